"""Tests of the index build at Wikidata scale (docs/wikidata-scale.md): the chunked prefix build
(grisp/prefix_build.py) gives PrefixIndex.build's arrays, stays under a memory cap the old build breaks,
resumes after its last finished chunk; the streamed item store; the Wikidata dump reader
(grisp/wikidata_dump.py) and the paged endpoint reader (grisp/endpoint_items.py) on hand-made inputs, and
the demo index as the reader before them built it."""

import bz2
import gzip
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_search import NAMES, POPULARITY

from grisp import endpoint_items, prefix_build, wikidata_dump
from grisp.dump_stores import write_dump_stores
from grisp.endpoint_items import QUERIES, fetch_pairs, items_from_endpoint, language_rank, local_name
from grisp.prefix_build import BYTES_PER_WORD, build_prefix
from grisp.skeleton import split_variant
from grisp.wikidata_dump import items_from_dump
from search import ItemStore, PrefixIndex, load_indices

ROOT = Path(__file__).resolve().parents[1]
WD = "http://www.wikidata.org/entity/"


def streamed(tmp_path: Path, names: list, popularity, chunk_words: int, name: str = "p") -> PrefixIndex:
    """The chunked build of `names` with chunks of about `chunk_words` words, loaded."""
    items = list(zip(names, popularity))
    budget = chunk_words * BYTES_PER_WORD
    build_prefix(
        tmp_path / name, lambda start: items[start:], {"test": name}, tmp_path / f"{name}.chunks", budget
    )
    assert not (tmp_path / f"{name}.chunks").exists()  # the chunks go once the index is complete
    return PrefixIndex.load(tmp_path / name)


def assert_same_arrays(got: PrefixIndex, expected: PrefixIndex) -> None:
    for name in PrefixIndex.ARRAYS:
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{name}: {a[:8]} != {b[:8]}"


def built_index(out: Path, *source: str, options: tuple = ()):
    """build_index.py run on `source` (e.g. "--items", path) into `out` without embeddings, loaded."""
    command = [sys.executable, "build_index.py", *source, "--out", str(out), "--embed", "none", *options]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return load_indices(out)


HAND_MADE = NAMES + [
    ["Zürich", "Zurich", "ZÜRICH"],  # one name after normalisation
    ["東京", "Tōkyō", "Tokyo"],
    ["Нью-Йорк", "New York"],
    ["", "   ", "?!"],  # no words at all
    ["x" * 80 + " tail", "x" * 70],  # words cut to 64 bytes
    ["a\x00 nul", "Big Tree"],  # a trailing NUL byte numpy's strings drop; a tie with rows 9-10
    [],
]
HAND_POPULARITY = np.concatenate([POPULARITY, [7, 7, 0, 3, 1, 7, 2]]).astype(np.float32)
QUERIES_OF_HAND_MADE = [
    "albert",
    "big tre",
    "zurich",
    "tokyo",
    "東京",
    "new york",
    "xxx",
    "a nul",
    "yo",
    "nyc",
]


@pytest.mark.parametrize("chunk_words", [1, 3, 10, 10_000])
def test_the_chunked_build_gives_the_same_arrays_and_results(tmp_path, chunk_words):
    expected = PrefixIndex.build(HAND_MADE, HAND_POPULARITY)
    got = streamed(tmp_path, HAND_MADE, HAND_POPULARITY, chunk_words)
    assert_same_arrays(got, expected)
    for query in QUERIES_OF_HAND_MADE:
        assert got.search(query, 10) == expected.search(query, 10)
        assert got.search(query, 10, allowed_ids=[0, 9, 10, 12, 16]) == expected.search(
            query, 10, [0, 9, 10, 12, 16]
        )
    assert json.loads((tmp_path / "p" / "config.json").read_text())["names"] == len(got.name_item)


def test_an_empty_input_gives_an_empty_index(tmp_path):
    assert_same_arrays(streamed(tmp_path, [], [], 10), PrefixIndex.build([], np.zeros(0)))
    assert_same_arrays(streamed(tmp_path, [[], [""]], [1, 2], 10, "q"), PrefixIndex.build([[], [""]], [1, 2]))


