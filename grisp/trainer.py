"""The engine of train.py: a training run's state, data order and schedule, its resumption (exact from a
checkpoint, or from a portable copy on another machine) and the loop (docs/method.md section 4).

- `TrainState`: where a run is (step, epoch, position in the epoch, early stopping, re-warm); `Run`: what
  train.py's setup fixed (flags, processes, device, precision, run directory).
- `plan_steps`, `lr_at`, `rewarm`, `data_sha256`: the epoch's batches, the learning rate, the samples'
  fingerprint: pure functions, so a resumed run sees exactly what an uninterrupted one sees.
- `resume`: from the latest checkpoint (exact) or the portable copy (checkpoint.save_portable), refusing
  other settings or other samples; `start_run_dir` and `log_stretch`: config, log and stretches.jsonl.
- `TrainingLoop`: epochs -> optimiser steps -> micro-batches (gradient accumulation, DDP), validation
  with best/, early stopping, checkpoints (and portable copies), log.jsonl lines.

    fresh = f"the adapter {args.init_adapter}" if args.init_adapter else "the base model"
    state, source = resume(run, config, model, optimizer) if args.resume else (TrainState(), fresh)
    TrainingLoop(run, model, optimizer, params, pad_id, train_epoch, first_epoch, val, config, state, total).train()
Tests: python -m pytest tests/test_train.py
"""

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from common.jsonl import append_jsonl, read_jsonl, write_jsonl
from grisp import checkpoint, loss, peft_format
from llm import cpu_speed

# flags that may differ on --resume: they change neither the samples nor the schedule (a different
# --micro-batch-size or precision changes float rounding, LoRA dropout's masks and peak memory: a run may
# move to a machine of the other kind; --runs-dir: a run moved elsewhere)
RESUMABLE_CHANGES = {
    "resume",
    "threads",
    "stop_after",
    "checkpoint_every",
    "keep_checkpoints",
    "device",
    "micro_batch_size",
    "runs_dir",
    "dtype",
    "portable_dir",
    "rewarm_steps",
    "accept_new_samples",
}
# settings added after runs were saved, with the value that gives such a run's samples (a run saved without
# one resumes with it)
LATER_SETTINGS = {"mention": 0.0, "first_epoch": 0, "compose_shapes": "chain"}
# settings compared by what they name, not by where it lies: a run may move to a machine with another home
# directory (the base model is its directory's name; its shapes are checked by trainable_parameters)
COMPARED_AS = {"model_dir": lambda path: Path(str(path)).name}


@dataclass
class TrainState:
    """Where a run is; saved as checkpoint-*/state.json (a dict: asdict) and restored on --resume."""

    step: int = 0  # optimiser steps done
    epoch: int = 0
    step_in_epoch: int = 0  # position in the epoch's batch plan (plan_steps)
    best_val: float | None = None  # lowest validation loss so far
    bad_evals: int = 0  # validations since the best one; early stop at --patience
    done: bool = False  # early-stopped: a resumed run only saves
    evaluated_step: int | None = None  # step of the last validation
    checkpointed_step: int | None = None  # step of the last checkpoint
    best_step: int | None = None  # step of the best validation loss (best/)
    rewarm_from: int | None = (
        None  # continued from a portable copy at this step: fresh AdamW moments, lr re-warmed
    )


@dataclass
class Run:
    """What setup() fixes for this process: flags, processes, device, precision, run directory."""

    args: argparse.Namespace
    world: int  # processes (torchrun)
    rank: int
    device: torch.device
    dtype: torch.dtype  # of the base weights and of autocast (float32: no autocast)
    why_dtype: str  # how --dtype was decided (e.g. the CPU has native bf16)
    autocast: torch.autocast
    run_dir: Path


