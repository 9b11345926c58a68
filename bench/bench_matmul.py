"""Which matmul form is fastest for each shape of Qwen2.5-0.5B: nn.Linear or cpu_speed.SplitLinear.

For every linear layer shape of the model (out x in, with or without bias) and input row count (1 =
decoding one sequence, 8 = eight beams, 512 = a prefill), times the plain nn.Linear (F.linear) and a
cpu_speed.SplitLinear made from it (torch.bmm, or torch.baddbmm with a bias, over P views of the
weight's output slices; forced to split at every row count here) back to back, rounds alternating, and
prints the median microseconds and the speed-up of the split form. cpu_speed.SPLIT_MAX_ROWS (the row
count up to which SplitLinear splits) is read off this table.

    python bench/bench_matmul.py
    python bench/bench_matmul.py --rows 1 8 64 128 256 --rounds 9
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.flags import positive_int  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from llm.cpu_speed import SplitLinear, cpu_name  # noqa: E402

# (name, out features, in features, parts as prepare_for_inference splits them, bias as in Qwen2)
SHAPES = [
    ("q_proj", 896, 896, 2, True),
    ("o_proj", 896, 896, 2, False),
    ("k_proj / v_proj", 128, 896, 2, True),
    ("gate_proj / up_proj", 4864, 896, 2, False),
    ("down_proj", 896, 4864, 2, False),
    ("lm_head", 151936, 896, 8, False),
]


def seconds(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def random_linear(out: int, inp: int, bias: bool) -> nn.Linear:
    """An nn.Linear with standard normal weights (and bias), without the cost of its default init."""
    linear = nn.utils.skip_init(nn.Linear, inp, out, bias=bias)
    for p in linear.parameters():
        nn.init.normal_(p)
    return linear


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(f"{cpu_name()}, {args.threads} threads, float32, median of {args.rounds} rounds\n")
    print("| weight | rows | nn.Linear us | SplitLinear us | split speed-up |\n|---|---|---|---|---|")
    for name, out, inp, parts, bias in SHAPES:
        linear = random_linear(out, inp, bias)
        for rows in args.rows:
            if name == "lm_head" and rows > 8:
                continue  # logits are computed for few rows only (model.py logits_at)
            x = torch.randn(rows, inp)
            split = SplitLinear(
                linear, parts, max_rows=rows
            )  # splits these rows, whatever SPLIT_MAX_ROWS says
            repeats = max(1, int(2e8 / (2 * rows * out * inp)))  # ~0.1 s of work per timing
            forms = {"linear": lambda: linear(x), "split": lambda: split(x)}  # noqa: B023 (used in this iteration)
            torch.testing.assert_close(forms["split"](), forms["linear"](), atol=1e-3, rtol=1e-4)
            times = {form: [] for form in forms}
            for r in range(args.rounds):
                for form in rotated(forms, r):
                    times[form].append(seconds(forms[form], repeats))
            a, b = statistics.median(times["linear"]), statistics.median(times["split"])
            print(
                f"| {name} {out}x{inp}{' + bias' if bias else ''} | {rows} | {1e6 * a:.0f} | {1e6 * b:.0f} "
                f"| {a / b:.2f}x |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="nn.Linear vs cpu_speed.SplitLinear per weight shape and row count.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--rows", type=positive_int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512], help="input row counts"
    )
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds per form (median)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    main(parser.parse_args())
