"""End to end: GRISP answering a benchmark (default the 53 demo questions), old code against new code.

Both run `evaluate.py` of their own code (the old one from `git archive <rev>` into a scratch
directory) on the same endpoint, index, adapter, precision and questions, in chunks that alternate
between the two (rotating who goes first) so that background load hits both alike. The adapter
(--adapter, default this tree's defaults.ADAPTER_DIR) and the precision (--precision, default float32)
are passed to both explicitly, not left to each version's own default (they differ between versions);
a side's own --old-flags / --new-flags come last and override them. Code whose evaluate.py has no
--precision flag (before issue 17, e.g. 3c21e6d) runs float32 on a CPU; it can only be compared at
float32. The header names the CPU and each side's adapter and precision. Each chunk is a fresh process
(resumable evaluate runs), so the model is loaded once per chunk. Printed side by side: F1, the median
and mean seconds per question, the mean seconds per stage (generate, search, constraint, rerank,
validate, resolve; from each answer's timings), start-up seconds per process (wall time minus the
questions' own: imports, model and index load, scoring) and peak resident memory.

    python endpoint.py start                                   # the demo knowledge graph
    python bench/bench_e2e.py                                  # old = 3c21e6d (before issue 17), new = this tree
    python bench/bench_e2e.py --old HEAD --new-flags="--precision int8"   # one lever: int8 vs float32
    python bench/bench_e2e.py --old HEAD --new-flags="--precision auto"   # the precision this CPU gets vs float32
    python bench/bench_e2e.py --limit 8 --chunks 2             # a quick look
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rotation import rotated  # noqa: E402
from common import defaults  # noqa: E402
from llm.cpu_speed import PRECISIONS, cpu_name, native_bf16, pick_precision  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OLD_REV = "3c21e6d"  # main before the speed work of issue 17
STAGES = ["generate", "search", "constraint", "rerank", "validate", "resolve"]


def checkout(rev: str, scratch: Path) -> Path:
    """The tree of commit `rev` in scratch/<commit hash> (git archive: no worktree bookkeeping). Named by
    the hash, not by `rev`: a name like HEAD moves, and its old tree would be reused."""
    parsed = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if parsed.returncode != 0:
        sys.exit(f"error: {rev} is not a commit of {REPO}: {parsed.stderr.strip()}")
    commit = parsed.stdout.strip()
    target = scratch / commit
    if not (target / "evaluate.py").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=False
        )
        if archive.returncode != 0:
            sys.exit(f"error: git archive {rev}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def own_flags(flags: list[str]) -> argparse.Namespace:
    """The --adapter and --precision among a side's own evaluate.py flags (None where not given)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--adapter")
    parser.add_argument("--precision")
    return parser.parse_known_args(flags)[0]


def without_precision(flags: list[str]) -> list[str]:
    """`flags` without their --precision (as `--precision X` or `--precision=X`)."""
    kept, skip = [], False
    for flag in flags:
        if not skip and flag != "--precision" and not flag.startswith("--precision="):
            kept.append(flag)
        skip = flag == "--precision"
    return kept


def takes_precision(code: Path) -> bool:
    """Does the evaluate.py of `code` have a --precision flag? (Its --help; 3c21e6d's has none.)"""
    done = subprocess.run(
        [sys.executable, "evaluate.py", "--help"], cwd=code, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"error: python evaluate.py --help failed in {code}:\n{done.stderr[-2000:]}")
    return "--precision" in done.stdout


def side(name: str, code: Path, extra: str, args: argparse.Namespace) -> dict:
    """One version's evaluate.py flags and what it runs: the shared --adapter and --precision first, its
    own flags last (argparse keeps the last of a repeated flag, so they override)."""
    extra_flags = shlex.split(extra)
    own = own_flags(extra_flags)
    flags = ["--adapter", args.adapter]
    if own.precision is not None:
        if not takes_precision(code):
            sys.exit(
                f"error: --{name}-flags gives --precision, but the {name} code's evaluate.py has no such flag"
            )
        resolved = pick_precision(own.precision, torch.device("cpu"))[
            0
        ]  # auto: what this CPU gets, shown and passed
        extra_flags = without_precision(extra_flags) + ["--precision", resolved]
        precision = f"{resolved} (--{name}-flags)"
    elif takes_precision(code):
        flags += ["--precision", args.precision]
        precision = args.precision
    elif args.precision == "float32":
        precision = "float32 (its evaluate.py has no --precision; it runs float32 on a CPU)"
    else:
        sys.exit(
            f"error: the {name} code's evaluate.py has no --precision flag (it runs float32 on a CPU); "
            f"compare at --precision float32"
        )
    return {
        "code": code,
        "flags": flags + extra_flags,
        "adapter": own.adapter or args.adapter,
        "precision": precision,
        "extra": extra,
    }


