"""Benchmark and item files through the project's data cache (shared by samples.py, evaluate.py and the data scripts).

Benchmarks are JSONL, one question per line: `{"id", "question", "sparql", "paraphrases", "info"}`
(GRASP's format; WWQ dev keeps its gold answers in `info.results`). Named benchmarks live in the
data cache `defaults.DATA_DIR`; a missing file is copied from `defaults.SHARED_DATA_DIR` when that
folder exists, else downloaded from its public source, else a clear error says what to do.

    from grisp import benchmarks
    questions = benchmarks.load_benchmark("wwq-dev")  # or "wwq-train", "demo", "wwq-dev-kg", a path, ...
    items = benchmarks.cached_file("wikidata/items.jsonl")  # labels, aliases, descriptions

Held-out dev sets (docs/method.md section 7.7): a fixed ~20% of QALD-10's train file is held out, chosen
by a hash of each id (`holdout`), and "qald10-train" is the rest. "qald10-dev" is the held-out part
without the questions a training source also asks (`unseen`: QALD-10 and QALD-7 repeat questions under
other ids). Training loads records with `load_training`, which refuses a held-out dev set and reads the
whole source file ("qald10" or its path) as its train part only.
"""

import hashlib
import re
import shutil
import sys
from pathlib import Path

import requests

from common import defaults
from common.jsonl import read_jsonl, write_atomic
from grisp.sparql_syntax import query_key

GRASP_DATA_URL = "https://raw.githubusercontent.com/ad-freiburg/grasp/main/data/benchmark/wikidata"
# name -> (path inside the data cache, public source or None)
BENCHMARKS = {
    "wwq-train": ("wwq/train.jsonl", f"{GRASP_DATA_URL}/wwq/train.jsonl"),
    "wwq-dev": ("wwq/dev.jsonl", f"{GRASP_DATA_URL}/wwq/val.jsonl"),
    # training material only (the project reports no scores on them; mixture.py draws from them)
    "qald7-train": ("extra/qald7_train.jsonl", f"{GRASP_DATA_URL}/qald7/train.jsonl"),
    "lcquad2-test": ("extra/lcquad2_test.jsonl", f"{GRASP_DATA_URL}/lcquad2/test.jsonl"),
    "simplequestions-val": ("extra/simplequestions_val.jsonl", f"{GRASP_DATA_URL}/simplequestions/val.jsonl"),
    "spinach-val": ("extra/spinach_val.jsonl", f"{GRASP_DATA_URL}/spinach/val.jsonl"),
}
# name -> (source file in the data cache, public source, salt of the held-out part): "<name>-dev" is the
# held-out part (`holdout`), "<name>-train" the rest
HELD_OUT = {"qald10": ("extra/qald10_train.jsonl", f"{GRASP_DATA_URL}/qald10/train.jsonl", "qald10-dev")}
DEV_FRACTION = 0.2
# what a training run may read (mixture.SOURCES): a held-out question asked there too is not held out
TRAINING_MATERIAL = (
    "wwq-train",
    "qald10-train",
    "qald7-train",
    "lcquad2-test",
    "simplequestions-val",
    "spinach-val",
)
SPLITS = {f"{name}-{part}": (name, part) for name in HELD_OUT for part in ("train", "dev")}
# every benchmark name benchmark_path takes (the rest are JSONL paths)
# the closed WWQ-dev evaluation KGs written by tools/build_eval_kg.py (their questions: "wwq-dev-kg",
# "wwq-dev-full" for `--setting full`: + the demo KG + labels of all items, and "wwq-dev-real" for
# `--setting real`: + CoDEx's real facts, questions the index cannot name kept)
EVAL_KG_DIR = defaults.GRISP_HOME / "eval_kg" / "wwq-dev"
EVAL_KG_FULL_DIR = defaults.GRISP_HOME / "eval_kg" / "wwq-dev-full"
EVAL_KG_REAL_DIR = defaults.GRISP_HOME / "eval_kg" / "wwq-dev-real"
EVAL_KGS = {
    "wwq-dev-kg": (EVAL_KG_DIR, "closed"),
    "wwq-dev-full": (EVAL_KG_FULL_DIR, "full"),
    "wwq-dev-real": (EVAL_KG_REAL_DIR, "real"),
}  # benchmark -> (directory, build_eval_kg --setting)
# every WWQ-dev set has a tune half, on which defaults are chosen, and a report half, which the README
# reports and no choice looks at ("<name>-tune", "<name>-report"; `half`)
HALVES = ("tune", "report")
HALF_SALT = "wwq-dev-half"
HALVED = ("wwq-dev", *EVAL_KGS)
NAMES = (*BENCHMARKS, *SPLITS, "demo", *EVAL_KGS, *(f"{name}-{h}" for name in HALVED for h in HALVES))
ITEMS_FILE = "wikidata/items.jsonl"  # {"id", "label", "aliases", "description", "count"} per line
REQUIRED_KEYS = ("id", "question", "sparql")


