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
checkpoint) -> save the adapter. About 540 lines, over a script's ~300: the flags and their checks take
~110 and the device recipes with the duration estimate ~40, the loop with DDP, early stopping and
exact resumption ~150; they stay here so that the whole training stage reads in one file, top to
bottom, as in nanoGPT's train.py (the loss of a batch and of the validation set is loss.py's, the data
mixture mixture.py's).

Flags left unset take the device's recipe: on a CPU the shipped adapter's (LoRA on the last 8 blocks,
micro-batches of 4, 2 epochs), on a GPU the paper's (all blocks, 4 epochs). The plan and, on a CPU, its
expected duration are printed before the first step and re-measured after three.

    python train.py --data wwq                                   # the device's recipe (CPU: the shipped adapter's)
    python train.py --data wwq,qald10,qald7,lcquad2,sq,spinach   # the training mixture
    python train.py --data wwq --max-steps 40                    # a short run
    python train.py --data wwq --name my-run --resume            # continue exactly where it stopped
    torchrun --nproc-per-node 4 train.py --data wwq              # several GPUs (DDP)
"""
import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

import checkpoint
import defaults
import lora
import loss
import mixture
import peft_format
import samples
from jsonl import append_jsonl, read_jsonl, write_jsonl
import cpu_speed
from model import Transformer, pick_device
from prompts import LATEST_PROMPT_FORMAT, PROMPT_FORMATS
from sparql import SparqlClient
from tokenizer import Tokenizer

# Flags left unset take the recipe of the device (`apply_recipe`): on a CPU the shipped adapter's (LoRA on
# the last 8 blocks, micro-batches of 4), on a GPU the paper's (all blocks); 2 epochs on a CPU, 4 on a GPU.
RECIPES = {"cpu": {"lora_layers": 8, "micro_batch_size": 4, "epochs": 2},
           "gpu": {"lora_layers": 0, "micro_batch_size": 1, "epochs": 4}}
# CPU seconds per token of a training step, a + b x (blocks with LoRA), fitted to the mixture's comparison
# runs here (0.5B model, 2 threads; README, Training): all tokens over all seconds, 81 tokens/s with LoRA on
# the last 8 blocks (cmp-l8-per-sample, 90 steps) and 46 tokens/s on all 24 (cmp-l24-reference, 33 steps)
CPU_SECONDS_PER_TOKEN = (7.5e-3, 0.6e-3)

# flags that may differ on --resume: they change neither the samples nor the math (a different
# --micro-batch-size or precision only changes float rounding and peak memory: a run may move to a machine of
# the other kind; --runs-dir: a run moved elsewhere)
RESUMABLE_CHANGES = {"resume", "threads", "stop_after", "checkpoint_every", "keep_checkpoints", "device", "micro_batch_size",
                     "runs_dir", "dtype", "portable_dir", "rewarm_steps"}


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
    rewarm_from: int | None = None  # continued from a portable copy at this step: fresh AdamW moments, lr re-warmed


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
        chunk = sorted(order[start:start + pool * batch_size], key=lambda i: lengths[i])
        steps += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
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


# ---------------------------------------------------------------------------- setup, data, model
def setup(args: argparse.Namespace) -> Run:
    """Processes (torchrun sets WORLD_SIZE/RANK/LOCAL_RANK), threads, flag checks, seed, device, run directory."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", 0)))
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if args.threads:
        torch.set_num_threads(args.threads)
    apply_recipe(args, device)
    check_args(args, world)
    torch.manual_seed(args.seed + rank)
    dtype, why_dtype = cpu_speed.pick_dtype(args.dtype, device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    run_dir = Path(args.runs_dir).expanduser() / args.name
    if (run_dir / "latest").exists() and not args.resume:
        sys.exit(f"error: run {run_dir} exists; continue it with --resume or pick another --name")
    return Run(args, world, rank, device, dtype, why_dtype, autocast, run_dir)


def apply_recipe(args: argparse.Namespace, device: torch.device) -> None:
    """Set the flags left unset (None) to the device's recipe (RECIPES); a model with no more blocks
    than the recipe's LoRA blocks gets LoRA on all of them."""
    for name, value in RECIPES["cpu" if device.type == "cpu" else "gpu"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
            if name == "lora_layers" and (Path(args.model_dir).expanduser() / "config.json").is_file():
                blocks = json.loads((Path(args.model_dir).expanduser() / "config.json").read_text())["num_hidden_layers"]
                args.lora_layers = 0 if value >= blocks else value


def describe_plan(args, device: torch.device, total_steps: int, first_epoch: list[dict], blocks: int) -> str:
    """The recipe in use and, on a CPU, the expected duration (CPU_SECONDS_PER_TOKEN; re-measured after 3 steps)."""
    layers = f"the last {args.lora_layers}" if args.lora_layers else f"all {blocks}"
    tokens = args.batch_size * sum(len(s["ids"]) for s in first_epoch) / max(1, len(first_epoch))
    plan = (f"{'CPU recipe (the shipped adapter' if device.type == 'cpu' else 'GPU recipe (the paper'}'s; flags "
            f"given override it): LoRA r={args.lora_r} on {layers} blocks, {args.epochs} epochs, batches of "
            f"{args.batch_size} in micro-batches of {args.micro_batch_size}: {total_steps} steps of ~{tokens:.0f} tokens")
    if device.type != "cpu":
        return plan
    a, b = CPU_SECONDS_PER_TOKEN
    seconds = total_steps * tokens * (a + b * (args.lora_layers or blocks))
    return (f"{plan}; expected ~{seconds / 3600:.1f} h ({seconds / max(1, total_steps):.0f} s/step, measured for the "
            f"0.5B model on 2 idle CPU threads; re-measured after 3 steps). Stop with Ctrl-C and continue with --resume.")


def load_data(args, tokenizer: Tokenizer):
    """(encoded training samples of epoch e as a function of e, encoded validation samples)."""
    def prepare(rows: list[dict]) -> list[dict]:
        encoded = [loss.encode(s, tokenizer) for s in rows]
        return [e for e in encoded if len(e["ids"]) <= args.max_length]  # longer ones are skipped

    is_val = samples.validation_split(args.val_fraction, args.seed) if args.val_data is None else (lambda _: False)
    augment, client = samples.Augment.from_args(args), SparqlClient(args.endpoint) if args.endpoint else None

    def generator(records: list[dict], weights: dict) -> samples.SampleGenerator:
        return samples.SampleGenerator(records, indices, augment, args.seed, weights, args.prompt_format, client)

    if args.samples:  # precomputed epochs; training longer than that cycles through them
        by_epoch = samples.read_samples(args.samples)
        check_prompt_format(args.samples, by_epoch, args.prompt_format)
        epochs = sorted(by_epoch)
        train_epoch = lambda e: prepare([s for s in by_epoch[epochs[e % len(epochs)]] if not is_val(s["id"])])
        val = [s for s in by_epoch[epochs[0]] if is_val(s["id"])]
    else:  # fresh samples per epoch from (seed, epoch, record), the records drawn by the mixture's weights
        data = mixture.read(args.data)
        indices = samples.open_index(args.index, args.data)
        data.prepare(indices)
        if os.environ.get("RANK", "0") == "0":
            print(data.table(is_val if args.val_data is None else None))
        train = generator([r for r in data.usable if not is_val(r["id"])], data.weights)
        train_epoch = lambda e: prepare(train.epoch(e)[0])
        # validation: every held-out record once at most (a weight above 1 repeats nothing new)
        val = generator([r for r in data.usable if is_val(r["id"])], {k: min(1.0, w) for k, w in data.weights.items()})
        val = val.epoch(0)[0]
    if args.val_data is not None and samples.is_sample_file(args.val_data):
        val = samples.read_samples(args.val_data)
        check_prompt_format(args.val_data, val, args.prompt_format)
        val = val[min(val)]
    elif args.val_data is not None:
        indices = samples.open_index(args.index, args.data)
        val = generator(mixture.read(args.val_data).prepare(indices).usable, {}).epoch(0)[0]
    return train_epoch, prepare(val)


def check_prompt_format(path: str, by_epoch: dict[int, list[dict]], prompt_format: str) -> None:
    """Precomputed re-ranking samples must be in the run's prompt format (samples without the field: v1)."""
    found = {s.get("prompt_format", "v1") for rows in by_epoch.values() for s in rows if s["task"] == "rerank"}
    if found - {prompt_format}:
        sys.exit(f"error: {path} holds re-ranking prompts in format {', '.join(sorted(found))}, not --prompt-format "
                 f"{prompt_format}; make them with gen_data.py --prompt-format {prompt_format} or pass that format")


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
def resume(run: Run, config: dict, model, optimizer) -> tuple[TrainState, str]:
    """The latest checkpoint's state, with LoRA weights, optimiser and RNG states restored, or, where the
    portable copy (--portable-dir) is further on or the only one, that copy's (see continue_portable); exits
    if a setting outside RESUMABLE_CHANGES differs from the saved one, or the samples do (data_sha256)."""
    latest = run.run_dir / "latest"
    local = run.run_dir / latest.read_text() if latest.exists() else None
    portable = Path(run.args.portable_dir).expanduser() / run.args.name if run.args.portable_dir else None
    portable = portable if portable and (portable / "state.json").is_file() else None
    if local is None and portable is None:
        sys.exit(f"error: --resume but {run.run_dir} has no checkpoint"
                 f"{' and ' + str(Path(run.args.portable_dir) / run.args.name) + ' no portable copy' if run.args.portable_dir else ''}"
                 f"; drop --resume to start the run")
    step_of = lambda path: json.loads((path / "state.json").read_text())["step"] if path else -1
    if step_of(portable) > step_of(local):
        check_same_run(json.loads((portable / "config.json").read_text()), config)
        return continue_portable(run, portable, model), f"portable copy {portable}"
    check_same_run(json.loads((local / "config.json").read_text()), config)
    return TrainState(**checkpoint.load(local, model, optimizer, run.rank, run.device)), f"checkpoint {local}"


def check_same_run(saved: dict, config: dict) -> None:
    """Exit if a setting outside RESUMABLE_CHANGES, or the samples (data_sha256), differ from the run's."""
    checked = config.keys() - RESUMABLE_CHANGES - {"data_sha256"}  # the fingerprint is checked below
    changed = {k for k in checked if saved.get(k) != config[k]}
    if changed:
        sys.exit(f"error: --resume with different settings: {', '.join(f'{k}={config[k]} (was {saved.get(k)})' for k in sorted(changed))}")
    if saved.get("data_sha256", config["data_sha256"]) != config["data_sha256"]:  # (runs from before it: unchecked)
        sys.exit("error: --resume with the same settings but other samples than the run's (epoch 0 and validation, "
                 "data_sha256): the data files, the code that makes samples or, with --endpoint, the endpoint's "
                 "answers changed since the run started")


def continue_portable(run: Run, portable: Path, model) -> TrainState:
    """Continue from a portable copy (e.g. on a fresh clone, no run directory): same step, schedule position,
    data order and RNG states; the LoRA weights are its bf16 ones, AdamW's moments start from zero and the
    lr is re-warmed over --rewarm-steps. Its logs and best/ become the run directory's."""
    state = TrainState(**checkpoint.load_portable(portable, model, run.rank))
    state.rewarm_from = state.step
    if run.rank == 0:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        for name in checkpoint.RUN_LOGS:
            if (portable / name).is_file():
                shutil.copyfile(portable / name, run.run_dir / name)
        if (portable / "best").is_dir():
            shutil.rmtree(run.run_dir / "best", ignore_errors=True)
            shutil.copytree(portable / "best", run.run_dir / "best")
        print(f"continuing from the portable copy {portable} at step {state.step}: LoRA weights rounded to bf16, "
              f"AdamW moments from zero, lr re-warmed over {run.args.rewarm_steps} steps")
    return state


def start_run_dir(run: Run, config: dict, state: TrainState, source: str) -> None:
    """Print and save the config; keep only the log lines up to the step we (re)start from."""
    if run.rank != 0:
        return
    run.run_dir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(config, indent=1))
    (run.run_dir / "config.json").write_text(json.dumps(config, indent=1))
    log_path = run.run_dir / "log.jsonl"  # drop lines of steps after the checkpoint we resume from
    kept = [r for r in read_jsonl(log_path, appended=True) if r["step"] <= state.step] if run.args.resume else []
    write_jsonl(log_path, kept)
    if not run.args.resume:
        write_jsonl(run.run_dir / "stretches.jsonl", [])
    log_stretch(run, {"event": "start", "step": state.step, "cpu": cpu_speed.cpu_name(), "native_bf16": cpu_speed.native_bf16(),
                      "dtype": config["dtype"], "why": run.why_dtype, "threads": torch.get_num_threads(),
                      "from": source})


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

    def __init__(self, run: Run, model, optimizer, params, pad_id: int, train_epoch, first_epoch: list[dict],
                 val: list[dict], config: dict, state: TrainState, total_steps: int):
        self.run, self.args, self.model, self.optimizer, self.params = run, run.args, model, optimizer, params
        self.pad_id, self.train_epoch, self.epoch_data = pad_id, train_epoch, {0: first_epoch}
        self.val, self.config, self.state, self.total_steps = val, config, state, total_steps
        self.bar = tqdm(total=total_steps, initial=state.step, disable=run.rank != 0, desc="train", dynamic_ncols=True)
        self.seconds, self.tokens = [], 0  # of the steps run by this process

    def train(self) -> bool:
        """Train to the end (total steps or early stop); False if stopped by a signal or --stop-after."""
        args, state = self.args, self.state
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
        lr = lr_at(state.step, self.total_steps, args.lr, args.warmup) * rewarm(state.step, state.rewarm_from, args.rewarm_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mine = batch[run.rank::run.world]
        total = sum(loss.units(s, args.loss_weighting) for s in batch)  # the whole batch's denominator
        by_task = loss.backward_batch(self.model, mine, total, args.micro_batch_size, args.loss_weighting, self.pad_id,
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
        self.seconds.append(seconds)
        self.tokens += tokens
        if len(self.seconds) == 3 and run.rank == 0:  # the expected duration, measured on this machine now
            per_step = sum(self.seconds) / 3
            self.bar.write(f"measured {per_step:.1f} s/step over 3 steps: the {self.total_steps - state.step} steps "
                           f"left take ~{per_step * (self.total_steps - state.step) / 3600:.1f} h (plus validations)")

    def validate(self) -> None:
        """Validation loss; a new best is saved as best/ and resets the early-stopping count."""
        state = self.state
        state.evaluated_step = state.step
        if not self.val:
            return
        result = loss.evaluate(self.model, self.val, self.args.micro_batch_size, self.pad_id, self.run.device, self.run.autocast,
                          self.args.loss_weighting)
        improved = state.best_val is None or result["val_loss"] < state.best_val
        state.best_val = result["val_loss"] if improved else state.best_val
        state.bad_evals = 0 if improved else state.bad_evals + 1
        state.best_step = state.step if improved else state.best_step
        self.log({"step": state.step, "epoch": state.epoch, **result, "best": improved})
        if self.run.rank == 0:
            self.bar.write(f"step {state.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in result.items()))
        if improved and self.run.rank == 0:
            peft_format.save_adapter(checkpoint.unwrap(self.model), self.run.run_dir / "best", str(self.args.model_dir),
                                     prompt_format=self.args.prompt_format)

    def checkpoint(self) -> None:
        self.state.checkpointed_step = self.state.step
        saved = checkpoint.save(self.run.run_dir, self.model, self.optimizer, asdict(self.state), self.config,
                                self.run.rank, self.run.world)
        if self.args.portable_dir and self.run.rank == 0:
            checkpoint.save_portable(saved, self.run.run_dir, Path(self.args.portable_dir).expanduser() / self.args.name)

    def end_stretch(self, how: str) -> None:
        """The stretch's line in stretches.jsonl: where it stopped, how fast its steps went."""
        seconds = sum(self.seconds)
        log_stretch(self.run, {"event": how, "step": self.state.step, "steps": len(self.seconds), "step_hours": round(seconds / 3600, 3),
                               "tokens_per_s": round(self.tokens / seconds, 1) if seconds else None})
        portable = Path(self.args.portable_dir).expanduser() / self.args.name if self.args.portable_dir else None
        if portable and portable.is_dir() and self.run.rank == 0:  # the copy was made at the checkpoint just before
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
    if run.rank == 0:
        print(describe_plan(args, run.device, total_steps, first_epoch, checkpoint.unwrap(model).args.num_hidden_layers))
        print(f"precision: {run.why_dtype}")

    # --- config (as saved: paths become strings), state: fresh or from the latest checkpoint
    config = vars(args) | {"world_size": run.world, "device": str(run.device), "dtype": str(run.dtype).removeprefix("torch."),
                           "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
                           "train_samples_epoch0": len(first_epoch), "val_samples": len(val),
                           "data_sha256": data_sha256(first_epoch + val),
                           "trainable_parameters": sum(p.numel() for p in params)}
    config = json.loads(json.dumps(config, default=str))
    state, source = resume(run, config, model, optimizer) if args.resume else (TrainState(), "the base model")
    start_run_dir(run, config, state, source)

    # --- loop
    loop = TrainingLoop(run, model, optimizer, params, tokenizer.pad_id, train_epoch, first_epoch, val, config, state,
                        total_steps)
    if not loop.train():
        return  # stopped: resumable from the checkpoint just written

    # --- save: the best adapter by validation loss (or the last one without validation data)
    if run.rank == 0:
        if not (run.run_dir / "best").exists() or not val:
            peft_format.save_adapter(checkpoint.unwrap(model), run.run_dir / "best", str(args.model_dir),
                                     prompt_format=args.prompt_format)
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
    group.add_argument("--data", default="wwq", help="the training mixture (mixture.py): comma-separated sources, each with an "
                       "optional weight = uses of each record per epoch (e.g. wwq,qald10,lcquad2:0.3); a source is "
                       f"{', '.join(mixture.SOURCES)}, demo, a benchmarks.py name or a JSONL path; samples are made "
                       "online, fresh per epoch; the QALD-10 hold-out (qald10-dev) is never among them")
    group.add_argument("--samples", default=None, help="precomputed samples from gen_data.py --out (instead of online "
                       "generation), or agent conversations from gen_agent_data.py")
    group.add_argument("--index", default=None, help=f"search index for online generation (default: demo index for demo, else {samples.WIKIDATA_INDEX_DIR}, built if missing)")
    group.add_argument("--val-fraction", type=float, default=0.05, help="records held out (by id hash) for the validation loss")
    group.add_argument("--val-data", default=None, help="validation benchmark or samples file instead of the held-out slice")
    group.add_argument("--max-length", type=int, default=1024, help="skip samples with more tokens than this")
    group.add_argument("--seed", type=int, default=0, help="seed of the samples, batch order, LoRA init and dropout")
    group.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=LATEST_PROMPT_FORMAT,
                       help="re-ranking prompt format (prompts.py), saved with the adapter (v1: the first adapter's)")
    group.add_argument("--endpoint", default=None, help="SPARQL endpoint of the KG, for the constrained re-ranking samples "
                       "(--constrain); without it no sample is constrained")
    samples.add_generation_args(parser.add_argument_group("augmentation (online generation)"))
    # model
    group = parser.add_argument_group("model")
    group.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory (Hugging Face Qwen2 layout)")
    group.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="precision of the base "
                       "weights and the compute (bfloat16: under autocast; the LoRA weights and AdamW stay float32): auto = "
                       "bfloat16 on GPUs and on CPUs with native bf16 (flag avx512_bf16/amx_bf16/bf16), float32 on other "
                       "CPUs, where bf16 is several times slower; may change on --resume")
    # LoRA
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora-r", type=int, default=32, help="rank")
    group.add_argument("--lora-alpha", type=float, default=32, help="scaling alpha (update scaled by alpha / r)")
    group.add_argument("--lora-dropout", type=float, default=0.05, help="dropout on the LoRA input")
    group.add_argument("--lora-targets", nargs="+", default=list(lora.DEFAULT_TARGETS), help="module names that get LoRA (default: all linear layers of the blocks)")
    group.add_argument("--init-adapter", default=None, help="start from these LoRA weights, an adapter or a run's checkpoint-* directory (same r, alpha, targets, layers), instead of LoRA's zero update")
    group.add_argument("--lora-layers", type=int, default=None, help="LoRA on the last N blocks only (0 = all blocks); "
                       "unset: 8 on a CPU (the shipped adapter's), all on a GPU (the paper's)")
    # optimisation
    group = parser.add_argument_group("optimisation")
    group.add_argument("--epochs", type=int, default=None, help="passes over the training records; unset: 2 on a CPU, "
                       "4 on a GPU (the paper's)")
    group.add_argument("--batch-size", type=int, default=8, help="samples per optimiser step (over all processes)")
    group.add_argument("--micro-batch-size", type=int, default=None, help="samples per forward pass (the batch is accumulated "
                       "from these); more is faster but costs memory (CPU, 0.5B, 4: ~7 GB with --lora-layers 8, ~10 GB "
                       "without); unset: 4 on a CPU, 1 on a GPU")
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
    group.add_argument("--portable-dir", default=None, help="also write a portable copy of the run's state to DIR/NAME at "
                       "every checkpoint (bf16 LoRA weights, RNG, position, logs, best/; no AdamW moments: ~35 MB for LoRA "
                       "r=32 on 24 blocks), small enough to commit to git; --resume continues from it where the run "
                       "directory is missing or behind it (e.g. on a fresh clone)")
    group.add_argument("--rewarm-steps", type=int, default=20, help="after continuing from a portable copy, raise the lr "
                       "linearly over this many steps while AdamW's moments fill again")
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
