"""How an adapter's re-ranker does on held-out re-ranking samples made from benchmark records (samples.py
with every augmentation off, k = 10): the gold item in search order, the lists shuffled, the entity named
by the question's words (--mention 1; only the samples whose wording changed), the gold item dropped.
Prints, per setting, the samples, top-1 correct, None on top, and for those with the gold item present how
often it is at A and above None (docs/results-mention.md).

    python tools/rerank_probe.py --adapter adapters/grisp-mix-0.5b --benchmark wwq-dev --limit 150
"""

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
from common import defaults  # noqa: E402
from grisp import (
    benchmarks,  # noqa: E402
)
from grisp.peft_format import load_for_inference, read_prompt_format  # noqa: E402
from grisp.prompts import IDENTIFIERS  # noqa: E402
from grisp.rerank import identifier_logits, identifier_token_ids  # noqa: E402
from grisp.samples import Augment, SampleGenerator  # noqa: E402
from llm.cpu_speed import pick_precision  # noqa: E402
from llm.tokenizer import Tokenizer, chat_prompt  # noqa: E402
from search import load_indices  # noqa: E402
from tools.matched_rerank_sets import marked  # noqa: E402

PLAIN = dict(vary_k=0, drop_infos=0, drop_gold=0, shuffle=0, alias=0, compose=0)
SETTINGS = {
    "search order": Augment(**PLAIN),
    "shuffled": Augment(**PLAIN | dict(shuffle=1)),
    "question wording": Augment(**PLAIN | dict(mention=1)),
    "gold dropped": Augment(**PLAIN | dict(drop_gold=1)),
}


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    records = benchmarks.load_benchmark(args.benchmark)
    random.Random(args.seed).shuffle(records)
    records = records[: args.limit]
    indices = load_indices(Path(args.index).expanduser())
    tokenizer = Tokenizer(args.model_dir)
    precision, why = pick_precision(args.precision, torch.device("cpu"))
    print(f"precision {precision} ({why})")
    model = load_for_inference(args.model_dir, args.adapter, precision, "cpu")
    token_of = dict(zip(IDENTIFIERS, identifier_token_ids(tokenizer, IDENTIFIERS)))
    prompt_format = read_prompt_format(args.adapter)
    plain = {}  # record id -> the placeholder marked in search order
    for name, augment in SETTINGS.items():
        generator = SampleGenerator(records, indices, augment, seed=args.seed, prompt_format=prompt_format)
        counts = Counter()
        for sample in (s for s in generator.epoch(0)[0] if s["task"] == "rerank"):
            if name == "search order":
                plain[sample["id"]] = marked(sample)
            elif name == "question wording" and plain.get(sample["id"]) == marked(sample):
                continue  # the question names it as the index does: the search-order sample again
            with torch.inference_mode():
                logits = model(
                    torch.tensor([tokenizer.encode(chat_prompt(sample["messages"]))]), logits_at=-1
                )[0]
            ids = torch.tensor([[token_of[i] for i in sample["identifiers"]]])
            scores = identifier_logits(logits.float()[None], ids)[0]
            top, none = sample["identifiers"][int(scores.argmax())], sample["identifiers"][-1]
            counts["samples"] += 1
            counts["correct"] += top == sample["target"]
            counts["None on top"] += top == none
            if sample["target"] != none:
                counts["gold present"] += 1
                counts["gold at A"] += sample["target"] == "A"
                counts["gold above None"] += bool(
                    scores[sample["identifiers"].index(sample["target"])] > scores[-1]
                )
        print(f"{name}: " + ", ".join(f"{key} {value}" for key, value in counts.items()), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--adapter", default=str(defaults.ADAPTER_DIR), help="the adapter whose re-ranker is probed"
    )
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument(
        "--benchmark", default="wwq-dev", help="records to make samples from (benchmarks.py name or path)"
    )
    parser.add_argument(
        "--index",
        default=str(defaults.GRISP_HOME / "indices" / "wikidata-items"),
        help="search index the samples' lists come from",
    )
    parser.add_argument("--limit", type=int, default=150, help="records (a seeded random choice)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the record choice and the samples")
    parser.add_argument("--precision", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    try:
        main(parser.parse_args())
    except (FileNotFoundError, ValueError) as error:  # a benchmark, index or model that is not there
        sys.exit(f"error: {error}")
