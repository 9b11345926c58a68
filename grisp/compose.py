"""Training records of query shapes the data lacks, composed from one-hop records (ours, not the paper's;
docs/method.md section 3.5): per epoch samples.py adds, for each shape of `Augment.compose_shapes`,
`Augment.compose` x weight x (number of records) of them (the flags `--compose` and `--compose-shapes` of
gen_data.py and train.py; by default only chains).

WWQ teaches few chains (22 of its 2,431 train queries), so a model trained on it alone writes
"where was the Pulp Fiction director born?" as one hop. compose_records makes chained records from
two one-hop ones: "who starred in pulp fiction?" (wd:Q104123 wdt:P161 ?x: Pulp Fiction is a work) and
"where was brad pitt born?" (wd:Q35332 wdt:P19 ?x: its subject is a person) give, through the
work -> person property "director", "where was the director of pulp fiction born?" with the query
{ wd:Q104123 wdt:P57 ?y . ?y wdt:P19 ?x . }. Types come from the properties (TYPES, SUBJECT_TYPES); only
fitting pairs are joined. The composed facts need not hold: a sample teaches the shape of the query
and the re-ranking of its IRIs, not an answer.

The other shapes take their entities the same way (a one-hop record's subject, named as its question
names it) and their wording from RELATIONS: yes/no questions (ask: "was brad pitt born in paris?"),
two constraints on one variable (intersection: "which films directed by x and starring y?"), the first
or latest of them by date (superlative), how many (count) and those before or after a year (filter);
their answers are typed by the class of the question's noun ("films" -> film: CLASSES), as WWQ's are.
"""

import math
import random
import re

from grisp.sparql_syntax import PREFIXES
from search import Indices

WD, WDT = PREFIXES["wd"], PREFIXES["wdt"]
ONE_HOP = re.compile(r"SELECT DISTINCT \?x WHERE \{ wd:(Q\d+) wdt:(P\d+) \?x \. \}$")
TYPES = {  # property -> (subject type, object type): which entities and properties composed records fit together
    "P57": ("work", "person"),
    "P58": ("work", "person"),
    "P86": ("work", "person"),
    "P50": ("work", "person"),
    "P170": ("work", "person"),
    "P161": ("work", "person"),
    "P495": ("work", "place"),
    "P19": ("person", "place"),
    "P20": ("person", "place"),
    "P27": ("person", "place"),
    "P22": ("person", "person"),
    "P25": ("person", "person"),
    "P26": ("person", "person"),
    "P36": ("place", "place"),
    "P17": ("place", "place"),
    "P47": ("place", "place"),
    "P35": ("place", "person"),
    "P112": ("organization", "person"),
    "P159": ("organization", "place"),
}
NOUN_PHRASES = {  # property -> noun phrases "the <property> of <subject>", for chains
    "P57": ["the director of {}", "the {} director", "{}'s director"],
    "P58": ["the screenwriter of {}", "the {} screenwriter"],
    "P86": ["the composer of {}", "the {} composer"],
    "P50": ["the author of {}", "{}'s author"],
    "P170": ["the creator of {}", "{}'s creator"],
    "P112": ["the founder of {}", "{}'s founder"],
    "P159": ["the headquarters of {}"],
    "P22": ["{}'s father", "the father of {}"],
    "P25": ["{}'s mother", "the mother of {}"],
    "P26": ["{}'s spouse", "the spouse of {}"],
    "P19": ["the birthplace of {}", "{}'s birthplace"],
    "P20": ["the place of death of {}", "{}'s place of death"],
    "P36": ["the capital of {}", "{}'s capital"],
    "P35": ["the head of state of {}"],
}
SUBJECT_TYPES = {  # properties beside TYPES' whose subject type is clear, for the one-hop records composed from
    "person": "P21 P40 P69 P102 P106 P509 P551 P569 P570 P1412 P3373",
    "place": "P6 P30 P37 P38 P122 P131 P150 P206 P421 P1082 P2046",
    "work": "P144 P175 P364 P577 P840",
    "organization": "P169 P452 P571",
}
SUBJECT_TYPE = {p: kind for kind, props in SUBJECT_TYPES.items() for p in props.split()}
SUBJECT_TYPE |= {p: subject_type for p, (subject_type, _) in TYPES.items()}

