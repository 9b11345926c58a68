"""Two-hop training records composed from pairs of one-hop records (ours, not the paper's;
docs/method.md section 3.5): samples.py adds them at the rate `Augment.compose`, the `--compose` flag of
gen_data.py and train.py.

WWQ teaches few chains (22 of its 2,431 train queries), so a model trained on it alone writes
"where was the Pulp Fiction director born?" as one hop. compose_records makes chained records from
two one-hop ones: "who starred in pulp fiction?" (wd:Q104123 wdt:P161 ?x: Pulp Fiction is a work) and
"where was brad pitt born?" (wd:Q35332 wdt:P19 ?x: its subject is a person) give, through the
work -> person property "director", "where was the director of pulp fiction born?" with the query
{ wd:Q104123 wdt:P57 ?y . ?y wdt:P19 ?x . }. Types come from the properties (SUBJECT_TYPES); only
fitting pairs are joined. The composed facts need not hold: a sample teaches the shape of the query
and the re-ranking of its IRIs, not an answer.
"""
import random
import re

from grisp.sparql_syntax import PREFIXES
from search import Indices

WD, WDT = PREFIXES["wd"], PREFIXES["wdt"]
ONE_HOP = re.compile(r"SELECT DISTINCT \?x WHERE \{ wd:(Q\d+) wdt:(P\d+) \?x \. \}$")
NOUN_PHRASES = {  # property -> (subject type, object type, noun phrases "the <property> of <subject>")
    "P57": ("work", "person", ["the director of {}", "the {} director", "{}'s director"]),
    "P58": ("work", "person", ["the screenwriter of {}", "the {} screenwriter"]),
    "P86": ("work", "person", ["the composer of {}", "the {} composer"]),
    "P50": ("work", "person", ["the author of {}", "{}'s author"]),
    "P170": ("work", "person", ["the creator of {}", "{}'s creator"]),
    "P112": ("organization", "person", ["the founder of {}", "{}'s founder"]),
    "P159": ("organization", "place", ["the headquarters of {}"]),
    "P22": ("person", "person", ["{}'s father", "the father of {}"]),
    "P25": ("person", "person", ["{}'s mother", "the mother of {}"]),
    "P26": ("person", "person", ["{}'s spouse", "the spouse of {}"]),
    "P19": ("person", "place", ["the birthplace of {}", "{}'s birthplace"]),
    "P20": ("person", "place", ["the place of death of {}", "{}'s place of death"]),
    "P36": ("place", "place", ["the capital of {}", "{}'s capital"]),
    "P35": ("place", "person", ["the head of state of {}"]),
}
SUBJECT_TYPES = {  # more properties whose subject type is clear, for the one-hop records composed from
    "person": "P21 P27 P40 P69 P102 P106 P509 P551 P569 P570 P1412 P3373",
    "place": "P6 P17 P30 P37 P38 P47 P122 P131 P150 P206 P421 P1082 P2046",
    "work": "P144 P161 P175 P364 P495 P577 P840",
    "organization": "P169 P452 P571",
}
SUBJECT_TYPE = {p: kind for kind, props in SUBJECT_TYPES.items() for p in props.split()}
SUBJECT_TYPE |= {p: subject_type for p, (subject_type, _, _) in NOUN_PHRASES.items()}


def mention(question: str, item) -> str | None:
    """How `question` names `item` (its label or an alias, any case, whole words), or None."""
    for name in sorted([item.label, *item.aliases], key=len, reverse=True):
        found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", question, re.IGNORECASE) if name else None
        if found:
            return found.group(0)
    return None


def compose_records(records: list[dict], indices: Indices, rate: float, rng: random.Random) -> list[dict]:
    """About rate * len(records) two-hop records. Each takes a one-hop record's subject S as named in
    its question (e.g. "pulp fiction", a work), a property P of S's type with a noun phrase ("the
    director of pulp fiction", a person) and a one-hop record about a subject of P's object type
    ("where was brad pitt born?"), whose subject's name the noun phrase replaces."""
    named = {}  # subject type -> [(record, subject, property, how its question names the subject)]
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
    joins = [p for p, (subject_type, object_type, _) in NOUN_PHRASES.items()
             if named.get(subject_type) and named.get(object_type)]
    composed = []
    for _ in range(round(rate * len(records)) if joins else 0):
        prop = rng.choice(joins)
        subject_type, object_type, phrases = NOUN_PHRASES[prop]
        head, subject, _, name = rng.choice(named[subject_type])
        tail, _, tail_prop, tail_name = rng.choice(named[object_type])
        before, after = tail["question"].split(tail_name, 1)
        phrase = rng.choice(phrases).format(name)
        if before.endswith("the ") and phrase.startswith("the "):  # "where was the [the director of x] born"
            phrase = phrase[len("the "):]
        elif before.endswith("the ") and phrase.startswith(name + "'s"):  # "the [x's birthplace]"
            before = before[:-len("the ")]
        sparql = (f"PREFIX wd: <{WD}> PREFIX wdt: <{WDT}> SELECT DISTINCT ?x "
                  f"WHERE {{ wd:{subject} wdt:{prop} ?y . ?y wdt:{tail_prop} ?x . }}")
        composed.append({"id": f"composed:{prop}:{head['id']}+{tail['id']}", "question": before + phrase + after,
                         "sparql": sparql, "paraphrases": [], "info": {"composed_from": [head["id"], tail["id"]]}})
    return composed
