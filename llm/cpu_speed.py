"""CPU inference speed-ups for model.py's Transformer (engineering, not the method).

GRISP runs its model many times per question (beam search over skeletons, then re-ranking search
results for each placeholder, paper Sec. 3). `prepare_for_inference(model)` switches the model to
inference and applies the levers measured on 2-core CPUs (docs/cpu_speed.md, section 1):
- split matmuls (exact, default, not over bf16 weights): each plain nn.Linear of the blocks and the lm_head
  becomes a `SplitLinear`. A plain F.linear with a few input rows (decoding) keeps one core busy here;
  SplitLinear multiplies such inputs by P slices of the weight's output features with one torch.bmm,
  which keeps both busy, and hands many rows (prefill) to F.linear, which is fastest there. The
  slices are views of the same weight, so the conversion costs no time and no memory.
- dynamic int8 (lossy, opt-in, `int8=True`): torch's dynamically quantised int8 matmul for every
  linear layer of the blocks except `down_proj` (the fragile one), and for the lm_head.
- precision (`native_bf16`; `pick_dtype` for training, `pick_precision` for inference): bfloat16 where
  the CPU computes it natively (AMD Zen 4 and newer, Intel Cooper Lake and newer: the `avx512_bf16` or
  `amx_bf16` flag; Arm's `bf16`), float32 elsewhere, where bf16 is emulated and several times slower
  (docs/cpu_speed.md). Training and inference decide with the same detection.
It is kept apart from model.py the way gpt-fast keeps quantize.py beside its model: model.py stays the
plain forward pass, this file holds the optional levers.

    from llm.cpu_speed import prepare_for_inference
    model = prepare_for_inference(Transformer.from_pretrained(model_dir))  # eval, no grad, split matmuls
Measure the levers (they are CPU- and load-dependent) with
    python bench/bench_model.py --impls ours ours-plain ours-int8 transformers
Tests: python -m pytest tests/test_cpu_speed.py
"""

import functools
import platform
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model import Transformer

# the linear layers of a Qwen2 block, by module name below `model.layers.<i>.`
BLOCK_LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
INT8_SKIP = ("mlp.down_proj",)  # int8 here changes greedy output on 19 of 20 prompts (docs/cpu_speed.md 1.5)
# inputs of at most this many rows take the split bmm, more rows F.linear: bench/bench_matmul.py measures
# both forms per shape (split wins clearly up to 64-128 rows, they tie from ~256 rows on)
SPLIT_MAX_ROWS = 128
# /proc/cpuinfo flags of native bf16 arithmetic: x86 AVX512-BF16 and AMX-BF16, Arm's BF16 extension
NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}
# inference precisions (pick_precision); the last two are opt-in and CPU-only, as CPU_ONLY_PRECISIONS says
PRECISIONS = ("auto", "float32", "bfloat16", "int8", "fp16-weights")
# what each CPU-only precision computes, for pick_precision's answer (int8 lossy: 1.4; fp16-weights: 1.8)
CPU_ONLY_PRECISIONS = {
    "int8": "float32 weights, dynamic int8 matmuls except down_proj",
    "fp16-weights": "float32 activations, fp16 weights for few-row matmuls (fbgemm)",
}


@functools.cache
def proc_cpuinfo() -> str:
    """/proc/cpuinfo's text, read once per process ("" where there is none)."""
    path = Path("/proc/cpuinfo")
    return path.read_text() if path.is_file() else ""


