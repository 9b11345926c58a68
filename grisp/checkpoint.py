"""Checkpoints that let a training run continue exactly where it stopped (train.py).

A checkpoint directory `checkpoint-<step>/` holds the LoRA weights (float32, our parameter names),
the AdamW state (tensors as safetensors, hyperparameters as JSON: no pickle), every process's RNG
states (dropout), the training state (step, epoch, position in the epoch, early-stopping counters)
and the resolved config. It is written under a temporary name and renamed, and the file `latest`
is replaced atomically, so an interrupted save never leaves a half checkpoint behind. StopFlag
turns SIGINT/SIGTERM into "checkpoint after this step and exit".

A portable copy (`save_portable`, train.py --portable-dir) is what a run needs to continue on another
machine, small enough to commit to git: the LoRA weights in bfloat16 (half the size), the RNG states, the
training state, the config and the run's logs, but not AdamW's moments (twice the weights) nor best/
(another copy of the weights: a landing after a validation would add both; state.json names best's step).
A run continued from it (`restore`, train.py's --resume) is at the same step, schedule position and data order with the
same RNG states; its weights are the bf16-rounded ones and its moments start again from zero.
"""

import json
import shutil
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

import lora
from common.jsonl import write_atomic

LORA_FILE = "lora.safetensors"  # the LoRA weights: our parameter names, float32 (resuming is exact)
RUN_LOGS = ("log.jsonl", "stretches.jsonl")  # a run directory's logs, copied into a portable copy


def save(run_dir: Path, model, optimizer, state: dict, config: dict, rank: int, world: int) -> Path:
    """Write checkpoint-<step>/ under a temporary name and rename it, then point `latest` at it."""
    final = run_dir / f"checkpoint-{state['step']:07d}"
    tmp = final.with_suffix(".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if world > 1:
        dist.barrier()
    rng = {"cpu": torch.get_rng_state()} | (
        {"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {}
    )
    save_file(rng, tmp / f"rng-rank{rank}.safetensors")  # every rank draws its own dropout masks
    if world > 1:
        dist.barrier()
    if rank == 0:
        save_file(
            {n: p.detach().cpu().contiguous() for n, p in lora.lora_state_dict(unwrap(model)).items()},
            tmp / LORA_FILE,
        )
        opt = optimizer.state_dict()  # tensors to safetensors, the rest to JSON: no pickle
        save_file(
            {
                f"{i}.{k}": v.detach().cpu().contiguous()
                for i, s in opt["state"].items()
                for k, v in s.items()
            },
            tmp / "optimizer.safetensors",
        )
        (tmp / "optimizer.json").write_text(json.dumps(opt["param_groups"]))
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if final.exists():  # saved again at the same step (e.g. after a final validation)
            final.rename(final.with_suffix(".old"))
        tmp.rename(final)
        shutil.rmtree(final.with_suffix(".old"), ignore_errors=True)
        write_atomic(run_dir / "latest", lambda part: part.write_text(final.name))
        old = sorted(run_dir.glob("checkpoint-*[0-9]"))[: -config["keep_checkpoints"]]
        for path in old:
            shutil.rmtree(path)
    if world > 1:
        dist.barrier()
    return final


def latest(run_dir: Path) -> Path | None:
    """The checkpoint the file `latest` names, or None. A save at the same step cut off between its two
    renames left that checkpoint as <name>.old: it is put back."""
    pointer = run_dir / "latest"
    if not pointer.exists():
        return None
    path = run_dir / pointer.read_text()
    if not path.exists() and path.with_suffix(".old").is_dir():
        try:
            path.with_suffix(".old").rename(path)
        except FileNotFoundError:  # another process of the run (DDP) put it back first
            pass
    return path


def read_lora(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A checkpoint's LoRA rank and alpha (named as in an adapter config: r, lora_alpha) and weights."""
    config = json.loads((path / "config.json").read_text())
    return {"r": config["lora_r"], "lora_alpha": config["lora_alpha"]}, load_file(path / LORA_FILE)


def load(path: Path, model, optimizer, rank: int, device: torch.device) -> dict:
    """Restore LoRA weights, optimiser and this rank's RNG states; returns the saved training state."""
    state = restore(path, model, rank)
    groups = json.loads((path / "optimizer.json").read_text())
    for group in groups:
        group["betas"] = tuple(group["betas"])
    tensors = load_file(path / "optimizer.safetensors", device=str(device))
    per_param = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = value.cpu() if name == "step" else value
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    return state


def save_portable(checkpoint_dir: Path, run_dir: Path, out_dir: Path) -> Path:
    """Write the portable copy of `checkpoint_dir` (of the run in `run_dir`) to `out_dir`, under a
    temporary name swapped in at the end. Unchanged files are byte-identical to the last copy's (bf16
    conversion is deterministic), so git stores only what changed. Returns out_dir."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_in_bf16(checkpoint_dir / LORA_FILE, tmp / LORA_FILE)
    copied = [
        *checkpoint_dir.glob("rng-rank*.safetensors"),
        checkpoint_dir / "state.json",
        checkpoint_dir / "config.json",
        *(run_dir / name for name in RUN_LOGS),
    ]
    for path in copied:
        if path.is_file():
            shutil.copyfile(path, tmp / path.name)
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def recover_portable(out_dir: Path) -> Path:
    """`out_dir`, put back from <name>.old where a save_portable was cut off between its two renames (the
    copy the run would continue from, on a machine whose checkpoints are gone). Returns out_dir."""
    old = out_dir.with_name(out_dir.name + ".old")
    if not out_dir.exists() and (old / "state.json").is_file():
        try:
            old.rename(out_dir)
        except FileNotFoundError:  # another process of the run (DDP) put it back first
            pass
    return out_dir


def copy_in_bf16(src: Path, dst: Path) -> None:
    """Copy a safetensors file with its float tensors cast to bfloat16."""
    tensors = load_file(src)
    save_file(
        {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in tensors.items()}, dst
    )


def restore(path: Path, model, rank: int) -> dict:
    """Restore what a checkpoint and a portable copy both hold: the LoRA weights (cast to the model's
    float32) and this rank's RNG states; returns the saved training state. The optimiser is left as it is."""
    lora.load_lora_state_dict(unwrap(model), load_file(path / LORA_FILE))
    rng = load_file(path / f"rng-rank{rank}.safetensors")
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"])
    return json.loads((path / "state.json").read_text())


def unwrap(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


class StopFlag:
    """Set by SIGINT/SIGTERM while active (a context manager that restores the old handlers); the
    loop then checkpoints and exits after the current step."""

    def __enter__(self):
        self.requested, self.previous = False, {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self.request)
        return self

    def request(self, *_):
        self.requested = True

    def __exit__(self, *_):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