def plan_steps(lengths: list[int], batch_size: int, seed: int, epoch: int, pool: int = 32) -> list[list[int]]:
    """Length-aware batches of one epoch: shuffle (seeded by epoch), drop the remainder, sort pools of
    `pool` batches by length, cut them into batches, shuffle the batches. Pure function of its inputs."""
    rng = random.Random(f"{seed}:{epoch}:batches")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order = order[: len(order) - len(order) % batch_size]
    steps = []
    for start in range(0, len(order), pool * batch_size):
        chunk = sorted(order[start : start + pool * batch_size], key=lambda i: lengths[i])
        steps += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(steps)
    return steps


def data_sha256(encoded: list[dict]) -> str:
    """A fingerprint of encoded samples (token ids and loss positions): a resumed run must see the same."""
    digest = hashlib.sha256()
    for s in encoded:
        digest.update(json.dumps([s["ids"], s["answer_at"], s["choices"], s["target"]]).encode())
    return digest.hexdigest()


def lr_at(step: int, total: int, base_lr: float, warmup: float) -> float:
    """Linear warmup over the first `warmup` fraction of the steps, then cosine decay to 0."""
    warmup_steps = max(1, round(warmup * total))
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total - warmup_steps)
    return base_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def rewarm(step: int, rewarm_from: int | None, rewarm_steps: int) -> float:
    """The factor on the schedule's lr after a run continued from a portable copy at `rewarm_from`: AdamW's
    moments start again from zero, so the lr rises linearly over `rewarm_steps` steps while they fill."""
    if rewarm_from is None or not rewarm_from <= step < rewarm_from + rewarm_steps:
        return 1.0
    return (step - rewarm_from + 1) / (rewarm_steps + 1)


# ---------------------------------------------------------------------------- resume, run directory
def portable_copy(args: argparse.Namespace) -> Path | None:
    """Where the run's portable copy lives (--portable-dir/NAME; one cut off mid-swap is put back), or None
    without --portable-dir."""
    return (
        checkpoint.recover_portable(Path(args.portable_dir).expanduser() / args.name)
        if args.portable_dir
        else None
    )


def resume(run: Run, config: dict, model, optimizer) -> tuple[TrainState, str]:
    """The latest checkpoint's state, with LoRA weights, optimiser and RNG states restored, or, where the
    portable copy (--portable-dir) is further on or the only one, that copy's (see continue_portable); exits
    if a setting outside RESUMABLE_CHANGES differs from the saved one, or the samples do (data_sha256)."""
    local = checkpoint.latest(run.run_dir)
    where = portable_copy(run.args)
    portable = where if where and (where / "state.json").is_file() else None
    if local is None and portable is None:
        copy = f" and {where} no portable copy" if where else ""
        sys.exit(f"error: --resume but {run.run_dir} has no checkpoint{copy}; drop --resume to start the run")
    step_of = lambda path: json.loads((path / "state.json").read_text())["step"] if path else -1
    if step_of(portable) > step_of(local):
        note = check_same_run(
            json.loads((portable / "config.json").read_text()), config, run.args.accept_new_samples
        )
        return continue_portable(run, portable, model, local), f"portable copy {portable}{note}"
    note = check_same_run(
        json.loads((local / "config.json").read_text()), config, run.args.accept_new_samples
    )
    return TrainState(
        **checkpoint.load(local, model, optimizer, run.rank, run.device)
    ), f"checkpoint {local}{note}"


