"""Benchmark our prefix-keyword index at Wikidata scale, beside GRASP's Rust `search-index` on the same data.

For each size (--names 1M,10M,100M: labels plus 10% aliases; bench/synthetic_names.py, streamed, so the
benchmark itself fits in memory at 100M), a search-index TSV is written and both indices are built from it,
each in its own process: ours by the chunked build (grisp/prefix_build.py, --memory-budget), Rust's where
it can be built (search-index holds all names in memory: above --rust-max-names, or when it is not
installed, the table says so). Printed per size: build time, peak RSS of the build process, index on disk,
load time and RSS after loading (a fresh process), p50/p95 query latency unconstrained and KG-constrained
to 1k and 100k allowed items (both indices in one process, interleaved per query, several rounds: the spread
across rounds is the noise), and, beside Rust, top-1 / top-10 agreement. Then one table over the sizes.
What ours must reach: latency near-flat in the size, within 2x of Rust; results: docs/wikidata-scale.md.

    pip install --no-deps search-index faiss-cpu    # bench-only (bench/requirements.txt)
    python bench/bench_search.py --names 1M,10M,100M --work-dir /data/bench   # hours at 100M; ~15 GB of disk
    python bench/bench_search.py --names 100k --queries 300 --rounds 2         # quick look (~1 minute)
"""

import argparse
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's modules
from bench.rotation import rotated  # noqa: E402
from bench.synthetic_names import items_count, sample_queries, vocabulary_size, write_tsv  # noqa: E402
from grisp.prefix_build import DEFAULT_BUDGET, build_prefix  # noqa: E402
from search import PrefixIndex  # noqa: E402

ALLOWED = (1000, 100_000)  # item counts of the KG-constrained searches


def rust_index():
    """GRASP's Rust PrefixIndex class, or None if search-index is not installed."""
    try:
        from search_index import PrefixIndex as RustPrefixIndex
    except ImportError:
        return None
    return RustPrefixIndex


# ---------------------------------------------------------------------------- child processes
def status_mb(field: str) -> float:
    """A memory figure of this process from /proc: VmRSS (resident now), VmHWM (peak resident since exec; the
    peak of getrusage would count the parent's memory, shared by the fork before the exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def rss_mb() -> float:
    return status_mb("VmRSS")


def tsv_items(tsv: Path, start: int):
    """(names, popularity) of the TSV's rows from `start` on (the chunked build's item source)."""
    with open(tsv, encoding="utf-8") as f:
        next(f)
        for row, line in enumerate(f):
            if row >= start:
                label, score, synonyms, _ = line.rstrip("\n").split("\t")
                yield [label] + [s for s in synonyms.split(";;;") if s], float(score)


def build_child(impl: str, tsv: Path, out: Path, budget: int) -> dict:
    """Build one index in a fresh process: seconds and the process's peak RSS (interpreter included)."""
    start = time.perf_counter()
    if impl == "ours":
        total = sum(1 for _ in open(tsv, encoding="utf-8")) - 1
        items = lambda row: tsv_items(tsv, row)
        build_prefix(out, items, {"tsv": str(tsv)}, out.with_name("ours.chunks"), budget, total)
    elif impl == "old":  # today's in-memory build, every name at once
        rows = list(tsv_items(tsv, 0))
        PrefixIndex.build([names for names, _ in rows], np.array([score for _, score in rows])).save(out)
    else:
        out.mkdir(parents=True)
        rust_index().build(str(tsv), str(out))
    return {"build_s": time.perf_counter() - start, "build_peak_mb": status_mb("VmHWM")}


def load_child(impl: str, tsv: Path, out: Path, query: str) -> dict:
    """Open one index in a fresh process and answer one query: seconds, and the resident memory it adds."""
    base, start = rss_mb(), time.perf_counter()
    index = PrefixIndex.load(out) if impl == "ours" else rust_index().load(str(tsv), str(out))
    index.search(query, 10) if impl == "ours" else index.find_matches(query)
    return {"load_s": time.perf_counter() - start, "load_mb": rss_mb() - base}


