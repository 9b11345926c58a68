"""Fill in `named` for the choices of evaluation runs recorded before resolve.py recorded it (2026-12-07),
so that `evaluate.py --score-only --min-confidence X` re-decides their answers by today's confidence rule
(grisp/confidence.py: an entity taken below None that no wording of its placeholder names caps the
confidence at the least probability).

A choice at an entity placeholder (its trace's `placeholder` event says kind "entity") gets
`named = any(item.named_by(wording) for wording in the placeholder's wordings)`, the item looked up in
the run's own index (its config.json, or --index); other choices get None, as resolve.py gives them.
Choices that already hold `named` are left as they are. predictions.jsonl is rewritten in place.

    python tools/name_choices.py ~/.cache/grisp/eval/issue70/wwq-dev-real-report-full
    python evaluate.py --score-only --min-confidence 0.02 --benchmark wwq-dev-real-report \\
        --out ~/.cache/grisp/eval/issue70/wwq-dev-real-report-full --endpoint http://127.0.0.1:7881/query
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
from common.jsonl import read_jsonl, write_jsonl  # noqa: E402
from grisp.skeleton import find_placeholders, wordings  # noqa: E402
from search import Indices  # noqa: E402


def name_choices(record: dict, indices: Indices) -> int:
    """Set `named` on the record's choices that lack it; how many were set."""
    kinds = {
        event["placeholder"]: event["kind"]
        for event in record.get("trace", [])
        if event["event"] == "placeholder"
    }
    filled = 0
    for choice in record.get("choices") or []:
        if "named" in choice:
            continue
        named = None
        if kinds.get(choice["placeholder"]) == "entity":
            item = indices.get(choice["iri"])
            placeholder = find_placeholders(choice["placeholder"])[0]
            named = item is not None and any(map(item.named_by, wordings(placeholder)))
        choice["named"], filled = named, filled + 1
    return filled


def main(args: argparse.Namespace) -> None:
    for run in args.runs:
        predictions = run / "predictions.jsonl"
        if not predictions.exists():
            sys.exit(f"{run}: no predictions.jsonl (give an evaluate.py --out directory)")
        index = args.index or json.loads((run / "config.json").read_text())["index"]
        indices = Indices(Path(index))
        records = read_jsonl(predictions)
        filled = sum(name_choices(record, indices) for record in records)
        write_jsonl(predictions, records)
        print(f"{run}: `named` set on {filled} choices of {len(records)} records (index {index})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="evaluate.py --out directories")
    parser.add_argument(
        "--index", type=Path, default=None, help="the index the runs used (default: their config.json's)"
    )
    main(parser.parse_args())