def check_same_run(saved: dict, config: dict, accept_new_samples: bool = False) -> str:
    """Exit if a setting outside RESUMABLE_CHANGES, or the samples (data_sha256), differ from the run's; other
    samples may be accepted (--accept-new-samples): then the note for the stretch's start line, else ''."""
    checked = config.keys() - RESUMABLE_CHANGES - {"data_sha256"}  # the fingerprint is checked below
    same = lambda k, was, now: COMPARED_AS[k](was) == COMPARED_AS[k](now) if k in COMPARED_AS else was == now
    changed = {k for k in checked if not same(k, saved.get(k, LATER_SETTINGS.get(k)), config[k])}
    if changed:
        settings = ", ".join(f"{k}={config[k]} (was {saved.get(k)})" for k in sorted(changed))
        sys.exit(f"error: --resume with different settings: {settings}")
    was, now = (
        saved.get("data_sha256", config["data_sha256"]),
        config["data_sha256"],
    )  # (older runs: unchecked)
    if was == now:
        return ""
    if not accept_new_samples:
        sys.exit(
            "error: --resume with the same settings but other samples than the run's (epoch 0 and validation, "
            "data_sha256): the data files, the code that makes samples, the search index or, with "
            "--endpoint, the endpoint's answers changed since the run started (--accept-new-samples "
            "continues with the new ones)"
        )
    print(
        f"warning: the samples changed (data_sha256 {was[:12]} -> {now[:12]}); continuing with the new ones"
    )
    return f"; samples changed, accepted: data_sha256 {was[:12]} -> {now[:12]}"


def continue_portable(run: Run, portable: Path, model, local: Path | None = None) -> TrainState:
    """Continue from a portable copy (e.g. on a fresh clone, no run directory): same step, schedule position,
    data order and RNG states; the LoRA weights are its bf16 ones, AdamW's moments start from zero and the
    lr is re-warmed over --rewarm-steps. Its logs become the run directory's; best/ stayed where the
    validation made it (the state keeps best_step and best_val, and train.py says so at the end). A best/
    of this machine's own checkpoint `local` (behind the copy) is kept only if it is still the best step's."""
    state = TrainState(**checkpoint.restore(portable, model, run.rank))
    state.rewarm_from = state.step
    if run.rank == 0:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        local_best = json.loads((local / "state.json").read_text()).get("best_step") if local else None
        if local_best != state.best_step:
            shutil.rmtree(run.run_dir / "best", ignore_errors=True)
        for name in checkpoint.RUN_LOGS:
            if (portable / name).is_file():
                shutil.copyfile(portable / name, run.run_dir / name)
        print(
            f"continuing from the portable copy {portable} at step {state.step}: LoRA weights rounded to bf16, "
            f"AdamW moments from zero, lr re-warmed over {run.args.rewarm_steps} steps"
        )
    return state


def start_run_dir(run: Run, config: dict, state: TrainState, source: str) -> None:
    """Print and save the config; keep only the log lines up to the step we (re)start from."""
    if run.rank != 0:
        return
    run.run_dir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(config, indent=1))
    (run.run_dir / "config.json").write_text(json.dumps(config, indent=1))
    log_path = run.run_dir / "log.jsonl"  # drop lines of steps after the checkpoint we resume from
    kept = (
        [r for r in read_jsonl(log_path, appended=True) if r["step"] <= state.step] if run.args.resume else []
    )
    write_jsonl(log_path, kept)
    if not run.args.resume:
        write_jsonl(run.run_dir / "stretches.jsonl", [])
    log_stretch(
        run,
        {
            "event": "start",
            "step": state.step,
            "cpu": cpu_speed.cpu_name(),
            "native_bf16": cpu_speed.native_bf16(),
            "dtype": config["dtype"],
            "why": run.why_dtype,
            "threads": torch.get_num_threads(),
            "from": source,
        },
    )


def log_stretch(run: Run, record: dict) -> None:
    """stretches.jsonl: one line where a stretch of the run starts (machine, precision) and one where it
    stops (steps, speed): a run resumed on several machines says which ran what."""
    if run.rank == 0:
        with open(run.run_dir / "stretches.jsonl", "a", encoding="utf-8") as f:
            append_jsonl(f, {**record, "time": time.strftime("%Y-%m-%d %H:%M:%S")})


