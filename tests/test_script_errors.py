"""The research scripts (bench/, runs/, tools/gen_agent_data.py, get_model.py) end a bad flag or a missing file with an
error message that names it, before loading a model or an index: no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MISSING = "{tmp}/missing"  # a path that does not exist; {tmp} is the test's tmp_path

CASES = [  # script, flags, what the message names
    ("bench/bench_shared_start.py", ["--data", MISSING, "--model-dir", MISSING], "missing"),
    ("bench/eval_property_search.py", ["--items", MISSING], "missing"),
    ("bench/bench_infer.py", ["--max-new-tokens", "0"], "max_new_tokens"),
    ("bench/bench_infer.py", ["--time-budget", "-1"], "time_budget"),
    ("bench/bench_attention.py", ["--threads", "0"], "--threads"),
    ("bench/bench_attention.py", ["--rounds", "0"], "--rounds"),
    ("bench/bench_matmul.py", ["--threads", "0"], "--threads"),
    ("bench/bench_matmul.py", ["--rounds", "0", "--rows", "1"], "--rounds"),
    ("bench/bench_train.py", ["--threads", "0"], "--threads"),
    ("bench/bench_train.py", ["--repeats", "0", "--model-dir", MISSING], "--repeats"),
    ("tools/rerank_probe.py", ["--benchmark", "nosuch"], "nosuch"),
    ("tools/matched_rerank_sets.py", [MISSING, MISSING, "{tmp}/out"], "missing"),
    ("tools/dead_ends.py", [MISSING, MISSING, "--endpoint", "http://127.0.0.1:9/query"], "missing"),
    (
        "tools/gen_agent_data.py",
        ["--limit", "-5", "--index", MISSING, "--out", "{tmp}/out.jsonl"],
        "--limit -5",
    ),
    ("get_model.py", ["--timeout", "0", "--gguf", MISSING, "--out", "{tmp}/model"], "--timeout 0"),
    ("get_model.py", ["--timeout", "-1", "--gguf", MISSING, "--out", "{tmp}/model"], "--timeout -1"),
]


@pytest.mark.parametrize("script, flags, named", CASES, ids=[f"{s} {' '.join(f)}" for s, f, _ in CASES])
def test_a_bad_flag_is_a_one_line_error(tmp_path, script, flags, named):
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    done = subprocess.run(
        ["nice", "-n", "19", sys.executable, script, *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(errors) == 1 and named in errors[0], done.stderr[-2000:]
