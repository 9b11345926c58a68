"""Property search quality: held-out aliases of Wikidata properties, prefix index vs embedding index.

For every property in the items file that has an alias, one alias is held out (not indexed) and used
as the query; a search succeeds if it returns that property. This is the situation of GRISP's
resolver, whose placeholders are labels or aliases the model learned, phrased in ways the index may
not hold (docs/method.md section 5.3: keywords miss "born in" -> "place of birth"). Printed: recall@1,
recall@10, MRR@10 and mean query time per method; this is the measurement behind the encoder choice.

    python bench/eval_property_search.py                         # items: defaults.SHARED_DATA_DIR/wikidata/items.jsonl
    python bench/eval_property_search.py --subset 500 --qwen   # adds our Qwen model as encoder
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's modules
from bench.flags import positive_int  # noqa: E402
from common import defaults  # noqa: E402
from common.jsonl import iter_jsonl  # noqa: E402
from llm.cpu_speed import cpu_name  # noqa: E402
from llm.encoder import MINILM, load_encoder  # noqa: E402
from search import EmbeddingIndex, PrefixIndex, normalize  # noqa: E402


def held_out_split(items_file: Path, seed: int) -> tuple[list[list[str]], list[tuple[str, int]]]:
    """Names per property with one alias removed, and (held-out alias, property row) queries."""
    rng = np.random.default_rng(seed)
    names, queries = [], []
    for _, item in iter_jsonl(items_file):
        if not item["id"].startswith("P"):
            continue
        label, aliases = item["label"], list(dict.fromkeys(item.get("aliases") or []))
        keys = [tuple(normalize(name)) for name in [label] + aliases]
        # hold out an alias whose normalised text no other name of the property has
        candidates = [a for a, key in zip(aliases, keys[1:]) if keys.count(key) == 1]
        if candidates:
            held = candidates[rng.integers(len(candidates))]
            aliases.remove(held)
            queries.append((held, len(names)))
        names.append([label] + aliases)
    return names, queries


class QwenLastToken:
    """Text encoder from our Qwen model (model.py): the final-norm hidden state of the last token of
    an instruction prompt ("... means in one word: \"", as in PromptEOL), L2-normalised later."""

    PROMPT = 'This knowledge graph property: "{}" means in one word: "'

    def __init__(self, model_dir: Path, batch_size: int = 16):
        from llm.tokenizer import Tokenizer
        from model import Transformer

        self.model, self.tokenizer = Transformer.from_pretrained(model_dir), Tokenizer(model_dir)
        self.batch_size, self.last = batch_size, None
        # with logits_at=-1 the final norm sees only the last position: [B, C]
        self.model.model.norm.register_forward_hook(
            lambda module, inputs, output: setattr(self, "last", output)
        )

    @torch.inference_mode()
    def __call__(self, texts: list[str]) -> np.ndarray:
        ids = [self.tokenizer.encode(self.PROMPT.format(text)) for text in texts]
        out = np.zeros((len(texts), self.model.args.hidden_size), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            T = max(len(ids[i]) for i in batch)
            # left padding, so position -1 is every row's last real token
            tokens = torch.tensor([[self.tokenizer.pad_id] * (T - len(ids[i])) + ids[i] for i in batch])
            mask = torch.tensor([[0] * (T - len(ids[i])) + [1] * len(ids[i]) for i in batch])
            self.model(tokens, mask, logits_at=-1)
            out[batch] = self.last.float().numpy()
        return out


class Cached:
    """An encoder that embeds known texts in batches up front (queries one by one are slow)."""

    def __init__(self, encoder, texts: list[str]):
        self.encoder, self.texts = encoder, list(dict.fromkeys(texts))
        self.rows = {text: i for i, text in enumerate(self.texts)}
        self.vectors = encoder(self.texts)

    def __call__(self, texts: list[str]) -> np.ndarray:
        if all(text in self.rows for text in texts):
            return self.vectors[[self.rows[text] for text in texts]]
        return self.encoder(texts)


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
    if not Path(args.items).is_file():
        sys.exit(
            f"error: items file {args.items} does not exist; pass an items JSONL with Wikidata P ids (--items)"
        )
    torch.set_num_threads(args.threads)
    names, queries = held_out_split(Path(args.items), args.seed)
    if args.subset:  # a random subset of the properties: only their names and aliases take part
        keep = np.sort(np.random.default_rng(args.seed).permutation(len(names))[: args.subset])
        new_row = {int(old): new for new, old in enumerate(keep)}
        names = [names[i] for i in keep]
        queries = [(query, new_row[row]) for query, row in queries if row in new_row]
    popularity = np.zeros(len(names), dtype=np.float32)  # no popularity: the text match alone
    n_names = sum(map(len, names))
    print(
        f"{len(names)} properties, {n_names} indexed names, {len(queries)} held-out alias queries; "
        f"CPU {cpu_name()}, {args.threads} threads"
    )

    # --- the indices: keywords, and embeddings of every name by each encoder
    methods = {"prefix keywords": PrefixIndex.build(names, popularity).search}
    encoders = {MINILM: lambda: load_encoder(MINILM)}
    if args.qwen:
        encoders["Qwen2.5 0.5B last token"] = lambda: QwenLastToken(Path(args.model_dir))
    latency = {}
    for name, make_encoder in encoders.items():
        start = time.perf_counter()
        encoder = make_encoder()
        index = EmbeddingIndex.build(names, popularity, encoder, name)
        print(f"embedded {n_names} names with {name} in {time.perf_counter() - start:.0f} s")
        single = [query for query, _ in queries[:20]]
        start = time.perf_counter()
        for query in single:  # one query at a time, as the resolver asks
            encoder([query])
        latency[f"embedding ({name})"] = 1000 * (time.perf_counter() - start) / len(single)
        index.encoder = Cached(encoder, [query for query, _ in queries])
        methods[f"embedding ({name})"] = index.search

    # --- held-out alias queries
    print("\n| method | recall@1 | recall@10 | MRR@10 | ms/query: search (+ embed the query) |")
    print("|---|---|---|---|---|")
    for name, search in methods.items():
        m = evaluate(search, queries)
        ms = f"{m['ms/query']:.1f}" + (f" (+ {latency[name]:.0f})" if name in latency else "")
        print(f"| {name} | {m['recall@1']:.3f} | {m['recall@10']:.3f} | {m['mrr@10']:.3f} | {ms} |")
    print("\nexample queries:", "; ".join(query for query, _ in queries[:8]))


if __name__ == "__main__":
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=formatter)
    default_items = defaults.SHARED_DATA_DIR / "wikidata" / "items.jsonl"
    parser.add_argument("--items", default=str(default_items), help="items JSONL with Wikidata P ids")
    parser.add_argument("--subset", type=int, default=0, help="a random subset of N properties (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="which alias is held out; the subset")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads of the encoders")
    parser.add_argument("--qwen", action="store_true", help="also our Qwen model as an encoder")
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="Qwen model (--qwen)")
    main(parser.parse_args())
