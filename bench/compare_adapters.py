"""How far a converted adapter (e.g. the bf16 copy we ship) is from its source: teacher-forced on demo
questions' gold queries after the skeleton prompt, the two adapters' next-token distributions are
compared at every answer position (same top-1 token? how much does the log-probability of the
source's top token move?).

    python bench/compare_adapters.py ~/.cache/grisp/runs/wwq-0.5b-l8/best adapters/grisp-wwq-0.5b
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import defaults  # noqa: E402
from common.jsonl import read_jsonl  # noqa: E402
from grisp import (
    peft_format,  # noqa: E402
)
from grisp.prompts import skeleton_messages  # noqa: E402
from llm.cpu_speed import cpu_name  # noqa: E402
from llm.tokenizer import Tokenizer, chat_prompt  # noqa: E402
from model import Transformer  # noqa: E402


@torch.no_grad()
def answer_logprobs(
    model_dir: Path, adapter: Path, tokenizer: Tokenizer, samples: list[dict]
) -> torch.Tensor:
    """log-softmax [positions, V] at every gold-query token of every sample, one sample at a time."""
    model = Transformer.from_pretrained(model_dir)
    peft_format.load_adapter(model, adapter)
    rows = []
    for sample in samples:
        prompt = tokenizer.encode(chat_prompt(skeleton_messages(sample["question"])))
        ids = torch.tensor([prompt + tokenizer.encode(sample["sparql"])])  # [1, T]
        at = torch.zeros_like(ids, dtype=torch.bool)
        at[0, len(prompt) - 1 : -1] = True  # the positions that predict the answer tokens
        rows.append(torch.log_softmax(model(ids, logits_at=at).float(), dim=-1))
    return torch.cat(rows)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    samples = read_jsonl(args.questions)[: args.limit]
    print(f"CPU {cpu_name()}, {args.threads} threads, float32")
    tokenizer = Tokenizer(args.model_dir)
    source = answer_logprobs(args.model_dir, args.source, tokenizer, samples)
    other = answer_logprobs(args.model_dir, args.other, tokenizer, samples)
    top = source.argmax(-1, keepdim=True)  # [N, 1] the source's top token per position
    moved = (source.gather(-1, top) - other.gather(-1, top)).abs()[:, 0]
    agree = int((other.argmax(-1, keepdim=True) == top).sum())
    print(
        f"{len(samples)} questions, {len(source)} answer positions: top-1 agree {agree}/{len(source)}; "
        f"|log-prob change| of the source's top token: max {float(moved.max()):.2e}, mean {float(moved.mean()):.2e}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Compare two adapters' next-token distributions on gold queries.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("source", type=Path, help="reference adapter directory (e.g. a run's float32 best/)")
    parser.add_argument("other", type=Path, help="adapter directory to compare (e.g. its bf16 copy)")
    parser.add_argument("--model-dir", type=Path, default=defaults.MODEL_DIR, help="base model directory")
    parser.add_argument(
        "--questions",
        type=Path,
        default=defaults.DEMO_DIR / "questions.jsonl",
        help="benchmark JSONL whose question/sparql pairs are teacher-forced",
    )
    parser.add_argument("--limit", type=int, default=10, help="questions to use")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    main(parser.parse_args())
