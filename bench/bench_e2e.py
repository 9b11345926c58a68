"""End to end: GRISP answering a benchmark (default the 53 demo questions), old code against new code.

Both run `evaluate.py` of their own code (the old one from `git archive <rev>` into a scratch
directory) on the same endpoint, index, adapter and questions, in chunks that alternate between the
two (rotating who goes first) so that background load hits both alike; each chunk is a fresh process
(resumable evaluate runs), so the model is loaded once per chunk. Printed side by side: F1, the median
and mean seconds per question, the mean seconds per stage (generate, search, constraint, rerank,
validate, resolve; from each answer's timings), start-up seconds per process (wall time minus the
questions' own: imports, model and index load, scoring) and peak resident memory.

    python endpoint.py start                                   # the demo knowledge graph
    python bench/bench_e2e.py                                  # old = 3c21e6d (before issue 17), new = this tree
    python bench/bench_e2e.py --old HEAD --new-flags="--precision int8"   # one lever: int8 vs float32
    python bench/bench_e2e.py --old HEAD --old-flags="--precision float32" --new-flags="--precision auto"
                                                               # the precision this CPU gets vs float32
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import defaults  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OLD_REV = "3c21e6d"  # main before the speed work of issue 17
STAGES = ["generate", "search", "constraint", "rerank", "validate", "resolve"]


def checkout(rev: str, scratch: Path) -> Path:
    """The tree of commit `rev` in scratch/<commit hash> (git archive: no worktree bookkeeping). Named by
    the hash, not by `rev`: a name like HEAD moves, and its old tree would be reused."""
    parsed = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, check=False)
    if parsed.returncode != 0:
        sys.exit(f"error: {rev} is not a commit of {REPO}: {parsed.stderr.strip()}")
    commit = parsed.stdout.strip()
    target = scratch / commit
    if not (target / "evaluate.py").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=False)
        if archive.returncode != 0:
            sys.exit(f"error: git archive {rev}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def run_chunk(code: Path, out: Path, limit: int, flags: list[str], args: argparse.Namespace) -> dict:
    """One evaluate.py process over the first `limit` questions (it resumes `out`): wall seconds and
    peak RSS of the process."""
    cmd = [sys.executable, "evaluate.py", "--benchmark", args.benchmark, "--out", str(out), "--limit", str(limit),
           "--endpoint", args.endpoint, "--index", args.index, "--model-dir", args.model_dir, *flags]
    if args.adapter:
        cmd += ["--adapter", args.adapter]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "a") as log:
        process = subprocess.Popen(cmd, cwd=code, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(map(shlex.quote, cmd))} failed in {code}; see {out.parent / (out.name + '.log')}")
    return {"wall": time.perf_counter() - start, "rss_mb": usage.ru_maxrss / 1024}


def records(out: Path) -> list[dict]:
    path = out / "predictions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(args: argparse.Namespace) -> None:
    scratch = Path(args.scratch).expanduser()
    scratch.mkdir(parents=True, exist_ok=True)
    versions = {"old": (checkout(args.old, scratch), shlex.split(args.old_flags)),
                "new": (REPO, shlex.split(args.new_flags))}
    n = args.limit or len([line for line in Path(benchmark_file(args)).read_text().splitlines() if line.strip()])
    run = Path(tempfile.mkdtemp(prefix="e2e-", dir=scratch))
    print(f"old = {args.old} {args.old_flags}, new = working tree {args.new_flags}; {n} questions of "
          f"{args.benchmark} in {args.chunks} chunks; runs in {run}", file=sys.stderr)
    processes = {name: [] for name in versions}
    bounds = [round(n * (i + 1) / args.chunks) for i in range(args.chunks)]
    for i, limit in enumerate(bounds):
        order = list(versions) if i % 2 == 0 else list(reversed(versions))
        for name in order:
            code, flags = versions[name]
            before = {r["id"] for r in records(run / name)}
            stats = run_chunk(code, run / name, limit, flags, args)
            new = [r for r in records(run / name) if r["id"] not in before]
            stats["startup"] = stats["wall"] - sum(r["seconds"] for r in new)
            processes[name].append(stats)
            print(f"chunk {i + 1}/{args.chunks} {name}: {len(new)} questions, {stats['wall']:.0f} s", file=sys.stderr)
    # ---------------------------------------------------------------- table
    rows = {}
    for name in versions:
        recs = records(run / name)
        scored = [r for r in recs if r.get("f1") is not None]
        rows[name] = {
            "F1 (scored questions)": 100 * statistics.fmean(r["f1"] for r in scored) if scored else float("nan"),
            "answered (a query)": sum(bool(r["sparql"]) for r in recs),
            "median s / question": statistics.median(r["seconds"] for r in recs),
            "mean s / question": statistics.fmean(r["seconds"] for r in recs),
            **{f"  {stage} (mean s)": statistics.fmean(r["timings"].get(stage, 0.0) for r in recs) for stage in STAGES},
            "start-up s / process (median)": statistics.median(p["startup"] for p in processes[name]),
            "peak RSS MB (max)": max(p["rss_mb"] for p in processes[name]),
        }
    print(f"\n{n} questions of {args.benchmark}; old = {args.old} {args.old_flags}, new = this tree {args.new_flags}; "
          f"{args.threads} threads")
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
    sys.exit("error: give --limit for a named benchmark other than demo (or a JSONL path)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="GRISP end to end, old code against new code, side by side.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--old", default=OLD_REV, help="git revision of the old code")
    parser.add_argument("--old-flags", default="", help="extra evaluate.py flags for the old code (one string)")
    parser.add_argument("--new-flags", default="", help="extra evaluate.py flags for the new code, e.g. '--precision int8'")
    parser.add_argument("--benchmark", default="demo", help="evaluate.py --benchmark (demo or a JSONL path)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions (default: all)")
    parser.add_argument("--chunks", type=int, default=4, help="alternating chunks (one process per version each)")
    parser.add_argument("--endpoint", default=defaults.ENDPOINT_URL, help="SPARQL endpoint (python endpoint.py start)")
    parser.add_argument("--index", default=str(defaults.DEMO_INDEX_DIR), help="search index directory")
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument("--adapter", default=None, help="LoRA adapter directory (default: each version's own default)")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both")
    parser.add_argument("--scratch", default=str(defaults.GRISP_HOME / "bench"), help="old code and run directories")
    main(parser.parse_args())
