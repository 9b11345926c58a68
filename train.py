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

main() runs the named steps in order: setup (processes, device, precision, run directory) -> load_data ->
make_model (base + LoRA, optimiser) -> resume (or a fresh TrainState) -> TrainingLoop.train (step,
validate, checkpoint) -> save the adapter. This file holds the stage as a reader follows it, top to
bottom as in nanoGPT's train.py; the engine it drives (the run's state, data order and schedule, exact
and portable resumption, the loop with DDP and early stopping) is grisp/trainer.py, the loss of a batch
and of the validation set grisp/loss.py, the data mixture grisp/mixture.py, and the flags are the fields
of TrainConfig (grisp/train_config.py).

Flags left unset take the device's recipe: on a CPU the shipped adapter's (LoRA on all blocks,
micro-batches of 1, 2 epochs), on a GPU the paper's (all blocks, 4 epochs); a resumed run keeps its own. The
plan and, on a CPU, its expected duration are printed before the first step and re-measured after three.

    python train.py --data wwq                                   # the device's recipe (CPU: the shipped adapter's)
    python train.py --data wwq,qald10,qald7,lcquad2,sq,spinach   # the training mixture (the `mix` adapter's)
    python train.py --data wwq,qald10,qald7,lcquad2,sq,spinach \\
        --compose-shapes chain,ask,intersection,superlative,count,filter   # every composed shape: the shipped adapter's
    python train.py --data wwq --max-steps 40                    # a short run
    python train.py --data wwq --name my-run --resume            # continue exactly where it stopped
    torchrun --nproc-per-node 4 train.py --data wwq              # several GPUs (DDP)
