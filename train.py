"""Fine-tune the base model with LoRA on GRISP's two tasks at once (paper section 3, "Training";
docs/method.md section 4).

One model learns (1) question -> SPARQL skeleton, with next-token cross-entropy on the answer tokens
(the skeleton and <|im_end|>), and (2) list-wise re-ranking, with cross-entropy restricted to the
identifier tokens (A, B, ...) present in the prompt, read at the first answer position. Samples come
from samples.py, fresh for every epoch (online) or precomputed by gen_data.py (`--samples`). Logits
are computed only at those loss positions, the batch of 8 is built by gradient accumulation, and a run
lives in `defaults.RUNS_DIR/<name>`: log.jsonl, config.json, checkpoint-*/ (adapter, optimiser, RNG
states, data position) every N steps and on SIGINT/SIGTERM, best/ (lowest validation loss) and, at the
end, adapter/ (a copy of best/ in the PEFT layout, for infer.py or `PeftModel.from_pretrained`).

main() runs the named steps in order: setup (processes, device, run directory) -> load_data -> make_model
(base + LoRA, optimiser) -> resume (or a fresh TrainState) -> TrainingLoop.train (step, validate,
checkpoint) -> save the adapter. About 480 lines, over a script's ~300: the flags and their checks take
~80, the loop with DDP, early stopping and exact resumption ~150; they stay here so that the whole
training stage reads in one file, top to bottom, as in nanoGPT's train.py.

    python train.py --data wwq                                   # the paper's setup, CPU or GPU
    python train.py --data wwq --lora-layers 8 --max-steps 40    # a short fast run on CPU
    python train.py --data wwq --name my-run --resume            # continue exactly where it stopped
    torchrun --nproc-per-node 4 train.py --data wwq              # several GPUs (DDP)
"""
import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

import checkpoint
import defaults
import lora
import loss
import peft_format
import samples
from jsonl import append_jsonl, read_jsonl, write_jsonl
from model import Transformer, pick_device
from tokenizer import Tokenizer

# flags that may differ on --resume: they change neither the samples nor the math (a different
# --micro-batch-size only changes float rounding and peak memory)
RESUMABLE_CHANGES = {"resume", "threads", "stop_after", "checkpoint_every", "keep_checkpoints", "device", "micro_batch_size"}


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


@dataclass
class Run:
    """What setup() fixes for this process: flags, processes, device, precision, run directory."""

    args: argparse.Namespace
    world: int  # processes (torchrun)
    rank: int
    device: torch.device
    dtype: torch.dtype  # of the base weights
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
        chunk = sorted(order[start:start + pool * batch_size], key=lambda i: lengths[i])
        steps += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(steps)
    return steps


def lr_at(step: int, total: int, base_lr: float, warmup: float) -> float:
    """Linear warmup over the first `warmup` fraction of the steps, then cosine decay to 0."""
    warmup_steps = max(1, round(warmup * total))
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total - warmup_steps)
    return base_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------- setup, data, model
