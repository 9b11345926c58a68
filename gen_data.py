"""Precompute GRISP training samples (paper section 3, "Training Data"; docs/method.md section 3.1) for N
epochs as JSONL: a skeleton and a re-ranking sample per benchmark record and epoch, with the
augmentations (samples.py holds the method; train.py makes the same samples online).

Reads the benchmark records of the mixture `--data` (mixture.py: one or several sources with weights,
e.g. `wwq,qald10,lcquad2:0.3`) and the search index of their KG (`--index`; the Wikidata index is built
in-process if missing), prints a per-source table of what is used and what is skipped and why and one of
the usable records' question shapes (one triple, two-hop, qualifier, ASK, ...), writes
one sample per line to `--out` (under a temporary name until complete) and prints the statistics:
samples per source and epoch, augmentation counts, and token lengths per task and source if the base
model's tokenizer is present. A sample (see samples.py):

    {"id": record id, "epoch": 0, "task": "skeleton", "messages": [system, user], "target": "SELECT ..."}
    {"id": ..., "epoch": 0, "task": "rerank", "messages": [...], "target": "C",
     "identifiers": ["A", ..., "K"], "iri": gold item IRI or null when dropped}
    a composed record's samples also carry "composed_from": [the ids of the records it was made of]
    (train.py --samples trains on one only if none of them is held out for validation)

    python gen_data.py --data wwq --epochs 4 --out ~/.cache/grisp/data/wwq-samples.jsonl
    python gen_data.py --data wwq,qald10,qald7,lcquad2,sq,spinach --epochs 1     # the mixture's statistics
    python gen_data.py --data wwq --epochs 1 --out /tmp/wwq.jsonl --show 2   # and look at two samples
    python train.py --samples ~/.cache/grisp/data/wwq-samples.jsonl      # train on them
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

from build_index import open_index
from common import defaults
from common.defaults import WIKIDATA_INDEX_DIR
from common.jsonl import write_jsonl
from grisp import mixture
from grisp.prompts import LATEST_PROMPT_FORMAT, PROMPT_FORMATS
from grisp.samples import Augment, SampleGenerator, add_generation_args, length_stats
from grisp.skeleton_score import SHAPES, shape
from grisp.sparql import SparqlClient


def main(args: argparse.Namespace) -> None:
    # --- setup
    if args.epochs < 1:
        sys.exit(f"error: --epochs must be at least 1, got {args.epochs}")
    if args.show < 0:  # samples[:-1] would print all but the last
        sys.exit(f"error: --show must be at least 0, got {args.show}")
    print(json.dumps(vars(args), indent=1, default=str), file=sys.stderr)
    try:
        data = mixture.read(args.data)
        indices = open_index(args.index, args.data)
        data.prepare(indices)
        client = SparqlClient(args.endpoint) if args.endpoint else None
        generator = SampleGenerator(
            data.usable, indices, Augment.from_args(args), args.seed, data.weights, args.prompt_format, client
        )
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(data.table())
    print("question shapes of the usable records (skeleton_score.shape, docs/method.md 7.6):")
    print(shape_table(data))
    if args.constrain and client is None:
        print(
            "no --endpoint: no re-ranking sample is constrained (--constrain needs the constraint queries' answers)"
        )

    # --- samples of every epoch, written as they are made
    total, first_epoch = Counter(), []

    def every_epoch() -> Iterator[dict]:
        for epoch in range(args.epochs):
            samples, stats = generator.epoch(epoch)
            total.update(stats)
            if epoch == 0:
                first_epoch.extend(samples)
                for sample in samples[: args.show]:
                    print(json.dumps(sample, indent=1, ensure_ascii=False))
            yield from samples

    out = Path(args.out).expanduser() if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(out, every_epoch())  # under a temporary name until complete
    else:
        for _ in every_epoch():  # statistics only
            pass

    # --- statistics
    print(
        f"{len(data.usable)} usable records x {args.epochs} epochs -> {total['skeleton']} skeleton and "
        f"{total['rerank']} re-ranking samples" + (f" in {out}" if out else "")
    )
    print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    by_source = Counter((s.get("source", ""), s["task"]) for s in first_epoch)
    print(
        "samples of epoch 0 by source: "
        + ", ".join(
            f"{source.name} {by_source[source.name, 'skeleton']} + {by_source[source.name, 'rerank']}"
            for source in data.sources
        )
        + f" (composed {sum(n for (s, _), n in by_source.items() if s == '')})"
    )
    model_dir = Path(args.model_dir).expanduser()
    if (model_dir / "tokenizer.json").exists() and first_epoch:
        print(f"token lengths (epoch 0): {json.dumps(length_stats(first_epoch, model_dir))}")
        if len(data.sources) > 1:
            for source in data.sources:
                mine = [s for s in first_epoch if s.get("source") == source.name]
                print(f"  {source.name}: {json.dumps(length_stats(mine, model_dir))}")


def shape_table(data: mixture.Mixture) -> str:
    """How many usable records of each source have each question shape: what the mixture teaches
    beyond one triple pattern."""
    counts = {source.name: Counter() for source in data.sources}
    for record in data.usable:
        counts[record["source"]][shape(record["sparql"])] += 1
    rows = [
        [name, *(str(c[s]) for s in SHAPES), str(c.total())]
        for name, c in [*counts.items(), ("total", sum(counts.values(), Counter()))]
    ]
    head = ["source", *SHAPES, "all"]
    return "\n".join("| " + " | ".join(row) + " |" for row in [head, ["---"] * len(head), *rows])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Precompute GRISP training samples (skeleton + re-ranking) for N epochs as JSONL.",
        formatter_class=defaults.HelpFormatter,
    )
    # data
    parser.add_argument(
        "--data",
        default="wwq",
        help="the mixture (mixture.py): comma-separated sources, each with an "
        f"optional weight = uses of each record per epoch, e.g. wwq,qald10,lcquad2:0.3; a source is "
        f"{', '.join(mixture.SOURCES)}, a benchmarks.py name or a JSONL path (never an evaluation set)",
    )
    parser.add_argument(
        "--index",
        default=None,
        help=f"index directory; unset: {WIKIDATA_INDEX_DIR}, built from the Wikidata items file if missing",
    )
    parser.add_argument("--out", default=None, help="output JSONL (default: statistics only)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs to precompute (fresh samples each)")
    parser.add_argument("--seed", type=int, default=0, help="sample = f(seed, epoch, record)")
    parser.add_argument("--show", type=int, default=0, help="print the first N samples of epoch 0")
    parser.add_argument(
        "--model-dir",
        default=str(defaults.MODEL_DIR),
        help="tokenizer for the length statistics (skipped if absent)",
    )
    parser.add_argument(
        "--prompt-format",
        choices=PROMPT_FORMATS,
        default=LATEST_PROMPT_FORMAT,
        help="re-ranking prompt format (prompts.py; v1: the first adapter's)",
    )
    parser.add_argument(
        "--endpoint",
        default=None,
        help="SPARQL endpoint of the KG, for the constrained re-ranking "
        "samples (--constrain); without it no sample is constrained",
    )
    # augmentation
    add_generation_args(parser.add_argument_group("augmentation"))
    main(parser.parse_args())
