"""gen_data.py, the command line over samples.py: it writes the epochs, reports bad input without a
traceback, and documents its flags."""

import subprocess
import sys
from pathlib import Path

import pytest

from grisp.samples import is_sample_file, read_samples
from tests.test_samples import tiny  # noqa: F401 (the tiny index and records, a fixture)

REPO = Path(__file__).resolve().parents[1]


def test_command_line_writes_epochs(tiny, tmp_path):
    _, records_file, _ = tiny
    out = tmp_path / "samples.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "gen_data.py"),
            "--data",
            str(records_file),
            "--epochs",
            "2",
            "--index",
            str(tiny[0].directory),
            "--out",
            str(out),
            "--model-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    by_epoch = read_samples(out)
    assert sorted(by_epoch) == [0, 1] and len(by_epoch[0]) == 800
    # the per-source table: 401 records read, the one with an IRI the index does not know skipped
    assert f"| {records_file} | 401 | 0 | 0 | 0 | 1 | 0 | 400 | - | 1 | 400 |" in run.stdout
    # the shapes table: the 400 usable records are intersections (wd:Qa wdt:Pp ?x . ?x wdt:Pq wd:Qb: two
    # patterns meeting in the selected ?x)
    assert (
        "| source | ask | aggregate | filter/order | qualifier | other | two-hop | intersection | one triple | all |"
        in run.stdout
    )
    assert f"| {records_file} | 0 | 0 | 0 | 0 | 0 | 0 | 400 | 0 | 400 |" in run.stdout
    assert is_sample_file(str(out)) and "samples of epoch 0 by source" in run.stdout


def test_command_line_mixture_weights(tiny, tmp_path):
    _, records_file, _ = tiny
    half = tmp_path / "half.jsonl"
    half.write_text(records_file.read_text())
    out = tmp_path / "samples.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "gen_data.py"),
            "--data",
            f"{records_file}:2,{half}:0.25",
            "--epochs",
            "1",
            "--index",
            str(tiny[0].directory),
            "--out",
            str(out),
            "--model-dir",
            str(tmp_path),
            "--compose",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    samples = read_samples(out)[0]
    skeletons = [s for s in samples if s["task"] == "skeleton"]
    assert sum(s["source"] == str(records_file) for s in skeletons) == 800  # every record twice
    assert sum(s["source"] == str(half) for s in skeletons) == 100  # a quarter of them
    assert all(s["id"].startswith(s["source"] + ":") for s in samples)  # two sources: ids made unique


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--data", "no/such.jsonl"], "no/such.jsonl"),
        (["--data", "wwq:0"], "must be a finite number > 0"),
        (["--data", "wwq:nan"], "must be a finite number > 0"),
        (["--epochs", "0"], "--epochs"),
        (["--show", "-1"], "--show must be at least 0"),
    ],
)
def test_command_line_bad_input(tmp_path, flags, message):
    run = subprocess.run(
        [sys.executable, str(REPO / "gen_data.py"), "--index", str(tmp_path), *flags],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and message in run.stderr and "Traceback" not in run.stderr


def test_help():
    run = subprocess.run(
        [sys.executable, str(REPO / "gen_data.py"), "--help"], capture_output=True, text=True
    )
    assert run.returncode == 0 and "--drop-gold" in run.stdout
    assert "(default: None)" not in " ".join(
        run.stdout.split()
    )  # a None default: the help says what unset means
    assert "demo index" not in " ".join(
        run.stdout.split()
    )  # --data demo is refused (an evaluation set): its index is no default