def cached_file(
    relative: str,
    url: str | None = None,
    data_dir: Path = defaults.DATA_DIR,
    shared_dir: Path = defaults.SHARED_DATA_DIR,
) -> Path:
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
    raise FileNotFoundError(
        f"{relative} is not in the data cache {data_dir} nor in {shared_dir} "
        f"and has no public source: copy it to {target}."
    )


def benchmark_path(
    name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> Path:
    """Resolve a benchmark name ("wwq-train", "wwq-dev", "demo", "wwq-dev-kg" / "wwq-dev-full": the
    questions of the closed WWQ-dev KGs; "qald10-train", "qald10-dev": their whole source file) or a
    JSONL path to a file."""
    if halved(name_or_path) is not None:  # the whole set; load_benchmark keeps the named half
        return benchmark_path(halved(name_or_path)[0], data_dir, shared_dir)
    if name_or_path in BENCHMARKS:
        relative, url = BENCHMARKS[name_or_path]
        return cached_file(relative, url, data_dir, shared_dir)
    if name_or_path in SPLITS:  # the whole source file; load_benchmark keeps the named part
        relative, url, _ = HELD_OUT[SPLITS[name_or_path][0]]
        return cached_file(relative, url, data_dir, shared_dir)
    if name_or_path == "demo":
        path = defaults.DEMO_DIR / "questions.jsonl"
    elif name_or_path in EVAL_KGS:
        directory, setting = EVAL_KGS[name_or_path]
        path = directory / "questions.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist; build the closed WWQ-dev KG first: "
                f"python tools/build_eval_kg.py --setting {setting}"
            )
    else:
        path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"benchmark {str(name_or_path)!r} is neither a known name "
            f"({', '.join(NAMES)}) nor an existing file {path}"
        )
    return path


