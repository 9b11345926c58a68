"""Build the demo knowledge graph `data/demo/kg.ttl` from readable source tables.

The demo KG is a small, real Wikidata subset (films, directors, cast with some character roles,
writers, composers; people's birth places, dates, occupations, families; cities, countries; awards)
on which the README example, the demo questions and the tests run. Sources:

    facts.tsv     (this folder) one row per fact or per qualifier of a fact, ids AND labels written out
    entities.tsv  (this folder) items without facts that share a name with one in facts.tsv (distractors)
    wikidata/items.jsonl, wwq/dev.jsonl  (the data cache, filled from ../shared/data or a download):
                  names, popularity counts, and WWQ dev gold answers (info.results)

All problems are reported together before anything is written: every id must be in items.jsonl with
exactly the label in the table; literals only on date/quantity properties; no duplicate rows; every
`wwq-dev:<id>` row must be asserted by that dev question's gold answers (see dev_facts).
Output in Wikidata's RDF shape: rdfs:label, skos:altLabel, schema:description (@en) and
wikibase:sitelinks (= the items.jsonl count, a stand-in) per item; wikibase:propertyType and the
wdt:/p:/ps:/pq: links per property; per fact the truthy `wdt:` triple and a statement `p:` -> node ->
`ps:` (+ `pq:` qualifiers). Statement node ids (`wds:Q104123-P161-Q80938`) are synthetic.

    python data/demo/build_demo.py           # validate, rewrite kg.ttl, print counts
    python data/demo/build_demo.py --check   # validate and count only
"""

import argparse
import hashlib
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pyoxigraph as ox

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's top-level modules
from common import defaults  # noqa: E402
from common.jsonl import read_jsonl  # noqa: E402
from grisp import (
    benchmarks,  # noqa: E402
)
from grisp.sparql_syntax import PREFIXES  # noqa: E402

FACT_COLUMNS = [
    "subject",
    "subject_label",
    "property",
    "value",
    "value_label",
    "statement",
    "qualifier",
    "qualifier_value",
    "qualifier_value_label",
    "source",
]
ENTITY_COLUMNS = ["id", "label", "note"]
ITEM_ID = re.compile(r"[QP]\d+")
DATE_PROPERTIES = {"P569", "P570", "P571", "P577", "P580", "P582", "P585"}
QUANTITY_PROPERTIES = {"P1082", "P2047"}
TURTLE_PREFIXES = ["wd", "wds", "wdt", "p", "ps", "pq", "wikibase", "rdf", "rdfs", "skos", "schema", "xsd"]

# ---------------------------------------------------------------------------- reading the tables


def read_table(path: Path, columns: list[str]) -> list[tuple[int, dict]]:
    """(line number, {column: cell}) per data line of a TSV file; '#' lines are comments and the
    first other line must be the header `columns`."""
    rows, header = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            if header != columns:
                raise ValueError(f"{path}:{number}: header {header} is not the expected {columns}")
        elif len(cells) != len(columns):
            raise ValueError(f"{path}:{number}: {len(cells)} cells, expected {len(columns)} ({columns})")
        else:
            rows.append((number, dict(zip(columns, [cell.strip() for cell in cells]))))
    return rows


# ---------------------------------------------------------------------------- WWQ dev gold answers

TERM = r"(wd:[QP]\d+|\?\w+)"
# the WHERE clauses (whitespace-normalised) whose gold answers assert facts, see dev_facts()
SINGLE = re.compile(rf"\{{ {TERM} wdt:(P\d+) {TERM} \.? \}}(?: LIMIT \d+)?")
TYPE = r"wdt:P31 / wdt:P279 \* wd:Q\d+"
TYPED = re.compile(rf"\{{ (\?\w+) (?:{TYPE} ; )?wdt:(P\d+) wd:(Q\d+) (?:(?:;|\. \1) {TYPE} )?\. \}}")
STATEMENT = re.compile(rf"\{{ wd:(Q\d+) p:(P\d+) (\?\w+) \. \3 ps:\2 {TERM} ; pq:(P\d+) {TERM} \. \}}")


