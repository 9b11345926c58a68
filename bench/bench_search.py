"""Benchmark our NumPy prefix-keyword index against GRASP's Rust `search-index` on the same data.

A synthetic entity set (default 1M names: labels plus 10% aliases, Zipf-distributed pseudo-words,
some accents) is written as a search-index TSV; both indices are built from it, then answer the same
queries (full names, names with the last word cut to a prefix, word subsets, short refining words,
misses). Printed: build time, extra peak memory while building, memory after loading and querying
(each in its own process), index size on disk, p50/p95 query latency (both indices in one process,
interleaved per query, several rounds: the spread across rounds is the noise), KG-constrained
latency, and top-1 / top-10 agreement. Ratios are ours / Rust. What ours must reach: latency within
2x of Rust, >= 95% top-1 agreement (the results: docs/search.md).

    pip install faiss-cpu          # search-index imports faiss; a bench-only dependency
    python bench/bench_search.py   # 1M names, 1000 queries (~5 minutes on 2 cores)
    python bench/bench_search.py --names 100000 --queries 300 --rounds 2   # quick look
"""

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's modules
from bench.rotation import rotated  # noqa: E402
from search import PrefixIndex  # noqa: E402

# ---------------------------------------------------------------------------- data


def make_tsv(path: Path, n_names: int, seed: int) -> int:
    """Write a search-index data file (name, score, synonyms, info; rows by popularity, highest
    first, so Rust's tie order (row) equals ours (popularity, then row)). Returns the vocabulary size.
    """
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ["a", "e", "i", "o", "u", "ai", "ou", "é"]]
    n_words = max(1000, n_names // 8)
    words = {"".join(rng.choice(syllables, rng.integers(2, 5))) for _ in range(n_words)}
    words = sorted(words) + ["of", "de", "la", "van", "st.", "the"]  # short connector words
    weights = 1.0 / (np.arange(len(words)) + 20.0)  # Zipf-like word frequencies
    rng.shuffle(weights)
    weights /= weights.sum()

    # all names at once: 1-4 Zipf-drawn words each (drawing per name would redo the cumsum of p)
    n_items = round(n_names / 1.1)
    n_all = n_names  # labels first, then the aliases of the most popular items
    lengths = rng.integers(1, 5, n_all)
    picked = rng.choice(len(words), lengths.sum(), p=weights)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    names = [" ".join(words[j] for j in picked[bounds[i] : bounds[i + 1]]).capitalize() for i in range(n_all)]
    popularity = np.sort(rng.zipf(1.5, n_items).clip(max=10**6))[::-1]
    with open(path, "w", encoding="utf-8") as f:
        f.write("name\tscore\tsynonyms\tinfo\n")
        for i in range(n_items):
            alias = names[n_items + i] if n_items + i < n_all else ""
            f.write(f"{names[i]}\t{popularity[i]}\t{alias}\t\n")
    return len(words)


def read_tsv(path: Path) -> tuple[list[list[str]], np.ndarray]:
    names, popularity = [], []
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            label, score, synonyms, _ = line.rstrip("\n").split("\t")
            names.append([label] + [s for s in synonyms.split(";;;") if s])
            popularity.append(float(score))
    return names, np.array(popularity, dtype=np.float32)


def make_queries(names: list[list[str]], n: int, seed: int) -> list[str]:
    """Queries with at least one keyword of >= 3 characters (Rust returns nothing otherwise)."""
    rng = np.random.default_rng(seed + 1)
    queries = []
    while len(queries) < n:
        words = names[rng.integers(len(names))][0].lower().split()
        kind = rng.random()
        if kind < 0.35:  # a full name
            query = words
        elif kind < 0.7:  # the last word cut to a prefix, as while typing
            query = words[:-1] + [words[-1][: max(3, len(words[-1]) // 2)]]
        elif kind < 0.85:  # some of the words, reordered
            query = list(rng.permutation(words)[: max(1, len(words) - 1)])
        elif kind < 0.95:  # a short refining word
            query = words + [words[0][:2]]
        else:  # a miss
            query = [w[::-1] for w in words]
        if any(len(w) >= 3 for w in query):
            queries.append(" ".join(query))
    return queries


# ---------------------------------------------------------------------------- child processes


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def build_child(impl: str, tsv: Path, out: Path) -> dict:
    """Build one index in a fresh process: seconds and extra peak memory (input data excluded)."""
    import threading

    from search_index import PrefixIndex as RustPrefixIndex

    names, popularity = read_tsv(tsv) if impl == "ours" else (None, None)
    base, peak, done = rss_mb(), [0.0], threading.Event()

    def sample():  # resident memory every 20 ms while building
        while not done.wait(0.02):
            peak[0] = max(peak[0], rss_mb())

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    if impl == "ours":
        PrefixIndex.build(names, popularity).save(out)
    else:
        out.mkdir(parents=True)
        RustPrefixIndex.build(str(tsv), str(out))
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return {"build_s": seconds, "build_peak_mb": max(peak[0], rss_mb()) - base}


def load_child(impl: str, tsv: Path, out: Path, queries: list[str]) -> dict:
    """Load one index in a fresh process and answer all queries: resident memory it adds."""
    from search_index import PrefixIndex as RustPrefixIndex

    base = rss_mb()
    index = PrefixIndex.load(out) if impl == "ours" else RustPrefixIndex.load(str(tsv), str(out))
    loaded = rss_mb()
    for query in queries:
        index.search(query, 10) if impl == "ours" else index.find_matches(query)[:10]
    return {"load_mb": loaded - base, "query_mb": rss_mb() - base}


def in_child(function, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


# ---------------------------------------------------------------------------- main


def disk_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.iterdir()) / 2**20


def timed(function, *args) -> tuple[float, list]:
    start = time.perf_counter()
    result = function(*args)
    return (time.perf_counter() - start) * 1000, result


def latency(
    work: Path, tsv: Path, names: list, queries: list[str], args: argparse.Namespace
) -> tuple[dict, dict]:
    """Per round, the p50 and p95 query milliseconds of both indices, unconstrained and within
    --allowed items ({"ours": [(p50, p95), ...], "rust": ..., "ours_sub": ..., "rust_sub": ...}),
    and each index's results per query ({(impl, query): [(row, score), ...]})."""
    from search_index import PrefixIndex as RustPrefixIndex

    ours, rust = PrefixIndex.load(work / "ours"), RustPrefixIndex.load(str(tsv), str(work / "rust"))
    run = {"ours": lambda q: ours.search(q, 10), "rust": lambda q: rust.find_matches(q)[:10]}
    allowed_rows = np.random.default_rng(args.seed).choice(len(names), args.allowed, replace=False)
    rust_sub = rust.sub_index_by_ids(sorted(int(i) for i in allowed_rows))
    run_sub = {
        "ours": lambda q: ours.search(q, 10, allowed_rows),
        "rust": lambda q: rust_sub.find_matches(q)[:10],
    }
    for q in queries[:100]:  # warm-up: page cache, lazy initialisation
        run["ours"](q), run["rust"](q)
    rounds = {key: [] for key in ["ours", "rust", "ours_sub", "rust_sub"]}
    results = {}
    for _ in range(args.rounds):
        times = {key: [] for key in rounds}
        for i, q in enumerate(queries):
            for impl in rotated(["ours", "rust"], i):
                ms, results[impl, q] = timed(run[impl], q)
                times[impl].append(ms)
                times[impl + "_sub"].append(timed(run_sub[impl], q)[0])
        for key in rounds:
            rounds[key].append((np.percentile(times[key], 50), np.percentile(times[key], 95)))
    return rounds, results


def agreement(queries: list[str], results: dict) -> tuple[float, float, float]:
    """Over the queries: how many have the same top-1 id, how many identical top-10 lists, and the sum of
    the overlaps of the two top-10 lists (each a fraction)."""
    top1 = top10_equal = overlap = 0.0
    for q in queries:
        a, b = [i for i, _ in results["ours", q]], [i for i, _ in results["rust", q]]
        top1 += a[:1] == b[:1]
        top10_equal += a == b
        overlap += len(set(a) & set(b)) / max(len(a), len(b), 1) if a or b else 1.0
    return top1, top10_equal, overlap


def report(
    stats: dict,
    rounds: dict,
    agreed: tuple[float, float, float],
    n: int,
    args: argparse.Namespace,
    load_start: float,
) -> None:
    """The table of both indices side by side (ratio ours / Rust), the agreement over the n queries and the
    noise."""
    top1, top10_equal, overlap = agreed

    def median(key, p):
        return float(np.median([x[p] for x in rounds[key]]))

    rows = [
        ("build time [s]", stats["ours"]["build_s"], stats["rust"]["build_s"]),
        (
            "build extra peak RSS [MB]",
            stats["ours"]["build_peak_mb"],
            stats["rust"]["build_peak_mb"],
        ),
        ("index on disk [MB]", stats["ours"]["disk_mb"], stats["rust"]["disk_mb"]),
        ("RSS after load [MB]", stats["ours"]["load_mb"], stats["rust"]["load_mb"]),
        ("RSS after load + queries [MB]", stats["ours"]["query_mb"], stats["rust"]["query_mb"]),
        ("query p50 [ms]", median("ours", 0), median("rust", 0)),
        ("query p95 [ms]", median("ours", 1), median("rust", 1)),
        (
            f"constrained p50 [ms] ({args.allowed} items)",
            median("ours_sub", 0),
            median("rust_sub", 0),
        ),
        (
            f"constrained p95 [ms] ({args.allowed} items)",
            median("ours_sub", 1),
            median("rust_sub", 1),
        ),
    ]
    print(f"\n| {'':42s} | {'ours (NumPy)':>12s} | {'Rust search-index':>17s} | {'ours / Rust':>11s} |")
    print(f"|{'-' * 44}|{'-' * 14}|{'-' * 19}|{'-' * 13}|")
    for label, a, b in rows:
        print(f"| {label:42s} | {a:12.2f} | {b:17.2f} | {a / b if b else float('nan'):10.2f}x |")
    print(
        f"\ntop-1 agreement {100 * top1 / n:.1f}%, identical top-10 lists {100 * top10_equal / n:.1f}%, "
        f"top-10 overlap {100 * overlap / n:.1f}% ({n} queries)"
    )
    spread = {k: f"{min(x[0] for x in v):.2f}-{max(x[0] for x in v):.2f}" for k, v in rounds.items()}
    print(
        f"noise: p50 range over {args.rounds} rounds: ours {spread['ours']} ms, rust {spread['rust']} ms; "
        f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end (2 shared cores)"
    )
    print("note: Rust find_matches returns every match (we keep the first 10); ours returns the top k")


def main(args: argparse.Namespace) -> None:

    from llm.cpu_speed import (
        cpu_name,  # here, not at the top: it imports torch, the spawned children need not
    )

    work = Path(tempfile.mkdtemp(prefix="bench_search_", dir=args.work_dir))
    tsv = work / "data.tsv"
    load_start = os.getloadavg()[0]
    vocab = make_tsv(tsv, args.names, args.seed)
    names, _ = read_tsv(tsv)
    queries = make_queries(names, args.queries, args.seed)
    print(
        f"synthetic set: {sum(map(len, names)):,} names of {len(names):,} items, {vocab:,} distinct "
        f"words; {len(queries)} queries, k=10, {args.rounds} rounds; CPU {cpu_name()}; data in {work}"
    )

    # --- build and memory, each in a fresh process
    stats = {}
    for impl in ["ours", "rust"]:
        stats[impl] = in_child(build_child, impl, tsv, work / impl)
        stats[impl] |= in_child(load_child, impl, tsv, work / impl, queries)
        stats[impl]["disk_mb"] = disk_mb(work / impl)

    # --- latency: both loaded here, interleaved per query, alternating who goes first
    rounds, results = latency(work, tsv, names, queries, args)
    # --- agreement of the two result lists, then the report
    report(stats, rounds, agreement(queries, results), len(queries), args, load_start)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--names", type=int, default=1_000_000, help="number of names (labels + aliases)")
    parser.add_argument("--queries", type=int, default=1000, help="number of queries")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds over all queries")
    parser.add_argument("--allowed", type=int, default=1000, help="item count of the KG-constrained searches")
    parser.add_argument("--seed", type=int, default=0, help="random seed of data and queries")
    parser.add_argument(
        "--work-dir", default=None, help="where to write data and indices (default: system temp)"
    )
    args = parser.parse_args()
    try:
        import search_index  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f"error: GRASP's search-index is needed ({e}); pip install search-index faiss-cpu"
        ) from None
    main(args)
