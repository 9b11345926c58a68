"""options.py: the one definition of GRISP's switches and knobs, and what derives from it (infer.py's
flags, evaluate.py's ablation presets)."""

import argparse
from dataclasses import fields

import pytest

import evaluate
from grisp.options import GrispError, Options, add_flags, from_flags, preset


def parse(argv, **kwargs):
    parser = argparse.ArgumentParser()
    add_flags(parser, **kwargs)
    return parser.parse_args(argv)


def test_no_flags_give_the_defaults():
    assert from_flags(parse([])) == Options()


def test_flags_set_their_fields():
    args = parse(
        ["--no-rerank", "--no-kg-guidance", "--deterministic", "--top-k", "5", "--time-budget", "2.5"]
    )
    assert from_flags(args) == Options(
        rerank=False, kg_guidance=False, sample=False, top_k=5, time_budget=2.5
    )
    assert args.no_rerank and args.deterministic  # the flags' own names stay in the namespace


def test_every_field_has_help_and_a_flag_but_the_length_cap():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    flags = {option for action in parser._actions for option in action.option_strings} - {"-h", "--help"}
    assert all(f.metadata["help"] for f in fields(Options))
    assert len(flags) == len(fields(Options)) - 1 and "--max-new-tokens" not in flags
    assert {
        "--no-beam-search",
        "--num-beams",
        "--deterministic",
        "--no-constrained",
        "--time-budget",
    } <= flags


def test_unset_knobs_stay_none():
    assert vars(parse([], names=evaluate.KNOBS, unset=True)) == {knob: None for knob in evaluate.KNOBS}
    assert parse(["--top-k", "5"], names=evaluate.KNOBS, unset=True).top_k == 5


def test_presets_are_checked_against_the_fields():
    assert preset(rerank=False, top_k=3) == {"rerank": False, "top_k": 3}
    with pytest.raises(GrispError, match="no option rerank_off"):
        preset(rerank_off=True)
    with pytest.raises(GrispError, match="top_k = 0 must be in"):
        preset(top_k=0)
    assert list(evaluate.ABLATIONS) == [
        "none",
        "no-beam-search",
        "no-rerank",
        "no-constrained",
        "no-kg-guidance",
        "no-backtracking",
        "all-disabled",
        "rerank-only",
    ]
    assert all(Options(**changes) for changes in evaluate.ABLATIONS.values())


def test_beam_ranking_is_a_closed_choice_defaulting_to_sum():
    assert Options().beam_ranking == "sum" and Options().max_new_tokens == 512
    assert from_flags(parse(["--beam-ranking", "length-normalised"])).beam_ranking == "length-normalised"
    with pytest.raises(SystemExit):  # argparse: invalid choice
        parse(["--beam-ranking", "mean"])
    with pytest.raises(GrispError, match="beam_ranking = mean must be one of sum, length-normalised"):
        Options(beam_ranking="mean")
    assert parse(["--beam-ranking", "sum"], names=evaluate.KNOBS, unset=True).beam_ranking == "sum"


def test_the_defaults_are_the_documented_ones():
    """The settings the README's "How GRISP answers a question" and docs/method.md give (the paper's and the reference's, and ours)."""
    from dataclasses import asdict

    assert asdict(Options()) == {
        "beam_search": True,
        "num_beams": 8,
        "num_skeletons": 3,
        "temperature": 0.4,
        "top_p": 0.9,
        "sample": True,
        "seed": 0,
        "max_new_tokens": 512,
        "beam_ranking": "sum",
        "skeleton_dedupe": "exact",
        "precision": "auto",
        "top_k": 10,
        "none_margin": 0.0,
        "retry": True,
        "rerank": True,
        "constrained": True,
        "kg_guidance": True,
        "backtracking": True,
        "time_budget": 60.0,
        "min_confidence": 0.02,
    }
