"""The shell scripts (demo.sh, runs/*.sh) answer --help with their usage and refuse bad arguments before they
start anything: run with a `python` (and `nohup`) on PATH that only records being called."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["demo.sh", "runs/mix.sh", "runs/mention.sh", "runs/results.sh"]


def run(tmp_path: Path, script: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run `bash script args` in tmp_path with stub programs that append their command lines to
    tmp_path/calls (and `env` added to the environment); returns the process and what the stubs recorded."""
    stubs, calls = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir(exist_ok=True)
    for name in ("python", "python3", "nohup", "pip"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        (stubs / name).chmod(0o755)
    env = (
        os.environ
        | {
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "GRISP_HOME": str(tmp_path / "home"),
            "HOME": str(tmp_path),
        }
        | env
    )
    done = subprocess.run(
        ["bash", str(REPO / script), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    return done, calls.read_text() if calls.exists() else ""


def usage(script: str) -> str:
    """The script's header comment (after the #! line), without the comment signs."""
    lines = (REPO / script).read_text().splitlines()[1:]
    header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    return "".join(line.removeprefix("#").removeprefix(" ") + "\n" for line in header)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage_and_starts_nothing(tmp_path, script, flag):
    done, calls = run(tmp_path, script, flag)
    assert done.returncode == 0 and done.stdout == usage(script) and "bash" in done.stdout, done.stderr
    assert calls == "" and not (tmp_path / "home").exists()


def test_mix_refuses_a_name_that_is_a_flag(tmp_path):
    done, calls = run(tmp_path, "runs/mix.sh", "--lr", "1e-4")
    assert done.returncode != 0 and "NAME --lr starts with '-'" in done.stderr
    assert calls == "" and not (tmp_path / "home").exists()


def test_results_checks_every_group_before_running_any(tmp_path):
    done, calls = run(tmp_path, "runs/results.sh", "demo", "wwq-dev-ful")
    assert done.returncode != 0 and "unknown group wwq-dev-ful" in done.stderr
    assert calls == ""


def test_results_runs_the_rows_that_place_the_full_system_first(tmp_path):
    done, calls = run(tmp_path, "runs/results.sh", "demo-ablations")
    assert done.returncode == 0, done.stderr
    runs = [
        line.split("--out ")[1].split()[0].rsplit("/", 1)[1]
        for line in calls.splitlines()
        if line.startswith("python evaluate.py")
    ]
    assert runs[:5] == [
        "demo-none",
        "demo-no-rerank",
        "demo-none-no-retry",
        "demo-oracle",
        "demo-no-rerank-oracle",
    ]
    assert set(runs[5:]) == {
        "demo-no-kg-guidance",
        "demo-no-constrained",
        "demo-no-backtracking",
        "demo-no-beam-search",
        "demo-all-disabled",
        "demo-rerank-only",
    }
    no_retry = next(line for line in calls.splitlines() if "demo-none-no-retry" in line)
    assert "--no-retry" in no_retry and no_retry.split("--skeletons-from ")[1].split()[0].endswith(
        "/demo-none"
    )
    gold_in_index_order = next(line for line in calls.splitlines() if "demo-no-rerank-oracle" in line)
    assert "--oracle-skeleton" in gold_in_index_order and "--ablation no-rerank" in gold_in_index_order


def test_results_takes_a_relative_out_from_the_current_directory(tmp_path):
    """Before: OUT was read after the script's `cd` to the repository, so a relative OUT landed inside it."""
    done, calls = run(tmp_path, "runs/results.sh", "demo", OUT="issue15/new")
    assert done.returncode == 0, done.stderr
    outs = [
        line.split("--out ")[1].split()[0]
        for line in calls.splitlines()
        if line.startswith("python evaluate.py")
    ]
    assert outs == [f"{tmp_path}/issue15/new/demo-none"]


def test_results_runs_a_half_of_the_realistic_setting_with_its_risk_table(tmp_path):
    done, calls = run(tmp_path, "runs/results.sh", "wwq-dev-real-report")
    assert done.returncode == 0, done.stderr
    lines = calls.splitlines()
    evaluations = [line for line in lines if line.startswith("python evaluate.py")]
    assert [line.split("--out ")[1].split()[0].rsplit("/", 1)[1] for line in evaluations] == [
        "wwq-dev-real-report-none",
        "wwq-dev-real-report-no-rerank",
    ]
    assert all("--benchmark wwq-dev-real-report" in line and "7881" in line for line in evaluations)
    assert any(line.startswith("python tools/build_eval_kg.py --setting real") for line in lines)
    assert any(line.startswith("python tools/report.py risk") and "--without-retry" in line for line in lines)
