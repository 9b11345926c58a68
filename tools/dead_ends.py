"""Where a run dead-ends on questions another run answers (docs/results.md, docs/results-mention.md): for
each question run A (e.g. w/o re-ranking) answers correctly and run B (e.g. the full system) gives up on,
the placeholder at which B's first skeleton ran out of alternatives, sorted into

  property, KG lacks it  B resolved the entity A's query uses, then the property placeholder's constrained
                         candidates (re-run on the endpoint) do not include the property the skeleton names:
                         B's None is right on this KG, and A answered with a property the skeleton did not name
  property, other entity B had resolved another entity than A's query uses (a same-named one) by then
  entity                 B found no entity it ranked above None
  other                  anything else (a literal, a later placeholder, no trace)

    python tools/dead_ends.py ~/.cache/grisp/eval/M/wwq-dev-full-no-rerank ~/.cache/grisp/eval/M/wwq-dev-full-none \\
        --endpoint http://127.0.0.1:7880/query
"""

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
from build_index import WIKIDATA_ID  # noqa: E402
from common.jsonl import read_jsonl  # noqa: E402
from grisp import benchmarks, sparql  # noqa: E402
from grisp.sparql_syntax import with_prefixes  # noqa: E402

# a property placeholder of a skeleton: its label, then the namespace the model chose, e.g. (wdt)
PROPERTY_PLACEHOLDER = re.compile(r"<iri>(.*) \((?:wdt|p|ps|pq)\)</iri>")


def local_id(iri: str) -> str:
    return iri.rstrip("/").rsplit("/", 1)[-1]


def first_resolution(trace: list[dict]) -> list[dict]:
    """The events of the first skeleton's resolution (from its `resolve` event to the next one)."""
    starts = [i for i, event in enumerate(trace) if event["event"] == "resolve"]
    if not starts:
        return []
    return trace[starts[0] : starts[1] if len(starts) > 1 else len(trace)]


def property_ids(items_file: Path) -> dict[str, set[str]]:
    """Lower-cased label or alias -> ids of the properties that carry it."""
    names: dict[str, set[str]] = {}
    for item in read_jsonl(items_file):
        if item["id"].startswith("P"):
            for name in [item["label"], *(item.get("aliases") or [])]:
                names.setdefault(name.lower(), set()).add(item["id"])
    return names


def classify(
    events: list[dict], answered_ids: set[str], client: sparql.SparqlClient, properties: dict[str, set[str]]
) -> str:
    """Sort one dead end (the events of B's first skeleton) into the classes of the module docstring."""
    placeholders = [e for e in events if e["event"] == "placeholder"]
    if not placeholders:
        return "other"
    last = placeholders[-1]
    if last.get("kind") == "entity":
        return "entity"
    named = PROPERTY_PLACEHOLDER.fullmatch(last["placeholder"])
    if last.get("kind") != "property" or not last.get("constraint") or named is None:
        return "other"
    chosen = {
        local_id(e["iri"])
        for e in events
        if e["event"] == "choose" and e["placeholder"] != last["placeholder"]
    }
    if not chosen & answered_ids:
        return "property, other entity"
    candidates = {local_id(iri) for iri in client.query(with_prefixes(last["constraint"])).iris("candidate")}
    return "other" if properties.get(named.group(1).lower(), set()) & candidates else "property, KG lacks it"


def main(args: argparse.Namespace) -> None:
    for run_dir in (args.run_a, args.run_b):
        if not (Path(run_dir) / "predictions.jsonl").is_file():
            sys.exit(
                f"error: {run_dir} has no predictions.jsonl (give evaluate.py run directories, its --out)"
            )
    a, b = ({r["id"]: r for r in read_jsonl(Path(d) / "predictions.jsonl")} for d in (args.run_a, args.run_b))
    properties = property_ids(
        Path(args.items) if args.items else benchmarks.cached_file(benchmarks.ITEMS_FILE)
    )
    client = sparql.SparqlClient(args.endpoint)
    classes, examples = Counter(), {}
    try:
        for qid, record in b.items():
            if record.get("failure") != "dead_end" or qid not in a or a[qid].get("failure"):
                continue
            answered_ids = set(WIKIDATA_ID.findall(a[qid]["sparql"] or ""))
            kind = classify(first_resolution(record["trace"]), answered_ids, client, properties)
            classes[kind] += 1
            examples.setdefault(kind, []).append(f"{qid}: {record['question']}")
    finally:
        client.close()
    print(
        f"{sum(classes.values())} questions {Path(args.run_a).name} answers and {Path(args.run_b).name} "
        f"dead-ends\n\n| where B's first skeleton died | questions |\n|---|---|"
    )
    for kind, n in classes.most_common():
        print(f"| {kind} | {n} |")
    for kind, lines in examples.items() if args.show else []:
        print(f"\n{kind}:\n  " + "\n  ".join(lines[: args.show]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("run_a", help="evaluate.py run directory that answers (e.g. the w/o re-ranking run)")
    parser.add_argument("run_b", help="evaluate.py run directory that dead-ends (e.g. the full system)")
    parser.add_argument("--endpoint", required=True, help="SPARQL endpoint of the KG both runs used")
    parser.add_argument(
        "--items", default=None, help="item label file (default: wikidata/items.jsonl of the data cache)"
    )
    parser.add_argument("--show", type=int, default=5, help="example questions printed per class")
    main(parser.parse_args())
