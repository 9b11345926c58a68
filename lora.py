"""LoRA: low-rank adapters on the linear layers of a frozen model, saved in the PEFT layout.

GRISP fine-tunes Qwen2.5 with LoRA (Hu et al., 2022), r=32, alpha=32, on all linear layers of the
transformer blocks (paper, training setup; METHOD.md section 2). A frozen linear layer W gets a
trainable low-rank update:  y = W x + (alpha / r) * B A dropout(x),  with A [r, in] and B [out, r].
B starts at zero, so step 0 is exactly the base model.

The library works on any nn.Module by module names (our model.py and transformers'
Qwen2ForCausalLM use the same names), and adapters use Hugging Face PEFT's files and key names,
so an adapter trained here loads with `PeftModel.from_pretrained` and a PEFT adapter loads here:

    adapter_config.json          {"peft_type": "LORA", "r": 32, "lora_alpha": 32, ...}
    adapter_model.safetensors    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight ...

Usage (see train.py / infer.py):
    inject_lora(model, r=32, alpha=32, layers=last_layers(model, 8))  # layers=None: all blocks
    mark_only_lora_trainable(model)
    ... train ...
    save_adapter(model, "adapters/run1", base_model_name_or_path="Qwen/...", dtype=torch.bfloat16)
    load_adapter(base_model, "adapters/run1")  # inference with the LoRA path, or for full speed:
    merge_lora(base_model); unload_lora(base_model); base_model.prepare_for_inference()

A trained adapter is shipped as a smaller copy (bf16 weights, a Hub id as its base model):
    python lora.py convert ~/.cache/grisp/runs/NAME/best adapters/NAME --dtype bfloat16 \
        --base-model Qwen/Qwen2.5-Coder-0.5B-Instruct
Tests: python -m pytest tests/test_lora.py
"""
import argparse
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

# The linear layers of a Qwen2 block: attention and SwiGLU MLP projections.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # PEFT's key = PEFT_PREFIX + our parameter name + ".weight"


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

    def delta_weight(self) -> torch.Tensor:
        """The update to the base weight, (alpha / r) * B @ A: [out, in]."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)  # [..., out]
        if self.merged:  # the update is already inside base_layer.weight
            if self.training:
                raise RuntimeError("LoRA weights are merged into the base layer; call unmerge() before training")
            return y
        # x [..., in] -> A -> [..., r] -> B -> [..., out]
        return y + F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """Add the update into the base weight, so forward costs one matmul (inference only)."""
        assert not self.merged, "LoRA layer is already merged"
        self.base_layer.weight += self.delta_weight().to(self.base_layer.weight.dtype)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Subtract the update again; restores the base weight up to float rounding."""
        assert self.merged, "LoRA layer is not merged"
        self.base_layer.weight -= self.delta_weight().to(self.base_layer.weight.dtype)
        self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, merged={self.merged}"


# --- finding and wrapping target layers (PEFT's matching rules) ---