def load_benchmark(
    name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> list[dict]:
    """Load a benchmark as a list of `{"id", "question", "sparql", "paraphrases", "info"}` dicts."""
    path = benchmark_path(name_or_path, data_dir, shared_dir)
    samples = read_jsonl(path)  # a malformed line: ValueError naming the file and line
    seen = set()
    for number, sample in enumerate(samples, start=1):
        missing = [key for key in REQUIRED_KEYS if key not in sample]
        if missing:
            raise ValueError(
                f"{path}: record {number} lacks {', '.join(missing)}; benchmark "
                f"records need {', '.join(REQUIRED_KEYS)}"
            )
        if not isinstance(sample["sparql"], str) or not sample["sparql"].strip():
            raise ValueError(
                f"{path}: record {number} (id {sample['id']!r}) has no gold SPARQL query; "
                f'give every record its query in "sparql"'
            )
        if sample["id"] in seen:
            raise ValueError(f"{path}: id {sample['id']!r} occurs twice")
        seen.add(sample["id"])
        sample.setdefault("paraphrases", [])
        sample.setdefault("info", {})
    if name_or_path in SPLITS:
        name, part = SPLITS[name_or_path]
        train, dev = holdout(samples, HELD_OUT[name][2])
        return unseen(dev, data_dir, shared_dir) if part == "dev" else train
    if halved(name_or_path) is not None:
        return [sample for sample in samples if half(sample["id"]) == halved(name_or_path)[1]]
    return samples


def halved(name: str | Path) -> tuple[str, str] | None:
    """("wwq-dev-real", "tune") for "wwq-dev-real-tune"; None for a name that is not a half."""
    base, _, part = str(name).rpartition("-")
    return (base, part) if base in HALVED and part in HALVES else None


def half(question_id: str) -> str:
    """ "tune" or "report": the half of the WWQ-dev sets a question belongs to, a pure function of its id
    (the SHA-256 of f"{HALF_SALT}:{id}" read as a number in [0, 1): below 0.5 is "tune"), so the
    halves of wwq-dev, wwq-dev-kg, wwq-dev-full and wwq-dev-real agree on every question they share."""
    digest = hashlib.sha256(f"{HALF_SALT}:{question_id}".encode()).digest()
    return HALVES[0] if int.from_bytes(digest, "big") / 2**256 < 0.5 else HALVES[1]


def load_training(
    name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> list[dict]:
    """Records a training run may see: `load_benchmark`, except that a held-out dev set ("qald10-dev")
    is refused and the source file of one ("qald10", or the file's path in the data cache or the
    shared folder) gives only its train part ("qald10-train")."""
    if name_or_path in SPLITS and SPLITS[name_or_path][1] == "dev":
        raise ValueError(
            f"{name_or_path} is held out for evaluation and no training run may see it; "
            f"train on {SPLITS[name_or_path][0]}-train"
        )
    if (evaluated := evaluation_set(name_or_path, data_dir, shared_dir)) is not None:
        raise ValueError(
            f"{name_or_path} is the evaluation set {evaluated}, which no training run may see; "
            f"train on wwq-train or the mixture's sources"
        )
    held = held_out_source(name_or_path, data_dir, shared_dir)
    if held is not None and name_or_path not in (held, f"{held}-train"):
        print(f"{name_or_path} holds the held-out {held}-dev: training on {held}-train only", file=sys.stderr)
    return load_benchmark(f"{held}-train" if held is not None else name_or_path, data_dir, shared_dir)


EVALUATION_SETS = ("wwq-dev", *EVAL_KGS, "demo")  # and qald10-dev (SPLITS), and the halves


def evaluation_set(
    name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> str | None:
    """The name of the evaluation set (EVALUATION_SETS) that `name_or_path` names or whose file it is, else None."""
    if name_or_path in EVALUATION_SETS:
        return str(name_or_path)
    if halved(name_or_path) is not None:
        return halved(name_or_path)[0]
    if name_or_path in BENCHMARKS or name_or_path in SPLITS or not Path(name_or_path).expanduser().is_file():
        return None
    path = Path(name_or_path).expanduser().resolve()
    files = {
        "wwq-dev": [Path(folder) / BENCHMARKS["wwq-dev"][0] for folder in (data_dir, shared_dir)],
        **{name: [directory / "questions.jsonl"] for name, (directory, _) in EVAL_KGS.items()},
        "demo": [defaults.DEMO_DIR / "questions.jsonl"],
    }
    return next(
        (name for name in EVALUATION_SETS if path in {f.resolve() for f in files[name] if f.exists()}), None
    )


def held_out_source(
    name_or_path: str | Path, data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> str | None:
    """The HELD_OUT name ("qald10") whose source file `name_or_path` reads ("qald10", "qald10-train", or
    the file's path in the data cache or the shared folder), else None."""
    if name_or_path in HELD_OUT:
        return str(name_or_path)
    if name_or_path in SPLITS:
        return SPLITS[name_or_path][0]
    try:
        path = benchmark_path(name_or_path, data_dir, shared_dir).resolve()
    except FileNotFoundError:  # no such benchmark: it holds nothing held out (loading it will say so)
        return None
    for name, (relative, _, _) in HELD_OUT.items():
        if path in {(Path(folder) / relative).resolve() for folder in (data_dir, shared_dir)}:
            return name
    return None


def held_out_count(
    name: str, data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> int:
    """How many records of HELD_OUT source `name` ("qald10") no training run reads (`holdout`'s dev part)."""
    relative, url, salt = HELD_OUT[name]
    return len(holdout(read_jsonl(cached_file(relative, url, data_dir, shared_dir)), salt)[1])


def unseen(
    records: list[dict], data_dir: Path = defaults.DATA_DIR, shared_dir: Path = defaults.SHARED_DATA_DIR
) -> list[dict]:
    """The records whose question no training source (TRAINING_MATERIAL) asks, as a question or a
    paraphrase, and whose gold query none has, compared as `question_key` and `sparql_syntax.query_key`;
    prints how many were dropped."""
    questions, queries = set(), set()
    for name in TRAINING_MATERIAL:
        try:
            material = load_benchmark(name, data_dir, shared_dir)
        except (
            FileNotFoundError
        ) as error:  # without it the held-out set would be another one, under the same name
            raise FileNotFoundError(
                f"the held-out questions are those no training source asks, so every "
                f"training source is needed to tell them: {error}"
            ) from None
        for record in material:
            questions.update(question_key(q) for q in [record["question"], *record["paraphrases"]])
            queries.add(query_key(record["sparql"]))
    kept = [
        r
        for r in records
        if question_key(r["question"]) not in questions and query_key(r["sparql"]) not in queries
    ]
    if len(kept) < len(records):
        print(
            f"held out: {len(records) - len(kept)} of {len(records)} questions dropped, a training source "
            "asks them too (same question or same query)",
            file=sys.stderr,
        )
    return kept


def question_key(question: str) -> str:
    """A question's words, lower-cased, without punctuation: "Who was on the Apollo 11 mission?" ->
    "who was on the apollo 11 mission"."""
    return " ".join(re.findall(r"\w+", question.lower()))


def holdout(records: list[dict], salt: str, fraction: float = DEV_FRACTION) -> tuple[list[dict], list[dict]]:
    """(train, dev) in file order: a record is held out iff the SHA-256 of f"{salt}:{id}", read as a
    number in [0, 1), is below `fraction`. A pure function of each id: the same ids are held out for
    any file order and any subset of the records (about `fraction` of them; 86 of QALD-10's 412)."""

    def held_out(record: dict) -> bool:
        digest = hashlib.sha256(f"{salt}:{record['id']}".encode()).digest()
        return int.from_bytes(digest, "big") / 2**256 < fraction

    return [r for r in records if not held_out(r)], [r for r in records if held_out(r)]
