"""Adapter files in Hugging Face PEFT's layout: save, load and convert what lora.py trains.

GRISP ships its fine-tuned model as a LoRA adapter (paper, training setup). The files and key names are
PEFT's, so an adapter trained here loads with `PeftModel.from_pretrained` and a PEFT adapter loads here:

    adapter_config.json          {"peft_type": "LORA", "r": 32, "lora_alpha": 32, ...}
    adapter_model.safetensors    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight ...

lora.py holds the LoRA idea (layers, injection, merging); this file only maps it to and from those files.
One file of our own sits beside PEFT's, `grisp_config.json` ({"prompt_format": "v2"}): the re-ranking
prompt format the adapter was trained on (prompts.PROMPT_FORMATS), which infer.py and evaluate.py read
back (`read_prompt_format`); an adapter without it was trained on "v1". PEFT ignores the file.

    save_adapter(model, "adapters/run1", base_model_name_or_path="Qwen/...", dtype=torch.bfloat16)
    load_adapter(base_model, "adapters/run1")  # LoRA layers beside the base weights (to train on), or
    load_merged(base_model, "adapters/run1")  # folded into the base weights: inference at base speed
    model = load_for_inference(model_dir, "adapters/run1", "bfloat16")  # base + merged adapter, ready

A trained adapter is shipped as a smaller copy (bf16 weights, a Hub id as its base model):
    python -m grisp.peft_format convert ~/.cache/grisp/runs/NAME/best adapters/NAME --dtype bfloat16 \
        --base-model Qwen/Qwen2.5-Coder-0.5B-Instruct
and a run's checkpoint (e.g. of a run still going) becomes an adapter the same way:
    python -m grisp.peft_format convert ~/.cache/grisp/runs/NAME/checkpoint-0000250 /tmp/step-250
Tests: python -m pytest tests/test_peft_format.py (a checkpoint's conversion: tests/test_train.py)
"""

import argparse
import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from common.jsonl import write_atomic, write_json
from grisp import checkpoint
from grisp.prompts import LATEST_PROMPT_FORMAT, PROMPT_FORMATS
from llm.cpu_speed import prepare_for_inference
from lora import (
    candidate_names,
    inject_lora,
    is_target,
    layer_index,
    load_lora_state_dict,
    lora_layers,
    lora_state_dict,
    merge_lora,
    unload_lora,
)
from model import Transformer

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
GRISP_CONFIG_NAME = "grisp_config.json"  # ours, beside PEFT's files: {"prompt_format": ...}
UNRECORDED_PROMPT_FORMAT = "v1"  # the format of adapters saved before the file existed (the first adapter)
PEFT_PREFIX = "base_model.model."  # PEFT's key = PEFT_PREFIX + our parameter name + ".weight"


# --- LoRA weights: our names <-> PEFT's keys ---


def _peft_key(name: str) -> str:
    return PEFT_PREFIX + name + ".weight"


def _our_name(key: str) -> str:
    """Inverse of _peft_key; keys without PEFT's prefix/suffix are kept (and reported as unexpected)."""
    if key.startswith(PEFT_PREFIX) and key.endswith(".weight"):
        return key[len(PEFT_PREFIX) : -len(".weight")]
    return key


# --- adapter directories ---


def _adapter_config(model: nn.Module, base_model_name_or_path: str | None) -> dict:
    """A PEFT LoraConfig describing exactly the LoRA layers in the model."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers; call inject_lora (or load_adapter) first")
    settings = {(m.r, m.alpha, getattr(m.lora_dropout, "p", 0.0)) for m in layers.values()}
    if len(settings) != 1:
        raise ValueError(
            f"LoRA layers differ in (r, alpha, dropout) {sorted(settings)}; "
            f"one adapter file holds one setting"
        )
    ((r, alpha, dropout),) = settings
    targets = sorted({n.rpartition(".")[2] for n in layers})
    # PEFT re-selects layers from (target_modules, layers_to_transform): prefer "all blocks", else the
    # blocks in use, and insist that the selection reproduces exactly our layers.
    names, indices = candidate_names(model), {layer_index(n, None) for n in layers}

    def selects_exactly_ours(layers_to_transform: list[int] | None) -> bool:
        return {n for n in names if is_target(n, targets, layers_to_transform)} == layers.keys()

    if selects_exactly_ours(None):
        selected = None
    elif None not in indices and selects_exactly_ours(sorted(indices)):
        selected = sorted(indices)
    else:
        raise ValueError(
            f"the LoRA layers {list(layers)[:3]}... cannot be described by target_modules="
            f"{targets} plus layers_to_transform; inject with one target list and layer list"
        )
    return _peft_config(r, alpha, dropout, targets, selected, base_model_name_or_path)


def _peft_config(
    r: int,
    alpha: float,
    dropout: float,
    targets: list[str],
    layers_to_transform: list[int] | None,
    base_model_name_or_path: str | None,
) -> dict:
    """PEFT's LoraConfig for plain LoRA with these settings (layers_to_transform None: every block)."""
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
        "layers_to_transform": layers_to_transform,
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


