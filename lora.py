"""LoRA: low-rank adapters on the linear layers of a frozen model (the idea, as in loralib).

GRISP fine-tunes Qwen2.5 with LoRA (Hu et al., 2022), r=32, alpha=32, on all linear layers of the
transformer blocks (paper, training setup; docs/method.md section 4.2). A frozen linear layer W gets a
trainable low-rank update:  y = W x + (alpha / r) * B A dropout(x),  with A [r, in] and B [out, r].
B starts at zero, so step 0 is exactly the base model.

The library works on any nn.Module by module names (our model.py and transformers'
Qwen2ForCausalLM use the same names) and selects layers by PEFT's matching rules. Adapter files in
Hugging Face PEFT's layout (save, load, convert) are peft_format.py.

Usage (see train.py / peft_format.py):
    inject_lora(model, r=32, alpha=32, layers=last_layers(model, 8))  # layers=None: all blocks
    mark_only_lora_trainable(model)
    ... train ...
    lora_state_dict(model)  # only lora_A / lora_B, by our parameter names
    merge_lora(model); unload_lora(model)  # inference at base speed: plain nn.Linear layers again
Tests: python -m pytest tests/test_lora.py
"""

import math
import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# The linear layers of a Qwen2 block: attention and SwiGLU MLP projections.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """An `nn.Linear` (`base_layer`, PEFT's name; frozen by mark_only_lora_trainable) plus a
    low-rank update `lora_B @ lora_A`."""

    def __init__(self, base_layer: nn.Linear, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        assert type(base_layer) is nn.Linear, f"LoRALinear wraps nn.Linear, got {type(base_layer).__name__}"
        assert r > 0, f"LoRA rank must be positive, got r={r}"
        self.base_layer = base_layer
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        w = base_layer.weight  # [out, in]; LoRA lives on the same device and dtype
        self.lora_A = nn.Parameter(torch.empty(r, w.shape[1], dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(w.shape[0], r, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # PEFT's default init of A
        self.merged = False
        self.train(base_layer.training)  # a new module defaults to training mode; keep the model's

    def delta_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The update to the base weight, (alpha / r) * B @ A: [out, in] (computed in `dtype` if given)."""
        return (self.lora_B.to(dtype) @ self.lora_A.to(dtype)) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)  # [..., out]
        if self.merged:  # the update is already inside base_layer.weight
            if self.training:
                raise RuntimeError(
                    "LoRA weights are merged into the base layer; call unmerge() before training"
                )
            return y
        # x [..., in] -> A -> [..., r] -> B -> [..., out]
        return y + F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """Add the update into the base weight, so forward costs one matmul (inference only)."""
        assert not self.merged, "LoRA layer is already merged"
        self._add_to_weight(+1)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Subtract the update again; restores the base weight up to float rounding."""
        assert self.merged, "LoRA layer is not merged"
        self._add_to_weight(-1)
        self.merged = False

    def _add_to_weight(self, sign: int) -> None:
        """weight + sign * update, summed in at least float32 and rounded once (in bf16 the product and the
        sum would each be rounded)."""
        weight = self.base_layer.weight
        wide = torch.promote_types(weight.dtype, torch.float32)
        weight.copy_(weight.to(wide) + sign * self.delta_weight(wide))

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, merged={self.merged}"


# --- finding and wrapping target layers (PEFT's matching rules) ---


def layer_index(name: str, layers_pattern: str | Sequence[str] | None) -> int | None:
    """The block index in a module name ('model.layers.3.mlp.up_proj' -> 3), PEFT's rule."""
    if not layers_pattern:  # PEFT's default: the first numbered path segment
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", name)
    else:
        patterns = [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern
        matches = (re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", name) for p in patterns)
        match = next((m for m in matches if m), None)
    return int(match["idx"]) if match else None


def is_target(
    name: str,
    target_modules: str | Sequence[str],
    layers: Sequence[int] | None,
    layers_pattern: str | Sequence[str] | None = None,
) -> bool:
    """PEFT's rule: a string is a full-match regex (layers ignored); a list matches name suffixes."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    if not any(name == t or name.endswith("." + t) for t in target_modules):
        return False
    return layers is None or layer_index(name, layers_pattern) in layers


def candidate_names(model: nn.Module) -> list[str]:
    """Names of all modules that could carry LoRA (not the internals of a LoRALinear)."""
    wrapped = {n for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    return [n for n, _ in model.named_modules() if n and n.rpartition(".")[0] not in wrapped]


def last_layers(model: nn.Module, n: int) -> list[int]:
    """Indices of the last n transformer blocks (LoRA on fewer layers trains faster on CPU)."""
    indices = sorted({i for name in candidate_names(model) if (i := layer_index(name, None)) is not None})
    if not 1 <= n <= len(indices):
        raise ValueError(f"cannot take the last {n} layers: the model has {len(indices)} blocks")
    return indices[-n:]


def inject_lora(
    model: nn.Module,
    r: int = 32,
    alpha: float = 32,
    dropout: float = 0.0,
    target_modules: str | Sequence[str] = DEFAULT_TARGETS,
    layers: Sequence[int] | None = None,
    layers_pattern: str | Sequence[str] | None = None,
) -> list[str]:
    """Replace every matching nn.Linear by a LoRALinear wrapping it; returns the wrapped names.

    target_modules: module-name suffixes, or one full-match regex (then `layers` is ignored, as in
    PEFT); layers: block indices to adapt (None = all). Fails if a suffix matches nothing (a typo
    would train less than asked) or a match is not a plain nn.Linear.
    """
    if r <= 0:
        raise ValueError(f"LoRA rank must be positive, got r={r}")
    names = [n for n in candidate_names(model) if is_target(n, target_modules, layers, layers_pattern)]
    if not names:
        raise ValueError(
            f"target_modules={target_modules!r} with layers={layers} matched no module "
            f"of {type(model).__name__}; check the names in model.named_modules()"
        )
    if not isinstance(target_modules, str) and (
        unmatched := [
            t for t in target_modules if not any(is_target(n, [t], layers, layers_pattern) for n in names)
        ]
    ):
        raise ValueError(
            f"target_modules {unmatched} matched no module with layers={layers} (matched: "
            f"{sorted({n.rpartition('.')[2] for n in names})})"
        )
    if layers is not None and not isinstance(target_modules, str):
        found = {layer_index(n, layers_pattern) for n in names}
        if missing := sorted(set(layers) - found):
            raise ValueError(f"layers {missing} do not exist or have no {list(target_modules)} modules")
    for name in names:  # check all before changing anything
        module = model.get_submodule(name)
        if isinstance(module, LoRALinear):
            raise ValueError(f"{name} already has LoRA; inject into a model without adapters")
        if type(module) is not nn.Linear:  # a subclass may have its own forward that would skip LoRA
            raise ValueError(
                f"{name} is a {type(module).__name__}, LoRA wraps plain nn.Linear only; inject "
                f"before converting the model for inference (cpu_speed.prepare_for_inference)"
            )
    for name in names:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, LoRALinear(model.get_submodule(name), r, alpha, dropout))
    return names


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """All LoRA layers by module name, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def mark_only_lora_trainable(model: nn.Module) -> int:
    """Freeze everything except lora_A / lora_B; returns the number of trainable parameters."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.rpartition(".")[2] in ("lora_A", "lora_B"))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge_lora(model: nn.Module, dtype: torch.dtype | None = None) -> None:
    """Merge every LoRA layer into its base weight (inference speed; undo with unmerge_lora). With
    `dtype`, each base layer is cast to it right after its merge: the sum is rounded once, and only
    one layer's weight is in the merge precision at a time (no undo then)."""
    params = [p for _, p in model.named_parameters(remove_duplicate=False)]
    for name, layer in lora_layers(model).items():
        if sum(p is layer.base_layer.weight for p in params) > 1:  # e.g. lm_head tied to embed_tokens
            raise ValueError(f"{name} shares its weight with another module; merging would change both")
    for layer in lora_layers(model).values():
        layer.merge()
        if dtype is not None:
            layer.base_layer.to(dtype)


def unmerge_lora(model: nn.Module) -> None:
    """Take the merged updates out of the base weights again."""
    for layer in lora_layers(model).values():
        layer.unmerge()


def unload_lora(model: nn.Module) -> None:
    """Put the plain nn.Linear layers back (merged weights if merged: PEFT's merge_and_unload)."""
    for name, layer in lora_layers(model).items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer.base_layer)


# --- LoRA weights by our parameter names (checkpoints; peft_format.py maps them to PEFT's keys) ---


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the LoRA parameters, by our names ('model.layers.0.self_attn.q_proj.lora_A')."""
    return {n: p for n, p in model.named_parameters() if n.rpartition(".")[2] in ("lora_A", "lora_B")}


@torch.no_grad()
def load_lora_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy LoRA weights into an injected model; the key sets and shapes must match exactly."""
    params = lora_state_dict(model)
    missing, unexpected = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
    if missing or unexpected:
        raise ValueError(
            f"LoRA weights do not fit this model: {len(missing)} missing {missing[:3]}, "
            f"{len(unexpected)} unexpected {unexpected[:3]}; was the adapter made for "
            f"another architecture or layer selection?"
        )
    for name, p in params.items():
        if state[name].shape != p.shape:
            raise ValueError(
                f"{name}: adapter has shape {tuple(state[name].shape)}, model expects "
                f"{tuple(p.shape)}; the adapter was trained for a different base model"
            )
        p.copy_(state[name])  # casts e.g. a bf16 file to the model's float32
