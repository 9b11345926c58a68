"""train.py's settings, defined once: each field of TrainConfig is one command-line flag of train.py,
with its type, default, help text and --help group (as grisp/options.py's Options makes the pipeline's
flags). `add_flags` puts them on a parser, group by group; the augmentation flags of online generation
are samples.py's (samples.add_generation_args) and follow the data group. A field whose default is None
is left to the device's recipe (train.py's RECIPES) or says in its help what unset does.

    parser = argparse.ArgumentParser(formatter_class=defaults.HelpFormatter)
    add_flags(parser)            # --data, --samples, ..., --device
    args = parser.parse_args()   # an argparse.Namespace with one attribute per field (and augmentation)
    TrainConfig().lr             # 1e-4: a default
"""

import argparse
import types
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import lora
from common import defaults
from grisp import loss, mixture, samples
from grisp.prompts import LATEST_PROMPT_FORMAT, PROMPT_FORMATS
from model import DEVICES


def setting(default: Any, group: str, help: str, choices: tuple | None = None) -> Any:
    """A field of TrainConfig: flag --<name> in --help's `group`, described by `help`; `choices` closes
    its set of values. A bool (off by default) is a switch; a list takes one or more values."""
    metadata = {"group": group, "help": help, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    # data
    data: str = setting(
        "wwq",
        "data",
        "the training mixture (mixture.py): comma-separated sources, each with an optional weight = uses "
        f"of each record per epoch (e.g. wwq,qald10,lcquad2:0.3); a source is {', '.join(mixture.SOURCES)}, a "
        "benchmarks.py name or a JSONL path; samples are made online, fresh per epoch; no evaluation set "
        "(qald10-dev, wwq-dev, the demo ...) is ever among them",
    )
    samples: str | None = setting(
        None,
        "data",
        "precomputed samples from gen_data.py --out (instead of online generation), or agent conversations "
        "from tools/gen_agent_data.py",
    )
    index: str | None = setting(
        None,
        "data",
        f"search index for online generation; unset: {defaults.WIKIDATA_INDEX_DIR}, built if missing",
    )
    val_fraction: float = setting(0.05, "data", "records held out (by id hash) for the validation loss")
    val_data: str | None = setting(
        None,
        "data",
        "validation benchmark or samples file instead of the held-out slice (not an evaluation set: "
        "validation picks best/)",
    )
    max_length: int = setting(1024, "data", "skip samples with more tokens than this")
    seed: int = setting(0, "data", "seed of the samples, batch order, LoRA init and dropout")
    prompt_format: str = setting(
        LATEST_PROMPT_FORMAT,
        "data",
        "re-ranking prompt format (prompts.py), saved with the adapter (v1: the first adapter's)",
        choices=PROMPT_FORMATS,
    )
    endpoint: str | None = setting(
        None,
        "data",
        "SPARQL endpoint of the KG, for the constrained re-ranking samples (--constrain); without it no "
        "sample is constrained",
    )
    # model
    model_dir: str = setting(
        str(defaults.MODEL_DIR), "model", "base model directory (Hugging Face Qwen2 layout)"
    )
    dtype: str = setting(
        "auto",
        "model",
        "precision of the base weights and the compute (bfloat16: under autocast; the LoRA weights and "
        "AdamW stay float32): auto = bfloat16 on GPUs of compute capability 8.0+ and on CPUs with native "
        "bf16 (flag avx512_bf16/amx_bf16/bf16), float32 on other CPUs, where bf16 is several times slower; "
        "may change on --resume",
        choices=("auto", "float32", "bfloat16"),
    )
    # LoRA
    lora_r: int = setting(32, "LoRA", "rank")
    lora_alpha: float = setting(32, "LoRA", "scaling alpha (update scaled by alpha / r)")
    lora_dropout: float = setting(0.05, "LoRA", "dropout on the LoRA input")
    lora_targets: list[str] = setting(
        list(lora.DEFAULT_TARGETS),
        "LoRA",
        "module names that get LoRA; the default is every linear layer of a block",
    )
    init_adapter: str | None = setting(
        None,
        "LoRA",
        "start from these LoRA weights, an adapter or a run's checkpoint-* directory (same r, alpha, "
        "targets, layers), instead of LoRA's zero update",
    )
    lora_layers: int | None = setting(
        None,
        "LoRA",
        "LoRA on the last N blocks only (0 = all blocks); unset: all (the shipped adapter's and the "
        "paper's recipe)",
    )
    # optimisation
    epochs: int | None = setting(
        None,
        "optimisation",
        "passes over the training records; unset: 2 on a CPU, 4 on a GPU (the paper's); with --resume, "
        "unset recipe flags (this, --lora-layers, --micro-batch-size) keep the run's own values",
    )
    first_epoch: int = setting(
        0,
        "optimisation",
        "draw the run's epoch e as epoch e + N of its samples: a continuation of a run that trained N "
        "epochs (--init-adapter) sees new samples and keeps --seed, and with it the validation split; with "
        "--samples, the file's epochs from the (N+1)-th",
    )
    batch_size: int = setting(8, "optimisation", "samples per optimiser step (over all processes)")
    micro_batch_size: int | None = setting(
        None,
        "optimisation",
        "samples per forward pass (the batch is accumulated from these); more costs memory and was not "
        "faster on a 2-core CPU (0.5B, all blocks, bf16: peak 5.5 / 7.7 / 12.3 GB for 1 / 2 / 4; "
        "docs/training-history.md); unset: 1",
    )
    lr: float = setting(1e-4, "optimisation", "peak learning rate (AdamW)")
    warmup: float = setting(
        0.05, "optimisation", "fraction of steps with linear warmup, then cosine decay to 0"
    )
    weight_decay: float = setting(0.0, "optimisation", "AdamW weight decay")
    clip_grad: float = setting(1.0, "optimisation", "clip the gradient norm (0 = off)")
    loss_weighting: str = setting(
        "reference",
        "optimisation",
        "reference: sum of all skeleton-token and re-ranking cross-entropies of the batch / (skeleton "
        "tokens + re-ranking rows), as the reference implementation; per-sample: each sample weighs 1, a "
        "skeleton's tokens averaged (the first adapter's)",
        choices=loss.WEIGHTINGS,
    )
    max_steps: int = setting(
        0, "optimisation", "train at most this many steps; the schedule spans them (0 = all epochs)"
    )
    eval_every: int = setting(0, "optimisation", "validation loss every N steps (0 = after each epoch)")
    patience: int = setting(
        2,
        "optimisation",
        "stop after this many validations without a new best loss (at least 1; a large value: never stop "
        "early)",
    )
    # checkpoints
    runs_dir: str = setting(str(defaults.RUNS_DIR), "checkpoints", "where runs live")
    name: str = setting("grisp", "checkpoints", "run name: the run directory is RUNS_DIR/NAME")
    checkpoint_every: int = setting(
        50, "checkpoints", "checkpoint every N steps (and on SIGINT/SIGTERM, at each epoch end)"
    )
    keep_checkpoints: int = setting(2, "checkpoints", "keep the newest N checkpoints")
    resume: bool = setting(False, "checkpoints", "continue the run NAME exactly from its latest checkpoint")
    stop_after: int = setting(
        0, "checkpoints", "act as if interrupted after step N (checkpoint and exit; for testing)"
    )
    portable_dir: str | None = setting(
        None,
        "checkpoints",
        "also write a portable copy of the run's state to DIR/NAME at every checkpoint (bf16 LoRA weights, "
        "RNG, position, logs; no AdamW moments nor best/: ~35 MB for LoRA r=32 on 24 blocks), small enough "
        "to commit to git; --resume continues from it where the run directory is missing or behind it "
        "(e.g. on a fresh clone)",
    )
    rewarm_steps: int = setting(
        20,
        "checkpoints",
        "after continuing from a portable copy, raise the lr linearly over this many steps while AdamW's "
        "moments fill again",
    )
    accept_new_samples: bool = setting(
        False,
        "checkpoints",
        "with --resume: continue although the samples differ from the run's (data_sha256; their number "
        "must not change), e.g. after a fix to the code that makes them; the rest of the epoch follows the "
        "new samples' plan (a few samples may repeat or be skipped), the stretch's start line in "
        "stretches.jsonl records both fingerprints' prefixes, and resumes from the next checkpoint on "
        "check against the new samples",
    )
    # CPU / device
    threads: int = setting(0, "CPU / device", "torch CPU threads (0 = torch's default)")
    device: str = setting("auto", "CPU / device", f"{DEVICES}; auto: cuda, then mps, then cpu")


def value_type(annotation: Any) -> type | None:
    """The type a flag converts its values to: the field's type without None (int | None -> int), a
    list's item type; None for text (argparse keeps it a string)."""
    if isinstance(annotation, types.UnionType):  # X | None
        (annotation,) = [arg for arg in annotation.__args__ if arg is not type(None)]
    if isinstance(annotation, types.GenericAlias):  # list[X]
        (annotation,) = annotation.__args__
    return None if annotation is str else annotation


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, in field order, under --help groups in the order they first appear;
    samples.py's augmentation flags (samples.add_generation_args) between the data and the model groups."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(TrainConfig):
        if f.metadata["group"] not in groups:
            if f.metadata["group"] == "model":
                samples.add_generation_args(parser.add_argument_group("augmentation (online generation)"))
            groups[f.metadata["group"]] = parser.add_argument_group(f.metadata["group"])
        group, flag, help = groups[f.metadata["group"]], "--" + f.name.replace("_", "-"), f.metadata["help"]
        if f.type is bool:
            assert f.default is False, f"switch {f.name} must default to off: its flag turns it on"
            group.add_argument(flag, action="store_true", help=help)
            continue
        default = f.default if f.default_factory is MISSING else f.default_factory()
        group.add_argument(
            flag,
            type=value_type(f.type),
            default=default,
            help=help,
            choices=f.metadata["choices"],
            nargs="+" if isinstance(default, list) else None,
        )
