"""Decoding's attention: torch's F.scaled_dot_product_attention against model.one_query_attention.

A decoding step attends from one new query per row to the whole KV cache. For that shape torch's CPU
SDPA runs its flash kernel, which in bf16 costs several times more than the two plain float32 matmuls
of `one_query_attention` (what model.py uses when T == 1). For each dtype, batch (1 = one sequence,
8 = the beams) and cache length, both run on the same Qwen2.5-0.5B-shaped tensors (14 query heads,
2 key/value heads, head size 64; the keys and values are a slice of a longer cache buffer, as
model.KVCache hands them over), rounds alternating; prints the median microseconds per call, the
speed-up and each result's largest difference from a float64 reference.

    python bench/bench_attention.py
    python bench/bench_attention.py --dtypes bfloat16 --batches 8 --lengths 300 1000 --rounds 21
"""

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_matmul import seconds  # noqa: E402
from bench.flags import positive_int  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from llm.cpu_speed import cpu_name  # noqa: E402
from model import one_query_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 14, 2, 64, 24  # Qwen2.5-0.5B


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(
        f"{cpu_name()}, {args.threads} threads, median of {args.rounds} rounds, per call "
        f"(a decoding step makes {LAYERS}: one per block)\n"
    )
    print("| dtype | batch | cache | SDPA us | one_query_attention us | speed-up | SDPA error | ours error |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in [getattr(torch, name) for name in args.dtypes]:
        for batch in args.batches:
            for length in args.lengths:
                buffer = torch.randn(2, batch, KV_HEADS, length + 64, HEAD_DIM, dtype=dtype)
                k, v = buffer[0, :, :, :length], buffer[1, :, :, :length]  # views into a longer cache
                q = torch.randn(batch, HEADS, 1, HEAD_DIM, dtype=dtype)
                sdpa = functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=True)
                ours = functools.partial(one_query_attention, q, k, v, None)
                exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
                errors = [float((fn().double() - exact).abs().max()) for fn in (sdpa, ours)]
                times = {sdpa: [], ours: []}
                for r in range(args.rounds):
                    for fn in rotated((sdpa, ours), r):
                        times[fn].append(seconds(fn, args.repeats))
                a, b = statistics.median(times[sdpa]), statistics.median(times[ours])
                print(
                    f"| {str(dtype).removeprefix('torch.')} | {batch} | {length} | {1e6 * a:.0f} | {1e6 * b:.0f} "
                    f"| {a / b:.2f}x | {errors[0]:.1e} | {errors[1]:.1e} |"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Decoding attention: torch SDPA vs model.one_query_attention.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=["float32", "bfloat16"],
        help="tensor dtypes to time",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="rows (beams)")
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[300, 700], help="cached positions attended to"
    )
    parser.add_argument("--rounds", type=positive_int, default=11, help="timed rounds per form (median)")
    parser.add_argument("--repeats", type=positive_int, default=20, help="calls per timing")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    main(parser.parse_args())
