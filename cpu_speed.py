"""CPU inference speed-up for model.py's Transformer: split matmuls (engineering, not the method).

GRISP runs its model many times per question (beam search over skeletons, then re-ranking search
results for each placeholder, paper Sec. 3). On a CPU, decoding multiplies a few rows by each weight
matrix. `prepare_for_inference(model)` replaces each plain nn.Linear of the blocks (and an untied
lm_head) by a `SplitLinear`: the same math, with the weight stored as P slices of the output features
and applied with one torch.bmm, so that both cores work on such few-row matmuls. It is kept apart from
model.py the way gpt-fast keeps quantize.py beside its model: model.py stays the plain forward pass,
this file is the optional lever (docs/cpu_speed.md lever 1.2: what it gains, measured).

    from cpu_speed import prepare_for_inference
    model = prepare_for_inference(Transformer.from_pretrained(model_dir))  # eval, no grad, split matmuls
Measure the lever (it is CPU- and load-dependent) with
    python bench/bench_model.py --impls ours ours-plain transformers
Tests: python -m pytest tests/test_cpu_speed.py
"""
import torch
from torch import nn

from model import Transformer

# the linear layers of a Qwen2 block, by module name below `model.layers.<i>.`
BLOCK_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class SplitLinear(nn.Module):
    """Inference-only stand-in for a plain nn.Linear, made by `prepare_for_inference(model)`.

    Same math as F.linear, but the weight is stored transposed in `parts` slices of the output features,
    [P, in, out/P], and applied with one torch.bmm: on CPU, few-row matmuls (decoding) then keep both
    cores busy. The conversion reuses the nn.Linear's memory, one slice at a time (scratch: 1/P of the
    weight), so that Linear must not be used afterwards."""

    def __init__(self, linear: nn.Linear, parts: int = 2):
        super().__init__()
        out_features, in_features = linear.weight.shape
        assert out_features % parts == 0, f"{out_features} outputs do not split into {parts} parts"
        w = linear.weight.detach()  # [out, in]
        assert w.is_contiguous(), "SplitLinear converts a contiguous weight in place"
        slices = w.view(parts, out_features // parts, in_features)  # [P, out/P, in]
        for p, flat in enumerate(w.view(parts, -1)):  # flat: the memory of slice p
            flat.copy_(slices[p].t().reshape(-1))  # reshape copies the transposed slice out first
        self.register_buffer("weight_t", w.view(parts, in_features, out_features // parts))  # [P, in, out/P]
        bias = None if linear.bias is None else linear.bias.detach().view(parts, 1, out_features // parts)
        self.register_buffer("bias", bias)  # [P, 1, out/P] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, C = x.shape
        P = self.weight_t.shape[0]
        xp = x.reshape(1, -1, C).expand(P, -1, C)  # [P, M, in], M = all leading dims
        y = torch.bmm(xp, self.weight_t) if self.bias is None else torch.baddbmm(self.bias, xp, self.weight_t)
        return y.transpose(0, 1).reshape(*lead, -1)  # [P, M, out/P] -> [..., out]


def prepare_for_inference(model: Transformer, split_matmuls: bool = True) -> Transformer:
    """Switch `model` to inference: eval mode, no gradients, and (split_matmuls) each plain nn.Linear of
    the blocks (and an untied lm_head) becomes a SplitLinear, its weight converted in place (exact up to
    float rounding). Layers that are not plain nn.Linear (e.g. wrapped by lora.py) stay as they are, so
    merge LoRA first. Afterwards the model cannot be trained or saved in the Hugging Face layout.
    Returns the same model."""
    if split_matmuls:
        slots = [(f"model.layers.{i}.{name}", 2) for i in range(model.args.num_hidden_layers) for name in BLOCK_LINEARS]
        if not model.args.tie_word_embeddings:  # a tied lm_head would overwrite the embedding
            # 8 parts where the vocabulary allows: converting the biggest matrix needs 1/8 of it as scratch
            slots.append(("lm_head", next(p for p in (8, 4, 2, 1) if model.args.vocab_size % p == 0)))
        for name, parts in slots:
            parent, _, child = name.rpartition(".")
            if type(model.get_submodule(name)) is nn.Linear:
                setattr(model.get_submodule(parent) if parent else model, child,
                        SplitLinear(model.get_submodule(name), parts))
    return model.eval().requires_grad_(False)