def dev_facts(sample: dict) -> set[tuple[str, ...]]:
    """Facts that one WWQ dev question's gold answers assert: (s, p, o) for `wd:S wdt:P ?x`,
    `?x wdt:P wd:O` (optionally typed, before or after, with `?x wdt:P31/wdt:P279* wd:C`, which also asserts
    (s, P31, C): Wikidata has C by P31/P279*, the demo writes it as the direct type), and (s, p, o) plus
    (s, p, o, qualifier, value) for `wd:S p:P ?st . ?st ps:P o ; pq:Q v` with one of o, v the
    answer. Ids are bare (Q42); other query shapes assert nothing here."""
    select, _, where = " ".join(sample["sparql"].split()).partition(" WHERE ")
    variable = re.search(r"SELECT (?:DISTINCT )?(\?\w+)", select)
    if variable is None:
        return set()
    variable = variable.group(1)
    answers = [
        row[variable[1:]]["value"].rsplit("/", 1)[-1]
        for row in sample["info"].get("results", [])
        if row.get(variable[1:], {}).get("type") == "uri"
    ]
    bare = lambda term, answer: answer if term == variable else term.split(":", 1)[1]  # noqa: E731
    facts = set()
    if match := SINGLE.fullmatch(where):
        subject, prop, obj = match.groups()
        if variable in (subject, obj):
            facts |= {(bare(subject, a), prop, bare(obj, a)) for a in answers}
    elif (match := TYPED.fullmatch(where)) and match.group(1) == variable:
        facts |= {(a, match.group(2), match.group(3)) for a in answers}
        if typed := re.search(TYPE, where):  # each answer has the type (by the path; see the docstring)
            facts |= {(a, "P31", typed.group(0).rsplit(":", 1)[1]) for a in answers}
    elif match := STATEMENT.fullmatch(where):
        subject, prop, _, value, qualifier, qualifier_value = match.groups()
        if variable in (value, qualifier_value):
            for a in answers:
                fact = (subject, prop, bare(value, a))
                facts |= {fact, fact + (qualifier, bare(qualifier_value, a))}
    return facts


# ---------------------------------------------------------------------------- checking


def check(
    facts: list[tuple[int, dict]],
    entities: list[tuple[int, dict]],
    items: dict[str, dict],
    dev: dict[str, dict],
) -> list[str]:
    """Every problem of the tables, as messages naming the line; an empty list means all is well."""
    problems, seen = [], Counter()
    labelled = [(f"facts.tsv:{n}", r["subject"], r["subject_label"]) for n, r in facts]  # where, id, label
    labelled += [(f"facts.tsv:{n}", r[c], None) for n, r in facts for c in ("property", "qualifier") if r[c]]
    for n, row in facts:
        for prop, value, label in (
            (row["property"], row["value"], row["value_label"]),
            (row["qualifier"], row["qualifier_value"], row["qualifier_value_label"]),
        ):
            if prop and ITEM_ID.fullmatch(value):
                labelled.append((f"facts.tsv:{n}", value, label))
            elif prop:
                try:
                    turtle_literal(prop, value)
                except ValueError as error:
                    problems.append(f"facts.tsv:{n}: {error}")
                if label:
                    problems.append(f"facts.tsv:{n}: literal {value!r} has a label {label!r}")
        seen[tuple(row[c] for c in FACT_COLUMNS[:-1] if "label" not in c)] += 1
        source = row["source"]
        if source.startswith("wwq-dev:"):
            key = (row["subject"], row["property"], row["value"])
            key += (row["qualifier"], row["qualifier_value"]) if row["qualifier"] else ()
            sample = dev.get(source.removeprefix("wwq-dev:"))
            if sample is None:
                problems.append(f"facts.tsv:{n}: {source} is not a WWQ dev question")
            elif key not in dev_facts(sample):
                problems.append(f"facts.tsv:{n}: {key} is not asserted by the gold answers of {source}")
        elif not source.startswith("hand"):
            problems.append(f"facts.tsv:{n}: source {source!r} is neither hand[...] nor wwq-dev:<id>")
    problems += [f"facts.tsv: row {list(key)} occurs {n} times" for key, n in seen.items() if n > 1]
    fact_ids = {i for _, i, _ in labelled}
    for n, row in entities:
        labelled.append((f"entities.tsv:{n}", row["id"], row["label"]))
        if row["id"] in fact_ids:
            problems.append(f"entities.tsv:{n}: {row['id']} is already in facts.tsv")
    for where, item_id, label in labelled:
        if not ITEM_ID.fullmatch(item_id):
            problems.append(f"{where}: {item_id!r} is not a Wikidata id (Q123 or P123)")
        elif item_id not in items:
            problems.append(f"{where}: {item_id} is not in items.jsonl")
        elif label is not None and items[item_id]["label"] != label:
            problems.append(
                f"{where}: {item_id} is {items[item_id]['label']!r} in items.jsonl, not {label!r}"
            )
    return problems


