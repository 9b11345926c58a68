"""Training speed on agent conversations with their shared start run once (loss.SharedPrefix) against
running every conversation whole, on the same model, LoRA and batch.

A batch of `--batch` conversations from a tools/gen_agent_data.py file (the first ones of similar length),
all sharing the system instruction and tool definitions; one round = loss.backward_batch on it (forward
+ backward, no optimiser step), once with the shared start and once without (loss.MIN_SHARED_PREFIX
raised above every start). The rounds alternate which goes first so that load from other processes
hits both alike;
the table shows the median seconds per batch and the ratio whole / shared (> 1: the shared start is
faster). The gradients of the two are checked to agree first.

    python tools/gen_agent_data.py --data wwq --limit 16 --out /tmp/agent-16.jsonl
    python bench/bench_shared_start.py --data /tmp/agent-16.jsonl               # LoRA on the last 8 blocks
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lora  # noqa: E402
from bench.flags import positive_int  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from common import defaults  # noqa: E402
from common.jsonl import read_jsonl  # noqa: E402
from grisp import (
    loss,  # noqa: E402
)
from llm.cpu_speed import cpu_name  # noqa: E402
from llm.tokenizer import Tokenizer  # noqa: E402
from model import Transformer  # noqa: E402


def main(args):
    if not Path(args.data).is_file():
        sys.exit(
            f"error: no conversations file {args.data}; make one with tools/gen_agent_data.py (see the docstring)"
        )
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = Tokenizer(args.model_dir)
    encoded = [loss.encode(s, tokenizer) for s in read_jsonl(args.data)]
    encoded.sort(key=lambda s: len(s["ids"]))
    batch = encoded[len(encoded) // 2 :][: args.batch]  # middle lengths
    model = Transformer.from_pretrained(args.model_dir)
    lora.inject_lora(model, args.r, args.r, 0.0, layers=lora.last_layers(model, args.lora_layers))
    lora.mark_only_lora_trainable(model)
    for layer in lora.lora_layers(model).values():  # as after some training: B != 0
        torch.nn.init.normal_(layer.lora_B, std=0.01)
    model.train()
    start = loss.shared_start(batch)
    total = sum(loss.units(s, "reference") for s in batch)
    print(
        f"{len(batch)} conversations of {[len(s['ids']) for s in batch]} tokens; shared start {start} tokens; "
        f"CPU {cpu_name()}, {args.threads} threads, float32"
    )
    if not start:
        sys.exit("error: these conversations share no start long enough to run once")
    min_shared = loss.MIN_SHARED_PREFIX

    def run(shared: bool) -> tuple[float, list[torch.Tensor]]:
        loss.MIN_SHARED_PREFIX = min_shared if shared else 10**9
        model.zero_grad()
        begin = time.perf_counter()
        loss.backward_batch(
            model,
            batch,
            total,
            args.micro_batch,
            "reference",
            tokenizer.pad_id,
            "cpu",
            torch.autocast("cpu", enabled=False),
        )
        seconds = time.perf_counter() - begin
        return seconds, [p.grad.clone() for p in model.parameters() if p.requires_grad]

    _, shared_grads = run(True)  # also the warm-up
    _, whole_grads = run(False)
    worst = max(float((a - b).abs().max()) for a, b in zip(shared_grads, whole_grads))
    print(f"largest gradient difference, shared vs whole: {worst:.2e}")
    times = {True: [], False: []}
    for r in range(args.rounds):
        for shared in rotated((True, False), r):
            times[shared].append(run(shared)[0])
    shared_s, whole_s = statistics.median(times[True]), statistics.median(times[False])
    print("| run | s per batch (median of %d) |" % args.rounds)
    print("|---|---|")
    print(f"| shared start once (loss.SharedPrefix) | {shared_s:.1f} |")
    print(f"| every conversation whole | {whole_s:.1f} |")
    print(f"ratio whole / shared: {whole_s / shared_s:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--data", required=True, help="agent conversations from tools/gen_agent_data.py")
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument("--batch", type=int, default=4, help="conversations per batch")
    parser.add_argument("--micro-batch", type=int, default=4, help="conversations per forward pass")
    parser.add_argument("--lora-layers", type=int, default=8, help="LoRA on the last N blocks")
    parser.add_argument("--r", type=int, default=32, help="LoRA rank (alpha = r)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed rounds of each")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    main(parser.parse_args())