# property -> (yes/no questions whether {s} has {o} as P, phrases that describe a subject with {o} as P:
# "which films <directed by x>?", plural nouns for such subjects), for the shapes other than chains
FILMS, PEOPLE = ["movies", "films"], ["people", "persons"]
RELATIONS = {
    "P57": (["did {o} direct {s}?", "was {s} directed by {o}?"], ["directed by {o}"], FILMS),
    "P58": (["did {o} write the screenplay of {s}?", "was {s} written by {o}?"], ["written by {o}"], FILMS),
    "P86": (
        ["did {o} compose the music for {s}?", "is {o} the composer of {s}?"],
        ["with music by {o}", "scored by {o}"],
        FILMS,
    ),
    "P161": (
        ["was {o} in {s}?", "did {o} star in {s}?", "did {o} act in {s}?"],
        ["starring {o}", "with {o} in the cast"],
        FILMS + ["shows"],
    ),
    "P50": (
        ["did {o} write {s}?", "is {o} the author of {s}?"],
        ["written by {o}", "by {o}"],
        ["books", "novels", "works"],
    ),
    "P170": (["did {o} create {s}?"], ["created by {o}"], ["works"]),
    "P495": (["is {s} from {o}?"], ["from {o}", "made in {o}"], FILMS + ["works"]),
    "P19": (["was {s} born in {o}?", "is {o} the birthplace of {s}?"], ["born in {o}"], PEOPLE),
    "P20": (["did {s} die in {o}?"], ["who died in {o}"], PEOPLE),
    "P27": (
        ["is {s} a citizen of {o}?", "does {s} have citizenship of {o}?"],
        ["with citizenship of {o}", "who are citizens of {o}"],
        PEOPLE,
    ),
    "P26": (["was {s} married to {o}?", "is {o} the spouse of {s}?"], ["married to {o}"], PEOPLE),
    "P22": (["is {o} the father of {s}?", "is {o} {s}'s father?"], ["whose father is {o}"], PEOPLE),
    "P25": (["is {o} the mother of {s}?"], ["whose mother is {o}"], PEOPLE),
    "P36": (["is {o} the capital of {s}?"], ["whose capital is {o}"], ["countries", "states"]),
    "P17": (["is {s} in {o}?", "is {s} located in the country {o}?"], ["in {o}"], ["places", "cities"]),
    "P47": (
        ["does {s} border {o}?"],
        ["bordering {o}", "that share a border with {o}"],
        ["countries", "places"],
    ),
    "P112": (
        ["did {o} found {s}?", "was {s} founded by {o}?"],
        ["founded by {o}"],
        ["organizations", "companies"],
    ),
    "P159": (
        ["is {s} headquartered in {o}?"],
        ["headquartered in {o}", "based in {o}"],
        ["organizations", "companies"],
    ),
}
# subject type -> its date property, words for the earliest / latest, for superlatives and filters
DATES = {
    "work": (
        "P577",
        ["first", "earliest", "oldest"],
        ["latest", "last", "newest", "most recent"],
        ["came out", "were released", "were published"],
    ),
    "person": ("P569", ["oldest"], ["youngest"], ["were born"]),
}
INTERSECTION = [
    "which {noun} {a} and {b}?",
    "what {noun} {a} and {b}?",
    "name the {noun} {a} and {b}.",
    "list {noun} {a} and {b}.",
]
SUPERLATIVE = [
    "what was the {which} {noun_one} {a}?",
    "which is the {which} {noun_one} {a}?",
    "what is the {which} of the {noun} {a}?",
]
COUNT = ["how many {noun} {a}?", "how many {noun} {a} are there?", "what is the number of {noun} {a}?"]
FILTER = ["which {noun} {a} {verb} {side} {year}?", "what {noun} {a} {verb} {side} {year}?"]
# plural noun -> the class the data's queries type such answers with (?x wdt:P31 / wdt:P279 * wd:Q, WWQ's
# form); nouns without one (people, works, places, states) stay untyped, as WWQ mostly leaves people
CLASSES = {
    "movies": "Q11424",
    "films": "Q11424",
    "shows": "Q5398426",
    "books": "Q47461344",
    "novels": "Q8261",
    "countries": "Q6256",
    "cities": "Q515",
    "organizations": "Q43229",
    "companies": "Q783794",
}
SINGULAR = {
    "movies": "movie",
    "films": "film",
    "shows": "show",
    "works": "work",
    "books": "book",
    "novels": "novel",
    "people": "person",
    "persons": "person",
}
PROLOGUE = f"PREFIX wd: <{WD}> PREFIX wdt: <{WDT}> "
XSD_PROLOGUE = f"PREFIX xsd: <{PREFIXES['xsd']}> " + PROLOGUE
SHAPES = ("chain", "ask", "intersection", "superlative", "count", "filter")