# ---------------------------------------------------------------------------- writing Turtle


def turtle_string(text: str) -> str:
    """An English Turtle string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"@en'


def turtle_literal(prop: str, text: str) -> str:
    """The Turtle literal of a date (YYYY-MM-DD, or YYYY at year precision) or quantity cell,
    as Wikidata's truthy triples write them; ValueError for anything else."""
    if prop in DATE_PROPERTIES:
        match = re.fullmatch(r"(\d{4})(?:-(\d\d)-(\d\d))?", text)
        if match is None:
            raise ValueError(f"date {text!r} of {prop} is neither YYYY-MM-DD nor YYYY")
        year, month, day = match.group(1), match.group(2) or "01", match.group(3) or "01"
        return f'"{year}-{month}-{day}T00:00:00Z"^^xsd:dateTime'
    if prop in QUANTITY_PROPERTIES:
        if not re.fullmatch(r"-?\d+(\.\d+)?", text):
            raise ValueError(f"quantity {text!r} of {prop} is not a number")
        return f'"{text}"^^xsd:decimal'
    raise ValueError(f"{prop} takes items (Q123), not the literal {text!r}")


def term(prop: str, value: str) -> str:
    """Turtle term of a fact's value: `wd:Q42` or a typed literal."""
    return f"wd:{value}" if ITEM_ID.fullmatch(value) else turtle_literal(prop, value)


def statement_node(subject: str, prop: str, value: str, number: str) -> str:
    """Synthetic statement id: wds:Q104123-P161-Q80938 (a hash stands in for literal values)."""
    value_part = value if ITEM_ID.fullmatch(value) else hashlib.md5(value.encode()).hexdigest()[:8]
    return f"wds:{subject}-{prop}-{value_part}" + (f"-{number}" if number else "")


def item_lines(record: dict) -> list[str]:
    """Predicate-object pairs for an item's names and popularity (and a property's links)."""
    item_id = record["id"]
    lines = [f"rdfs:label {turtle_string(record['label'])}"]
    aliases = dict.fromkeys(a for a in record.get("aliases") or [] if a != record["label"])
    lines += [f"skos:altLabel {turtle_string(alias)}" for alias in aliases]
    if record.get("description"):
        lines.append(f"schema:description {turtle_string(record['description'])}")
    if item_id.startswith("P"):
        kind = (
            "Time"
            if item_id in DATE_PROPERTIES
            else "Quantity"
            if item_id in QUANTITY_PROPERTIES
            else "WikibaseItem"
        )
        lines += [
            "a wikibase:Property",
            f"wikibase:propertyType wikibase:{kind}",
            f"wikibase:directClaim wdt:{item_id}",
            f"wikibase:claim p:{item_id}",
            f"wikibase:statementProperty ps:{item_id}",
            f"wikibase:qualifier pq:{item_id}",
        ]
    else:
        lines.append(f"wikibase:sitelinks {int(record.get('count') or 0)}")
    return lines


def to_turtle(facts: list[dict], ids: set[str], items: dict[str, dict]) -> str:
    """The whole demo KG as Turtle text: properties, then items, each followed by its statements."""
    statements = defaultdict(list)  # (subject, property, value, number) -> qualifier (property, value)s
    for row in facts:
        key = (row["subject"], row["property"], row["value"], row["statement"])
        statements[key] += [(row["qualifier"], row["qualifier_value"])] if row["qualifier"] else []
    by_subject = defaultdict(list)
    for key in statements:
        by_subject[key[0]].append(key)
    blocks = [f"@prefix {name}: <{PREFIXES[name]}> ." for name in TURTLE_PREFIXES]
    for item_id in sorted(ids, key=lambda i: (i[0], int(i[1:]))):
        lines = item_lines(items[item_id])
        truthy = dict.fromkeys(f"wdt:{p} {term(p, v)}" for _, p, v, _ in by_subject[item_id])
        lines += list(truthy) + [f"p:{key[1]} {statement_node(*key)}" for key in by_subject[item_id]]
        blocks.append(f"\nwd:{item_id} " + " ;\n    ".join(lines) + " .")
        for key in by_subject[item_id]:
            _, prop, value, _ = key
            parts = [f"ps:{prop} {term(prop, value)}"]
            parts += [f"pq:{q} {term(q, qv)}" for q, qv in statements[key]]
            blocks.append(f"{statement_node(*key)} " + " ;\n    ".join(parts) + " .")
    return "\n".join(blocks) + "\n"


