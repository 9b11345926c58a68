"""Tests for the bench scripts' argument handling and round order (no model, no timing)."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import bench_e2e, bench_model  # noqa: E402
from bench.rotation import rotated  # noqa: E402
from llm.cpu_speed import SplitLinear  # noqa: E402


def test_rotated_puts_each_first_equally_often():
    assert [rotated("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert rotated({"x": 1, "y": 2}, 1) == ["y", "x"]  # a dict: its keys
    assert rotated([], 3) == []


def e2e_args(**changes) -> argparse.Namespace:
    return argparse.Namespace(**{"adapter": "/a/grisp-mix-0.5b", "precision": "float32", **changes})


def test_e2e_gives_both_sides_the_shared_adapter_and_precision(monkeypatch):
    monkeypatch.setattr(bench_e2e, "takes_precision", lambda code: True)
    version = bench_e2e.side("new", Path("/code"), "", e2e_args())
    assert version["flags"] == ["--adapter", "/a/grisp-mix-0.5b", "--precision", "float32"]
    assert (version["adapter"], version["precision"]) == ("/a/grisp-mix-0.5b", "float32")


def test_e2e_side_flags_come_last_and_show_in_the_header(monkeypatch):
    monkeypatch.setattr(bench_e2e, "takes_precision", lambda code: True)
    version = bench_e2e.side("new", Path("/code"), "--precision int8 --adapter=/b", e2e_args())
    # the side's own precision replaces the shared one; its adapter follows the shared one, and evaluate.py's
    # argparse keeps the last
    assert version["flags"] == ["--adapter", "/a/grisp-mix-0.5b", "--adapter=/b", "--precision", "int8"]
    assert version["adapter"] == "/b" and version["precision"].startswith("int8")
    assert "adapter /b, precision int8" in bench_e2e.describe("new", version, "this tree")


def test_e2e_a_sides_own_precision_is_resolved_and_needs_the_flag(monkeypatch, mock_native_bf16):
    mock_native_bf16(True)
    monkeypatch.setattr(bench_e2e, "takes_precision", lambda code: True)
    version = bench_e2e.side("new", Path("/code"), "--precision auto", e2e_args())
    assert version["flags"][-2:] == ["--precision", "bfloat16"] and version["precision"].startswith(
        "bfloat16"
    )
    monkeypatch.setattr(bench_e2e, "takes_precision", lambda code: False)
    with pytest.raises(
        SystemExit, match="no such flag"
    ):  # it failed only at the first chunk, after the header
        bench_e2e.side("old", Path("/old"), "--precision float32", e2e_args())


def test_e2e_code_without_a_precision_flag_runs_float32_only(monkeypatch):
    monkeypatch.setattr(bench_e2e, "takes_precision", lambda code: False)
    version = bench_e2e.side("old", Path("/old"), "", e2e_args())
    assert version["flags"] == ["--adapter", "/a/grisp-mix-0.5b"] and version["precision"].startswith(
        "float32"
    )
    with pytest.raises(SystemExit, match="no --precision flag"):
        bench_e2e.side("old", Path("/old"), "", e2e_args(precision="bfloat16"))


@pytest.mark.parametrize("n, chunks", [(2, 2), (3, 2), (5, 4), (53, 4), (7, 7)])
def test_e2e_chunk_bounds_rise_to_n_and_are_never_0(n, chunks):
    bounds = bench_e2e.chunk_bounds(n, chunks)  # round(2 * 1/4) was 0: evaluate.py --limit 0 aborts
    assert len(bounds) == chunks and bounds[0] >= 1 and bounds[-1] == n
    assert all(a < b for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--limit", "2", "--chunks", "4"], "2 questions cannot fill --chunks 4"),
        (["--chunks", "0"], "--chunks 0"),
        (["--limit", "0"], "--limit 0"),
        (["--benchmark", "wwq-dev"], "give --limit N"),
    ],
)
def test_e2e_bad_arguments_are_refused_before_the_old_code_is_checked_out(tmp_path, flags, message):
    """(--old names no commit: a check that came after the checkout would report that instead.)"""
    done = subprocess.run(
        [sys.executable, "bench/bench_e2e.py", "--old", "no-such-rev", "--scratch", str(tmp_path), *flags],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("error:") and list(tmp_path.iterdir()) == []


def test_bench_model_names_the_precision_of_every_implementation():
    assert bench_model.runs_in("ours", "bfloat16") == "bfloat16"
    assert bench_model.runs_in("transformers", "bfloat16") == "bfloat16"
    assert bench_model.runs_in("ours-int8", "bfloat16").startswith("float32 weights")
    assert bench_model.runs_in("ours-autocast", "float32").startswith("float32 weights")


@pytest.mark.parametrize("bias", [False, True])
def test_bench_matmul_times_split_linear_on_both_paths(bias):
    from bench.bench_matmul import random_linear

    linear = random_linear(8, 6, bias)
    x = torch.randn(5, 6)
    split = SplitLinear(linear, 2, max_rows=5)  # as bench_matmul makes it: the split path at these rows
    assert (split.bias is not None) == bias
    torch.testing.assert_close(split(x), linear(x))