def save_adapter(
    model: nn.Module,
    out_dir: str | Path,
    base_model_name_or_path: str | None = None,
    dtype: torch.dtype | None = None,
    prompt_format: str | None = None,
) -> Path:
    """Write adapter_config.json + adapter_model.safetensors (PEFT layout), and grisp_config.json if a
    prompt format is given; dtype e.g. torch.bfloat16 halves the file. Returns the directory."""
    _check_float(dtype)
    config = _adapter_config(model, base_model_name_or_path)
    tensors = {_peft_key(n): p.detach().cpu() for n, p in lora_state_dict(model).items()}
    return _write_adapter(out_dir, tensors, config, dtype, prompt_format)


def read_prompt_format(adapter_dir: str | Path | None) -> str:
    """The re-ranking prompt format the adapter was trained on: its grisp_config.json, else "v1" (adapters
    from before the file, and PEFT-trained ones); None (the base model, no adapter): the latest format."""
    if adapter_dir is None:
        return LATEST_PROMPT_FORMAT
    path = Path(adapter_dir) / GRISP_CONFIG_NAME
    if not path.is_file():
        return UNRECORDED_PROMPT_FORMAT
    try:
        prompt_format = json.loads(path.read_text()).get("prompt_format", UNRECORDED_PROMPT_FORMAT)
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(
            f'{path} is not a JSON object like {{"prompt_format": "v2"}}; fix or delete it'
        ) from None
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(
            f"{path}: unknown prompt_format {prompt_format!r}; known: {', '.join(PROMPT_FORMATS)}"
        )
    return prompt_format


def _check_float(dtype: torch.dtype | None) -> None:
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"cannot save LoRA weights as {dtype}; use a float dtype such as torch.bfloat16")