def count_triples(turtle: str) -> dict[str, int]:
    """Parse the Turtle (a syntax check) and count its triples by kind."""
    kinds = {
        "wdt": "truthy facts (wdt:)",
        "p": "statement links (p:)",
        "ps": "statement values (ps:)",
        "pq": "qualifiers (pq:)",
    }
    names = {
        "label": "labels",
        "altLabel": "aliases",
        "description": "descriptions",
        "sitelinks": "popularity",
    }
    counts, subjects = Counter(), set()
    for triple in ox.parse(turtle.encode("utf-8"), format=ox.RdfFormat.TURTLE):
        predicate = triple.predicate.value
        namespace = next(
            (n for n in kinds if re.fullmatch(re.escape(PREFIXES[n]) + r"P\d+", predicate)), None
        )
        local = re.split(r"[#/]", predicate)[-1]
        counts[kinds[namespace] if namespace else names.get(local, "property links")] += 1
        if local == "label":
            subjects.add(triple.subject.value)
    counts["triples"] = sum(counts.values())
    counts["entities (labelled items)"] = sum("/entity/Q" in s for s in subjects)
    counts["properties (labelled)"] = sum("/entity/P" in s for s in subjects)
    return dict(counts)


def main(args: argparse.Namespace) -> None:
    # --- read the tables and what they are checked against
    facts = read_table(args.facts, FACT_COLUMNS)
    entities = read_table(args.entities, ENTITY_COLUMNS)
    wanted = {
        r[c] for _, r in facts for c in ("subject", "property", "value", "qualifier", "qualifier_value")
    }
    wanted |= {r["id"] for _, r in entities}
    items_path = args.items or benchmarks.cached_file(benchmarks.ITEMS_FILE)
    items = {r["id"]: r for r in read_jsonl(items_path) if r["id"] in wanted}  # ~75k lines
    dev = {sample["id"]: sample for sample in benchmarks.load_benchmark(args.dev)}

    # --- check everything, report all problems at once
    problems = check(facts, entities, items, dev)
    if problems:
        sys.exit(f"error: {len(problems)} problems in the demo tables:\n  " + "\n  ".join(problems))
    rows = [row for _, row in facts]
    ids = {i for i in wanted if ITEM_ID.fullmatch(i)}
    sources = Counter(row["source"].split(":")[0].split(",")[0] for row in rows)
    print(
        f"checked {len(rows)} fact rows ({dict(sources)}) and {len(entities)} distractor items: all "
        f"ids and labels match items.jsonl, all wwq-dev rows are backed by gold answers"
    )

    # --- build and count
    turtle = "\n".join(
        [
            "# GRISP demo knowledge graph: a small subset of Wikidata (CC0), generated by",
            "# data/demo/build_demo.py from facts.tsv and entities.tsv (edit those and rebuild, not this file).",
            "# Names and the popularity count (written as wikibase:sitelinks) come from items.jsonl;",
            "# statement node ids are synthetic. See data/demo/README.md for provenance.",
            to_turtle(rows, ids, items),
        ]
    )
    for name, count in count_triples(turtle).items():
        print(f"  {name:28s} {count:6d}")
    if args.check:
        return
    args.out.write_text(turtle, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Build the demo knowledge graph kg.ttl from facts.tsv and entities.tsv, checking every "
        "id and label against items.jsonl and every wwq-dev row against WWQ dev gold answers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # sources
    parser.add_argument("--facts", type=Path, default=defaults.DEMO_DIR / "facts.tsv", help="facts table")
    parser.add_argument(
        "--entities",
        type=Path,
        default=defaults.DEMO_DIR / "entities.tsv",
        help="table of distractor items (no facts)",
    )
    parser.add_argument(
        "--items",
        type=Path,
        default=None,
        help="items.jsonl (id, label, aliases, description, count); default: the data cache",
    )
    parser.add_argument(
        "--dev", default="wwq-dev", help="WWQ dev benchmark (name or JSONL path) with gold answers"
    )
    # output
    parser.add_argument("--out", type=Path, default=defaults.DEMO_DIR / "kg.ttl", help="Turtle file to write")
    parser.add_argument("--check", action="store_true", help="only validate and count; write nothing")
    args = parser.parse_args()
    try:
        main(args)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