def describe(name: str, version: dict, rev: str) -> str:
    """A header line: which code, adapter and precision one side runs."""
    return f"{name} = {rev}: adapter {version['adapter']}, precision {version['precision']}" + (
        f", own flags {version['extra']}" if version["extra"] else ""
    )


def run_chunk(code: Path, out: Path, limit: int, flags: list[str], args: argparse.Namespace) -> dict:
    """One evaluate.py process over the first `limit` questions (it resumes `out`): wall seconds and
    peak RSS of the process."""
    cmd = [
        sys.executable,
        "evaluate.py",
        "--benchmark",
        args.benchmark,
        "--out",
        str(out),
        "--limit",
        str(limit),
        "--endpoint",
        args.endpoint,
        "--index",
        args.index,
        "--model-dir",
        args.model_dir,
        *flags,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "a") as log:
        process = subprocess.Popen(cmd, cwd=code, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(
            f"error: {' '.join(map(shlex.quote, cmd))} failed in {code}; see {out.parent / (out.name + '.log')}"
        )
    return {"wall": time.perf_counter() - start, "rss_mb": usage.ru_maxrss / 1024}


def records(out: Path) -> list[dict]:
    path = out / "predictions.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def chunk_bounds(n: int, chunks: int) -> list[int]:
    """The --limit of each chunk's evaluate.py: `chunks` even steps up to n, none 0 (needs n >= chunks)."""
    assert 1 <= chunks <= n, f"{n} questions in {chunks} chunks"
    return [n * (i + 1) // chunks for i in range(chunks)]


def main(args: argparse.Namespace) -> None:
    # --- checks, before the old code is checked out
    if args.chunks < 1:
        sys.exit(f"error: --chunks {args.chunks}: give 1 or more")
    if args.limit is not None and args.limit < 1:
        sys.exit(f"error: --limit {args.limit}: give 1 or more (or leave it out for all questions)")
    n = args.limit or len(
        [line for line in Path(benchmark_file(args)).read_text().splitlines() if line.strip()]
    )
    if n < args.chunks:
        sys.exit(f"error: {n} questions cannot fill --chunks {args.chunks}: give --chunks {n} or fewer")
    scratch = Path(args.scratch).expanduser()
    scratch.mkdir(parents=True, exist_ok=True)
    # absolute paths: each version runs in its own directory, and both must read the same files
    args.model_dir, args.index = str(Path(args.model_dir).resolve()), str(Path(args.index).resolve())
    if args.adapter.lower() != "none":
        args.adapter = str(Path(args.adapter).expanduser().resolve())
    # auto resolved here, once, so that both sides get the same explicit precision
    args.precision, why_precision = pick_precision(args.precision, torch.device("cpu"))
    versions = {
        "old": side("old", checkout(args.old, scratch), args.old_flags, args),
        "new": side("new", REPO, args.new_flags, args),
    }
    run = Path(tempfile.mkdtemp(prefix="e2e-", dir=scratch))
    header = "\n".join(
        [
            f"CPU {cpu_name()} (native bf16: {native_bf16()}), {args.threads} threads; "
            f"--precision {args.precision} ({why_precision})",
            describe("old", versions["old"], args.old),
            describe("new", versions["new"], "this tree"),
        ]
    )
    print(
        f"{header}\n{n} questions of {args.benchmark} in {args.chunks} chunks; runs in {run}", file=sys.stderr
    )
    processes = {name: [] for name in versions}
    for i, limit in enumerate(chunk_bounds(n, args.chunks)):
        for name in rotated(versions, i):
            code, flags = versions[name]["code"], versions[name]["flags"]
            before = {r["id"] for r in records(run / name)}
            stats = run_chunk(code, run / name, limit, flags, args)
            new = [r for r in records(run / name) if r["id"] not in before]
            stats["startup"] = stats["wall"] - sum(r["seconds"] for r in new)
            processes[name].append(stats)
            print(
                f"chunk {i + 1}/{args.chunks} {name}: {len(new)} questions, {stats['wall']:.0f} s",
                file=sys.stderr,
            )
    # ---------------------------------------------------------------- table
    rows = {}
    for name in versions:
        recs = records(run / name)
        scored = [r for r in recs if r.get("f1") is not None]
        rows[name] = {
            "F1 (scored questions)": 100 * statistics.fmean(r["f1"] for r in scored)
            if scored
            else float("nan"),
            "answered (a query)": sum(bool(r["sparql"]) for r in recs),
            "median s / question": statistics.median(r["seconds"] for r in recs),
            "mean s / question": statistics.fmean(r["seconds"] for r in recs),
            **{
                f"  {stage} (mean s)": statistics.fmean(r["timings"].get(stage, 0.0) for r in recs)
                for stage in STAGES
            },
            "start-up s / process (median)": statistics.median(p["startup"] for p in processes[name]),
            "peak RSS MB (max)": max(p["rss_mb"] for p in processes[name]),
        }
    print(f"\n{n} questions of {args.benchmark}\n{header}")
    print("| metric | old | new | new / old |\n|---|---|---|---|")
    for metric in rows["old"]:
        old, new = rows["old"][metric], rows["new"][metric]
        ratio = f"{new / old:.2f}x" if old else "-"
        print(f"| {metric} | {old:.1f} | {new:.1f} | {ratio} |")
    print(f"\nper-question records: {run}/old/predictions.jsonl, {run}/new/predictions.jsonl")


def benchmark_file(args: argparse.Namespace) -> str:
    """The benchmark's JSONL (for counting its questions): the demo file, a path, or the cached name."""
    if args.benchmark == "demo":
        return str(defaults.DEMO_DIR / "questions.jsonl")
    if Path(args.benchmark).exists():
        return args.benchmark
    sys.exit(
        f"error: --benchmark {args.benchmark} is neither demo nor a JSONL file: give --limit N with a benchmark name"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="GRISP end to end, old code against new code, side by side.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--old", default=OLD_REV, help="git revision of the old code")
    parser.add_argument(
        "--old-flags", default="", help="extra evaluate.py flags for the old code (one string)"
    )
    parser.add_argument(
        "--new-flags", default="", help="extra evaluate.py flags for the new code, e.g. '--precision int8'"
    )
    parser.add_argument(
        "--benchmark",
        default="demo",
        help="evaluate.py --benchmark: demo, a JSONL path, or another "
        "benchmark name (wwq-dev ...) with --limit",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only the first N questions (default: all; needed for a benchmark name other than demo)",
    )
    parser.add_argument(
        "--chunks", type=int, default=4, help="alternating chunks (one process per version each)"
    )
    parser.add_argument(
        "--endpoint", default=defaults.ENDPOINT_URL, help="SPARQL endpoint (python endpoint.py start)"
    )
    parser.add_argument("--index", default=str(defaults.DEMO_INDEX_DIR), help="search index directory")
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument(
        "--adapter",
        default=str(defaults.ADAPTER_DIR),
        help="LoRA adapter directory (or 'none') given to both versions (this tree's default "
        "adapter unless set; the versions' own defaults differ); --old-flags / --new-flags "
        "may override it per side",
    )
    parser.add_argument(
        "--precision",
        default="float32",
        choices=list(PRECISIONS),
        help="evaluate.py --precision given to both versions: float32 by default (the one every "
        "version runs); auto is resolved here once, for this CPU; --old-flags / --new-flags "
        "may override it per side",
    )
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both")
    parser.add_argument(
        "--scratch", default=str(defaults.GRISP_HOME / "bench"), help="old code and run directories"
    )
    main(parser.parse_args())