def _write_adapter(
    out_dir: str | Path,
    tensors: dict[str, torch.Tensor],
    config: dict,
    dtype: torch.dtype | None,
    prompt_format: str | None,
) -> Path:
    """The files of an adapter directory: weights (under PEFT's keys, cast to dtype) and config (PEFT's),
    and grisp_config.json with the prompt format, if known (an older one is removed, not left to mislead).
    Each file is written atomically: a run killed mid-save (best/ is rewritten at every better
    validation) leaves the old file or the new one, never half of one."""
    tensors = {key: t.to(dtype or t.dtype).contiguous() for key, t in tensors.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_json(out_dir / CONFIG_NAME, config)
    if prompt_format is None:
        (out_dir / GRISP_CONFIG_NAME).unlink(missing_ok=True)
    else:
        write_json(out_dir / GRISP_CONFIG_NAME, {"prompt_format": prompt_format})
    return out_dir


# Config fields of PEFT features this plain LoRA does not implement, with their "off" value.
_UNSUPPORTED = {
    "bias": "none",
    "fan_in_fan_out": False,
    "use_dora": False,
    "use_rslora": False,
    "lora_bias": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "exclude_modules": None,
    "layer_replication": None,
    "target_parameters": None,
    "trainable_token_indices": None,
    "use_qalora": False,
    "alora_invocation_tokens": None,
}


def read_adapter_config(adapter_dir: str | Path) -> dict:
    """Read and check adapter_config.json; raises a clear error for what lora.py cannot load."""
    path = Path(adapter_dir) / CONFIG_NAME
    if not path.is_file() or not (path.parent / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(
            f"{adapter_dir} is not an adapter directory: it needs {CONFIG_NAME} and "
            f"{WEIGHTS_NAME} (written by save_adapter or PEFT's save_pretrained)"
        )
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
            raise ValueError(
                f"{path}: {key}={config[key]!r} is not supported (plain LoRA only); "
                f"retrain the adapter with {key}={off!r}"
            )
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
    inject_lora(
        model,
        r=config["r"],
        alpha=config["lora_alpha"],
        dropout=config.get("lora_dropout") or 0.0,
        target_modules=config["target_modules"],
        layers=layers,
        layers_pattern=config.get("layers_pattern"),
    )
    state = read_adapter_weights(adapter_dir)
    try:
        load_lora_state_dict(model, state)
    except ValueError:
        unload_lora(model)  # leave the base model as it was
        raise
    return config


def load_merged(model: nn.Module, adapter_dir: str | Path, dtype: torch.dtype | None = None) -> dict:
    """Load the adapter and fold it into the base weights (PEFT's merge_and_unload): the model keeps
    plain nn.Linear layers, so inference runs at base speed; with `dtype` each merged layer is cast to
    it (lora.merge_lora). Returns the adapter's config."""
    config = load_adapter(model, adapter_dir)
    merge_lora(model, dtype)
    unload_lora(model)
    return config


def load_for_inference(
    model_dir: str | Path, adapter_dir: str | Path | None, precision: str, device: str | torch.device = "cpu"
) -> Transformer:
    """The base model of `model_dir` with the adapter folded in, in `precision` (a precision name of
    cpu_speed.pick_precision, not "auto"), switched to inference by cpu_speed.prepare_for_inference.
    The adapter is merged in float32 and the sum rounded to bfloat16 once (a merge in bf16 would round
    the base weight and the LoRA product separately): the base model is loaded in float32 for that, so
    loading with an adapter peaks at the float32 model's memory (about 2 GB for the 0.5B model)."""
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    model = Transformer.from_pretrained(model_dir, torch.float32 if adapter_dir else dtype, device)
    if adapter_dir is not None:
        config = load_merged(model, adapter_dir, dtype)
        if (mismatch := base_model_mismatch(model_dir, config)) is not None:
            warnings.warn(f"the adapter at {adapter_dir} {mismatch}", stacklevel=2)
        model.to(dtype)  # the weights without LoRA (embeddings, norms, biases)
    return prepare_for_inference(model, int8=precision == "int8", fp16_weights=precision == "fp16-weights")


def base_model_mismatch(model_dir: str | Path, config: dict) -> str | None:
    """Why the adapter's base model (`base_model_name_or_path`) is not the model of `model_dir` (the
    Hugging Face repo get_model.py recorded in its get_model.json), or None if they agree or either is
    unknown. A base of the same shape loads without error, but the adapter was not trained on it."""
    manifest = Path(model_dir) / "get_model.json"
    base = config.get("base_model_name_or_path")
    if not base or not manifest.exists():
        return None
    repo = json.loads(manifest.read_text()).get("args", {}).get("hf_repo")
    if not repo or str(base).lower() == str(repo).lower():
        return None
    return f"was trained on {base}, and {model_dir} is {repo}"


def read_adapter_weights(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The adapter's LoRA weights under our parameter names (for lora.load_lora_state_dict)."""
    return {_our_name(k): v for k, v in load_file(Path(adapter_dir) / WEIGHTS_NAME).items()}


def convert_adapter(
    src_dir: str | Path,
    out_dir: str | Path,
    dtype: torch.dtype | None = None,
    base_model_name_or_path: str | None = None,
) -> Path:
    """Copy an adapter directory, or make one from a training run's checkpoint-* directory, with its
    weights cast to `dtype` and, if given, another base model name in its config (a Hub id instead of
    the local path training saw). Returns the directory."""
    _check_float(dtype)
    src_dir = Path(src_dir)
    if (src_dir / checkpoint.LORA_FILE).is_file():
        config, tensors, prompt_format = _checkpoint_adapter(src_dir)
    else:
        config, tensors, prompt_format = read_adapter_config(src_dir), load_file(src_dir / WEIGHTS_NAME), None
    if base_model_name_or_path is not None:
        config["base_model_name_or_path"] = base_model_name_or_path
    if prompt_format is None and (src_dir / GRISP_CONFIG_NAME).is_file():  # it travels with the weights
        prompt_format = read_prompt_format(src_dir)
    return _write_adapter(out_dir, tensors, config, dtype, prompt_format)


def _checkpoint_adapter(path: Path) -> tuple[dict, dict[str, torch.Tensor], str]:
    """A checkpoint's LoRA weights as an adapter: the config from the run's settings and the weights'
    names (which blocks, which layers), as save_adapter writes it for the same model."""
    run = json.loads((path / "config.json").read_text())
    weights = load_file(path / checkpoint.LORA_FILE)
    names = {n.rpartition(".")[0] for n in weights}  # model.layers.3.self_attn.q_proj
    targets, indices = sorted({n.rpartition(".")[2] for n in names}), {layer_index(n, None) for n in names}
    blocks = sorted(i for i in indices if i is not None)
    every_block = not blocks or blocks[0] == 0  # training puts LoRA on the last N blocks: block 0 means all
    if not every_block and None in indices:
        raise ValueError(
            f"{path}: LoRA on the last blocks and on {sorted(n for n in names if layer_index(n, None) is None)} "
            f"cannot be described by target_modules plus layers_to_transform"
        )
    config = _peft_config(
        run["lora_r"],
        run["lora_alpha"],
        run["lora_dropout"],
        targets,
        None if every_block else blocks,
        run["model_dir"],
    )
    return (
        config,
        {_peft_key(n): t for n, t in weights.items()},
        run.get("prompt_format", UNRECORDED_PROMPT_FORMAT),
    )


def main(args: argparse.Namespace) -> None:
    dtype = getattr(torch, args.dtype) if args.dtype else None
    out = convert_adapter(args.src, args.out, dtype, args.base_model)
    size = (out / WEIGHTS_NAME).stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB of weights)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Adapter files (PEFT layout).", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser(
        "convert",
        help="copy an adapter (or make one from a training checkpoint) with "
        "another weight dtype or base model name",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    convert.add_argument(
        "src",
        type=Path,
        help="adapter directory to read (e.g. a run's best/), or a run's checkpoint-* directory",
    )
    convert.add_argument("out", type=Path, help="adapter directory to write")
    convert.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default=None,
        help="weight dtype of the copy (None: keep the source's)",
    )
    convert.add_argument(
        "--base-model",
        default=None,
        help="base_model_name_or_path written into the copy's config (None: keep)",
    )
    try:
        main(parser.parse_args())
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
