"""Property search quality: held-out aliases of Wikidata properties, prefix index vs embedding index.

For every property in the items file that has an alias, one alias is held out (not indexed) and used
as the query; a search succeeds if it returns that property. This is the situation of GRISP's
resolver, whose placeholders are labels or aliases the model learned, phrased in ways the index may
not hold (METHOD.md section 4: keywords miss "born in" -> "place of birth"). Printed: recall@1,
recall@10, MRR@10 and mean query time per method; this is the measurement behind the encoder choice.

    python bench/eval_property_search.py                         # ../shared/data/wikidata/items.jsonl
    python bench/eval_property_search.py --items FILE --limit 500
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's modules
import defaults  # noqa: E402
from encoder import MINILM, load_encoder  # noqa: E402
from indices import EmbeddingIndex, PrefixIndex, normalize  # noqa: E402


def held_out_split(items_file: Path, seed: int) -> tuple[list[list[str]], list[tuple[str, int]]]:
    """Names per property with one alias removed, and (held-out alias, property row) queries."""
    rng = np.random.default_rng(seed)
    names, queries = [], []
    with open(items_file, encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            if not item["id"].startswith("P"):
                continue
            label, aliases = item["label"], list(dict.fromkeys(item.get("aliases") or []))
            # an alias that normalises like another name of the same property is not held out
            own = {tuple(normalize(n)) for n in [label] + aliases}
            candidates = [
                a
                for a in aliases
                if sum(tuple(normalize(n)) == tuple(normalize(a)) for n in [label] + aliases) == 1
            ]
            if candidates and len(own) > 1:
                held = candidates[rng.integers(len(candidates))]
                aliases.remove(held)
                queries.append((held, len(names)))
            names.append([label] + aliases)
    return names, queries


def evaluate(search, queries: list[tuple[str, int]], k: int = 10) -> dict:
    ranks, seconds = [], 0.0
    for query, target in queries:
        start = time.perf_counter()
        rows = [row for row, _ in search(query, k)]
        seconds += time.perf_counter() - start
        ranks.append(rows.index(target) + 1 if target in rows else None)
    n = len(queries)
    return {
        "recall@1": sum(r == 1 for r in ranks) / n,
        "recall@10": sum(r is not None for r in ranks) / n,
        "mrr@10": sum(1 / r for r in ranks if r) / n,
        "ms/query": 1000 * seconds / n,
    }


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    names, queries = held_out_split(Path(args.items), args.seed)
    if args.limit:
        queries = [
            queries[i]
            for i in np.random.default_rng(args.seed).permutation(len(queries))[: args.limit]
        ]
    popularity = np.zeros(
        len(names), dtype=np.float32
    )  # no popularity: measure the text match alone
    print(
        f"{len(names)} properties, {sum(map(len, names))} indexed names, {len(queries)} held-out alias queries"
    )

    methods = {"prefix keywords": PrefixIndex.build(names, popularity).search}
    start = time.perf_counter()
    encoder = load_encoder(MINILM)
    embedding = EmbeddingIndex.build(names, popularity, encoder, MINILM)
    print(
        f"embedded {len(embedding.vectors)} names with {MINILM} in {time.perf_counter() - start:.0f} s"
    )
    methods[f"embedding ({MINILM})"] = embedding.search

    print(f"\n| method | recall@1 | recall@10 | MRR@10 | ms/query |\n|---|---|---|---|---|")
    for name, search in methods.items():
        m = evaluate(search, queries)
        print(
            f"| {name} | {m['recall@1']:.3f} | {m['recall@10']:.3f} | {m['mrr@10']:.3f} | {m['ms/query']:.1f} |"
        )
    examples = [q for q, _ in queries[:8]]
    print("\nexample queries:", "; ".join(examples))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--items",
        default=str(defaults.SHARED_DATA_DIR / "wikidata" / "items.jsonl"),
        help="items JSONL with Wikidata P ids",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        help="evaluate a random subset of this many queries (0: all)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="which alias is held out, and the subset"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the encoder")
    main(parser.parse_args())