# ---------------------------------------------------------------------------- the loop
class TrainingLoop:
    """Epochs -> optimiser steps of batch_size samples -> micro-batches (gradient accumulation), with
    validation (keeping the best adapter), early stopping, checkpoints and log.jsonl lines."""

    def __init__(
        self,
        run: Run,
        model,
        optimizer,
        params,
        pad_id: int,
        train_epoch,
        first_epoch: list[dict],
        val: list[dict],
        config: dict,
        state: TrainState,
        total_steps: int,
    ):
        self.run, self.args, self.model, self.optimizer, self.params = run, run.args, model, optimizer, params
        self.pad_id, self.train_epoch, self.epoch_data = pad_id, train_epoch, {0: first_epoch}
        self.val, self.config, self.state, self.total_steps = val, config, state, total_steps
        self.bar = tqdm(
            total=total_steps, initial=state.step, disable=run.rank != 0, desc="train", dynamic_ncols=True
        )
        self.seconds, self.tokens = [], 0  # of the steps run by this process

    def train(self) -> bool:
        """Train to the end (total steps or early stop); False if stopped by a signal or --stop-after."""
        args, state = self.args, self.state
        if args.eval_every and state.step == 0:
            self.validate()  # the base model's loss: where training starts
        # the epochs the schedule was planned for: fresh samples per epoch, so a later epoch may come out a
        # batch shorter than epoch 0 (it then ends the run early) or longer (its surplus is not trained)
        epochs = math.ceil(self.total_steps / self.config["steps_per_epoch"])
        with checkpoint.StopFlag() as stop:
            while not state.done and state.step < self.total_steps and state.epoch < epochs:
                epoch = state.epoch
                data = self.epoch_data.pop(epoch) if epoch in self.epoch_data else self.train_epoch(epoch)
                self.epoch_data.clear()
                steps = plan_steps([len(s["ids"]) for s in data], args.batch_size, args.seed, epoch)
                while state.step_in_epoch < len(steps) and state.step < self.total_steps:
                    self.step([data[i] for i in steps[state.step_in_epoch]], epoch)
                    if args.eval_every and state.step % args.eval_every == 0:
                        self.validate()
                    if args.stop_after and state.step >= args.stop_after:
                        stop.request()
                    stopping = self.all_agree(stop.requested or state.bad_evals >= args.patience)
                    if stopping or state.step % args.checkpoint_every == 0:
                        state.done = state.bad_evals >= args.patience
                        self.checkpoint()
                    if stopping:
                        break
                if stop.requested:
                    self.bar.close()
                    self.end_stretch("stop")
                    print(f"stopped at step {state.step}; continue with the same command plus --resume")
                    return False
                if state.step_in_epoch >= len(steps):  # epoch finished: validate, move on
                    state.epoch, state.step_in_epoch = epoch + 1, 0
                    if not args.eval_every:
                        self.validate()
                    state.done = state.done or state.bad_evals >= args.patience
                    self.checkpoint()
            if state.evaluated_step != state.step:  # e.g. --max-steps ended mid-epoch
                self.validate()
            if state.checkpointed_step != state.step:  # the end of training is always resumable
                self.checkpoint()
        self.bar.close()
        self.end_stretch("end")
        return True

    def step(self, batch: list[dict], epoch: int) -> None:
        """One optimiser step on the batch: this rank's share, accumulated over micro-batches; logs it."""
        args, run, state = self.args, self.run, self.state
        started = time.time()
        lr = lr_at(state.step, self.total_steps, args.lr, args.warmup)
        lr *= rewarm(state.step, state.rewarm_from, args.rewarm_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mine = batch[run.rank :: run.world]
        total = sum(loss.units(s, args.loss_weighting) for s in batch)  # the whole batch's denominator
        by_task = loss.backward_batch(
            self.model,
            mine,
            total,
            args.micro_batch_size,
            args.loss_weighting,
            self.pad_id,
            run.device,
            run.autocast,
            run.world,
        )
        step_loss = sum(value for value, _ in by_task.values()) / total  # this rank's part of the batch loss
        tokens = sum(len(s["ids"]) for s in mine)
        if args.clip_grad:
            torch.nn.utils.clip_grad_norm_(self.params, args.clip_grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.step_in_epoch += 1
        if run.world > 1:  # log the loss and tokens of the whole batch, not of this rank's share
            totals = torch.tensor([step_loss, float(tokens)], device=run.device)
            dist.all_reduce(totals)
            step_loss, tokens = totals.tolist()
        seconds = time.time() - started
        self.log(
            {
                "step": state.step,
                "epoch": epoch,
                "loss": step_loss,
                "lr": lr,
                "tokens": tokens,
                **{
                    f"loss_{task}": value / n for task, (value, n) in by_task.items() if n
                },  # this rank's share
                "s_per_step": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 1),
            }
        )
        self.bar.set_postfix(
            epoch=epoch, loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens / seconds:.0f}"
        )
        self.bar.update()
        self.seconds.append(seconds)
        self.tokens += tokens
        if len(self.seconds) == 3 and run.rank == 0:  # the expected duration, measured on this machine now
            per_step = sum(self.seconds) / 3
            self.bar.write(
                f"measured {per_step:.1f} s/step over 3 steps: the {self.total_steps - state.step} steps "
                f"left take ~{per_step * (self.total_steps - state.step) / 3600:.1f} h (plus validations)"
            )

    def validate(self) -> None:
        """Validation loss; a new best is saved as best/ and resets the early-stopping count."""
        state = self.state
        state.evaluated_step = state.step
        if not self.val:
            return
        result = loss.evaluate(
            self.model,
            self.val,
            self.args.micro_batch_size,
            self.pad_id,
            self.run.device,
            self.run.autocast,
            self.args.loss_weighting,
        )
        improved = state.best_val is None or result["val_loss"] < state.best_val
        state.best_val = result["val_loss"] if improved else state.best_val
        state.bad_evals = 0 if improved else state.bad_evals + 1
        state.best_step = state.step if improved else state.best_step
        self.log({"step": state.step, "epoch": state.epoch, **result, "best": improved})
        if self.run.rank == 0:
            self.bar.write(f"step {state.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
        if improved and self.run.rank == 0:
            peft_format.save_adapter(
                checkpoint.unwrap(self.model),
                self.run.run_dir / "best",
                str(self.args.model_dir),
                prompt_format=self.args.prompt_format,
            )

    def checkpoint(self) -> None:
        self.state.checkpointed_step = self.state.step
        saved = checkpoint.save(
            self.run.run_dir,
            self.model,
            self.optimizer,
            asdict(self.state),
            self.config,
            self.run.rank,
            self.run.world,
        )
        if self.args.portable_dir and self.run.rank == 0:
            checkpoint.save_portable(saved, self.run.run_dir, portable_copy(self.args))

    def end_stretch(self, how: str) -> None:
        """The stretch's line in stretches.jsonl: where it stopped, how fast its steps went."""
        seconds = sum(self.seconds)
        log_stretch(
            self.run,
            {
                "event": how,
                "step": self.state.step,
                "steps": len(self.seconds),
                "step_hours": round(seconds / 3600, 3),
                "tokens_per_s": round(self.tokens / seconds, 1) if seconds else None,
            },
        )
        portable = portable_copy(self.args)
        if (
            portable and portable.is_dir() and self.run.rank == 0
        ):  # the copy was made at the checkpoint just before
            shutil.copyfile(self.run.run_dir / "stretches.jsonl", portable / "stretches.jsonl")

    def log(self, record: dict) -> None:
        if self.run.rank == 0:
            with open(self.run.run_dir / "log.jsonl", "a", encoding="utf-8") as f:
                append_jsonl(f, record)

    def all_agree(self, stopping: bool) -> bool:
        """Stop if any rank stops (signals may reach the processes at different times)."""
        if self.run.world == 1:
            return stopping
        flag = torch.tensor(float(stopping), device=self.run.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