def parse_shapes(text: str) -> dict[str, float]:
    """`--compose-shapes`: "chain,ask:0.5" -> {"chain": 1.0, "ask": 0.5}, each shape's share of `--compose`."""
    shapes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        shape, _, weight = part.partition(":")
        if shape not in SHAPES:
            raise ValueError(f"--compose-shapes: unknown shape {shape!r}; known: {', '.join(SHAPES)}")
        try:
            shapes[shape] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--compose-shapes: {part!r} needs a number after ':'") from None
        if not 0 < shapes[shape] < math.inf:  # nan and inf too
            raise ValueError(
                f"--compose-shapes: the weight of {shape} must be a finite number > 0, got {weight}"
            )
    return shapes


def mention(question: str, item) -> str | None:
    """How `question` names `item` (its label or an alias, any case, whole words), or None."""
    for name in sorted([item.label, *item.aliases], key=len, reverse=True):
        found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", question, re.IGNORECASE) if name else None
        if found:
            return found.group(0)
    return None


def named_subjects(records: list[dict], indices: Indices) -> dict[str, list[tuple]]:
    """Subject type -> [(record, subject id, property, how its question names the subject)] of the
    one-hop records whose property tells the subject's type and whose question names the subject."""
    named = {}
    for record in records:
        match = ONE_HOP.search(record["sparql"])
        if not match or match.group(2) not in SUBJECT_TYPE:
            continue
        subject, prop = match.groups()
        try:
            name = mention(record["question"], indices.item(WD + subject))
        except KeyError:
            continue
        if name:
            named.setdefault(SUBJECT_TYPE[prop], []).append((record, subject, prop, name))
    return named


def compose_records(
    records: list[dict], indices: Indices, rate: float, rng: random.Random, shape: str = "chain"
) -> list[dict]:
    """About rate * len(records) records of `shape` (one of SHAPES), with entities from `records`."""
    if shape not in SHAPES:
        raise ValueError(f"unknown composed shape {shape!r}; one of {', '.join(SHAPES)}")
    named = named_subjects(records, indices)
    count = round(rate * len(records))
    if shape == "chain":
        return compose_chains(named, count, rng)
    return compose_shape(
        shape, named, count, rng, {noun: q for noun, q in CLASSES.items() if WD + q in indices}
    )


def compose_chains(named: dict[str, list[tuple]], count: int, rng: random.Random) -> list[dict]:
    """Two-hop records. Each takes a one-hop record's subject S as named in its question (e.g. "pulp
    fiction", a work), a property P of S's type with a noun phrase ("the director of pulp fiction", a
    person) and a one-hop record about a subject of P's object type ("where was brad pitt born?"), whose
    subject's name the noun phrase replaces."""
    joins = [p for p in NOUN_PHRASES if all(named.get(kind) for kind in TYPES[p])]
    composed = []
    for _ in range(count if joins else 0):
        prop = rng.choice(joins)
        (subject_type, object_type), phrases = TYPES[prop], NOUN_PHRASES[prop]
        head, subject, _, name = rng.choice(named[subject_type])
        tail, _, tail_prop, tail_name = rng.choice(named[object_type])
        before, after = tail["question"].split(tail_name, 1)
        phrase = rng.choice(phrases).format(name)
        if before.endswith("the ") and phrase.startswith("the "):  # "where was the [the director of x] born"
            phrase = phrase[len("the ") :]
        elif before.endswith("the ") and phrase.startswith(name + "'s"):  # "the [x's birthplace]"
            before = before[: -len("the ")]
        sparql = (
            PROLOGUE + f"SELECT DISTINCT ?x WHERE {{ wd:{subject} wdt:{prop} ?y . ?y wdt:{tail_prop} ?x . }}"
        )
        composed.append(
            {
                "id": f"composed:{prop}:{head['id']}+{tail['id']}",
                "question": before + phrase + after,
                "sparql": sparql,
                "paraphrases": [],
                "info": {"composed_from": [head["id"], tail["id"]]},
            }
        )
    return composed


