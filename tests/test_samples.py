"""samples.py on a tiny in-test Wikidata-like index: sample structure, augmentation rates,
reproducibility, skipped records, composed records, and the in-process build of a missing index."""

import json
import math
import random
import re
from pathlib import Path

import pytest

import build_index
from build_index import open_index
from common import defaults
from grisp import benchmarks, compose, skeleton_score
from grisp.prompts import NONE_TEXT
from grisp.samples import Augment, SampleGenerator, validation_split

WD = "http://www.wikidata.org/entity/"
CITIES = ["Berlin", "Paris", "Rome", "Vienna", "Madrid", "Oslo", "Prague", "Lisbon"]
RELATIONS = ["birth", "death", "work", "burial", "study", "rest"]


def write_items(path: Path) -> None:
    """Every entity label contains "alpha" and every property label "relation", so every search has
    at least 6 hits; the exact label or alias always ranks the gold item first."""
    rows = [
        {
            "id": f"Q{i + 1}",
            "label": f"Alpha {c}",
            "aliases": [f"{c} town", f"{c} place"],
            "description": f"city number {i + 1}",
            "count": 10 - i,
        }
        for i, c in enumerate(CITIES)
    ]
    rows += [
        {
            "id": f"P{i + 10}",
            "label": f"{r} relation",
            "aliases": [f"{r} link"],
            "description": f"relation of {r}",
            "count": 5,
        }
        for i, r in enumerate(RELATIONS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_records(path: Path, n: int) -> list[dict]:
    records = []
    for j in range(n):
        a, b, p, q = 1 + j % 8, 1 + (j * 3 + 1) % 8, 10 + j % 6, 10 + (j + 2) % 6
        sparql = (
            f"PREFIX wd: <{WD}> PREFIX wdt: <http://www.wikidata.org/prop/direct/> "
            f"SELECT ?x WHERE {{ wd:Q{a} wdt:P{p} ?x . ?x wdt:P{q} wd:Q{b} . }}"
        )
        records.append(
            {
                "id": f"r{j}",
                "question": f"question {j}?",
                "sparql": sparql,
                "paraphrases": [f"paraphrase {j}?"],
                "info": {},
            }
        )
    records.append({"id": "unknown", "question": "q?", "sparql": "SELECT ?x WHERE { wd:Q999 wdt:P10 ?x }"})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(index, records file, records) built once per module with build_index.py."""
    root = tmp_path_factory.mktemp("samples")
    write_items(root / "items.jsonl")
    records = write_records(root / "records.jsonl", 400)
    build_index.build(root / "index", items=root / "items.jsonl", embed="none")
    return open_index(str(root / "index"), "custom"), root / "records.jsonl", records


def sparql_line(sample: dict) -> str:
    """The marked query of a re-ranking prompt (v1: `SPARQL: query`, v2: `SPARQL:` then the query)."""
    return re.search(r"^SPARQL:[ \n](.*)$", sample["messages"][1]["content"], re.M).group(1)


def alternative_lines(sample: dict) -> list[str]:
    return [line for line in sample["messages"][1]["content"].split("Alternatives:\n")[1].split("\n") if line]


def within(count: int, n: int, p: float) -> bool:
    """count is a plausible Binomial(n, p) draw (4 standard deviations; the seeds are fixed)."""
    return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1


def test_samples_have_the_documented_structure(tiny):
    indices, _, records = tiny
    augment = Augment(alias=0.0, vary_k=0.0, drop_infos=0.0, drop_gold=0.0, shuffle=0.0, max_k=4)
    samples, stats = SampleGenerator(records[:20], indices, augment, seed=1).epoch(0)
    skeletons = [s for s in samples if s["task"] == "skeleton"]
    reranks = [s for s in samples if s["task"] == "rerank"]
    assert len(skeletons) == len(reranks) == 20 and stats["skeleton"] == 20
    record = records[0]  # wd:Q1 wdt:P10 ?x . ?x wdt:P12 wd:Q2
    assert skeletons[0]["target"] == (
        "SELECT ?x WHERE { <iri>Alpha Berlin</iri> <iri>birth relation (wdt)</iri> ?x . "
        "?x <iri>work relation (wdt)</iri> <iri>Alpha Paris</iri> . }"
    )
    assert skeletons[0]["messages"][1]["content"] in (record["question"], record["paraphrases"][0])
    for s, skeleton in zip(reranks, skeletons):  # one of each per record, in record order
        query = sparql_line(s)
        assert query.count("<rep>") == 1
        before, after = query.split("<rep>")
        # earlier placeholders are resolved to IRIs, later ones are not: same shape as the skeleton
        placeholder = r"<iri>[^<]*</iri>"
        shape = (
            re.sub(r"wdt?:[PQ]\d+", "I", before) + "R" + re.sub(placeholder, "L", after.split("</rep>", 1)[1])
        )
        n_before = len(re.findall(r"wdt?:[PQ]\d+", before))
        letters = iter("I" * n_before + "R" + "L" * 10)  # resolved, the marked one, later ones
        assert shape == re.sub(placeholder, lambda _: next(letters), skeleton["target"])
        lines = alternative_lines(s)
        assert len(lines) == 5 and lines[-1] == f"{s['identifiers'][-1]}. {NONE_TEXT}"
        assert s["identifiers"] == list("ABCDE") and s["target"] == "A"  # exact label: the gold ranks first
        shown_gold = re.search(r"\((\w+:\w+)\)", lines[0]).group(1)
        assert shown_gold.split(":")[1] == s["iri"].rsplit("/", 1)[1]
        # a property alternative is shown in the placeholder's variant
        assert shown_gold.startswith("wdt:P") == (
            "(wdt)</rep>" in after or "(wdt)" in after.split("</rep>")[0]
        )


def test_augmentations_appear_at_their_rates(tiny):
    indices, _, records = tiny
    augment = Augment(alias=0.3, vary_k=0.4, drop_infos=0.15, drop_gold=0.25, shuffle=0.5, min_k=2, max_k=5)
    generator = SampleGenerator(records, indices, augment, seed=0)
    samples = [s for epoch in range(4) for s in generator.epoch(epoch)[0]]
    skeletons = [s for s in samples if s["task"] == "skeleton"]
    reranks = [s for s in samples if s["task"] == "rerank"]
    assert len(reranks) == 1600

    labels = {f"Alpha {c}" for c in CITIES} | {f"{r} relation" for r in RELATIONS}
    names = [
        re.sub(r" \(wdt\)$", "", n) for s in skeletons for n in re.findall(r"<iri>(.*?)</iri>", s["target"])
    ]
    assert within(sum(n not in labels for n in names), len(names), 0.3), "alias rate"

    dropped = [s for s in reranks if s["target"] == s["identifiers"][-1]]
    assert within(len(dropped), len(reranks), 0.25), "drop-gold rate"
    assert all(s["iri"] is None for s in dropped)

    n_searched = [len(s["identifiers"]) - 1 for s in reranks]  # k: a dropped gold is replaced by the next hit
    assert set(n_searched) == {2, 3, 4, 5}  # every search has k + 1 >= 6 hits
    assert within(sum(n < 5 for n in n_searched), len(reranks), 0.4 * 3 / 4), (
        "vary-k rate (k=5 is drawn 1/4 of the time)"
    )

    with_infos = [
        any("city number" in line or "relation of" in line for line in alternative_lines(s)) for s in reranks
    ]
    assert within(len(reranks) - sum(with_infos), len(reranks), 0.15), "drop-infos rate"

    # the gold ranks first in the search; only shuffling moves it (to position A with chance 1/k)
    kept = [s for s in reranks if s["iri"] is not None]
    moved = sum(s["target"] != "A" for s in kept)
    p_moved = [0.5 * (1 - 1 / (len(s["identifiers"]) - 1)) for s in kept]
    expected, sigma = sum(p_moved), math.sqrt(sum(p * (1 - p) for p in p_moved))
    assert abs(moved - expected) <= 4 * sigma, f"shuffle rate: {moved} moved, {expected:.0f} expected"


def test_list_length_does_not_tell_a_dropped_gold(tiny):
    """A list without the gold item is filled up with the next hit: a list one shorter than usual would
    teach "None of the above" from its length alone."""
    indices, _, records = tiny
    augment = Augment(vary_k=0.0, drop_gold=0.5, max_k=4)
    reranks = [
        s for s in SampleGenerator(records, indices, augment, seed=0).epoch(0)[0] if s["task"] == "rerank"
    ]
    dropped = [s for s in reranks if s["iri"] is None]
    assert within(len(dropped), len(reranks), 0.5)
    assert {len(s["identifiers"]) for s in reranks} == {5}  # 4 alternatives + None, with or without the gold
    assert all(s["target"] == "E" for s in dropped)


def test_samples_are_a_function_of_seed_epoch_record(tiny):
    indices, _, records = tiny
    augment = Augment(alias=0.5, vary_k=0.5, shuffle=0.5)
    full = SampleGenerator(records[:50], indices, augment, seed=3)
    subset = SampleGenerator(records[10:12], indices, augment, seed=3)
    epoch0 = full.epoch(0)[0]
    assert subset.epoch(0)[0] == [s for s in epoch0 if s["id"] in ("r10", "r11")]
    assert full.epoch(0)[0] == epoch0, "reproducible"
    assert full.epoch(1)[0] != epoch0, "fresh samples per epoch"
    assert SampleGenerator(records[:50], indices, augment, seed=4).epoch(0)[0] != epoch0


def test_unknown_iri_is_skipped_and_counted(tiny):
    indices, _, records = tiny
    samples, stats = SampleGenerator(records[-3:], indices, Augment(), seed=0).epoch(0)
    assert stats["skipped_unknown_iri"] == 1
    assert {s["id"] for s in samples} == {records[-3]["id"], records[-2]["id"]}


def test_validation_split_is_stable():
    is_val = validation_split(0.1, seed=0)
    ids = [f"r{i}" for i in range(5000)]
    held_out = [i for i in ids if is_val(i)]
    assert within(len(held_out), 5000, 0.1)
    assert held_out == [i for i in ids[::-1] if is_val(i)][::-1]


class FakeItem:
    def __init__(self, label, aliases=()):
        self.label, self.aliases = label, list(aliases)


class FakeIndices:
    def __init__(self, items):
        self.items = items

    def item(self, iri):
        return self.items[iri.rsplit("/", 1)[1]]

    def __contains__(self, iri):
        return iri.rsplit("/", 1)[1] in self.items


def one_hop(record_id, question, subject, prop):
    return {
        "id": record_id,
        "question": question,
        "paraphrases": [],
        "info": {},
        "sparql": f"PREFIX wd: <{WD}> SELECT DISTINCT ?x WHERE {{ wd:{subject} wdt:{prop} ?x . }}",
    }


def test_composed_records_chain_two_one_hop_records_of_fitting_types():
    indices = FakeIndices(
        {
            "Q1": FakeItem("Pulp Fiction"),
            "Q2": FakeItem("Brad Pitt", ["William Bradley Pitt"]),
            "Q3": FakeItem("Nobody"),
        }
    )
    records = [
        one_hop("work", "who starred in pulp fiction?", "Q1", "P161"),
        one_hop("person", "where was brad pitt born?", "Q2", "P19"),
        one_hop("unnamed", "who is it?", "Q3", "P19"),  # its question does not name Q3: never used
        {"id": "two", "question": "q", "sparql": "SELECT ?x WHERE { wd:Q1 wdt:P57 ?y . ?y wdt:P19 ?x . }"},
    ]
    composed = compose.compose_records(records * 25, indices, 0.5, random.Random(0))
    assert len(composed) == 50
    pattern = re.compile(r"SELECT DISTINCT \?x WHERE \{ wd:(Q\d) wdt:(P\d+) \?y \. \?y wdt:(P\d+) \?x \. \}$")
    seen = set()
    for record in composed:
        subject, first, second = pattern.search(record["sparql"]).groups()
        (subject_type, object_type), phrases = compose.TYPES[first], compose.NOUN_PHRASES[first]
        # Q1 is only known as a work, Q2 as a person; the second hop fits the first hop's object type
        assert (subject, subject_type) in {("Q1", "work"), ("Q2", "person")}
        assert compose.SUBJECT_TYPE[second] == object_type
        name = {"Q1": "pulp fiction", "Q2": "brad pitt"}[subject]
        assert any(p.format(name).removeprefix("the ") in record["question"] for p in phrases)
        seen.add((first, record["question"]))
    assert ("P57", "who starred in the director of pulp fiction?") not in seen  # person -> work never joins
    assert any(q == "where was the director of pulp fiction born?" for _, q in seen)
    assert composed == compose.compose_records(records * 25, indices, 0.5, random.Random(0))
    assert compose.compose_records(records[:1], indices, 0.5, random.Random(0)) == []  # no person to join


def test_an_epoch_adds_samples_of_composed_records(tiny, monkeypatch):
    indices, _, _ = tiny
    monkeypatch.setattr(compose, "TYPES", {"P10": ("city", "city")})
    monkeypatch.setattr(compose, "NOUN_PHRASES", {"P10": ["the twin of {}"]})
    monkeypatch.setattr(compose, "SUBJECT_TYPE", {"P10": "city", "P11": "city"})
    records = [
        one_hop(f"r{i}", f"what is near alpha {c.lower()}?", f"Q{i + 1}", "P11") for i, c in enumerate(CITIES)
    ]
    augment = Augment(compose=0.5, alias=0.0)
    samples, stats = SampleGenerator(records, indices, augment, seed=0).epoch(0)
    composed = [s for s in samples if s["id"].startswith("composed:")]
    assert stats["composed"] == 4 and len(composed) == 8  # a skeleton and a re-ranking sample each
    for s in composed:
        if s["task"] == "skeleton":
            assert re.fullmatch(r"what is near the twin of alpha \w+\?", s["messages"][1]["content"])
            assert re.fullmatch(
                r"SELECT DISTINCT \?x WHERE \{ <iri>Alpha \w+</iri> <iri>birth relation \(wdt\)</iri> \?y \. "
                r"\?y <iri>death relation \(wdt\)</iri> \?x \. \}",
                s["target"],
            ), s["target"]
    no_compose = SampleGenerator(records, indices, Augment(compose=0.0, alias=0.0), seed=0).epoch(0)[0]
    assert [s for s in samples if not s["id"].startswith("composed:")] == no_compose
    # each composed sample names the records it was made of (train.py --samples splits by them)
    assert all(
        s["id"].endswith("+".join(s["composed_from"])) and len(s["composed_from"]) == 2 for s in composed
    )
    assert not any("composed_from" in s for s in no_compose)


COMPOSED_SHAPE = {
    "ask": "ask",
    "intersection": "intersection",
    "superlative": "filter/order",
    "count": "aggregate",
    "filter": "filter/order",
}  # compose's shape -> skeleton_score.shape of its queries


def typed_records():
    """One-hop records that name a work, two people and a place (their types from the properties)."""
    indices = FakeIndices(
        {
            "Q1": FakeItem("Pulp Fiction"),
            "Q2": FakeItem("Brad Pitt"),
            "Q3": FakeItem("Uma Thurman"),
            "Q4": FakeItem("Paris"),
        }
    )
    records = [
        one_hop("work", "who starred in pulp fiction?", "Q1", "P161"),
        one_hop("brad", "where was brad pitt born?", "Q2", "P19"),
        one_hop("uma", "when was uma thurman born?", "Q3", "P569"),
        one_hop("paris", "what country is paris in?", "Q4", "P17"),
    ]
    return indices, records


@pytest.mark.parametrize("shape", list(COMPOSED_SHAPE))
def test_composed_shapes_have_their_query_form_and_fitting_entities(shape):
    indices, records = typed_records()
    composed = compose.compose_records(records * 25, indices, 0.4, random.Random(0), shape)
    # 0.4 x 100 records; an intersection never repeats a constraint, an ask never asks about an entity and itself
    assert len(composed) == 40 if shape not in ("intersection", "ask") else 30 <= len(composed) <= 40
    names = {"Q1": "pulp fiction", "Q2": "brad pitt", "Q3": "uma thurman", "Q4": "paris"}
    types = {"Q1": "work", "Q2": "person", "Q3": "person", "Q4": "place"}
    for record in composed:
        query = record["sparql"]
        assert skeleton_score.shape(query) == COMPOSED_SHAPE[shape], query
        triples = re.findall(r"(wd:Q\d|\?x|;) wdt:(P\d+) (wd:Q\d|\?y)", query)
        assert triples, query
        for subject, prop, obj in triples:
            if prop in ("P577", "P569"):  # the date of a superlative or filter
                assert obj == "?y" and prop == compose.DATES[compose.TYPES[triples[0][1]][0]][0]
                continue
            subject_type, object_type = compose.TYPES[prop]
            assert types[obj[3:]] == object_type and names[obj[3:]] in record["question"]
            if subject.startswith("wd:"):  # ask: the subject is named too, and is another entity
                assert types[subject[3:]] == subject_type and names[subject[3:]] in record["question"]
                assert subject != obj
    if shape == "intersection":
        assert all(len(set(re.findall(r"wdt:P\d+ wd:Q\d", r["sparql"]))) == 2 for r in composed)
    if shape in ("superlative", "filter"):  # only types with a date: works and people
        assert {compose.TYPES[re.search(r"wdt:(P\d+)", r["sparql"]).group(1)][0] for r in composed} <= {
            "work",
            "person",
        }
    assert composed == compose.compose_records(records * 25, indices, 0.4, random.Random(0), shape)


@pytest.mark.parametrize("shape", ["intersection", "superlative", "count", "filter"])
def test_composed_answers_are_typed_by_their_noun_where_the_index_knows_its_class(shape):
    indices, records = typed_records()
    indices.items["Q11424"] = FakeItem("film")  # the class of "films" and "movies"; "people" has none
    composed = compose.compose_records(records * 25, indices, 0.4, random.Random(0), shape)
    typed = re.compile(r"\{ \?x wdt:P31 / wdt:P279 \* wd:Q11424 ; wdt:P\d+ wd:Q\d")
    films = [r for r in composed if re.search(r"\b(films|movies|film|movie)\b", r["question"])]
    others = [r for r in composed if r not in films]
    assert films and others
    assert all(typed.search(r["sparql"]) for r in films), films[0]
    assert not any("P31" in r["sparql"] for r in others), others[0]
    # typed or not, each has its shape (a type path P31/P279* is no hop of its own: a typed intersection is one)
    assert all(skeleton_score.shape(r["sparql"]) == COMPOSED_SHAPE[shape] for r in composed)
    # an index without the class leaves the answers untyped
    del indices.items["Q11424"]
    assert not any(
        "P31" in r["sparql"]
        for r in compose.compose_records(records * 25, indices, 0.4, random.Random(0), shape)
    )


def test_composed_superlatives_and_filters_order_and_bound_as_their_questions_say():
    indices, records = typed_records()
    for record in compose.compose_records(records * 50, indices, 0.5, random.Random(1), "superlative"):
        latest = any(
            word in record["question"] for word in ("latest", "last", "newest", "most recent", "youngest")
        )
        assert record["sparql"].endswith(
            "ORDER BY DESC ( ?y ) LIMIT 1" if latest else "ORDER BY ?y LIMIT 1"
        ), record
    sides = set()
    for record in compose.compose_records(records * 50, indices, 0.5, random.Random(1), "filter"):
        side, year = re.search(r"(after|before|in) (\d{4})\?$", record["question"]).groups()
        sides.add(side)
        year = int(year)
        condition = {
            "before": f'?y < "{year}-01-01T00:00:00Z" ^^ xsd:dateTime',
            "after": f'?y >= "{year + 1}-01-01T00:00:00Z" ^^ xsd:dateTime',
            # a whole year in WWQ's form: two parenthesised bounds, the upper one first
            "in": f'( ?y < "{year + 1}-01-01T00:00:00Z" ^^ xsd:dateTime ) && '
            f'( ?y >= "{year}-01-01T00:00:00Z" ^^ xsd:dateTime )',
        }[side]
        assert record["sparql"].endswith(f"FILTER ( {condition} ) }}"), record
    assert sides == {"before", "after", "in"}


def test_compose_shapes_parse_with_weights_and_reject_unknown_ones():
    assert compose.parse_shapes("chain") == {"chain": 1.0}
    assert compose.parse_shapes("chain, ask:0.5,count:2") == {"chain": 1.0, "ask": 0.5, "count": 2.0}
    for text, message in [
        ("chain,cycle", "unknown shape 'cycle'"),
        ("ask:x", "needs a number"),
        ("ask:0", "must be a finite number > 0"),
        ("ask:nan", "finite number"),
        ("ask:inf", "finite number"),
    ]:
        with pytest.raises(ValueError, match=message):
            compose.parse_shapes(text)


def test_an_epoch_with_more_composed_shapes_keeps_the_chains_and_adds_each_shape(tiny, monkeypatch):
    indices, _, _ = tiny
    monkeypatch.setattr(compose, "TYPES", {"P10": ("city", "city"), "P12": ("city", "city")})
    monkeypatch.setattr(compose, "NOUN_PHRASES", {"P10": ["the twin of {}"]})
    monkeypatch.setattr(compose, "SUBJECT_TYPE", {"P10": "city", "P11": "city"})
    monkeypatch.setattr(
        compose, "RELATIONS", {"P12": (["is {o} the twin of {s}?"], ["twinned with {o}"], ["cities"])}
    )
    records = [
        one_hop(f"r{i}", f"what is near alpha {c.lower()}?", f"Q{i + 1}", "P11") for i, c in enumerate(CITIES)
    ]
    chains = SampleGenerator(records, indices, Augment(compose=0.5, alias=0.0), seed=0).epoch(0)[0]
    augment = Augment(compose=0.5, compose_shapes="chain,ask:0.5,count", alias=0.0)
    samples, stats = SampleGenerator(records, indices, augment, seed=0).epoch(0)
    assert (stats["composed_chain"], stats["composed_count"]) == (4, 4)  # 0.5 x 8 records each
    assert 1 <= stats["composed_ask"] <= 2  # 0.5 x 0.5 x 8, less any that would ask about a city and itself
    assert [s for s in samples if not s["id"].startswith(("composed:ask", "composed:count"))] == chains
    # the chains draw from the stream they drew from before other shapes existed: saved runs keep their samples
    earlier = compose.compose_records(records, indices, 0.5, random.Random("0:0:compose"))
    assert [s["id"] for s in chains if s["id"].startswith("composed:") and s["task"] == "skeleton"] == [
        r["id"] for r in earlier
    ]
    asks = [s for s in samples if s["id"].startswith("composed:ask") and s["task"] == "skeleton"]
    assert len(asks) == stats["composed_ask"]
    for sample in asks:
        assert re.fullmatch(r"is alpha \w+ the twin of alpha \w+\?", sample["messages"][1]["content"]), sample
        assert re.fullmatch(
            r"ASK \{ <iri>Alpha \w+</iri> <iri>work relation \(wdt\)</iri> <iri>Alpha \w+</iri> \. \}",
            sample["target"],
        ), sample
    off = SampleGenerator(
        records, indices, Augment(compose=0.0, compose_shapes="chain,ask", alias=0.0), seed=0
    ).epoch(0)
    assert off[1]["composed"] == 0


def test_a_missing_wikidata_index_is_built_in_process_with_a_message(tmp_path, monkeypatch, capsys):
    write_items(tmp_path / "items.jsonl")
    directory = tmp_path / "wikidata-items"
    monkeypatch.setattr(defaults, "WIKIDATA_INDEX_DIR", directory)
    monkeypatch.setattr(benchmarks, "cached_file", lambda relative: tmp_path / "items.jsonl")

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"the index is built in this process, not by {args}")

    monkeypatch.setattr("subprocess.run", no_subprocess)
    indices = open_index(None, "wwq")
    assert indices.directory == directory and indices.item(WD + "Q1").label == "Alpha Berlin"
    message = capsys.readouterr().err
    assert (
        f"building the Wikidata index there from {tmp_path / 'items.jsonl'}" in message
        and str(directory) in message
    )
    open_index(None, "wwq")  # built once
    assert "building" not in capsys.readouterr().err


# ---------------------------------------------------------------------------- issue 15: targets, prompt, constraints
class Missing:
    """The tiny index, except that searches never return the items `missed` (a search that misses the gold)."""

    def __init__(self, indices, missed):
        self.inner, self.missed = indices, set(missed)
        self.stores, self.item = indices.stores, indices.item

    def search(self, kind, query, k, allowed_ids=None):
        return [
            h
            for h in self.inner.search(kind, query, k + len(self.missed), allowed_ids)
            if h.id not in self.missed
        ][:k]


def test_a_missed_gold_item_is_none_or_inserted(tiny):
    indices, _, records = tiny
    missed = {WD + "Q1", WD + "Q2", WD + "P10", WD + "P11"}
    runs = {}
    for gold_missing in ("none", "insert"):
        augment = Augment(drop_gold=0.0, shuffle=0.0, drop_infos=0.0, gold_missing=gold_missing, max_k=4)
        samples, stats = SampleGenerator(records[:80], Missing(indices, missed), augment, seed=0).epoch(0)
        runs[gold_missing] = ([s for s in samples if s["task"] == "rerank"], stats)
    (none, none_stats), (insert, insert_stats) = runs["none"], runs["insert"]
    assert (
        len(none) == len(insert) == 80 and 0 < none_stats["gold_missed"] == insert_stats["gold_inserted"] < 80
    )
    for a, b in zip(none, insert):  # the same records and placeholders, the same draws
        if (
            b["iri"] in missed
        ):  # the reference: the right answer is None; the first adapter's: the gold, put in
            assert (
                a["iri"] is None
                and a["target"] == a["identifiers"][-1]
                and b["target"] != b["identifiers"][-1]
            )
        else:
            assert a["target"] == b["target"] and a["iri"] == b["iri"] is not None
        assert len(a["identifiers"]) == len(
            b["identifiers"]
        )  # k hits + None either way: the length tells nothing


def test_v2_prompts_list_the_resolved_gold_items_with_labels(tiny):
    indices, _, records = tiny
    augment = Augment(alias=0.0, drop_gold=0.0, shuffle=0.0, drop_infos=0.0)
    reranks = [
        s
        for s in SampleGenerator(records[:60], indices, augment, seed=2).epoch(0)[0]
        if s["task"] == "rerank"
    ]
    assert {s["prompt_format"] for s in reranks} == {"v2"}
    by_position = {}
    for s in reranks:
        content = s["messages"][1]["content"]
        resolved = re.findall(r"^- (.*?) \((wdt?:[PQ]\d+)\)", content, re.M)
        query = sparql_line(s)
        # every id resolved in the query is listed with its label (the index's), and nothing else is
        in_query = re.findall(r"wdt?:[PQ]\d+", query.split("<rep>")[0])
        assert sorted(i for _, i in resolved) == sorted(in_query)
        for label, shown in resolved:
            assert indices.item(WD + shown.split(":")[1]).label == label
        if resolved:
            assert ("Using entities:" in content) == any(i.startswith("wd:") for _, i in resolved)
            assert ("Using properties:" in content) == any(i.startswith("wdt:") for _, i in resolved)
        by_position[len(in_query)] = by_position.get(len(in_query), 0) + 1
    assert set(by_position) == {0, 1, 2, 3}  # the marked placeholder is any of the four
    v1 = SampleGenerator(records[:60], indices, augment, seed=2, prompt_format="v1").epoch(0)[0]
    assert not any("Using " in s["messages"][1]["content"] for s in v1 if s["task"] == "rerank")


class FakeEndpoint:
    """Answers constraint queries with a fixed set of items (a sparql.SparqlClient stand-in)."""

    def __init__(self, allowed):
        self.allowed, self.queries = allowed, []

    def query(self, sparql):
        from grisp.sparql import Result

        self.queries.append(sparql)
        return Result(["candidate"], [{"candidate": {"type": "uri", "value": iri}} for iri in self.allowed])


def test_constrained_samples_search_within_the_constraint(tiny):
    indices, _, records = tiny
    allowed = [
        WD + "Q3",
        WD + "Q5",
        "http://www.wikidata.org/prop/direct/P14",
    ]  # a property in its wdt variant
    endpoint = FakeEndpoint(allowed)
    augment = Augment(constrain=0.5, drop_gold=0.0, gold_missing="none", max_k=4)
    samples, stats = SampleGenerator(records[:200], indices, augment, seed=0, client=endpoint).epoch(0)
    reranks = [s for s in samples if s["task"] == "rerank"]
    assert endpoint.queries and all(q.startswith("SELECT DISTINCT ?candidate") for q in endpoint.queries)
    assert (
        0 < stats["constrained"] < len(reranks)
    )  # a share of the samples, the first placeholder never (nothing resolved)
    shown = [re.findall(r"\((wdt?:[PQ]\d+)\)", "\n".join(alternative_lines(s))) for s in reranks]
    within = [ids for ids in shown if set(ids) <= {"wd:Q3", "wd:Q5", "wdt:P14"}]
    assert len(within) >= stats["constrained"] > 0
    # without an endpoint the same seed gives the same samples, unconstrained
    plain = SampleGenerator(records[:200], indices, augment, seed=0).epoch(0)
    assert plain[1]["constrained"] == 0 and len(plain[0]) == len(samples)


def test_a_weighted_record_used_twice_gets_other_variations(tiny):
    indices, _, records = tiny
    sourced = [dict(r, source="a") for r in records[:10]]
    generator = SampleGenerator(sourced, indices, Augment(alias=0.5, shuffle=0.5), seed=0, weights={"a": 2})
    samples = generator.epoch(0)[0]
    skeletons = [s for s in samples if s["task"] == "skeleton"]
    assert len(skeletons) == 20 and all(s["source"] == "a" for s in samples)
    first, second = skeletons[:10], skeletons[10:]
    assert [s["id"] for s in first] == [s["id"] for s in second] and [s["target"] for s in first] != [
        s["target"] for s in second
    ]
    once = SampleGenerator(sourced, indices, Augment(alias=0.5, shuffle=0.5), seed=0).epoch(0)[0]
    assert once == samples[: len(once)]  # copy 0 is the unweighted epoch


def test_question_mention_finds_how_the_question_names_an_item():
    from grisp.samples import question_mention

    assert question_mention("where is shawn johnson gymnast from?", ["Shawn Johnson East"]) == "Shawn Johnson"
    assert question_mention("what do you call russian currency?", ["Russia"]) == "Russian"  # a near form
    assert (
        question_mention("how many mlb teams are there?", ["Major League Baseball", "MLB"]) == "MLB"
    )  # an alias, its casing
    assert (
        question_mention("what did hitler do bad?", ["Adolf Hitler"]) == "Hitler"
    )  # not "did hitler": no stopword edge
    assert question_mention("who wrote the bible?", ["The Bible"]) == "The Bible"  # unless the name has it
    assert question_mention("what was james madison's job?", ["James Madison"]) == "James Madison"
    assert question_mention("who is the ceo?", ["Apple Inc."]) is None  # not named in the question


def test_mention_names_the_reranked_entity_by_the_questions_words(tiny):
    """With `mention`, the entity to re-rank is shown and searched by the question's words for it: the
    search then still finds the gold item (target its identifier) or misses it (target None)."""
    indices, _, _ = tiny
    sparql = (
        f"PREFIX wd: <{WD}> PREFIX wdt: <http://www.wikidata.org/prop/direct/> "
        "SELECT ?x WHERE { wd:Q1 wdt:P10 ?x . }"
    )  # Alpha Berlin, birth relation
    records = [{"id": f"m{j}", "question": "who was born in berlin?", "sparql": sparql} for j in range(60)]
    augment = Augment(alias=0.0, drop_gold=0.0, shuffle=0.0, drop_infos=0.0, max_k=4)
    plain = [
        s for s in SampleGenerator(records, indices, augment, seed=0).epoch(0)[0] if s["task"] == "rerank"
    ]
    worded, stats = SampleGenerator(
        records, indices, Augment(**{**augment.__dict__, "mention": 1.0}), seed=0
    ).epoch(0)
    worded = [s for s in worded if s["task"] == "rerank"]
    entity = [s for s in worded if "<rep>Berlin</rep>" in sparql_line(s)]
    assert stats["mention"] == len(entity) > 10  # every sample marking the entity, none marking the property
    assert all("<rep>Alpha Berlin</rep>" not in sparql_line(s) for s in worded)
    assert all(s["iri"] == WD + "Q1" and s["target"] == "A" for s in entity)  # "Berlin" still finds it first
    assert not any("<rep>Berlin</rep>" in sparql_line(s) for s in plain)  # off by default


def test_every_composing_property_has_its_types():
    # chains and the other shapes look up a property's subject and object type in one table
    assert set(compose.NOUN_PHRASES) | set(compose.RELATIONS) <= set(compose.TYPES)
    listed = [p for props in compose.SUBJECT_TYPES.values() for p in props.split()]
    assert len(listed) == len(set(listed)) and not set(listed) & set(
        compose.TYPES
    )  # each property typed once
