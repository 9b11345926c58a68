"""GRISP's switches and knobs, defined once (paper section 4 and Table 5; defaults = the paper's settings).

`Options` is the single definition. grisp.Grisp and resolve.Resolver read its fields by name;
infer.py's flags are made from them (`add_flags`, `from_flags`: a switch becomes `--no-<name>`, a knob
`--<name>` with the field's default and help text); evaluate.py's ablation presets are overrides of
them, checked by `preset`. Bad values raise GrispError with every problem named.

    options = Options(rerank=False, top_k=5)
    add_flags(parser); options = from_flags(parser.parse_args())
    ABLATIONS = {"no-rerank": preset(rerank=False), ...}
"""

import argparse
from dataclasses import dataclass, field, fields
from typing import Any, Iterable

import torch

from grisp.generate import RANKINGS
from grisp.prompts import IDENTIFIERS
from llm.cpu_speed import PRECISIONS, pick_precision

DEDUPES = ("exact", "merge")
MAX_TOP_K = (len(IDENTIFIERS) - 1) // 2  # 12: the union of two top-k lists fits one re-ranking prompt


class GrispError(Exception):
    """A problem the user can fix (bad settings, missing model, adapter or index); the message says how."""


def option(default: Any, help: str, flag: str | None = None, choices: tuple | None = None) -> Any:
    """A field of Options with the help text of its command-line flag. A switch (bool, on by default)
    gets a flag that turns it off, `--no-<name>` unless `flag` names another; flag="" keeps the field
    off the command line; `choices` closes a knob's set of values."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass
class Options:
    # skeleton generation
    beam_search: bool = option(True, "one greedy skeleton instead of beam search")
    num_beams: int = option(8, "beam width")
    num_skeletons: int = option(3, "skeletons kept for resolution")
    temperature: float = option(0.4, "sampling temperature of the beams")
    top_p: float = option(0.9, "nucleus sampling threshold of the beams")
    sample: bool = option(True, "plain beam search, no sampling", flag="--deterministic")
    seed: int = option(0, "seed of the beam sampling")
    max_new_tokens: int = option(
        512,
        "longest skeleton in tokens (the reference's 512; the search stops as soon as "
        "no running beam can beat the finished ones)",
        flag="",
    )
    beam_ranking: str = option(
        "sum",
        "how beams and skeletons are ranked: sum = sum of raw token log-probabilities "
        "(the default, measured against the other in docs/method.md 2.5); length-normalised = "
        "Hugging Face's beam sampling as the reference decodes (processed "
        "log-probabilities / length)",
        choices=RANKINGS,
    )
    skeleton_dedupe: str = option(
        "exact",
        "beams that are the same skeleton: exact = only identical texts are one "
        "(the paper); merge = also texts that differ only in placeholder wording, whose "
        "wordings the resolver then searches one after the other (the reference "
        "implementation's default; waits for the whole beam search)",
        choices=DEDUPES,
    )
    precision: str = option(
        "auto",
        "precision of the model's weights and matmuls: auto (the default) = bfloat16 on a "
        "GPU of compute capability 8.0+ and on a CPU with native bf16 (flag avx512_bf16, amx_bf16 or bf16; the same F1 "
        "as float32 on the demo and WWQ dev, docs/inference.md), float32 on other CPUs, "
        "where bf16 is emulated and slow (docs/cpu_speed.md); int8 = float32 weights with "
        "torch's dynamic int8 matmuls except down_proj (CPU only; lossy, docs/cpu_speed.md 1.4); "
        "fp16-weights = float32 activations, fp16 weights for decoding's few-row matmuls (x86 CPU "
        "only; near-lossless, 2.9x at batch-8 decoding without native bf16, docs/cpu_speed.md 1.8). On this "
        f"machine auto is {pick_precision('auto', torch.device('cpu'))[1].removeprefix('auto: ')}",
        choices=PRECISIONS,
    )
    # placeholder resolution (the paper's ablations)
    top_k: int = option(10, "search hits re-ranked per placeholder")
    none_margin: float = option(
        0.0,
        "re-ranking keeps the alternatives that score above None's score minus this "
        "(logits) as the placeholder's choice and backtracking's later options; 0 = "
        "strictly above None (the paper); inf = all of them, in the re-ranked order",
    )
    retry: bool = option(
        True,
        "no second pass: a question whose skeletons all dead-end fails, as in the paper (by "
        "default, with re-ranking on, those skeletons are resolved once more keeping every hit "
        "in the re-ranked order, None's cut lifted; ours)",
    )
    min_confidence: float = option(
        0.02,
        "decline an answer whose confidence (grisp/confidence.py: the re-ranker's "
        "mean probability of the chosen IRIs, their least if an entity no wording names was taken below "
        'None) is below this: "no confident answer", '
        "the query kept as a marked guess (the default was chosen on wwq-dev-real's tune half, "
        "docs/method.md 6.10); 0 = answer whatever was found",
    )
    rerank: bool = option(True, "take the index order, no model re-ranking")
    constrained: bool = option(True, "search without KG constraints")
    kg_guidance: bool = option(True, "no constraints and no final validation")
    backtracking: bool = option(True, "a dead end fails the skeleton")
    # seconds per skeleton for resolution (after generation, whose cost is hardware-bound), as in the
    # reference: a skeleton out of time fails and the next one gets a fresh budget (docs/method.md 6.7)
    time_budget: float = option(
        60.0,
        "seconds per skeleton for resolving it, then the next skeleton (at most "
        "num_skeletons x this per question, one more for a retry); also a hard limit on "
        "every endpoint query (generation not counted)",
    )

    def __post_init__(self):
        problems = [
            f"{name} = {value} must be {rule}"
            for name, value, ok, rule in [
                ("num_beams", self.num_beams, self.num_beams >= 1, ">= 1"),
                ("num_skeletons", self.num_skeletons, self.num_skeletons >= 1, ">= 1"),
                ("max_new_tokens", self.max_new_tokens, self.max_new_tokens >= 1, ">= 1"),
                ("temperature", self.temperature, self.temperature > 0, "> 0"),
                ("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]"),
                # a placeholder of unknown position re-ranks the union of two top-k lists, and the
                # re-ranking prompt names at most len(IDENTIFIERS) - 1 alternatives
                ("top_k", self.top_k, 1 <= self.top_k <= MAX_TOP_K, f"in [1, {MAX_TOP_K}]"),
                ("none_margin", self.none_margin, self.none_margin >= 0, ">= 0"),
                ("min_confidence", self.min_confidence, 0 <= self.min_confidence <= 1, "in [0, 1]"),
                ("time_budget", self.time_budget, self.time_budget > 0, "> 0"),
                ("seed", self.seed, 0 <= self.seed < 2**63, "in [0, 2**63)"),
            ]
            if not ok
        ]  # what torch's generators take
        problems += [
            f"{f.name} = {getattr(self, f.name)} must be one of {', '.join(f.metadata['choices'])}"
            for f in fields(self)
            if f.metadata["choices"] and getattr(self, f.name) not in f.metadata["choices"]
        ]
        if problems:
            raise GrispError("bad settings: " + "; ".join(problems))

    @property
    def beam_width(self) -> int:
        """Beams of stage 1: num_beams, or 1 (greedy) without beam search."""
        return self.num_beams if self.beam_search else 1

    @property
    def skeletons_wanted(self) -> int:
        """Skeletons stage 1 keeps at most: num_skeletons, or 1 without beam search."""
        return self.num_skeletons if self.beam_search else 1


def preset(**overrides: Any) -> dict[str, Any]:
    """`overrides` checked against Options (known field names, valid values) and returned as given."""
    names = [f.name for f in fields(Options)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise GrispError(f"bad settings: no option {', '.join(unknown)}; the options are {', '.join(names)}")
    Options(**overrides)  # raises GrispError on a bad value
    return overrides


def _flag(f) -> str | None:
    """The command-line flag of field `f`, or None if it has none."""
    if f.metadata["flag"] is not None:
        return f.metadata["flag"] or None
    dashed = f.name.replace("_", "-")
    return f"--no-{dashed}" if isinstance(f.default, bool) else f"--{dashed}"


def add_flags(
    parser: argparse.ArgumentParser, names: Iterable[str] | None = None, unset: bool = False
) -> None:
    """One flag per Options field (`names`: only these, in this order). A switch is a store_true flag
    that turns it off; a knob takes a value of the field's type, default the field's default, or with
    `unset` None, so that only the knobs given on the command line override the Options defaults."""
    by_name = {f.name: f for f in fields(Options)}
    for f in [by_name[name] for name in names] if names is not None else by_name.values():
        flag, help = _flag(f), f.metadata["help"]
        if flag is None:
            continue
        if isinstance(f.default, bool):
            assert f.default, f"switch {f.name} must default to on: its flag turns it off"
            parser.add_argument(flag, action="store_true", help=help)
        elif unset:
            parser.add_argument(
                flag,
                type=type(f.default),
                default=None,
                help=f"{help}; unset: {f.default}",
                choices=f.metadata["choices"],
            )
        else:
            parser.add_argument(
                flag, type=type(f.default), default=f.default, help=help, choices=f.metadata["choices"]
            )


def from_flags(args: argparse.Namespace) -> Options:
    """Options from parsed `add_flags` flags (a given switch flag turns its field off)."""
    values = {}
    for f in fields(Options):
        flag = _flag(f)
        if flag is not None:
            value = getattr(args, flag.lstrip("-").replace("-", "_"))
            values[f.name] = not value if isinstance(f.default, bool) else value
    return Options(**values)
