"""Run every demo gold query on the demo KG and record its answers in questions.jsonl.

The demo questions (questions.jsonl, benchmark JSONL: id, question, sparql, paraphrases, info) are
written by hand; `info.answers` records what each gold query returns on data/demo/kg.ttl, for
readers and for tests/test_demo_data.py: the labels of IRI answers, the values of literal answers
(dates as xsd:dateTime text), "true"/"false" for ASK, sorted. A gold query that returns no rows is
an error (an ASK always answers). Runs in memory with pyoxigraph (no server needed); rerun it after
rebuilding kg.ttl.

    python data/demo/answer_questions.py           # rewrite info.answers
    python data/demo/answer_questions.py --check   # exit 1 if a recorded answer is stale
"""

import argparse
import sys
from pathlib import Path

import pyoxigraph as ox

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's top-level modules
from common import defaults  # noqa: E402
from common.jsonl import write_jsonl  # noqa: E402
from grisp import (
    benchmarks,  # noqa: E402
)
from grisp.sparql_syntax import PREFIXES  # noqa: E402

RDFS_LABEL = ox.NamedNode(PREFIXES["rdfs"] + "label")


def answers(store: ox.Store, sparql: str) -> list[str]:
    """Sorted distinct answers of a gold query: labels of IRIs, values of literals, or the ASK truth."""
    result = store.query(sparql)
    if isinstance(result, ox.QueryBoolean):
        return [str(bool(result)).lower()]
    values = set()
    for solution in result:
        for term in solution:
            if isinstance(term, ox.NamedNode):
                label = next(store.quads_for_pattern(term, RDFS_LABEL, None), None)
                values.add(label.object.value if label else term.value)
            elif term is not None:
                values.add(term.value)
    return sorted(values)


def main(args: argparse.Namespace) -> None:
    store = ox.Store()
    store.load(path=str(args.kg), format=ox.RdfFormat.TURTLE)
    questions = benchmarks.load_benchmark(args.questions)
    empty, stale = [], []
    for question in questions:
        found = answers(store, question["sparql"])
        empty += [question["id"]] if not found else []
        stale += [question["id"]] if question["info"].get("answers") != found else []
        question["info"]["answers"] = found
    if empty:
        sys.exit(f"error: these gold queries return nothing on {args.kg}: {', '.join(empty)}")
    print(f"{len(questions)} gold queries answer on {args.kg}; recorded answers changed: {stale or 'none'}")
    if args.check:
        sys.exit(1 if stale else 0)
    write_jsonl(args.questions, questions)
    print(f"wrote {args.questions}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--kg", type=Path, default=defaults.DEMO_DIR / "kg.ttl", help="demo KG (Turtle)")
    parser.add_argument(
        "--questions",
        type=Path,
        default=defaults.DEMO_DIR / "questions.jsonl",
        help="demo questions (benchmark JSONL) whose info.answers are (re)written",
    )
    parser.add_argument("--check", action="store_true", help="only report stale answers; write nothing")
    args = parser.parse_args()
    try:
        main(args)
    except (FileNotFoundError, ValueError, SyntaxError, OSError) as error:
        sys.exit(f"error: {error}")