def compose_shape(
    shape: str, named: dict[str, list[tuple]], count: int, rng: random.Random, classes: dict[str, str]
) -> list[dict]:
    """`count` records of an ask, intersection, superlative, count or filter shape. Each picks relations
    of RELATIONS whose types have named entities, the entities from `named`, a wording at random; the
    answers are typed by the class of their noun where `classes` has one ("which films ..." -> film)."""
    fits = [
        p
        for p in RELATIONS
        if named.get(TYPES[p][1])
        and (shape != "ask" or named.get(TYPES[p][0]))
        and (shape not in ("superlative", "filter") or TYPES[p][0] in DATES)
    ]
    composed = []
    for _ in range(count if fits else 0):
        prop = rng.choice(fits)
        (subject_type, object_type), (questions, phrases, nouns) = TYPES[prop], RELATIONS[prop]
        source, o, _, o_name = rng.choice(named[object_type])
        used = [source["id"]]
        a = rng.choice(phrases).format(o=o_name)
        noun = rng.choice(nouns)
        answers = (
            f"?x wdt:P31 / wdt:P279 * wd:{classes[noun]} ; wdt:{prop} wd:{o}"
            if noun in classes
            else f"?x wdt:{prop} wd:{o}"
        )
        if shape == "ask":
            head, s, _, s_name = rng.choice(named[subject_type])
            if s == o:  # "was paris born in paris?"
                continue
            used.insert(0, head["id"])
            question = rng.choice(questions).format(s=s_name, o=o_name)
            sparql = PROLOGUE + f"ASK {{ wd:{s} wdt:{prop} wd:{o} . }}"
        elif shape == "intersection":
            second = rng.choice([p for p in fits if TYPES[p][0] == subject_type])
            other, o2, _, o2_name = rng.choice(named[TYPES[second][1]])
            if (second, o2) == (prop, o):  # the same constraint twice
                continue
            used.append(other["id"])
            b = rng.choice(RELATIONS[second][1]).format(o=o2_name)
            question = rng.choice(INTERSECTION).format(noun=noun, a=a, b=b)
            sparql = PROLOGUE + f"SELECT DISTINCT ?x WHERE {{ {answers} ; wdt:{second} wd:{o2} . }}"
        elif shape == "superlative":
            date, earliest, latest, _ = DATES[subject_type]
            first = rng.random() < 0.5
            which = rng.choice(earliest if first else latest)
            question = rng.choice(SUPERLATIVE).format(which=which, noun=noun, noun_one=SINGULAR[noun], a=a)
            order = "?y" if first else "DESC ( ?y )"
            sparql = PROLOGUE + (
                f"SELECT DISTINCT ?x WHERE {{ {answers} ; wdt:{date} ?y . }} ORDER BY {order} LIMIT 1"
            )
        elif shape == "count":
            question = rng.choice(COUNT).format(noun=noun, a=a)
            sparql = PROLOGUE + f"SELECT ( COUNT ( DISTINCT ?x ) AS ?count ) WHERE {{ {answers} . }}"
        else:  # filter
            date, _, _, verbs = DATES[subject_type]
            year, side = rng.randint(1900, 2020), rng.choice(["before", "after", "in"])
            question = rng.choice(FILTER).format(noun=noun, a=a, verb=rng.choice(verbs), side=side, year=year)
            before = f"?y < {year_start(year if side == 'before' else year + 1)}"
            after = f"?y >= {year_start(year + 1 if side == 'after' else year)}"
            # one bound alone; a whole year as WWQ writes it, two parenthesised bounds with the upper one first
            condition = {"before": before, "after": after, "in": f"( {before} ) && ( {after} )"}[side]
            sparql = XSD_PROLOGUE + (
                f"SELECT DISTINCT ?x WHERE {{ {answers} ; wdt:{date} ?y . FILTER ( {condition} ) }}"
            )
        composed.append(
            {
                "id": f"composed:{shape}:{prop}:{'+'.join(used)}",
                "question": question,
                "sparql": sparql,
                "paraphrases": [],
                "info": {"composed_from": used},
            }
        )
    return composed


def year_start(year: int) -> str:
    """The first instant of a year as a dateTime literal, the bound of a date filter."""
    return f'"{year}-01-01T00:00:00Z" ^^ xsd:dateTime'