"""

import argparse
import json
import math
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import build_index
import lora
from common import defaults
from grisp import checkpoint, loss, mixture, peft_format, samples
from grisp.sparql import SparqlClient
from grisp.train_config import add_flags
from grisp.trainer import Run, TrainingLoop, TrainState, data_sha256, portable_copy, resume, start_run_dir
from llm import cpu_speed
from llm.tokenizer import Tokenizer
from model import Transformer, pick_device

# Flags left unset take the recipe of the device (`apply_recipe`): on a CPU the shipped adapter's (LoRA on
# all blocks, micro-batches of 1 as its run had), on a GPU the paper's; 2 epochs on a CPU, 4 on a GPU.
RECIPES = {
    "cpu": {"lora_layers": 0, "micro_batch_size": 1, "epochs": 2},
    "gpu": {"lora_layers": 0, "micro_batch_size": 1, "epochs": 4},
}
# CPU seconds per token of a training step on the mixture, a + b x (blocks with LoRA), per precision (0.5B
# model, 2 threads), for the plan's expected duration: fitted to measured runs (the runs and their
# tokens/s: docs/method.md 4.3, docs/training.md).
CPU_SECONDS_PER_TOKEN = {"float32": (7.5e-3, 0.6e-3), "bfloat16": (1.8e-3, 0.2e-3)}


# ---------------------------------------------------------------------------- setup, data, model
def setup(args: argparse.Namespace) -> Run:
    """Processes (torchrun sets WORLD_SIZE/RANK/LOCAL_RANK), threads, flag checks, seed, device, run directory."""
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    try:
        device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError as error:  # a bad --device
        sys.exit(f"error: {error}")
    if device.type == "cuda":  # this process's GPU for NCCL and for the CUDA RNG state its checkpoints save
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    apply_recipe(args, device)
    check_args(args, world)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed + rank)
    dtype, why_dtype = cpu_speed.pick_dtype(args.dtype, device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    run_dir = Path(args.runs_dir).expanduser() / args.name
    if (run_dir / "latest").exists() and not args.resume:
        sys.exit(f"error: run {run_dir} exists; continue it with --resume or pick another --name")
    copy = portable_copy(args)
    if (
        copy is not None and (copy / "state.json").is_file() and not args.resume
    ):  # its first checkpoint would replace it
        sys.exit(
            f"error: {copy} holds a portable copy of run {args.name}; continue it with --resume or pick "
            f"another --name"
        )
    return Run(args, world, rank, device, dtype, why_dtype, autocast, run_dir)


def apply_recipe(args: argparse.Namespace, device: torch.device) -> None:
    """Set the flags left unset (None) to the device's recipe (RECIPES); a model with no more blocks
    than the recipe's LoRA blocks gets LoRA on all of them. With --resume they keep the run's own values
    instead, so the command that started a run on a CPU continues it on a GPU."""
    saved = saved_settings(args) if args.resume else {}
    for name, value in RECIPES["cpu" if device.type == "cpu" else "gpu"].items():
        if getattr(args, name) is None and saved.get(name) is not None:
            setattr(args, name, saved[name])
        elif getattr(args, name) is None:
            setattr(args, name, value)
            if name == "lora_layers" and (Path(args.model_dir).expanduser() / "config.json").is_file():
                config = json.loads((Path(args.model_dir).expanduser() / "config.json").read_text())
                blocks = config["num_hidden_layers"]
                args.lora_layers = 0 if value >= blocks else value


def saved_settings(args: argparse.Namespace) -> dict:
    """The settings (config.json) of the run --resume continues: of its latest checkpoint or its portable
    copy, whichever is further on, as resume() picks; {} if it has neither (resume() then says so)."""
    found = [
        path
        for path in (checkpoint.latest(Path(args.runs_dir).expanduser() / args.name), portable_copy(args))
        if path is not None and (path / "state.json").is_file() and (path / "config.json").is_file()
    ]
    further = max(found, key=lambda path: json.loads((path / "state.json").read_text())["step"], default=None)
    return json.loads((further / "config.json").read_text()) if further else {}


def describe_plan(
    args, device: torch.device, dtype: torch.dtype, total_steps: int, first_epoch: list[dict], blocks: int
) -> str:
    """The recipe in use and, on a CPU, the expected duration in `dtype` (CPU_SECONDS_PER_TOKEN; re-measured
    after 3 steps)."""
    layers = f"the last {args.lora_layers}" if args.lora_layers else f"all {blocks}"
    tokens = args.batch_size * sum(len(s["ids"]) for s in first_epoch) / max(1, len(first_epoch))
    plan = (
        f"{'CPU recipe (the shipped adapter' if device.type == 'cpu' else 'GPU recipe (the paper'}'s; flags "
        f"given override it): LoRA r={args.lora_r} on {layers} blocks, {args.epochs} epochs, batches of "
        f"{args.batch_size} in micro-batches of {args.micro_batch_size}: {total_steps} steps of ~{tokens:.0f} "
        f"tokens"
    )
    if device.type != "cpu":
        return plan
    precision = str(dtype).removeprefix("torch.")
    a, b = CPU_SECONDS_PER_TOKEN[precision]
    seconds = total_steps * tokens * (a + b * (args.lora_layers or blocks))
    return (
        f"{plan}; expected ~{seconds / 3600:.1f} h in {precision} ({seconds / max(1, total_steps):.0f} s/step, "
        f"measured for the 0.5B model on 2 idle CPU threads; re-measured after 3 steps). Stop with Ctrl-C and "
        f"continue with --resume."
    )


def open_index_once(index: str | None, data: str):
    """build_index.open_index, which builds a missing index: with several processes rank 0 opens (builds) it
    first and the others wait, so they do not build into the same directories at once."""
    several, first = dist.is_initialized() and dist.get_world_size() > 1, int(os.environ.get("RANK", 0)) == 0
    if several and not first:
        dist.barrier()
    indices = build_index.open_index(index, data)
    if several and first:
        dist.barrier()
    return indices


def load_data(args, tokenizer: Tokenizer):
    """(encoded training samples of epoch e as a function of e, encoded validation samples)."""

    def prepare(rows: list[dict]) -> list[dict]:
        encoded = [loss.encode(s, tokenizer) for s in rows]
        return [e for e in encoded if len(e["ids"]) <= args.max_length]  # longer ones are skipped

    is_val = (
        samples.validation_split(args.val_fraction, args.seed) if args.val_data is None else (lambda _: False)
    )
    augment, client = samples.Augment.from_args(args), SparqlClient(args.endpoint) if args.endpoint else None

    def generator(records: list[dict], weights: dict) -> samples.SampleGenerator:
        return samples.SampleGenerator(
            records, indices, augment, args.seed, weights, args.prompt_format, client
        )

    if args.samples:  # precomputed epochs; training longer than that cycles through them
        by_epoch = samples.read_samples(args.samples)
        check_prompt_format(args.samples, by_epoch, args.prompt_format)
        epochs = sorted(by_epoch)
        # a composed sample is made of other records: it trains only if none of them is held out, and
        # validates only if all are (as the online path composes within each part)
        held_out = lambda s: [is_val(i) for i in s.get("composed_from", [s["id"]])]
        train_epoch = lambda e: prepare(
            [s for s in by_epoch[epochs[(e + args.first_epoch) % len(epochs)]] if not any(held_out(s))]
        )
        val = [s for s in by_epoch[epochs[0]] if all(held_out(s))]
    else:  # fresh samples per epoch from (seed, epoch, record), the records drawn by the mixture's weights
        data = mixture.read(args.data)
        indices = open_index_once(args.index, args.data)
        data.prepare(indices)
        if os.environ.get("RANK", "0") == "0":
            print(data.table(is_val if args.val_data is None else None))
        train = generator([r for r in data.usable if not is_val(r["id"])], data.weights)
        train_epoch = lambda e: prepare(train.epoch(e + args.first_epoch)[0])
        # validation: every held-out record once at most (a weight above 1 repeats nothing new)
        val = generator(
            [r for r in data.usable if is_val(r["id"])], {k: min(1.0, w) for k, w in data.weights.items()}
        )
        val = val.epoch(0)[0]
    if args.val_data is not None and samples.is_sample_file(args.val_data):
        val = samples.read_samples(args.val_data)
        check_prompt_format(args.val_data, val, args.prompt_format)
        val = val[min(val)]
    elif args.val_data is not None:
        indices = open_index_once(args.index, args.data)
        val = generator(mixture.read(args.val_data).prepare(indices).usable, {}).epoch(0)[0]
    return train_epoch, prepare(val)


def check_prompt_format(path: str, by_epoch: dict[int, list[dict]], prompt_format: str) -> None:
    """Precomputed re-ranking samples must be in the run's prompt format (samples without the field: v1)."""
    found = {
        s.get("prompt_format", "v1") for rows in by_epoch.values() for s in rows if s["task"] == "rerank"
    }
    if found - {prompt_format}:
        sys.exit(
            f"error: {path} holds re-ranking prompts in format {', '.join(sorted(found))}, not --prompt-format "
            f"{prompt_format}; make them with gen_data.py --prompt-format {prompt_format} or pass that format"
        )


