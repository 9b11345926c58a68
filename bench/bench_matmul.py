"""Which matmul form is fastest for each shape of Qwen2.5-0.5B, and what the lossy ones cost in accuracy.

For every linear layer shape of the model (out x in, with or without bias) and input row count (1 =
decoding one sequence, 8 = eight beams, 512 = a prefill), times the forms of FORMS back to back, rounds
alternating, and prints each one's median microseconds with its speed-up over the plain float32
nn.Linear, then each form's error against it (relative RMS of the outputs over random inputs).
cpu_speed.SPLIT_MAX_ROWS (the row count up to which SplitLinear splits) is read off this table; the
int8 and fp16 forms are the candidates for CPUs without native bf16 (docs/cpu_speed.md 1.8).

    python bench/bench_matmul.py
    python bench/bench_matmul.py --rows 1 8 64 128 256 --rounds 9 --forms linear split
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.flags import positive_int  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from llm.cpu_speed import HalfWeightLinear, SplitLinear, cpu_name, quantize_int8  # noqa: E402

# (name, out features, in features, parts as prepare_for_inference splits them, bias as in Qwen2)
SHAPES = [
    ("q_proj", 896, 896, 2, True),
    ("o_proj", 896, 896, 2, False),
    ("k_proj / v_proj", 128, 896, 2, True),
    ("gate_proj / up_proj", 4864, 896, 2, False),
    ("down_proj", 896, 4864, 2, False),
    ("lm_head", 151936, 896, 8, False),
]


def int8_weight(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """`linear`'s weight in int8 with a float32 scale per output channel (its largest magnitude / 127)."""
    w = linear.weight.detach()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # [out]
    return torch.round(w / scale[:, None]).to(torch.int8), scale


def int8_weight_only(linear: nn.Linear, dequantise: bool):
    """Weight-only int8 (activations and sums float32, as gpt-fast's int8 mode): torch's kernel
    torch._weight_int8pack_mm, or the weight dequantised to float32 per call and F.linear."""
    w8, scale = int8_weight(linear)
    if dequantise:
        return lambda x: F.linear(x, w8.float() * scale[:, None], linear.bias)
    bias = 0 if linear.bias is None else linear.bias
    return lambda x: torch._weight_int8pack_mm(x, w8, scale) + bias


def int8_rows(linear: nn.Linear):
    """int8 weights (a scale per output channel) times int8 activations (a scale per input row), int32
    sums (torch._int_mm), both scales applied after."""
    w8, scale = int8_weight(linear)
    bias = 0 if linear.bias is None else linear.bias

    def forward(x):
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        x8 = torch.round(x / x_scale).to(torch.int8)
        return torch._int_mm(x8, w8.t()).float() * x_scale * scale + bias

    return forward


# name -> (what it is, make(linear, parts, rows) -> callable on [rows, in])
FORMS = {
    "linear": ("nn.Linear, float32 (F.linear)", lambda linear, parts, rows: linear),
    "split": (
        "cpu_speed.SplitLinear (P output slices in one bmm; forced to split at every row count here)",
        lambda linear, parts, rows: SplitLinear(linear, parts, max_rows=rows),
    ),
    "int8": (
        "weight-only int8, torch._weight_int8pack_mm",
        lambda linear, parts, rows: int8_weight_only(linear, dequantise=False),
    ),
    "int8-dequant": (
        "weight-only int8 dequantised to float32 per call, then F.linear",
        lambda linear, parts, rows: int8_weight_only(linear, dequantise=True),
    ),
    "fp16": (
        "fp16 weights, float32 activations (fbgemm; cpu_speed.HalfWeightLinear forced to its fp16 form)",
        lambda linear, parts, rows: HalfWeightLinear(linear, max_rows=rows),
    ),
    "dynamic-int8": (
        "torch's dynamic int8 Linear: activations quantised per call, one scale per tensor (lever 1.4)",
        lambda linear, parts, rows: quantize_int8(linear),
    ),
    "int8-rows": (
        "int8 weights and int8 activations with a scale per row, torch._int_mm",
        lambda linear, parts, rows: int8_rows(linear),
    ),
}


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
    forms = ["linear"] + [f for f in args.forms if f != "linear"]
    print(f"{cpu_name()}, {args.threads} threads, median of {args.rounds} rounds; forms:")
    for form in forms:
        print(f"- {form}: {FORMS[form][0]}")
    print(f"\n| weight | rows | {' | '.join(forms)} |\n|---|---|{'---|' * len(forms)}")
    errors = {}
    for name, out, inp, parts, bias in SHAPES:
        linear = random_linear(out, inp, bias)
        for rows in args.rows:
            if name == "lm_head" and rows > 8:
                continue  # logits are computed for few rows only (model.py logits_at)
            x = torch.randn(rows, inp)
            layers = {form: FORMS[form][1](linear, parts, rows) for form in forms}
            exact = linear(x)
            errors[name] = {f: rms(layers[f](x) - exact) / rms(exact) for f in forms[1:]}
            repeats = max(1, int(2e8 / (2 * rows * out * inp)))  # ~0.1 s of work per timing
            times = {form: [] for form in forms}
            for r in range(args.rounds):
                for form in rotated(forms, r):
                    times[form].append(seconds(lambda: layers[form](x), repeats))  # noqa: B023 (called at once)
            medians = {form: statistics.median(times[form]) for form in forms}
            cells = [f"{1e6 * medians['linear']:.0f} us"]
            cells += [f"{1e6 * medians[f]:.0f} us ({medians['linear'] / medians[f]:.2f}x)" for f in forms[1:]]
            print(f"| {name} {out}x{inp}{' + bias' if bias else ''} | {rows} | {' | '.join(cells)} |")
    print(f"\nrelative RMS error against linear (last row count)\n\n| weight | {' | '.join(forms[1:])} |")
    print(f"|---|{'---|' * (len(forms) - 1)}")
    for name, by_form in errors.items():
        print(f"| {name} | {' | '.join(f'{by_form[f]:.1e}' for f in forms[1:])} |")


def rms(t: torch.Tensor) -> float:
    return t.float().pow(2).mean().sqrt().item()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Matmul forms (float32, split, int8, fp16) per weight shape and row count: speed and error.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--rows", type=positive_int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512], help="input row counts"
    )
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds per form (median)")
    parser.add_argument(
        "--forms", nargs="+", choices=list(FORMS), default=list(FORMS), help="forms to time beside linear"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    main(parser.parse_args())
