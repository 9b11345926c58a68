"""Two matched re-ranking training sets for the `--mention` experiment (runs/mention.sh): the same
re-ranking samples of one epoch made twice, without and with `--mention 1` (gen_data.py --out); a
sample whose entity the question names in other words appears in its worded form in one set and its
plain form in the other, so the sets differ only in the wording.

    python tools/matched_rerank_sets.py PLAIN.jsonl WORDED.jsonl OUT_DIR [--n-worded 120 --n-plain 120 --n-val 24]

writes OUT_DIR/train-mention.jsonl (N worded + M plain samples), OUT_DIR/train-control.jsonl (the same
samples, all plain) and OUT_DIR/val.jsonl (V worded + V plain others, in their worded form).
"""

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
from grisp.prompts import marked_placeholder  # noqa: E402


def marked(sample: dict) -> str:
    """The placeholder a re-ranking sample marks (`<rep>...</rep>` in its user message)."""
    return marked_placeholder(sample["messages"][1]["content"])


def rerank_samples(path: Path) -> list[dict]:
    return [s for s in map(json.loads, path.open()) if s["task"] == "rerank"]


def matched_pairs(plain: list[dict], worded: list[dict]) -> list[tuple[dict, dict]]:
    """(plain, worded) versions of the same sample: the samples of a record id in order, for ids with as
    many samples in both (a worded search that found nothing drops its sample)."""
    by_id = defaultdict(lambda: ([], []))
    for sample in plain:
        by_id[sample["id"]][0].append(sample)
    for sample in worded:
        by_id[sample["id"]][1].append(sample)
    return [pair for a, b in by_id.values() if len(a) == len(b) for pair in zip(a, b)]


def main(args: argparse.Namespace) -> None:
    for path in (args.plain, args.worded):
        if not Path(path).is_file():
            raise SystemExit(
                f"error: {path} does not exist; make it with gen_data.py --out (as runs/mention.sh does)"
            )
    pairs = matched_pairs(rerank_samples(Path(args.plain)), rerank_samples(Path(args.worded)))
    changed = [pair for pair in pairs if marked(pair[0]) != marked(pair[1])]
    same = [pair for pair in pairs if marked(pair[0]) == marked(pair[1])]
    rng = random.Random(args.seed)
    rng.shuffle(changed)
    rng.shuffle(same)
    if len(changed) < args.n_worded + args.n_val or len(same) < args.n_plain + args.n_val:
        raise SystemExit(f"only {len(changed)} worded and {len(same)} plain samples; ask for fewer")
    train = changed[: args.n_worded] + same[: args.n_plain]
    rng.shuffle(train)
    val = changed[args.n_worded : args.n_worded + args.n_val] + same[args.n_plain : args.n_plain + args.n_val]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in [
        ("train-mention", [w for _, w in train]),
        ("train-control", [p for p, _ in train]),
        ("val", [w for _, w in val]),
    ]:
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row | {"epoch": 0}) + "\n" for row in rows))
    none = lambda rows: sum(row["iri"] is None for row in rows)
    print(
        f"{len(changed)} of {len(pairs)} samples worded differently; wrote {len(train)} training samples "
        f"(None targets: {none([w for _, w in train])} worded set, {none([p for p, _ in train])} control) and "
        f"{len(val)} validation samples to {out}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("plain", help="gen_data.py --out samples without --mention")
    parser.add_argument("worded", help="the same epoch with --mention 1")
    parser.add_argument("out_dir", help="where the three sets are written")
    parser.add_argument("--n-worded", type=int, default=120, help="worded samples in the training sets")
    parser.add_argument("--n-plain", type=int, default=120, help="plain samples in the training sets")
    parser.add_argument("--n-val", type=int, default=24, help="validation samples of each kind")
    parser.add_argument("--seed", type=int, default=0, help="the shuffles' seed")
    main(parser.parse_args())