def make_model(run: Run):
    """(model, optimizer, LoRA parameters): the frozen base + LoRA (float32 LoRA weights; the base may
    be bf16 on GPUs), from --init-adapter if given, AdamW over the LoRA weights, DDP when world > 1."""
    args = run.args
    model = Transformer.from_pretrained(args.model_dir, run.dtype, run.device)
    layers = lora.last_layers(model, args.lora_layers) if args.lora_layers else None
    lora.inject_lora(model, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets, layers)
    for p in lora.lora_state_dict(model).values():  # before --init-adapter: its float32 weights stay exact
        p.data = p.data.float()
    if args.init_adapter:  # continue from trained LoRA weights, with a fresh optimiser and schedule
        load_init_adapter(model, args)
    lora.mark_only_lora_trainable(model)
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
        sys.exit(
            f"error: --init-adapter has r={saved['r']}, alpha={saved['lora_alpha']}; pass the same "
            f"--lora-r and --lora-alpha (and --lora-layers, --lora-targets)"
        )
    try:
        lora.load_lora_state_dict(model, weights)
    except ValueError as error:
        sys.exit(f"error: --init-adapter {args.init_adapter}: {error}")


# ---------------------------------------------------------------------------- main
def main(args: argparse.Namespace) -> None:
    # --- setup: processes, device, run directory. Until the loop takes over SIGINT/SIGTERM (checkpoint, then
    # exit), an INT ends the process: a background job of a shell (runs/mix.sh) starts with INT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
        blocks = checkpoint.unwrap(model).args.num_hidden_layers
        print(describe_plan(args, run.device, run.dtype, total_steps, first_epoch, blocks))
        print(f"precision: {run.why_dtype}")

    # --- config (as saved: paths become strings), state: fresh or from the latest checkpoint
    config = vars(args) | {
        "world_size": run.world,
        "device": str(run.device),
        "dtype": str(run.dtype).removeprefix("torch."),
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "train_samples_epoch0": len(first_epoch),
        "val_samples": len(val),
        "data_sha256": data_sha256(first_epoch + val),
        "trainable_parameters": sum(p.numel() for p in params),
    }
    config = json.loads(json.dumps(config, default=str))
    fresh = f"the adapter {args.init_adapter}" if args.init_adapter else "the base model"
    state, source = resume(run, config, model, optimizer) if args.resume else (TrainState(), fresh)
    start_run_dir(run, config, state, source)

    # --- loop
    loop = TrainingLoop(
        run,
        model,
        optimizer,
        params,
        tokenizer.pad_id,
        train_epoch,
        first_epoch,
        val,
        config,
        state,
        total_steps,
    )
    if not loop.train():
        return  # stopped: resumable from the checkpoint just written

    # --- save: the best adapter by validation loss (or the last one without validation data)
    if run.rank == 0:
        best, adapter = run.run_dir / "best", run.run_dir / "adapter"
        shutil.rmtree(adapter, ignore_errors=True)
        if val and best.exists():
            shutil.copytree(best, adapter)
            what = f"best validation loss {state.best_val}, step {state.best_step}"
        else:  # no validation data, or best/ stayed on the machine whose validation made it (a portable copy has
            # none): the last weights, written to adapter/ only (best/ is only ever step best_step's weights)
            peft_format.save_adapter(
                checkpoint.unwrap(model), adapter, str(args.model_dir), prompt_format=args.prompt_format
            )
            what = "the last step's weights"
            if state.best_step == state.step:
                what += f", also the best by validation loss ({state.best_val})"
            elif state.best_step is not None:
                what += (
                    f"; the best validation loss {state.best_val} was step {state.best_step}'s, whose weights "
                    f"stayed on the machine that validated it (the run continued from a portable copy)"
                )
        print(f"adapter ({what}) saved to {adapter}")
    if run.world > 1:
        dist.destroy_process_group()