def _layer_index(name: str, layers_pattern: str | Sequence[str] | None) -> int | None:
    """The block index in a module name ('model.layers.3.mlp.up_proj' -> 3), PEFT's rule."""
    if not layers_pattern:  # PEFT's default: the first numbered path segment
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", name)
    else:
        patterns = [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern
        matches = (re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", name) for p in patterns)
        match = next((m for m in matches if m), None)
    return int(match["idx"]) if match else None


def _is_target(name: str, target_modules: str | Sequence[str], layers: Sequence[int] | None,
               layers_pattern: str | Sequence[str] | None = None) -> bool:
    """PEFT's rule: a string is a full-match regex (layers ignored); a list matches name suffixes."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    if not any(name == t or name.endswith("." + t) for t in target_modules):
        return False
    return layers is None or _layer_index(name, layers_pattern) in layers


def _candidate_names(model: nn.Module) -> list[str]:
    """Names of all modules that could carry LoRA (not the internals of a LoRALinear)."""
    wrapped = {n for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    return [n for n, _ in model.named_modules() if n and n.rpartition(".")[0] not in wrapped]


def last_layers(model: nn.Module, n: int) -> list[int]:
    """Indices of the last n transformer blocks (LoRA on fewer layers trains faster on CPU)."""
    indices = sorted({i for name in _candidate_names(model) if (i := _layer_index(name, None)) is not None})
    if not 1 <= n <= len(indices):
        raise ValueError(f"cannot take the last {n} layers: the model has {len(indices)} blocks")
    return indices[-n:]


def inject_lora(model: nn.Module, r: int = 32, alpha: float = 32, dropout: float = 0.0,
                target_modules: str | Sequence[str] = DEFAULT_TARGETS, layers: Sequence[int] | None = None,
                layers_pattern: str | Sequence[str] | None = None) -> list[str]:
    """Replace every matching nn.Linear by a LoRALinear wrapping it; returns the wrapped names.

    target_modules: module-name suffixes, or one full-match regex (then `layers` is ignored, as in
    PEFT); layers: block indices to adapt (None = all). Fails if nothing matches or a match is not
    a plain nn.Linear.
    """
    if r <= 0:
        raise ValueError(f"LoRA rank must be positive, got r={r}")
    names = [n for n in _candidate_names(model) if _is_target(n, target_modules, layers, layers_pattern)]
    if not names:
        raise ValueError(f"target_modules={target_modules!r} with layers={layers} matched no module "
                         f"of {type(model).__name__}; check the names in model.named_modules()")
    if layers is not None and not isinstance(target_modules, str):
        found = {_layer_index(n, layers_pattern) for n in names}
        if missing := sorted(set(layers) - found):
            raise ValueError(f"layers {missing} do not exist or have no {list(target_modules)} modules")
    for name in names:  # check all before changing anything
        module = model.get_submodule(name)
        if isinstance(module, LoRALinear):
            raise ValueError(f"{name} already has LoRA; inject into a model without adapters")
        if type(module) is not nn.Linear:  # a subclass may have its own forward that would skip LoRA
            raise ValueError(f"{name} is a {type(module).__name__}, LoRA wraps plain nn.Linear only; "
                             f"inject before converting the model for inference (prepare_for_inference)")
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


def merge_lora(model: nn.Module) -> None:
    """Merge every LoRA layer into its base weight (inference speed; undo with unmerge_lora)."""
    params = [p for _, p in model.named_parameters(remove_duplicate=False)]
    for name, layer in lora_layers(model).items():
        if sum(p is layer.base_layer.weight for p in params) > 1:  # e.g. lm_head tied to embed_tokens
            raise ValueError(f"{name} shares its weight with another module; merging would change both")
    for layer in lora_layers(model).values():
        layer.merge()


def unmerge_lora(model: nn.Module) -> None:
    """Take the merged updates out of the base weights again."""
    for layer in lora_layers(model).values():
        layer.unmerge()


def unload_lora(model: nn.Module) -> None:
    """Put the plain nn.Linear layers back (merged weights if merged: PEFT's merge_and_unload)."""
    for name, layer in lora_layers(model).items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer.base_layer)


# --- LoRA weights: our names <-> PEFT's file ---

def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the LoRA parameters, by our names ('model.layers.0.self_attn.q_proj.lora_A')."""
    return {n: p for n, p in model.named_parameters() if n.rpartition(".")[2] in ("lora_A", "lora_B")}


@torch.no_grad()
def load_lora_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy LoRA weights into an injected model; the key sets and shapes must match exactly."""
    params = lora_state_dict(model)
    missing, unexpected = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
    if missing or unexpected:
        raise ValueError(f"LoRA weights do not fit this model: {len(missing)} missing {missing[:3]}, "
                         f"{len(unexpected)} unexpected {unexpected[:3]}; was the adapter made for "
                         f"another architecture or layer selection?")
    for name, p in params.items():
        if state[name].shape != p.shape:
            raise ValueError(f"{name}: adapter has shape {tuple(state[name].shape)}, model expects "
                             f"{tuple(p.shape)}; the adapter was trained for a different base model")
        p.copy_(state[name])  # casts e.g. a bf16 file to the model's float32


def _peft_key(name: str) -> str:
    return PEFT_PREFIX + name + ".weight"


def _our_name(key: str) -> str:
    """Inverse of _peft_key; keys without PEFT's prefix/suffix are kept (and reported as unexpected)."""
    if key.startswith(PEFT_PREFIX) and key.endswith(".weight"):
        return key[len(PEFT_PREFIX):-len(".weight")]
    return key


# --- adapters in the PEFT layout ---

def _adapter_config(model: nn.Module, base_model_name_or_path: str | None) -> dict:
    """A PEFT LoraConfig describing exactly the LoRA layers in the model."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers; call inject_lora (or load_adapter) first")
    settings = {(m.r, m.alpha, getattr(m.lora_dropout, "p", 0.0)) for m in layers.values()}
    if len(settings) != 1:
        raise ValueError(f"LoRA layers differ in (r, alpha, dropout) {sorted(settings)}; "
                         f"one adapter file holds one setting")
    (r, alpha, dropout), = settings
    targets = sorted({n.rpartition(".")[2] for n in layers})
    # PEFT re-selects layers from (target_modules, layers_to_transform): prefer "all blocks", else the
    # blocks in use, and insist that the selection reproduces exactly our layers.
    names, indices = _candidate_names(model), {_layer_index(n, None) for n in layers}

    def selects_exactly_ours(layers_to_transform: list[int] | None) -> bool:
        return {n for n in names if _is_target(n, targets, layers_to_transform)} == layers.keys()

    if selects_exactly_ours(None):
        selected = None
    elif None not in indices and selects_exactly_ours(sorted(indices)):
        selected = sorted(indices)
    else:
        raise ValueError(f"the LoRA layers {list(layers)[:3]}... cannot be described by target_modules="
                         f"{targets} plus layers_to_transform; inject with one target list and layer list")
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": targets,
        "layers_to_transform": selected,
        "layers_pattern": None,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def save_adapter(model: nn.Module, out_dir: str | Path, base_model_name_or_path: str | None = None,
                 dtype: torch.dtype | None = None) -> Path:
    """Write adapter_config.json + adapter_model.safetensors (PEFT layout); dtype e.g. torch.bfloat16
    halves the file. Returns the directory."""
    _check_float(dtype)
    config = _adapter_config(model, base_model_name_or_path)
    tensors = {_peft_key(n): p.detach().cpu() for n, p in lora_state_dict(model).items()}
    return _write_adapter(out_dir, tensors, config, dtype)


def _check_float(dtype: torch.dtype | None) -> None:
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"cannot save LoRA weights as {dtype}; use a float dtype such as torch.bfloat16")


def _write_adapter(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict,
                   dtype: torch.dtype | None) -> Path:
    """The two files of a PEFT adapter directory: weights (under PEFT's keys, cast to dtype) and config."""
    tensors = {key: t.to(dtype or t.dtype).contiguous() for key, t in tensors.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / WEIGHTS_NAME, metadata={"format": "pt"})
    (out_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


# Config fields of PEFT features this plain LoRA does not implement, with their "off" value.
_UNSUPPORTED = {"bias": "none", "fan_in_fan_out": False, "use_dora": False, "use_rslora": False,
                "lora_bias": False, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
                "exclude_modules": None, "layer_replication": None, "target_parameters": None,
                "trainable_token_indices": None, "use_qalora": False, "alora_invocation_tokens": None}


def read_adapter_config(adapter_dir: str | Path) -> dict:
    """Read and check adapter_config.json; raises a clear error for what lora.py cannot load."""
    path = Path(adapter_dir) / CONFIG_NAME
    if not path.is_file() or not (path.parent / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"{adapter_dir} is not an adapter directory: it needs {CONFIG_NAME} and "
                                f"{WEIGHTS_NAME} (written by save_adapter or PEFT's save_pretrained)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-save the adapter") from None
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type={config.get('peft_type')!r}; only LORA adapters can be loaded")
    if missing := [key for key in ("r", "lora_alpha", "target_modules") if config.get(key) is None]:
        raise ValueError(f"{path} lacks {missing}; it is not a complete LoRA adapter config")
    for key, off in _UNSUPPORTED.items():
        if config.get(key) and config[key] != off:
            raise ValueError(f"{path}: {key}={config[key]!r} is not supported (plain LoRA only); "
                             f"retrain the adapter with {key}={off!r}")
    return config


def load_adapter(model: nn.Module, adapter_dir: str | Path) -> dict:
    """Inject LoRA into a base model as the adapter's config says and load its weights strictly.

    Works for adapters from save_adapter and from PEFT's save_pretrained. Returns the config.
    """
    config = read_adapter_config(adapter_dir)
    if lora_layers(model):
        raise ValueError("the model already has LoRA layers; load the adapter into a fresh base model")
    layers = config.get("layers_to_transform")  # PEFT: an int, a list, or None / [] for all blocks
    layers = [layers] if isinstance(layers, int) else layers or None
    inject_lora(model, r=config["r"], alpha=config["lora_alpha"], dropout=config.get("lora_dropout") or 0.0,
                target_modules=config["target_modules"], layers=layers,
                layers_pattern=config.get("layers_pattern"))
    state = read_adapter_weights(adapter_dir)
    try:
        load_lora_state_dict(model, state)
    except ValueError:
        unload_lora(model)  # leave the base model as it was
        raise
    return config


def read_adapter_weights(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The adapter's LoRA weights under this module's names (for load_lora_state_dict)."""
    return {_our_name(k): v for k, v in load_file(Path(adapter_dir) / WEIGHTS_NAME).items()}


def convert_adapter(src_dir: str | Path, out_dir: str | Path, dtype: torch.dtype | None = None,
                    base_model_name_or_path: str | None = None) -> Path:
    """Copy an adapter directory with its weights cast to `dtype` and, if given, another base model name
    in its config (a Hub id instead of the local path training saw). Returns the directory."""
    _check_float(dtype)
    config = read_adapter_config(src_dir)
    if base_model_name_or_path is not None:
        config["base_model_name_or_path"] = base_model_name_or_path
    return _write_adapter(out_dir, load_file(Path(src_dir) / WEIGHTS_NAME), config, dtype)


def main(args: argparse.Namespace) -> None:
    dtype = getattr(torch, args.dtype) if args.dtype else None
    out = convert_adapter(args.src, args.out, dtype, args.base_model)
    size = (out / WEIGHTS_NAME).stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB of weights)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Adapter files (PEFT layout).",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="copy an adapter with another weight dtype or base model name",
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    convert.add_argument("src", type=Path, help="adapter directory to read (e.g. a run's best/)")
    convert.add_argument("out", type=Path, help="adapter directory to write")
    convert.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                         help="weight dtype of the copy (None: keep the source's)")
    convert.add_argument("--base-model", default=None,
                         help="base_model_name_or_path written into the copy's config (None: keep)")
    try:
        main(parser.parse_args())
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}")