def cpuinfo_field(keys: tuple[str, ...], cpuinfo: str | None = None) -> str | None:
    """The first value of one of `keys` in /proc/cpuinfo (or the text `cpuinfo`); None where absent."""
    for line in (proc_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (x86 "flags", Arm "Features"); empty where unreadable."""
    return set((cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name, to say which machine ran a measurement."""
    return cpuinfo_field(("model name",), cpuinfo) or platform.processor() or platform.machine()


def native_bf16(flags: set[str] | None = None) -> bool:
    """Does this CPU compute bfloat16 natively? Read from the CPU's flags, not timed: a calibration matmul
    on a shared, noisy 2-core machine can flip, the flags cannot (no flags readable: False)."""
    return bool((cpu_flags() if flags is None else flags) & NATIVE_BF16_FLAGS)


def has_fbgemm() -> bool:
    """Does this torch have fbgemm, the x86 kernels of HalfWeightLinear's fp16 matmul?"""
    return "fbgemm" in torch.backends.quantized.supported_engines


def pick_dtype(choice: str, device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, why) for `choice` "auto", "float32" or "bfloat16": auto is bfloat16 on a GPU of compute
    capability 8.0 or newer (Ampere: native bf16 matmuls) and on a CPU with native bf16, float32 on older
    GPUs, other CPUs and mps."""
    if choice != "auto":
        return getattr(torch, choice), f"{choice} as asked"
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability >= (8, 0):
            return torch.bfloat16, "auto: bfloat16 on a GPU with native bf16"
        return (
            torch.float32,
            f"auto: float32, a GPU of compute capability {capability[0]}.{capability[1]} has no native bf16",
        )
    if device.type == "cpu" and native_bf16():
        return torch.bfloat16, f"auto: bfloat16, the CPU has native bf16 ({cpu_name()})"
    return (
        torch.float32,
        f"auto: float32, no native bf16 on {cpu_name() if device.type == 'cpu' else device.type}",
    )


def pick_precision(choice: str, device: torch.device) -> tuple[str, str]:
    """(precision, why) of inference for `choice` in PRECISIONS: "auto", "float32" and "bfloat16" as
    pick_dtype decides them (the same detection as training), "int8" and "fp16-weights" as asked."""
    if choice not in PRECISIONS:
        raise ValueError(f"precision {choice!r}: must be one of {', '.join(PRECISIONS)}")
    if choice in CPU_ONLY_PRECISIONS:
        if device.type != "cpu":  # torch's dynamic int8 and fp16-weight Linear run on a CPU only
            raise ValueError(
                f"precision {choice} runs on a CPU only, not on {device.type}; use auto, float32 or bfloat16"
            )
        if choice == "fp16-weights" and not has_fbgemm():
            raise ValueError("precision fp16-weights needs torch's fbgemm (x86 CPUs); use auto or float32")
        return choice, f"{choice} as asked ({CPU_ONLY_PRECISIONS[choice]})"
    dtype, why = pick_dtype(choice, device)
    return str(dtype).removeprefix("torch."), why


class SplitLinear(nn.Module):
    """Inference-only stand-in for a plain nn.Linear, made by `prepare_for_inference(model)`.

    Same math as F.linear. Inputs of up to `max_rows` rows (all leading dims together) are multiplied by
    `parts` slices of the output features, [P, out/P, in] views of the weight, in one torch.bmm, so that
    on a CPU both cores work on few-row matmuls (decoding); more rows take F.linear. The weight and bias
    are the nn.Linear's own tensors (no copy), so a tied lm_head may be split too."""

    def __init__(self, linear: nn.Linear, parts: int = 2, max_rows: int = SPLIT_MAX_ROWS):
        super().__init__()
        out_features, in_features = linear.weight.shape
        assert out_features % parts == 0, f"{out_features} outputs do not split into {parts} parts"
        self.parts, self.max_rows = parts, max_rows
        self.register_buffer("weight", linear.weight.detach())  # [out, in]
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())  # [out] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, C = x.shape
        M = x.numel() // C
        if M > self.max_rows:
            return F.linear(x, self.weight, self.bias)
        P, out = self.parts, self.weight.shape[0]
        w = self.weight.view(P, out // P, C).transpose(1, 2)  # [P, in, out/P], a view
        xp = x.reshape(1, M, C).expand(P, M, C)  # [P, M, in]
        if self.bias is None:
            y = torch.bmm(xp, w)
        else:
            y = torch.baddbmm(self.bias.view(P, 1, out // P), xp, w)  # [P, M, out/P]
        return y.transpose(0, 1).reshape(*lead, out)


class HalfWeightLinear(nn.Module):
    """Inference-only stand-in for a float32 nn.Linear that multiplies few-row inputs by an fp16 copy of
    its weight: torch's fbgemm fp16 matmul (x86) stores the weight in fp16 and converts it to float32
    in registers, so decoding reads half of float32's bytes; activations and sums stay float32, and
    fp16 keeps 11 significant bits of each weight (bf16: 8). Inputs of more than `max_rows` rows (a
    prefill) take F.linear over the float32 weight, which is kept (1.5x the weights' memory). A
    candidate for CPUs without native bf16 (docs/cpu_speed.md 1.8). Made by
    `prepare_for_inference(model, fp16_weights=True)`."""

    def __init__(self, linear: nn.Linear, max_rows: int = SPLIT_MAX_ROWS):
        super().__init__()
        self.register_buffer("weight", linear.weight.detach())  # [out, in], float32
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        self.packed = torch.ops.quantized.linear_prepack_fp16(self.weight, self.bias)
        self.max_rows = max_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, C = x.shape
        if x.numel() // C > self.max_rows:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, C), self.packed).view(*lead, -1)


def quantize_int8(linear: nn.Linear) -> nn.Module:
    """torch's dynamic int8 linear layer for `linear`: int8 weights (per output channel), activations
    quantised per call. Lossy (docs/cpu_speed.md 1.4)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    from torch.ao.quantization import per_channel_dynamic_qconfig

    linear.qconfig = per_channel_dynamic_qconfig
    with warnings.catch_warnings():  # torch announces that its quantised tensors will move to torchao
        warnings.simplefilter("ignore")
        return DynamicInt8Linear.from_float(linear)


def prepare_for_inference(
    model: Transformer,
    split_matmuls: bool = True,
    int8: bool = False,
    fp16_weights: bool = False,
) -> Transformer:
    """Switch `model` to inference: eval mode, no gradients, and the CPU levers of this file.

    split_matmuls: each plain nn.Linear of the blocks and the lm_head becomes a SplitLinear (exact up to
        float rounding; free: the weights are not copied), except over bf16 weights: there F.linear
        keeps both cores busy and the split bmm is slower (docs/cpu_speed.md 1.6).
    int8: every plain nn.Linear of the blocks except down_proj, and the lm_head, become dynamic int8
        layers (lossy; down_proj still splits). A tied lm_head stays float (it is the embedding).
    fp16_weights: every float32 nn.Linear of the blocks and the lm_head becomes a HalfWeightLinear (fp16
        weights for few rows, the float32 weight for many; a tied lm_head keeps the embedding's float rows
        for model.vocab_logits).
    Layers that are not plain nn.Linear (e.g. wrapped by lora.py) stay as they are, so merge LoRA first.
    Afterwards the model cannot be trained. Returns the same model."""
    slots = [
        f"model.layers.{i}.{name}" for i in range(model.args.num_hidden_layers) for name in BLOCK_LINEARS
    ]
    slots.append("lm_head")
    # the lm_head in 8 parts where the vocabulary allows: the biggest matrix, decoded at few rows
    lm_parts = next(p for p in (8, 4, 2, 1) if model.args.vocab_size % p == 0)
    for name in slots:
        module = model.get_submodule(name)
        if type(module) is not nn.Linear:
            continue
        tied = name == "lm_head" and model.args.tie_word_embeddings
        if fp16_weights and module.weight.dtype == torch.float32:  # every layer, the lm_head too
            replacement = HalfWeightLinear(module)
        elif int8 and not tied and not name.endswith(INT8_SKIP):
            replacement = quantize_int8(module)
        elif split_matmuls and module.weight.dtype != torch.bfloat16:  # bf16: F.linear is faster (see above)
            replacement = SplitLinear(module, lm_parts if name == "lm_head" else 2)
        else:
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, replacement)
    return model.eval().requires_grad_(False)