WORDS = ["ab", "abc", "abcd", "Abd", "b", "bc", "bcd", "x", "xyz", "Ärger", "東京", "x" * 66]


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(
        st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join), max_size=3),
        max_size=30,
    ),
    chunk_words=st.integers(1, 40),
    data=st.data(),
)
def test_the_chunked_build_equals_the_in_memory_build_on_random_inputs(
    tmp_path_factory, names, chunk_words, data
):
    popularity = data.draw(st.lists(st.integers(0, 3), min_size=len(names), max_size=len(names)))
    tmp_path = tmp_path_factory.mktemp("random")
    expected = PrefixIndex.build(names, popularity)
    got = streamed(tmp_path, names, popularity, chunk_words)
    assert_same_arrays(got, expected)
    for query in ["ab", "abc x", "b", "xyz abc", "arger", "東"]:
        assert got.search(query, 10) == expected.search(query, 10)


def test_an_interrupted_build_resumes_after_its_last_finished_chunk(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    names = [[" ".join(rng.choice(WORDS, 3))] for _ in range(200)]
    items = list(zip(names, rng.integers(0, 9, 200)))
    work, out = tmp_path / "chunks", tmp_path / "index"
    write_chunk, written = prefix_build.write_chunk, []

    def killed_after_three(directory, start, chunk):
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(start)
        return write_chunk(directory, start, chunk)

    monkeypatch.setattr(prefix_build, "write_chunk", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        build_prefix(out, lambda start: items[start:], {"kg": 1}, work, budget=30 * BYTES_PER_WORD)
    finished = json.loads((work / "chunks.json").read_text())["chunks"]
    assert len(finished) == 3 and not (out / "postings.npy").exists()
    monkeypatch.undo()

    starts = []  # where the resumed build asks the items to start

    def source(start):
        starts.append(start)
        return items[start:]

    build_prefix(out, source, {"kg": 1}, work, budget=30 * BYTES_PER_WORD)
    assert starts == [finished[-1]["items"][1]] and 0 < starts[0] < 200
    assert_same_arrays(PrefixIndex.load(out), PrefixIndex.build(names, [p for _, p in items]))


def test_chunks_of_other_settings_are_not_resumed(tmp_path, monkeypatch):
    items = [([f"name {i}"], 1.0) for i in range(50)]
    monkeypatch.setattr(prefix_build, "write_names", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # every chunk finished, then killed in the merges
        build_prefix(
            tmp_path / "i", lambda start: items[start:], {"kg": 1}, tmp_path / "w", 20 * BYTES_PER_WORD
        )
    monkeypatch.undo()
    starts = []
    other = [([f"other {i}"], 1.0) for i in range(50)]
    build_prefix(tmp_path / "i", lambda s: starts.append(s) or other[s:], {"kg": 2}, tmp_path / "w", 10**6)
    assert starts == [0] and PrefixIndex.load(tmp_path / "i").search("other 7", 1) == [(7, 2.0)]


# ---------------------------------------------------------------------------- memory cap
CHILD = """
import resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import numpy as np
import tqdm
tqdm.tqdm.monitor_interval = 0  # no monitor thread: its stack would count against the cap
from grisp.prefix_build import build_prefix
from search import PrefixIndex

mode, n_items, budget, cap, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), Path(sys.argv[6])
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
WORDS = [a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES[:20]]  # 162k distinct words

def items(start):  # 1-3 words per label, an alias for every 10th item, streamed
    for i in range(start, n_items):
        label = " ".join(WORDS[(i * p) % len(WORDS)] for p in (7919, 104729, 1299709)[: 1 + i % 3])
        yield ([label, WORDS[(i * 31) % len(WORDS)] + " alias"] if i % 10 == 0 else [label]), float(i % 97)

def status(field):  # bytes
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) * 1024

base, resident = status("VmSize"), status("VmRSS")  # the interpreter with what the build imports
resource.setrlimit(resource.RLIMIT_AS, (base + cap, base + cap))
try:
    if mode == "chunked":
        build_prefix(out, items, {"n": n_items}, out.with_suffix(".chunks"), budget)
    else:  # the in-memory build of the same stream
        popularity = np.zeros(n_items, np.float32)
        PrefixIndex.build((names for names, _ in items(0)), popularity).save(out)
except MemoryError:
    sys.exit(3)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - resident
print(grown, PrefixIndex.load(out).search(WORDS[7919] + " " + WORDS[104729 % len(WORDS)], 1))
"""


def build_under_cap(tmp_path: Path, mode: str, items: int, cap_mb: int) -> subprocess.CompletedProcess:
    # a plain environment: one BLAS thread, one malloc arena (threads and arenas reserve address space)
    env = {
        "PATH": os.environ["PATH"],
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "1",
    }
    budget, out = 24 << 20, tmp_path / f"{mode}-{items}"
    command = [
        sys.executable,
        "-c",
        CHILD,
        str(ROOT),
        mode,
        str(items),
        str(budget),
        str(cap_mb << 20),
        str(out),
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_the_chunked_build_stays_under_a_memory_cap_the_in_memory_build_breaks(tmp_path):
    """96 MB of address space over the interpreter's own (numpy, tqdm, search imported). The in-memory build
    of 100k items fits in it, its resident memory growing by ~34 MB (~340 bytes a name); grown in proportion,
    600k items would need ~200 MB, twice the cap (run, it fails with a MemoryError, or hangs in one of our
    tries under pytest). The chunked build, with a budget of 24 MB, builds those 600k items within it."""
    in_memory = build_under_cap(tmp_path, "in-memory", 100_000, 96)
    assert in_memory.returncode == 0, in_memory.stderr[-2000:]
    assert int(in_memory.stdout.split()[0]) * 6 > 96 << 20  # 600k items: over the cap
    chunked = build_under_cap(tmp_path, "chunked", 600_000, 96)
    assert chunked.returncode == 0, chunked.stderr[-2000:]
    # item 1's label; items 1 + 162000 j have it too, the most popular wins (popularity i % 97)
    assert chunked.stdout.split(maxsplit=1)[1].strip() == "[(486001, 2.0)]"


# ---------------------------------------------------------------------------- the item store
def test_the_item_store_is_written_in_chunks_with_the_same_files(tmp_path):
    items = [
        {
            "id": f"http://ex.org/{i}",
            "label": f"Näme {i}",
            "aliases": ["a"] * (i % 2),
            "description": "",
            "popularity": i,
        }
        for i in range(23)
    ]
    assert ItemStore.write(tmp_path / "s", items, run_items=5, batch=3) == 23
    store = ItemStore(tmp_path / "s")
    lines = (tmp_path / "s" / "items.jsonl").read_bytes().splitlines(keepends=True)
    assert list(store.offsets) == [0] + list(np.cumsum([len(line) for line in lines]))
    assert np.all(np.diff(store.id_hash.astype(np.float64)) > 0) and sorted(store.id_row) == list(range(23))
    assert [store.get(item["id"]).label for item in items] == [item["label"] for item in items]
    assert [item.id for item in store.stream(20)] == [f"http://ex.org/{i}" for i in (20, 21, 22)]
    assert list(store.stream(23)) == [] and not list((tmp_path / "s").glob("*.run*"))
    with pytest.raises(ValueError, match="duplicate"):  # a repeat in another chunk's run
        ItemStore.write(tmp_path / "dup", items + items[3:4], run_items=5, batch=3)
    assert not list((tmp_path / "dup").glob("*.run*"))


# ---------------------------------------------------------------------------- the Wikidata dump
def entity_line(entity: dict) -> str:
    return json.dumps(entity, ensure_ascii=False)


def label(lang: str, value: str) -> dict:
    return {"language": lang, "value": value}


DUMP = [
    {
        "type": "item",
        "id": "Q42",
        "labels": {"en": label("en", "Douglas Adams"), "de": label("de", "Douglas Adams (Autor)")},
        "aliases": {"en": [label("en", "DNA"), label("en", "Douglas Noël Adams")]},
        "descriptions": {"en": label("en", "English writer"), "fr": label("fr", "écrivain")},
        "claims": {"P31": [{}], "P214": [{}, {}]},
        "sitelinks": {"enwiki": {"site": "enwiki", "title": "Douglas Adams"}, "dewiki": {}},
    },
    {  # no English label: the regional variant's, then "mul"'s as an alias
        "type": "item",
        "id": "Q1490",
        "labels": {
            "mul": label("mul", "東京"),
            "en-gb": label("en-gb", "Tokyo"),
            "ja": label("ja", "東京都"),
        },
        "claims": {"P31": [{}]},
    },
    {"type": "item", "id": "Q7", "labels": {"fr": label("fr", "Sept")}, "sitelinks": {}},  # no label in en
    {"type": "lexeme", "id": "L1", "lemmas": {"en": label("en", "run")}},  # not an item: skipped
    {
        "type": "property",
        "id": "P31",
        "datatype": "wikibase-item",
        "labels": {"en": label("en", "instance of")},
        "aliases": {"en": [label("en", "is a")]},
        "claims": {"P31": [{}]},
    },
    {"type": "property", "id": "P214", "datatype": "external-id", "labels": {"en": label("en", "VIAF ID")}},
]
EXPECTED_DUMP_ITEMS = [
    ("entity", WD + "Q42", "Douglas Adams", ["DNA", "Douglas Noël Adams"], "English writer", 2.0),
    ("entity", WD + "Q1490", "Tokyo", ["東京"], "", 0.0),
    ("entity", WD + "Q7", "Q7", [], "", 0.0),
    ("property", WD + "P31", "instance of", ["is a"], "", 3.0),  # used 3 times (twice by Q42, Q1490, itself)
    ("property", WD + "P214", "VIAF ID", [], "", 2 / 4 - 1),  # an external id: after the others, in [-1, 0)
]


def write_dump(path: Path, entities: list[dict]) -> Path:
    """A dump in Wikidata's layout: "[", one entity a line with a comma but the last, "]"."""
    text = "[\n" + ",\n".join(entity_line(entity) for entity in entities) + "\n]\n"
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix, open)
    with opener(path, "wt", encoding="utf-8") as file:
        file.write(text)
    return path


@pytest.mark.parametrize("name", ["latest-all.json.gz", "latest-all.json.bz2", "dump.json"])
def test_the_dump_reader_on_a_hand_made_dump(tmp_path, name):
    items = list(items_from_dump(write_dump(tmp_path / name, DUMP), lang="en"))
    got = [(kind, i["id"], i["label"], i["aliases"], i["description"], i["popularity"]) for kind, i in items]
    assert got == EXPECTED_DUMP_ITEMS
    german = {item["id"]: item for _, item in items_from_dump(tmp_path / name, lang="de")}
    assert german[WD + "Q42"]["label"] == "Douglas Adams (Autor)" and german[WD + "Q1490"]["label"] == "東京"


def test_a_broken_dump_line_is_named(tmp_path):
    path = tmp_path / "broken.json.gz"
    with gzip.open(path, "wt") as file:
        file.write('[\n{"type": "item", "id": "Q1"},\n{"type": "item", "id": \n]\n')
    with pytest.raises(ValueError, match="broken.json.gz:3"):
        list(items_from_dump(path))


def test_a_dump_pass_cut_short_resumes_after_its_last_part(tmp_path, monkeypatch):
    items = [
        {"type": "item", "id": f"Q{i}", "labels": {"en": label("en", f"item {i}")}, "claims": {"P31": [{}]}}
        | ({"sitelinks": {"enwiki": {}}} if i % 2 else {})
        for i in range(1, 12)
    ]
    dump = write_dump(tmp_path / "latest-all.json.gz", items[:5] + [DUMP[4]] + items[5:])  # P31 after Q5
    build = lambda work, out: write_dump_stores(
        out / "e", out / "p", dump, "en", {"a": 1}, work, part_items=3
    )
    build(tmp_path / "w0", tmp_path / "whole")  # the reference: a pass not cut short

    write, parts = ItemStore.write, []

    def killed_in_the_third_part(directory, items, **settings):
        parts.append(directory)
        if len(parts) == 3:
            raise KeyboardInterrupt
        return write(directory, items, **settings)

    monkeypatch.setattr(ItemStore, "write", killed_in_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path / "w", tmp_path / "resumed")
    monkeypatch.undo()
    parsed, dump_item = [], wikidata_dump.dump_item
    monkeypatch.setattr(
        wikidata_dump,
        "dump_item",
        lambda entity, lang: parsed.append(entity["id"]) or dump_item(entity, lang),
    )
    build(tmp_path / "w", tmp_path / "resumed")
    assert parsed[0] == "Q7"  # after the parts Q1-Q3 and Q4-Q6 (P31 read between them, kept with the second)
    for kind in ("e", "p"):
        whole, resumed = ItemStore(tmp_path / "whole" / kind), ItemStore(tmp_path / "resumed" / kind)
        assert list(resumed) == list(whole) and len(whole) == (11 if kind == "e" else 1)
        for name in ("offsets", "popularity", "id_hash", "id_row"):
            assert np.array_equal(getattr(resumed, name), getattr(whole, name)), name
    # P31's statements counted once each: the 11 items' and its own
    assert ItemStore(tmp_path / "resumed" / "p")[0].popularity == 12.0


def test_build_index_from_a_wikidata_dump(tmp_path):
    dump = write_dump(tmp_path / "latest-all.json.gz", DUMP)
    indices = built_index(
        tmp_path / "index", "--wikidata-dump", str(dump), options=("--memory-budget", "64M")
    )
    assert indices.manifest["counts"] == {"entity": 3, "property": 2}
    assert indices.manifest["source"]["wikidata_dump"] == "latest-all.json.gz"
    assert [h.id for h in indices.search("entity", "tokyo")] == [WD + "Q1490"]
    assert indices.search("entity", "東京")[0].label == "Tokyo" and indices.item(WD + "Q42").popularity == 2
    assert [h.id for h in indices.search("property", "is a")] == [WD + "P31"]
    help_text = subprocess.run(
        [sys.executable, "build_index.py", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert "--wikidata-dump" in help_text.stdout and "--endpoint" in help_text.stdout
    missing = subprocess.run(
        [sys.executable, "build_index.py", "--wikidata-dump", str(tmp_path / "nope.gz")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "nope.gz" in missing.stderr and "Traceback" not in missing.stderr


# ---------------------------------------------------------------------------- the paged endpoint reader
def fake_endpoint(tables: dict[str, list[tuple[str, dict]]], cap: int, log: list):
    """A SPARQL client over in-memory (item, value) tables: answers our queries (VALUES, ORDER BY, LIMIT,
    OFFSET) with at most `cap` rows a page, as a server with a result cap; logs each query's table name."""
    marks = {"UNION": "occurrences", "?s ?item ?o": "usage", "rdfs:label": "labels", "altLabel": "aliases"}
    marks |= {"description": "descriptions", "sitelinks": "sitelinks", "propertyType": "external_ids"}

    class Client:
        def __init__(self, url, read_timeout_s=None):
            pass

        def query(self, text: str) -> SimpleNamespace:
            name = next(name for mark, name in marks.items() if mark in text)
            log.append(name)
            values = re.search(r"VALUES \?item \{ (.*?) \}", text)
            allowed = set(re.findall(r"<([^>]+)>", values[1])) if values else None
            limit, offset = map(int, re.search(r"LIMIT (\d+) OFFSET (\d+)", text).groups())
            rows = [pair for pair in tables.get(name, []) if allowed is None or pair[0] in allowed]
            rows = sorted(rows, key=lambda pair: (pair[0], pair[1]["value"]))
            rows = [{"item": {"type": "uri", "value": iri}, "value": dict(term)} for iri, term in rows]
            return SimpleNamespace(rows=rows[offset : offset + min(limit, cap)])

        def close(self):
            pass

    return Client


def literal(value, lang=None) -> tuple:
    return tuple(
        sorted({"type": "literal", "value": str(value), **({"xml:lang": lang} if lang else {})}.items())
    )


def wikidata_tables(n: int) -> dict:
    """n entities Q1..Qn (labels, regional labels, aliases, sitelinks for some), properties P1 (used), P2
    (labelled only), and IRIs that are neither (the fake endpoint applies no language filter: all en here)."""
    tables = defaultdict(list)
    for i in range(1, n + 1):
        tables["occurrences"].append((f"{WD}Q{i}", literal(i)))
        tables["labels"] += [(f"{WD}Q{i}", literal(f"item {i}", "en"))]
        tables["labels"] += [(f"{WD}Q{i}", literal(f"thing {i}", "en-gb"))] if i % 3 == 0 else []
        tables["aliases"] += [(f"{WD}Q{i}", literal(f"alias {i}", "en"))] if i % 2 else []
        tables["sitelinks"] += [(f"{WD}Q{i}", literal(10 * i))] if i % 4 == 0 else []
    tables["occurrences"] += [
        (f"{WD}P1", literal(1)),
        (f"{WD}P2", literal(1)),
        ("http://other/x", literal(5)),
    ]
    tables["labels"] += [(f"{WD}P1", literal("subclass of", "en")), (f"{WD}P2", literal("spare", "en"))]
    tables["usage"] = [("http://www.wikidata.org/prop/direct/P1", literal(7)), ("http://x/p", literal(1))]
    tables["external_ids"] = []
    return {name: [(iri, dict(term)) for iri, term in rows] for name, rows in tables.items()}


def test_the_endpoint_reader_streams_a_page_at_a_time(monkeypatch):
    log = []
    tables = wikidata_tables(25)
    monkeypatch.setattr(endpoint_items, "SparqlClient", fake_endpoint(tables, cap=3, log=log))
    stream = items_from_endpoint("http://fake/sparql", "wikidata", "en", page_size=5)
    first = next(stream)
    # two pages of 3 IRIs read (the first holds http://other/x, P1, P2), not the whole KG's ten
    assert log.count("occurrences") == 2
    rest = list(stream)
    items = {item["id"]: (kind, item) for kind, item in [first] + rest}
    assert len(items) == 27 and [kind for kind, _ in rest[-2:]] == ["property", "property"]
    assert items[WD + "Q3"][1] | {"id": None} == {
        "id": None, "label": "item 3", "aliases": ["thing 3", "alias 3"], "description": "", "popularity": 3.0
    }  # fmt: skip
    assert items[WD + "Q8"][1]["popularity"] == 80.0 and items[WD + "P1"][1]["popularity"] == 7.0
    assert items[WD + "P2"][1]["popularity"] == 0.0  # labelled, never used
    assert old_items_from_endpoint(tables, "wikidata", "en") == {
        kind: [item for k, item in [first] + rest if k == kind] for kind in ("entity", "property")
    }


# the reader before streaming (build_index.items_from_endpoint until this change), over the same tables: the
# reference the streamed reader must agree with
def old_items_from_endpoint(tables: dict, schema: str, lang: str) -> dict[str, list[dict]]:
    pairs = defaultdict(
        list, {name: sorted(rows, key=lambda p: (p[0], p[1]["value"])) for name, rows in tables.items()}
    )
    texts = {n: defaultdict(list) for n in ("labels", "aliases", "descriptions")}
    for n, table in texts.items():
        for iri, term in sorted(pairs[n], key=lambda p: language_rank(p[1], lang)):
            if term["value"] not in table[iri]:
                table[iri].append(term["value"])
    usage, popularity = defaultdict(float), {}
    if schema == "wikidata":
        for iri, term in pairs["usage"]:
            canonical, _ = split_variant(iri)
            if canonical.startswith(WD + "P"):
                usage[canonical] += float(term["value"])
        for iri in texts["labels"]:
            if iri.startswith(WD + "P"):
                usage.setdefault(iri, 0.0)
        entities = {iri for iri, _ in pairs["occurrences"] if iri.startswith(WD + "Q")}
        entities |= {iri for iri in texts["labels"] if iri.startswith(WD + "Q")}
        popularity = {iri: float(term["value"]) for iri, term in pairs["sitelinks"]}
    else:
        usage.update({iri: float(term["value"]) for iri, term in pairs["usage"]})
        entities = {iri for iri, _ in pairs["occurrences"]} - set(usage)
    occurrences = {iri: float(term["value"]) for iri, term in pairs["occurrences"]}
    external = {iri for iri, _ in pairs.get("external_ids", [])}
    top = max(usage.values(), default=0.0) + 1.0
    for iri in usage:
        popularity[iri] = usage[iri] / top - 1.0 if iri in external else usage[iri]

    def item(iri, score):
        labels = texts["labels"].get(iri) or [local_name(iri)]
        aliases = [a for a in labels[1:] + texts["aliases"].get(iri, []) if a != labels[0]]
        description = (texts["descriptions"].get(iri) or [""])[0]
        return {
            "id": iri,
            "label": labels[0],
            "aliases": list(dict.fromkeys(aliases)),
            "description": description,
            "popularity": score,
        }

    return {
        "entity": [item(iri, popularity.get(iri, occurrences.get(iri, 0.0))) for iri in sorted(entities)],
        "property": [item(iri, popularity[iri]) for iri in sorted(usage)],
    }


def all_pairs(url: str, lang: str) -> dict:
    """Every table of the endpoint at `url`, fetched whole: the input of the reader before streaming."""
    client = endpoint_items.SparqlClient(url)
    try:
        return {
            name: fetch_pairs(client, name, query.replace("{lang}", lang), 1000)
            for name, query in QUERIES.items()
        }
    finally:
        client.close()


def test_the_demo_index_is_built_as_before(demo_endpoint, tmp_path):
    """The demo KG's items as the reader before streaming read them, and its prefix indices as PrefixIndex.build
    built them: the same items in the same rows, the same search results."""
    options = ("--page-size", "500", "--memory-budget", "1M")
    indices = built_index(tmp_path / "demo", "--endpoint", demo_endpoint, options=options)
    before = old_items_from_endpoint(all_pairs(demo_endpoint, "en"), "wikidata", "en")
    for kind in ("entity", "property"):
        store = indices.stores[kind]
        assert [item.__dict__ for item in store] == before[kind]
        names = [[item["label"]] + item["aliases"] for item in before[kind]]
        expected = PrefixIndex.build(names, [item["popularity"] for item in before[kind]])
        assert_same_arrays(indices.methods[kind]["prefix"], expected)
    entities = before["entity"]
    expected = PrefixIndex.build(
        [[i["label"]] + i["aliases"] for i in entities], [i["popularity"] for i in entities]
    )
    for query in ["pulp fiction", "tarantino", "new york", "the", "film", "us"]:
        hits = [(h.id, h.score) for h in indices.search("entity", query, k=10)]
        assert hits == [(entities[row]["id"], score) for row, score in expected.search(query, 10)]


def test_the_71k_item_index_is_built_as_before(tmp_path):
    """The 71k items of the shared item cache (wikidata/items.jsonl), built in many chunks: the prefix arrays
    PrefixIndex.build makes from the same items, and the same search results."""
    from build_index import items_from_jsonl
    from common.defaults import SHARED_DATA_DIR

    items_file = SHARED_DATA_DIR / "wikidata" / "items.jsonl"
    if not items_file.exists():  # a checkout without ../shared (CI copies it beside the clone)
        pytest.skip(f"{items_file} is not here")
    indices = built_index(tmp_path / "items", "--items", str(items_file), options=("--memory-budget", "8M"))
    entities = list(items_from_jsonl(items_file, "entity"))
    expected = PrefixIndex.build(
        [[i["label"]] + i["aliases"] for i in entities], [i["popularity"] for i in entities]
    )
    assert_same_arrays(indices.methods["entity"]["prefix"], expected)
    for query in ["pulp fiction", "barack obama", "new york", "the", "united states of america", "paris"]:
        hits = [(h.id, h.score) for h in indices.search("entity", query, k=10)]
        assert hits == [(entities[row]["id"], score) for row, score in expected.search(query, 10)]


# ---------------------------------------------------------------------------- the benchmark's data
def test_the_benchmark_names_stream_from_any_row_and_its_sizes_parse():
    from bench.bench_search import parse_sizes
    from bench.synthetic_names import labels_of, synthetic_items

    items = list(synthetic_items(3000, seed=1))
    assert len(items) == 2727 and sum(len(names) for names, _ in items) == 3000  # labels + 10% aliases
    assert list(synthetic_items(3000, seed=1, start=2000)) == items[2000:]  # as a resumed build reads them
    assert labels_of(3000, 1, [5, 2700]) == [items[5][0][0], items[2700][0][0]]
    popularity = [p for _, p in items]
    assert popularity == sorted(popularity, reverse=True)  # Rust's tie order (row) is ours
    assert parse_sizes("1M,10M,100k,2000") == [10**6, 10**7, 10**5, 2000]