def in_child(function, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


# ---------------------------------------------------------------------------- latency
def timed(function, *args) -> tuple[float, list]:
    start = time.perf_counter()
    result = function(*args)
    return (time.perf_counter() - start) * 1000, result


def searchers(work: Path, tsv: Path, impls: list[str], n_items: int, seed: int) -> dict:
    """{(impl, allowed count or None): query -> top-10 [(row, score)]} over the loaded indices."""
    runs = {}
    rng = np.random.default_rng(seed)
    allowed = {count: np.sort(rng.choice(n_items, min(count, n_items), replace=False)) for count in ALLOWED}
    if "ours" in impls:
        ours = PrefixIndex.load(work / "ours")
        runs["ours", None] = lambda q: ours.search(q, 10)
        for count, rows in allowed.items():
            runs["ours", count] = lambda q, rows=rows: ours.search(q, 10, rows)
    if "rust" in impls:
        rust = rust_index().load(str(tsv), str(work / "rust"))
        runs["rust", None] = lambda q: rust.find_matches(q)[:10]
        for count, rows in allowed.items():  # the sub-index is made once per allowed set, not timed (ours
            # works from the allowed rows at every query)
            sub = rust.sub_index_by_ids([int(row) for row in rows])
            runs["rust", count] = lambda q, sub=sub: sub.find_matches(q)[:10]
    return runs


def latency(runs: dict, queries: list[str], rounds: int) -> tuple[dict, dict]:
    """Per (impl, allowed), the (p50, p95) query milliseconds of each round; and the unconstrained results."""
    for run in runs.values():  # warm-up: page cache, lazy initialisation
        for query in queries[:50]:
            run(query)
    times, results = {key: [] for key in runs}, {}
    for r in range(rounds):
        round_times = {key: [] for key in runs}
        for i, query in enumerate(queries):
            for key in rotated(list(runs), r * len(queries) + i):  # each goes first equally often
                ms, result = timed(runs[key], query)
                round_times[key].append(ms)
                if key[1] is None:
                    results[key[0], query] = result
        for key, values in round_times.items():
            times[key].append((np.percentile(values, 50), np.percentile(values, 95)))
    return times, results


def agreement(queries: list[str], results: dict, other: str = "rust") -> str:
    """Top-1 agreement and identical top-10 lists of ours and another index over the queries."""
    top1 = top10 = 0
    for q in queries:
        a, b = [i for i, _ in results["ours", q]], [i for i, _ in results[other, q]]
        top1, top10 = top1 + (a[:1] == b[:1]), top10 + (a == b)
    return f"top-1 agreement {100 * top1 / len(queries):.1f}%, identical top-10 {100 * top10 / len(queries):.1f}%"


def old_build_agreement(tsv: Path, work: Path, queries: list[str], results: dict, budget: int) -> str:
    """Ours (chunked) against today's in-memory build of the same data: built, loaded and asked apart from
    the timed runs; its build time and peak RSS are printed for comparison, its latency is not timed."""
    built = in_child(build_child, "old", tsv, work / "old", budget)
    old = PrefixIndex.load(work / "old")
    results = results | {("old", q): old.search(q, 10) for q in queries}
    return (
        f"in-memory build (PrefixIndex.build): {built['build_s']:.1f} s, peak RSS {built['build_peak_mb']:,.0f} MB; "
        f"against ours: {agreement(queries, results, 'old')}"
    )


# ---------------------------------------------------------------------------- one size, the report
def disk_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20


def measure_size(n_names: int, args: argparse.Namespace, work: Path) -> dict:
    """Every number of the table for one size: {"ours": {...}, "rust": {...} or {"skipped": why}}."""
    tsv, n_items = work / "data.tsv", items_count(n_names)
    started = time.perf_counter()
    write_tsv(tsv, n_names, args.seed)
    queries = sample_queries(n_names, args.queries, args.seed)
    print(
        f"\n{n_names:,} names of {n_items:,} items, {vocabulary_size(n_names):,} words; data written in "
        f"{time.perf_counter() - started:.0f} s ({tsv.stat().st_size / 2**20:,.0f} MB); {len(queries)} queries"
    )
    stats, impls = {}, ["ours"]
    if rust_index() is None:
        stats["rust"] = {"skipped": "search-index not installed"}
    elif n_names > args.rust_max_names:
        stats["rust"] = {
            "skipped": f"not built above --rust-max-names {args.rust_max_names:,} (all in memory)"
        }
    else:
        impls.append("rust")
    for impl in impls:
        stats[impl] = in_child(build_child, impl, tsv, work / impl, args.memory_budget)
        stats[impl] |= in_child(load_child, impl, tsv, work / impl, queries[0])
        stats[impl]["disk_mb"] = disk_mb(work / impl)
    times, results = latency(searchers(work, tsv, impls, n_items, args.seed), queries, args.rounds)
    for (impl, allowed), rounds in times.items():
        label = "" if allowed is None else f"_{allowed}"
        stats[impl] |= {
            f"p{p}{label}": float(np.median([r[i] for r in rounds])) for i, p in ((0, 50), (1, 95))
        }
        stats[impl][f"p50{label}_range"] = (min(r[0] for r in rounds), max(r[0] for r in rounds))
    if "rust" in impls:
        stats["agreement"] = agreement(queries, results)
    if n_names <= args.old_max_names:
        stats["old"] = old_build_agreement(tsv, work, queries, results, args.memory_budget)
    return stats


ROWS = [
    ("build time [s]", "build_s"),
    ("build peak RSS (whole process) [MB]", "build_peak_mb"),
    ("index on disk [MB]", "disk_mb"),
    ("load time [s]", "load_s"),
    ("RSS added by load + 1 query [MB]", "load_mb"),
    ("query p50 [ms]", "p50"),
    ("query p95 [ms]", "p95"),
] + [(f"constrained {n:,} p{p} [ms]", f"p{p}_{n}") for n in ALLOWED for p in (50, 95)]


def report_size(n_names: int, stats: dict) -> None:
    """Both indices side by side (ratio ours / Rust), or why Rust was not built."""
    rust = stats["rust"]
    print(f"\n| {n_names:,} names{'':<24s} | {'ours':>10s} | {'Rust':>10s} | {'ours / Rust':>11s} |")
    print(f"|{'-' * 39}|{'-' * 12}|{'-' * 12}|{'-' * 13}|")
    for label, key in ROWS:
        a, b = stats["ours"][key], rust.get(key, float("nan"))
        print(f"| {label:37s} | {a:10.2f} | {b:10.2f} | {a / b if b else float('nan'):10.2f}x |")
    if "skipped" in rust:
        print(f"Rust: {rust['skipped']}")
    else:
        print(stats["agreement"])
    if "old" in stats:
        print(stats["old"])
    spread = {
        impl: "%.2f-%.2f" % stats[impl]["p50_range"] for impl in ("ours", "rust") if "p50" in stats[impl]
    }
    print(f"noise: unconstrained p50 range over the rounds {spread}; load average {os.getloadavg()[0]:.1f}")


def report_scale(sizes: list[int], all_stats: dict) -> None:
    """Ours over the sizes: how build, memory and latency grow."""
    print(f"\n| {'ours':37s} | " + " | ".join(f"{n:>12,}" for n in sizes) + " |")
    print(f"|{'-' * 39}|" + "|".join("-" * 14 for _ in sizes) + "|")
    for label, key in ROWS:
        print(f"| {label:37s} | " + " | ".join(f"{all_stats[n]['ours'][key]:12.2f}" for n in sizes) + " |")


def parse_sizes(text: str) -> list[int]:
    """'1M,10M,100M' or '100k,1000000' -> numbers of names."""
    sizes = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", part.strip())
        if not match:
            raise argparse.ArgumentTypeError(f"{part!r}: a number of names is written 100k, 1M or 1000000")
        sizes.append(int(float(match[1]) * {"": 1, "k": 10**3, "m": 10**6}[match[2].lower()]))
    return sizes


def main(args: argparse.Namespace) -> None:
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench_search_", dir=args.work_dir))
    print(f"sizes {args.names}, {args.queries} queries, k=10, {args.rounds} rounds; data in {root}")
    all_stats = {}
    for n_names in args.names:
        work = root / f"{n_names}"
        work.mkdir()
        all_stats[n_names] = measure_size(n_names, args, work)
        report_size(n_names, all_stats[n_names])
        if not args.keep:
            shutil.rmtree(work)
    report_scale(args.names, all_stats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--names", type=parse_sizes, default="1M", help="sizes in names, comma-separated")
    parser.add_argument("--queries", type=int, default=1000, help="number of queries")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds over all queries")
    parser.add_argument("--seed", type=int, default=0, help="random seed of data and queries")
    parser.add_argument(
        "--memory-budget", type=int, default=DEFAULT_BUDGET, help="our build's budget [bytes]"
    )
    parser.add_argument(
        "--rust-max-names",
        type=int,
        default=10_000_000,
        help="largest size Rust's in-memory build is tried at",
    )
    parser.add_argument(
        "--old-max-names",
        type=int,
        default=1_000_000,
        help="largest size at which today's in-memory build is also made and its top-10 compared with ours",
    )
    parser.add_argument(
        "--work-dir", default=tempfile.gettempdir(), help="where to write data and indices (made if missing)"
    )
    parser.add_argument("--keep", action="store_true", help="keep each size's data and indices")
    main(parser.parse_args())
