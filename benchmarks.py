"""Benchmark and item files through the project's data cache (shared by samples.py, evaluate.py and the data scripts).

Benchmarks are JSONL, one question per line: `{"id", "question", "sparql", "paraphrases", "info"}`
(GRASP's format; WWQ dev keeps its gold answers in `info.results`). Named benchmarks live in the
data cache `defaults.DATA_DIR`; a missing file is copied from `defaults.SHARED_DATA_DIR` when that
folder exists, else downloaded from its public source, else a clear error says what to do.

    import benchmarks
    questions = benchmarks.load_benchmark("wwq-dev")  # or "wwq-train", "demo", "wwq-dev-kg", a path
    items = benchmarks.cached_file("wikidata/items.jsonl")  # labels, aliases, descriptions
"""
import shutil
from pathlib import Path

import requests

import defaults
from jsonl import read_jsonl, write_atomic

GRASP_DATA_URL = "https://raw.githubusercontent.com/ad-freiburg/grasp/main/data/benchmark/wikidata"
# name -> (path inside the data cache, public source or None)
BENCHMARKS = {
    "wwq-train": ("wwq/train.jsonl", f"{GRASP_DATA_URL}/wwq/train.jsonl"),
    "wwq-dev": ("wwq/dev.jsonl", f"{GRASP_DATA_URL}/wwq/val.jsonl"),
}
# the closed WWQ-dev evaluation KGs written by build_eval_kg.py (their questions: "wwq-dev-kg",
# and "wwq-dev-full" for `--setting full`: + the demo KG + labels of all items)
EVAL_KG_DIR = defaults.GRISP_HOME / "eval_kg" / "wwq-dev"
EVAL_KG_FULL_DIR = defaults.GRISP_HOME / "eval_kg" / "wwq-dev-full"
ITEMS_FILE = "wikidata/items.jsonl"  # {"id", "label", "aliases", "description", "count"} per line
REQUIRED_KEYS = ("id", "question", "sparql")


def cached_file(relative: str, url: str | None = None, data_dir: Path = defaults.DATA_DIR,
                shared_dir: Path = defaults.SHARED_DATA_DIR) -> Path:
    """Return `data_dir/relative`, filling it first from `shared_dir` or by downloading `url`."""
    target = Path(data_dir) / relative
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    shared = Path(shared_dir) / relative
    if shared.exists():
        shutil.copyfile(shared, target)
        return target
    if url is not None:
        try:
            response = requests.get(url, timeout=60)
            response.raise_for_status()
        except requests.RequestException as error:
            raise FileNotFoundError(
                f"{relative} is not in the data cache {data_dir}, not in {shared_dir}, and the "
                f"download from {url} failed ({error}). Copy the file to {target} by hand."
            ) from None
        write_atomic(target, lambda tmp: tmp.write_bytes(response.content))  # only a complete download
        return target
    raise FileNotFoundError(f"{relative} is not in the data cache {data_dir} nor in {shared_dir} "
                            f"and has no public source: copy it to {target}.")


def benchmark_path(name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR,
                   shared_dir: Path = defaults.SHARED_DATA_DIR) -> Path:
    """Resolve a benchmark name ("wwq-train", "wwq-dev", "demo", "wwq-dev-kg" / "wwq-dev-full": the
    questions of the closed WWQ-dev KGs) or a JSONL path to a file."""
    if name_or_path in BENCHMARKS:
        relative, url = BENCHMARKS[name_or_path]
        return cached_file(relative, url, data_dir, shared_dir)
    if name_or_path == "demo":
        path = defaults.DEMO_DIR / "questions.jsonl"
    elif name_or_path in ("wwq-dev-kg", "wwq-dev-full"):
        full = name_or_path == "wwq-dev-full"
        path = (EVAL_KG_FULL_DIR if full else EVAL_KG_DIR) / "questions.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist; build the closed WWQ-dev KG first: "
                                    f"python build_eval_kg.py{' --setting full' if full else ''}")
    else:
        path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"benchmark {str(name_or_path)!r} is neither a known name "
                                f"({', '.join([*BENCHMARKS, 'demo', 'wwq-dev-kg', 'wwq-dev-full'])}) nor an existing file {path}")
    return path


def load_benchmark(name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR,
                   shared_dir: Path = defaults.SHARED_DATA_DIR) -> list[dict]:
    """Load a benchmark as a list of `{"id", "question", "sparql", "paraphrases", "info"}` dicts."""
    path = benchmark_path(name_or_path, data_dir, shared_dir)
    samples = read_jsonl(path)  # a malformed line: ValueError naming the file and line
    seen = set()
    for number, sample in enumerate(samples, start=1):
        missing = [key for key in REQUIRED_KEYS if key not in sample]
        if missing:
            raise ValueError(f"{path}: record {number} lacks {', '.join(missing)}; benchmark "
                             f"records need {', '.join(REQUIRED_KEYS)}")
        if sample["id"] in seen:
            raise ValueError(f"{path}: id {sample['id']!r} occurs twice")
        seen.add(sample["id"])
        sample.setdefault("paraphrases", [])
        sample.setdefault("info", {})
    return samples
