"""Which matmul form is fastest for each shape of Qwen2.5-0.5B: F.linear or cpu_speed.SplitLinear's bmm.

For every weight shape of the model (out x in) and input row count (1 = decoding one sequence, 8 = eight
beams, 512 = a prefill), times F.linear(x, W) and the split form (torch.bmm over P views of the
weight's output slices) back to back, rounds alternating, and prints the median microseconds and the
speed-up of the split form. cpu_speed.SPLIT_MAX_ROWS (the row count up to which SplitLinear splits) is
read off this table.

    python bench/bench_matmul.py
    python bench/bench_matmul.py --rows 1 8 64 128 256 --rounds 9
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

# (name, out features, in features, parts as prepare_for_inference splits them)
SHAPES = [("q_proj / o_proj", 896, 896, 2), ("k_proj / v_proj", 128, 896, 2), ("gate_proj / up_proj", 4864, 896, 2),
          ("down_proj", 896, 4864, 2), ("lm_head", 151936, 896, 8)]


def split_matmul(x: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    out, C = weight.shape
    w = weight.view(parts, out // parts, C).transpose(1, 2)  # [P, in, out/P]
    return torch.bmm(x.expand(parts, *x.shape), w).transpose(0, 1).reshape(x.shape[0], out)


def seconds(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(f"{args.threads} threads, float32, median of {args.rounds} rounds\n")
    print("| weight | rows | F.linear us | split us | split speed-up |\n|---|---|---|---|---|")
    for name, out, inp, parts in SHAPES:
        weight = torch.randn(out, inp)
        for rows in args.rows:
            if name == "lm_head" and rows > 8:
                continue  # logits are computed for few rows only (model.py logits_at)
            x = torch.randn(rows, inp)
            repeats = max(1, int(2e8 / (2 * rows * out * inp)))  # ~0.1 s of work per timing
            linear, split = (lambda: F.linear(x, weight)), (lambda: split_matmul(x, weight, parts))
            torch.testing.assert_close(split(), linear(), atol=1e-3, rtol=1e-4)
            times = {"linear": [], "split": []}
            for r in range(args.rounds):
                for form in (("linear", "split") if r % 2 == 0 else ("split", "linear")):
                    times[form].append(seconds(linear if form == "linear" else split, repeats))
            a, b = statistics.median(times["linear"]), statistics.median(times["split"])
            print(f"| {name} {out}x{inp} | {rows} | {1e6 * a:.0f} | {1e6 * b:.0f} | {a / b:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="F.linear vs split bmm per weight shape and row count.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512], help="input row counts")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per form (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    main(parser.parse_args())