def setup(args: argparse.Namespace) -> Run:
    """Processes (torchrun sets WORLD_SIZE/RANK/LOCAL_RANK), threads, flag checks, seed, device, run directory."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", 0)))
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if args.threads:
        torch.set_num_threads(args.threads)
    check_args(args, world)
    torch.manual_seed(args.seed + rank)
    dtype = torch.float32 if device.type == "cpu" or args.dtype == "float32" else torch.bfloat16
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    run_dir = Path(args.runs_dir).expanduser() / args.name
    if (run_dir / "latest").exists() and not args.resume:
        sys.exit(f"error: run {run_dir} exists; continue it with --resume or pick another --name")
    return Run(args, world, rank, device, dtype, autocast, run_dir)


def load_data(args, tokenizer: Tokenizer):
    """(encoded training samples of epoch e as a function of e, encoded validation samples)."""
    def prepare(rows: list[dict]) -> list[dict]:
        encoded = [loss.encode(s, tokenizer) for s in rows]
        return [e for e in encoded if len(e["ids"]) <= args.max_length]  # longer ones are skipped

    is_val = samples.validation_split(args.val_fraction, args.seed) if args.val_data is None else (lambda _: False)
    if args.samples:  # precomputed epochs; training longer than that cycles through them
        by_epoch = samples.read_samples(args.samples)
        epochs = sorted(by_epoch)
        train_epoch = lambda e: prepare([s for s in by_epoch[epochs[e % len(epochs)]] if not is_val(s["id"])])
        val = [s for s in by_epoch[epochs[0]] if is_val(s["id"])]
    else:  # fresh samples per epoch from (seed, epoch, record)
        records = samples.load_records(args.data)
        indices = samples.open_index(args.index, args.data)
        augment = samples.Augment.from_args(args)
        train = samples.SampleGenerator([r for r in records if not is_val(r["id"])], indices, augment, args.seed)
        train_epoch = lambda e: prepare(train.epoch(e)[0])
        held_out = samples.SampleGenerator([r for r in records if is_val(r["id"])], indices, augment, args.seed)
        val = held_out.epoch(0)[0]
    if args.val_data is not None and samples.is_sample_file(args.val_data):
        val = samples.read_samples(args.val_data)
        val = val[min(val)]
    elif args.val_data is not None:
        held_out = samples.SampleGenerator(samples.load_records(args.val_data), samples.open_index(args.index, args.data),
                                           samples.Augment.from_args(args), args.seed)
        val = held_out.epoch(0)[0]
    return train_epoch, prepare(val)


def make_model(run: Run):
    """(model, optimizer, LoRA parameters): the frozen base + LoRA (float32 LoRA weights; the base may
    be bf16 on GPUs), from --init-adapter if given, AdamW over the LoRA weights, DDP when world > 1."""
    args = run.args
    model = Transformer.from_pretrained(args.model_dir, run.dtype, run.device)
    layers = lora.last_layers(model, args.lora_layers) if args.lora_layers else None
    lora.inject_lora(model, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets, layers)
    if args.init_adapter:  # continue from trained LoRA weights, with a fresh optimiser and schedule
        load_init_adapter(model, args)
    lora.mark_only_lora_trainable(model)
    for p in lora.lora_state_dict(model).values():
        p.data = p.data.float()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    if run.world > 1:
        device_ids = [run.device.index] if run.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    return model, optimizer, params


def load_init_adapter(model, args) -> None:
    """LoRA weights from an adapter or a run's checkpoint directory, which must match --lora-r/--lora-alpha."""
    init = Path(args.init_adapter).expanduser()
    if (init / checkpoint.LORA_FILE).is_file():  # a run's checkpoint directory
        saved, weights = checkpoint.read_lora(init)
    else:
        saved, weights = peft_format.read_adapter_config(init), peft_format.read_adapter_weights(init)
    if (saved["r"], saved["lora_alpha"]) != (args.lora_r, args.lora_alpha):
        sys.exit(f"error: --init-adapter has r={saved['r']}, alpha={saved['lora_alpha']}; pass the same "
                 f"--lora-r and --lora-alpha (and --lora-layers, --lora-targets)")
    try:
        lora.load_lora_state_dict(model, weights)
    except ValueError as error:
        sys.exit(f"error: --init-adapter {args.init_adapter}: {error}")


# ---------------------------------------------------------------------------- resume, run directory
def resume(run: Run, config: dict, model, optimizer) -> TrainState:
    """The latest checkpoint's state, with LoRA weights, optimiser and RNG states restored; exits if a
    setting outside RESUMABLE_CHANGES differs from the checkpoint's."""
    latest = run.run_dir / "latest"
    if not latest.exists():
        sys.exit(f"error: --resume but {run.run_dir} has no checkpoint; drop --resume to start the run")
    saved = json.loads((run.run_dir / latest.read_text() / "config.json").read_text())
    changed = {k for k in config if k not in RESUMABLE_CHANGES and saved.get(k) != config[k]}
    if changed:
        sys.exit(f"error: --resume with different settings: {', '.join(f'{k}={config[k]} (was {saved.get(k)})' for k in sorted(changed))}")
    return TrainState(**checkpoint.load(run.run_dir / latest.read_text(), model, optimizer, run.rank, run.device))


def start_run_dir(run: Run, config: dict, state: TrainState) -> None:
    """Print and save the config; keep only the log lines up to the step we (re)start from."""
    if run.rank != 0:
        return
    run.run_dir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(config, indent=1))
    (run.run_dir / "config.json").write_text(json.dumps(config, indent=1))
    log_path = run.run_dir / "log.jsonl"  # drop lines of steps after the checkpoint we resume from
    kept = [r for r in read_jsonl(log_path, appended=True) if r["step"] <= state.step] if run.args.resume else []
    write_jsonl(log_path, kept)