def check_args(args: argparse.Namespace, world: int) -> None:
    """Bad settings exit with a message naming the flag and the fix."""
    problems = [
        msg
        for bad, msg in [
            (
                not (Path(args.model_dir).expanduser() / "config.json").exists(),
                f"--model-dir {args.model_dir} has no config.json; run `python get_model.py` or pass --model-dir",
            ),
            (
                args.samples and not Path(args.samples).expanduser().is_file(),
                f"--samples {args.samples} does not exist",
            ),
            (
                args.init_adapter
                and not any(
                    (Path(args.init_adapter).expanduser() / name).is_file()
                    for name in (peft_format.CONFIG_NAME, checkpoint.LORA_FILE)
                ),
                f"--init-adapter {args.init_adapter} is neither an adapter nor a checkpoint directory",
            ),
            (
                args.batch_size < 1 or args.batch_size % world,
                f"--batch-size {args.batch_size} must be a positive multiple of the {world} processes",
            ),
            (
                args.micro_batch_size < 1,
                f"--micro-batch-size must be at least 1, got {args.micro_batch_size}",
            ),
            (args.epochs < 1, f"--epochs must be at least 1, got {args.epochs}"),
            (args.first_epoch < 0, f"--first-epoch must be at least 0, got {args.first_epoch}"),
            (not 0 <= args.val_fraction < 1, f"--val-fraction must be in [0, 1), got {args.val_fraction}"),
            (not 0 < args.lr < math.inf, f"--lr must be a finite number > 0, got {args.lr}"),  # nan too
            (not 0 <= args.warmup < 1, f"--warmup must be in [0, 1), got {args.warmup}"),
            (args.max_steps < 0, f"--max-steps must be at least 0 (0: all epochs), got {args.max_steps}"),
            (
                args.eval_every < 0,
                f"--eval-every must be at least 0 (0: after each epoch), got {args.eval_every}",
            ),
            (args.lora_r < 1, f"--lora-r must be at least 1, got {args.lora_r}"),
            (not 0 <= args.lora_dropout < 1, f"--lora-dropout must be in [0, 1), got {args.lora_dropout}"),
            (args.threads < 0, f"--threads must be at least 0 (0: torch's default), got {args.threads}"),
            (
                args.checkpoint_every < 1 or args.keep_checkpoints < 1,
                "--checkpoint-every and --keep-checkpoints must be at least 1",
            ),
            (
                args.patience < 1,
                f"--patience must be at least 1 (validations without a new best), got {args.patience}; "
                f"a large value turns early stopping off",
            ),
        ]
        if bad
    ]
    if problems:
        sys.exit("error: " + "; ".join(problems))


def make_parser() -> argparse.ArgumentParser:
    """train.py's command line: one flag per TrainConfig field (grisp/train_config.py), in groups."""
    parser = argparse.ArgumentParser(
        description="Fine-tune Qwen2.5 with LoRA jointly on SPARQL skeletons and "
        "list-wise re-ranking (GRISP).",
        formatter_class=defaults.HelpFormatter,
    )
    add_flags(parser)
    return parser


if __name__ == "__main__":
    try:
        main(make_parser().parse_args())
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    except KeyboardInterrupt:
        sys.exit("interrupted outside the training loop (before its first step or after its last checkpoint)")