# ---------------------------------------------------------------------------- the loop
class TrainingLoop:
    """Epochs -> optimiser steps of batch_size samples -> micro-batches (gradient accumulation), with
    validation (keeping the best adapter), early stopping, checkpoints and log.jsonl lines."""

    def __init__(self, run: Run, model, optimizer, params, pad_id: int, train_epoch, first_epoch: list[dict],
                 val: list[dict], config: dict, state: TrainState, total_steps: int):
        self.run, self.args, self.model, self.optimizer, self.params = run, run.args, model, optimizer, params
        self.pad_id, self.train_epoch, self.epoch_data = pad_id, train_epoch, {0: first_epoch}
        self.val, self.config, self.state, self.total_steps = val, config, state, total_steps
        self.bar = tqdm(total=total_steps, initial=state.step, disable=run.rank != 0, desc="train", dynamic_ncols=True)

    def train(self) -> bool:
        """Train to the end (total steps or early stop); False if stopped by a signal or --stop-after."""
        args, run, state = self.args, self.run, self.state
        if args.eval_every and state.step == 0:
            self.validate()  # the base model's loss: where training starts
        with checkpoint.StopFlag() as stop:
            while not state.done and state.step < self.total_steps:
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
        return True

    def step(self, batch: list[dict], epoch: int) -> None:
        """One optimiser step on the batch: this rank's share, accumulated over micro-batches; logs it."""
        args, run, state = self.args, self.run, self.state
        started = time.time()
        lr = lr_at(state.step, self.total_steps, args.lr, args.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mine = batch[run.rank::run.world]
        total = sum(loss.units(s, args.loss_weighting) for s in batch)  # the whole batch's denominator
        by_task = backward_batch(self.model, mine, total, args.micro_batch_size, args.loss_weighting, self.pad_id,
                                 run.device, run.autocast, run.world)
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
        self.log({"step": state.step, "epoch": epoch, "loss": step_loss, "lr": lr, "tokens": tokens,
                  **{f"loss_{task}": value / n for task, (value, n) in by_task.items() if n},  # this rank's share
                  "s_per_step": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)})
        self.bar.set_postfix(epoch=epoch, loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens / seconds:.0f}")
        self.bar.update()

    def validate(self) -> None:
        """Validation loss; a new best is saved as best/ and resets the early-stopping count."""
        state = self.state
        state.evaluated_step = state.step
        if not self.val:
            return
        result = evaluate(self.model, self.val, self.args.micro_batch_size, self.pad_id, self.run.device, self.run.autocast,
                          self.args.loss_weighting)
        improved = state.best_val is None or result["val_loss"] < state.best_val
        state.best_val = result["val_loss"] if improved else state.best_val
        state.bad_evals = 0 if improved else state.bad_evals + 1
        self.log({"step": state.step, "epoch": state.epoch, **result, "best": improved})
        if self.run.rank == 0:
            self.bar.write(f"step {state.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
        if improved and self.run.rank == 0:
            peft_format.save_adapter(checkpoint.unwrap(self.model), self.run.run_dir / "best", str(self.args.model_dir))

    def checkpoint(self) -> None:
        self.state.checkpointed_step = self.state.step
        checkpoint.save(self.run.run_dir, self.model, self.optimizer, asdict(self.state), self.config,
                        self.run.rank, self.run.world)

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


def backward_batch(model, mine: list[dict], total: int, micro_batch_size: int, weighting: str, pad_id: int,
                   device, autocast, world: int = 1) -> dict[str, tuple[float, int]]:
    """Accumulate the gradient of sum(sample losses of `mine`) / `total` over micro-batches, where
    `total` is the units of the whole batch (loss.units: counted before any micro-batch, so the result
    is the whole batch's loss however it is split); DDP averages gradients over the `world` processes,
    hence the factor. Returns per task (summed sample losses, units) of `mine`."""
    by_task = {"skeleton": (0.0, 0), "rerank": (0.0, 0)}
    micro = [mine[i:i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]
    for j, batch in enumerate(micro):
        sync = nullcontext() if world == 1 or j == len(micro) - 1 else model.no_sync()
        with sync, autocast:
            losses, _ = loss.sample_losses(model, to_device(loss.collate(batch, pad_id, weighting), device))
            (losses.sum() * world / total).backward()
        for s, value in zip(batch, losses.tolist()):
            task = "rerank" if s["choices"] else "skeleton"
            by_task[task] = (by_task[task][0] + value, by_task[task][1] + loss.units(s, weighting))
    return by_task


@torch.no_grad()
def evaluate(model, val: list[dict], micro_batch: int, pad_id: int, device, autocast, weighting: str) -> dict:
    """Validation loss as training weighs it (sum of losses / units), the same per task, and the
    re-ranking accuracy (no dropout, no RNG use)."""
    model.eval()
    totals = {"skeleton": [0.0, 0], "rerank": [0.0, 0]}
    correct_reranks = []
    order = sorted(range(len(val)), key=lambda i: len(val[i]["ids"]))
    for start in range(0, len(order), micro_batch):
        batch = [val[i] for i in order[start:start + micro_batch]]
        with autocast:
            losses, correct = loss.sample_losses(model, to_device(loss.collate(batch, pad_id, weighting), device))
        for s, value, ok in zip(batch, losses.tolist(), correct.tolist()):
            task = "rerank" if s["choices"] else "skeleton"
            totals[task][0] += value
            totals[task][1] += loss.units(s, weighting)
            if s["choices"]:
                correct_reranks.append(float(ok))
    model.train()
    mean = {task: value / n if n else float("nan") for task, (value, n) in totals.items()}
    units = totals["skeleton"][1] + totals["rerank"][1]
    return {"val_loss": (totals["skeleton"][0] + totals["rerank"][0]) / max(1, units),
            "val_skeleton": mean["skeleton"], "val_rerank": mean["rerank"],
            "val_rerank_acc": sum(correct_reranks) / len(correct_reranks) if correct_reranks else float("nan")}


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


# ---------------------------------------------------------------------------- main
def main(args: argparse.Namespace) -> None:
    # --- setup: processes, device, run directory
    run = setup(args)

    # --- data
    tokenizer = Tokenizer(args.model_dir)
    train_epoch, val = load_data(args, tokenizer)
    first_epoch = train_epoch(0)
    steps_per_epoch = len(first_epoch) // args.batch_size
    if steps_per_epoch == 0:
        sys.exit(f"error: {len(first_epoch)} training samples do not fill one batch of {args.batch_size}")
    total_steps = min(args.epochs * steps_per_epoch, args.max_steps or math.inf)

    # --- model: frozen base + LoRA, optimiser
    model, optimizer, params = make_model(run)

    # --- config (as saved: paths become strings), state: fresh or from the latest checkpoint
    config = vars(args) | {"world_size": run.world, "device": str(run.device), "dtype": str(run.dtype).removeprefix("torch."),
                           "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
                           "train_samples_epoch0": len(first_epoch), "val_samples": len(val),
                           "trainable_parameters": sum(p.numel() for p in params)}
    config = json.loads(json.dumps(config, default=str))
    state = resume(run, config, model, optimizer) if args.resume else TrainState()
    start_run_dir(run, config, state)

    # --- loop
    loop = TrainingLoop(run, model, optimizer, params, tokenizer.pad_id, train_epoch, first_epoch, val, config, state,
                        total_steps)
    if not loop.train():
        return  # stopped: resumable from the checkpoint just written

    # --- save: the best adapter by validation loss (or the last one without validation data)
    if run.rank == 0:
        if not (run.run_dir / "best").exists() or not val:
            peft_format.save_adapter(checkpoint.unwrap(model), run.run_dir / "best", str(args.model_dir))
        shutil.rmtree(run.run_dir / "adapter", ignore_errors=True)
        shutil.copytree(run.run_dir / "best", run.run_dir / "adapter")
        print(f"adapter (best validation loss {state.best_val}) saved to {run.run_dir / 'adapter'}")
    if run.world > 1:
        dist.destroy_process_group()


def check_args(args: argparse.Namespace, world: int) -> None:
    """Bad settings exit with a message naming the flag and the fix."""
    problems = [msg for bad, msg in [
        (not (Path(args.model_dir).expanduser() / "config.json").exists(),
         f"--model-dir {args.model_dir} has no config.json; run `python get_model.py` or pass --model-dir"),
        (args.samples and not Path(args.samples).expanduser().is_file(), f"--samples {args.samples} does not exist"),
        (args.init_adapter and not any((Path(args.init_adapter).expanduser() / name).is_file()
                                       for name in (peft_format.CONFIG_NAME, checkpoint.LORA_FILE)),
         f"--init-adapter {args.init_adapter} is neither an adapter nor a checkpoint directory"),
        (args.batch_size < 1 or args.batch_size % world, f"--batch-size {args.batch_size} must be a positive multiple of the {world} processes"),
        (args.micro_batch_size < 1, f"--micro-batch-size must be at least 1, got {args.micro_batch_size}"),
        (args.epochs < 1, f"--epochs must be at least 1, got {args.epochs}"),
        (not 0 <= args.val_fraction < 1, f"--val-fraction must be in [0, 1), got {args.val_fraction}"),
        (args.lr <= 0 or not 0 <= args.warmup < 1, f"need --lr > 0 and 0 <= --warmup < 1, got {args.lr}, {args.warmup}"),
        (args.checkpoint_every < 1 or args.keep_checkpoints < 1, "--checkpoint-every and --keep-checkpoints must be at least 1"),
    ] if bad]
    if problems:
        sys.exit("error: " + "; ".join(problems))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Fine-tune Qwen2.5 with LoRA jointly on SPARQL skeletons and "
                                     "list-wise re-ranking (GRISP).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # data
    group = parser.add_argument_group("data")
    group.add_argument("--data", default="wwq", help="wwq (WikiWebQuestions train), demo, or a benchmark JSONL path; samples are generated online, fresh per epoch")
    group.add_argument("--samples", default=None, help="precomputed samples from gen_data.py --out (instead of online generation)")
    group.add_argument("--index", default=None, help=f"search index for online generation (default: demo index for demo, else {samples.WIKIDATA_INDEX_DIR}, built if missing)")
    group.add_argument("--val-fraction", type=float, default=0.05, help="records held out (by id hash) for the validation loss")
    group.add_argument("--val-data", default=None, help="validation benchmark or samples file instead of the held-out slice")
    group.add_argument("--max-length", type=int, default=1024, help="skip samples with more tokens than this")
    group.add_argument("--seed", type=int, default=0, help="seed of the samples, batch order, LoRA init and dropout")
    samples.add_generation_args(parser.add_argument_group("augmentation (online generation)"))
    # model
    group = parser.add_argument_group("model")
    group.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory (Hugging Face Qwen2 layout)")
    group.add_argument("--dtype", default="auto", choices=["auto", "float32"], help="base weights: auto = float32 on CPU, bfloat16 with autocast on GPUs")
    # LoRA
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora-r", type=int, default=32, help="rank")
    group.add_argument("--lora-alpha", type=float, default=32, help="scaling alpha (update scaled by alpha / r)")
    group.add_argument("--lora-dropout", type=float, default=0.05, help="dropout on the LoRA input")
    group.add_argument("--lora-targets", nargs="+", default=list(lora.DEFAULT_TARGETS), help="module names that get LoRA (default: all linear layers of the blocks)")
    group.add_argument("--init-adapter", default=None, help="start from these LoRA weights, an adapter or a run's checkpoint-* directory (same r, alpha, targets, layers), instead of LoRA's zero update")
    group.add_argument("--lora-layers", type=int, default=0, help="LoRA on the last N blocks only (faster on CPU; 0 = all blocks)")
    # optimisation
    group = parser.add_argument_group("optimisation")
    group.add_argument("--epochs", type=int, default=4, help="passes over the training records")
    group.add_argument("--batch-size", type=int, default=8, help="samples per optimiser step (over all processes)")
    group.add_argument("--micro-batch-size", type=int, default=1, help="samples per forward pass (the batch is accumulated from these); "
                       "more is faster on GPUs but costs memory (CPU, 0.5B, 4: ~7 GB with --lora-layers 8, ~10 GB without)")
    group.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (AdamW)")
    group.add_argument("--warmup", type=float, default=0.05, help="fraction of steps with linear warmup, then cosine decay to 0")
    group.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    group.add_argument("--clip-grad", type=float, default=1.0, help="clip the gradient norm (0 = off)")
    group.add_argument("--loss-weighting", choices=loss.WEIGHTINGS, default="reference",
                       help="reference: sum of all skeleton-token and re-ranking cross-entropies of the batch / "
                            "(skeleton tokens + re-ranking rows), as the reference implementation; per-sample: "
                            "each sample weighs 1, a skeleton's tokens averaged (the first adapter's)")
    group.add_argument("--max-steps", type=int, default=0, help="train at most this many steps; the schedule spans them (0 = all epochs)")
    group.add_argument("--eval-every", type=int, default=0, help="validation loss every N steps (0 = after each epoch)")
    group.add_argument("--patience", type=int, default=2, help="stop after this many validations without a new best loss")
    # checkpoints
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--runs-dir", default=str(defaults.RUNS_DIR), help="where runs live")
    group.add_argument("--name", default="grisp", help="run name: the run directory is RUNS_DIR/NAME")
    group.add_argument("--checkpoint-every", type=int, default=50, help="checkpoint every N steps (and on SIGINT/SIGTERM, at each epoch end)")
    group.add_argument("--keep-checkpoints", type=int, default=2, help="keep the newest N checkpoints")
    group.add_argument("--resume", action="store_true", help="continue the run NAME exactly from its latest checkpoint")
    group.add_argument("--stop-after", type=int, default=0, help="act as if interrupted after step N (checkpoint and exit; for testing)")
    # CPU
    group = parser.add_argument_group("CPU / device")
    group.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    group.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
    return parser


if __name__ == "__main__":
    try:
        main(make_parser().parse_args())
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
