"""Tests for tools/build_eval_kg.py on a tiny fake dev file and item cache."""

import argparse
import json
import subprocess
import sys

import pyoxigraph as ox
import pytest
from conftest import free_port

import endpoint
from common import defaults
from grisp import benchmarks, metrics
from tools import build_eval_kg

PREFIXES = "PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX wd: <http://www.wikidata.org/entity/> "
WD, WDT = build_eval_kg.WD, build_eval_kg.WDT


def uri(qid: str) -> dict:
    return {"type": "uri", "value": WD + qid}


def question(qid: str, body: str, answers: list[dict], var: str = "x") -> dict:
    return {
        "id": qid,
        "question": f"question {qid}?",
        "paraphrases": [],
        "sparql": f"{PREFIXES}SELECT DISTINCT ?{var} WHERE {{ {body} }}",
        "info": {"results": [{var: a} for a in answers]},
    }


DEV = [
    question("object", "wd:Q1 wdt:P19 ?x .", [uri("Q2")]),
    question("subject", "?x wdt:P26 wd:Q3 .", [uri("Q4"), uri("Q5")]),
    question("two-hops", "wd:Q1 wdt:P19 ?p . ?p wdt:P17 ?x .", [uri("Q9")]),
    question(
        "literal",
        "wd:Q1 wdt:P569 ?x .",
        [
            {
                "type": "literal",
                "value": "1961-08-04T00:00:00Z",
                "datatype": "http://www.w3.org/2001/XMLSchema#dateTime",
            }
        ],
    ),
    # q6's pattern also matches q5's triple (Q6 P40 Q7): q6 gets an extra answer and is dropped
    question("kept", "wd:Q6 wdt:P40 ?x .", [uri("Q7")]),
    question("conflict", "?x wdt:P40 wd:Q7 .", [uri("Q8")]),
    question("no-label", "wd:Q99 wdt:P19 ?x .", [uri("Q2")]),
    question("full-iris", f"<{WD}Q1> <{WDT}P27> ?y", [uri("Q30")], var="y"),
]
ITEMS = [
    {
        "id": i,
        "label": f"label {i}",
        "aliases": [f"alias {i}"] if i == "Q1" else [],
        "description": "a person" if i == "Q1" else None,
        "count": 1,
    }
    for i in ["Q1", "Q2", "Q3", "Q4", "Q6", "Q7", "Q30", "P19", "P26", "P27", "P40", "P569"]
]


# the training material the popularity is counted in (instead of benchmarks.TRAINING_MATERIAL): it asks
# about Q50, a namesake of the dev questions' Q1, twice, and gives P19's answer Q2 once
TRAINING = [
    question("train-1", "wd:Q50 wdt:P19 ?x .", [uri("Q2")]),
    question("train-2", "wd:Q50 <http://www.wikidata.org/prop/P19> ?s .", []),
]


@pytest.fixture(autouse=True)
def fake_training_material(monkeypatch):
    monkeypatch.setattr(build_eval_kg, "training_records", lambda: TRAINING)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def build(tmp_path, items=ITEMS, setting="closed", extra_kg=None, name="kg", popularity="training"):
    """Run main on DEV and `items` in `tmp_path`; returns the output directory."""
    write_jsonl(tmp_path / "dev.jsonl", DEV)
    write_jsonl(tmp_path / f"{name}-items.jsonl", items)
    out = tmp_path / name
    build_eval_kg.main(
        argparse.Namespace(
            setting=setting,
            benchmark=str(tmp_path / "dev.jsonl"),
            items=str(tmp_path / f"{name}-items.jsonl"),
            extra_kg=extra_kg,
            out=str(out),
            verify=False,
            store=None,
            port=None,
            popularity=popularity,
        )
    )
    return out


@pytest.fixture
def built(tmp_path):
    return build(tmp_path)


def test_single_pattern_recognises_only_one_wdt_triple():
    assert build_eval_kg.single_pattern(DEV[0]["sparql"]) == ("?x", WD + "Q1", WDT + "P19", "?x")
    assert build_eval_kg.single_pattern(DEV[1]["sparql"]) == ("?x", "?x", WDT + "P26", WD + "Q3")
    assert build_eval_kg.single_pattern(DEV[-1]["sparql"]) == ("?y", WD + "Q1", WDT + "P27", "?y")
    assert build_eval_kg.single_pattern(PREFIXES + "SELECT ?x WHERE { wd:Q1 wdt:P19 ?x } LIMIT 4")
    rejected = [
        "SELECT DISTINCT ?x WHERE { wd:Q1 wdt:P19 ?p . ?p wdt:P17 ?x . }",  # two patterns
        "SELECT DISTINCT ?x WHERE { ?x wdt:P19 ?y . }",  # two variables
        "SELECT DISTINCT ?x WHERE { wd:Q1 p:P19 ?x . }",  # not a wdt: property (undeclared here)
        "SELECT DISTINCT ?y WHERE { wd:Q1 wdt:P19 ?x . }",  # selects another variable
        "SELECT DISTINCT ?x WHERE { wd:Q1 wdt:P19 ?x . FILTER(?x != wd:Q2) }",
        "ASK { wd:Q1 wdt:P19 wd:Q2 . }",
    ]
    for query in rejected:
        assert build_eval_kg.single_pattern(PREFIXES + query) is None, query


def test_covered_questions_and_stats(built):
    covered = [json.loads(line)["id"] for line in (built / "questions.jsonl").read_text().splitlines()]
    assert covered == ["object", "subject", "literal", "kept", "full-iris"]
    stats = json.loads((built / "stats.json").read_text())
    assert (stats["questions"], stats["single_pattern"], stats["covered"]) == (8, 7, 5)
    assert (stats["conflicting"], stats["unlabelled_topic"]) == (1, 1)
    assert stats["answer_triples"] == 8  # q1: 1, q2: 2, literal 1, kept 1, conflict 1, no-label 1, full 1
    assert stats["unlabelled"] == ["Q5", "Q8", "Q99"]


def test_kg_answers_every_covered_gold_query_exactly(built):
    store = ox.Store()
    store.load(path=str(built / "kg.nt"), format=ox.RdfFormat.N_TRIPLES)
    for line in (built / "questions.jsonl").read_text().splitlines():
        sample = json.loads(line)
        document = store.query(sample["sparql"]).serialize(format=ox.QueryResultsFormat.JSON)
        answers = metrics.from_json(json.loads(document)).rows
        assert sorted(answers) == sorted(metrics.from_bindings(sample["info"]["results"]).rows)
    # labels, aliases, descriptions and the property link are in the graph
    q1 = ox.NamedNode(WD + "Q1")
    assert ox.Literal("label Q1", language="en") in {
        q.object for q in store.quads_for_pattern(q1, ox.NamedNode(build_eval_kg.RDFS_LABEL), None)
    }
    assert len(list(store.quads_for_pattern(q1, ox.NamedNode(build_eval_kg.SKOS_ALT_LABEL), None))) == 1
    assert len(list(store.quads_for_pattern(q1, ox.NamedNode(build_eval_kg.SCHEMA_DESCRIPTION), None))) == 1
    assert (
        len(
            list(
                store.quads_for_pattern(
                    ox.NamedNode(WD + "P19"),
                    ox.NamedNode(build_eval_kg.WIKIBASE_DIRECT_CLAIM),
                    ox.NamedNode(WDT + "P19"),
                )
            )
        )
        == 1
    )
    # the dropped questions' triples stay in the KG
    assert len(list(store.quads_for_pattern(ox.NamedNode(WD + "Q99"), None, None))) == 1


def test_verification_on_a_real_oxigraph_server(built, tmp_path):
    covered = [json.loads(line) for line in (built / "questions.jsonl").read_text().splitlines()]
    store = tmp_path / "store"
    assert build_eval_kg.verify_on_server(built / "kg.nt", covered, store, free_port()) == []
    # a wrong gold answer is caught, and the server is stopped afterwards
    wrong = [{**covered[0], "info": {"results": [{"x": {"type": "uri", "value": WD + "Q666"}}]}}]
    assert build_eval_kg.verify_on_server(built / "kg.nt", wrong, store, free_port()) == [covered[0]["id"]]
    assert endpoint.status(store) is None
    # a server the user runs over that store is theirs: it stays up
    port = free_port()
    url = endpoint.start([built / "kg.nt"], store, port=port)
    try:
        assert build_eval_kg.verify_on_server(built / "kg.nt", covered, store, port) == []
        assert endpoint.status(store)["url"] == url
    finally:
        endpoint.stop(store)


def test_items_file_lists_the_labelled_items(built):
    ids = [json.loads(line)["id"] for line in (built / "items.jsonl").read_text().splitlines()]
    assert sorted(ids) == sorted(i["id"] for i in ITEMS)


def test_popularity_is_counted_in_the_training_material_only(tmp_path):
    """The item cache counts validation data too (every record here has count 1, the dev items included):
    the index of an evaluation KG ranks by what training saw, so a dev answer is not first for being one."""

    def counts(out):
        return {r["id"]: r["count"] for r in map(json.loads, (out / "items.jsonl").read_text().splitlines())}

    trained = counts(build(tmp_path, items=ITEMS_FULL, setting="full", name="full"))
    assert (
        trained["Q50"] == 2 and trained["P19"] == 2 and trained["Q2"] == 1
    )  # queries (any variant) and answers
    assert trained["Q1"] == trained["Q3"] == trained["P26"] == 0  # asked about only in dev
    assert counts(build(tmp_path, items=ITEMS_FULL, setting="full", name="old", popularity="items")) == {
        i["id"]: i["count"] for i in ITEMS_FULL
    }
    assert json.loads((tmp_path / "full" / "stats.json").read_text())["popularity"] == "training"


# ---------------------------------------------------------------------------- the full setting

ITEMS_FULL = ITEMS + [  # items no question mentions: a homonym of Q1 and an unused property
    {"id": "Q50", "label": "label Q1", "aliases": ["paris"], "description": "another Q1", "count": 0},
    {"id": "P999", "label": "unused property", "aliases": [], "description": None, "count": 0},
]
EXTRA_KG = """@prefix wd: <http://www.wikidata.org/entity/> .
@prefix wdt: <http://www.wikidata.org/prop/direct/> .
@prefix wds: <http://www.wikidata.org/entity/statement/> .
@prefix p: <http://www.wikidata.org/prop/> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
wd:Q1 wdt:P19 wd:Q77 .
wd:Q4 wdt:P26 wd:Q3 .
wd:Q50 wdt:P19 wd:Q2 .
wd:Q50 p:P19 wds:Q50-P19-Q2 .
wd:Q1 rdfs:label "label Q1"@en .
"""  # a second birth place of Q1 (question "object" gains an answer), a fact agreeing with the
# gold answers of "subject", a distractor's fact and statement, and a label the item cache repeats


@pytest.fixture
def full(tmp_path):
    (tmp_path / "extra.ttl").write_text(EXTRA_KG)
    return build(tmp_path, items=ITEMS_FULL, setting="full", extra_kg=[str(tmp_path / "extra.ttl")])


def load_store(directory):
    store = ox.Store()
    store.load(path=str(directory / "kg.nt"), format=ox.RdfFormat.N_TRIPLES)
    return store


def test_full_setting_labels_every_item_and_adds_the_extra_kg(full, tmp_path):
    store = load_store(full)

    def objects(item_id, predicate):
        return {
            q.object
            for q in store.quads_for_pattern(ox.NamedNode(WD + item_id), ox.NamedNode(predicate), None)
        }

    for item in ITEMS_FULL:  # every record of the item cache, mentioned or not
        assert objects(item["id"], build_eval_kg.RDFS_LABEL) == {ox.Literal(item["label"], language="en")}
        aliases = {ox.Literal(alias, language="en") for alias in item["aliases"]}
        assert objects(item["id"], build_eval_kg.SKOS_ALT_LABEL) == aliases
        assert len(objects(item["id"], build_eval_kg.SCHEMA_DESCRIPTION)) == (item["description"] is not None)
        if item["id"].startswith("P"):  # what constraint queries and the resolver use of a property
            assert objects(item["id"], build_eval_kg.WIKIBASE_DIRECT_CLAIM) == {
                ox.NamedNode(WDT + item["id"])
            }
            assert objects(item["id"], build_eval_kg.RDF_TYPE) == {
                ox.NamedNode(build_eval_kg.WIKIBASE_PROPERTY)
            }
    extra = [q.triple for q in ox.parse(path=str(tmp_path / "extra.ttl"), format=ox.RdfFormat.TURTLE)]
    assert all(ox.Quad(t.subject, t.predicate, t.object) in store for t in extra)
    lines = (full / "kg.nt").read_text().splitlines()
    assert len(lines) == len(set(lines)) == len(store)  # the repeated label is written once
    indexed = [json.loads(line)["id"] for line in (full / "items.jsonl").read_text().splitlines()]
    assert sorted(indexed) == sorted(item["id"] for item in ITEMS_FULL)  # every item, for the search index


def test_full_setting_keeps_gold_answers_exact(full):
    covered = [json.loads(line) for line in (full / "questions.jsonl").read_text().splitlines()]
    # "object" gains the extra KG's second birth place: dropped and reported; "subject" stays
    assert [sample["id"] for sample in covered] == ["subject", "literal", "kept", "full-iris"]
    store = load_store(full)
    for sample in covered:
        document = store.query(sample["sparql"]).serialize(format=ox.QueryResultsFormat.JSON)
        assert sorted(metrics.from_json(json.loads(document)).rows) == sorted(
            metrics.from_bindings(sample["info"]["results"]).rows
        )
    stats = json.loads((full / "stats.json").read_text())
    assert (stats["setting"], stats["changed_by_extra_kg"], stats["conflicting"]) == ("full", ["object"], 1)
    assert (stats["covered"], stats["unlabelled_topic"], stats["label_records"]) == (4, 1, len(ITEMS_FULL))
    assert list(stats["extra_kg_triples"].values()) == [5]
    assert stats["unlabelled"] == ["Q5", "Q77", "Q8", "Q99"]  # ids only, no statement nodes
    assert (stats["items"], stats["properties"]) == (8 + 4, 6)  # labelled + unlabelled ids


def test_difficulty_counts_what_the_readme_quotes(tmp_path, monkeypatch):
    """stats.json's difficulty: memory (dev queries in the training material, however written), property
    distractors (topics with one wdt: property in the KG) and namesakes (the gold one first by which count)."""
    subject_rewritten = {
        "id": "train-3",
        "question": "who?",
        "info": {},
        "sparql": f"SELECT DISTINCT ?who WHERE {{ ?who <{WDT}P26> <{WD}Q3> }}",
    }
    monkeypatch.setattr(build_eval_kg, "training_records", lambda: TRAINING + [subject_rewritten])
    (tmp_path / "extra.ttl").write_text(EXTRA_KG)
    out = build(tmp_path, items=ITEMS_FULL, setting="full", extra_kg=[str(tmp_path / "extra.ttl")])
    assert json.loads((out / "stats.json").read_text())["difficulty"] == {
        "in_training": 1,  # "subject", asked with another variable name and full IRIs
        "one_property": 4,  # Q3 (P26), Q6 and Q7 (P40), Q99 (P19); Q1 has P19, P569 and P27
        "namesakes": 2,  # "literal" and "full-iris" ask about Q1, whose label Q50 shares
        "gold_first_by_written_count": 0,  # training counts Q50 twice, Q1 never
        "gold_first_by_item_cache_count": 2,  # the cache counts Q1 once, Q50 never
    }


def test_closed_setting_is_unchanged_by_more_item_records(tmp_path, built):
    more = build(tmp_path, items=ITEMS_FULL, name="more")  # the default setting, a larger item cache
    for name in ("kg.nt", "questions.jsonl", "items.jsonl"):
        assert (more / name).read_bytes() == (built / name).read_bytes(), name
    stats = json.loads((more / "stats.json").read_text())
    assert (stats["setting"], stats["extra_kg_triples"], stats["changed_by_extra_kg"]) == ("closed", {}, [])
    assert "Q77" not in (more / "kg.nt").read_text() and "Q50" not in (more / "kg.nt").read_text()


@pytest.mark.parametrize("name, setting", [("wwq-dev-full", "full"), ("wwq-dev-real", "real")])
def test_each_setting_is_a_benchmark_name(tmp_path, monkeypatch, name, setting):
    monkeypatch.setitem(benchmarks.EVAL_KGS, name, (tmp_path, setting))
    with pytest.raises(FileNotFoundError, match=f"python tools/build_eval_kg.py --setting {setting}"):
        benchmarks.load_benchmark(name)
    write_jsonl(tmp_path / "questions.jsonl", DEV[:1])
    assert benchmarks.load_benchmark(name)[0]["id"] == "object"
    halves = [benchmarks.load_benchmark(f"{name}-{half}") for half in benchmarks.HALVES]
    assert sorted(len(h) for h in halves) == [0, 1]  # the question is in exactly one half


def run_script(*args):
    return subprocess.run(
        [sys.executable, "tools/build_eval_kg.py", *args],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_exits_zero():
    result = run_script("--help")
    assert result.returncode == 0 and "--items" in result.stdout


def test_missing_benchmark_exits_with_a_message(tmp_path):
    result = run_script("--benchmark", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"))
    assert result.returncode != 0
    assert "nope.jsonl" in result.stderr and "Traceback" not in result.stderr


def test_missing_extra_kg_exits_with_a_message(tmp_path):
    write_jsonl(tmp_path / "dev.jsonl", DEV)
    write_jsonl(tmp_path / "items.jsonl", ITEMS)
    result = run_script(
        "--setting",
        "full",
        "--benchmark",
        str(tmp_path / "dev.jsonl"),
        "--items",
        str(tmp_path / "items.jsonl"),
        "--extra-kg",
        str(tmp_path / "nope.ttl"),
        "--out",
        str(tmp_path / "o"),
        "--no-verify",
    )
    assert result.returncode != 0
    assert "nope.ttl" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("port", ["70000", "0"])
def test_a_bad_port_is_refused_before_the_build(tmp_path, port):
    """--port 0 was replaced by the setting's port; 70000 failed only at the check after the build."""
    write_jsonl(tmp_path / "dev.jsonl", DEV)
    write_jsonl(tmp_path / "items.jsonl", ITEMS)
    result = run_script(
        "--benchmark",
        str(tmp_path / "dev.jsonl"),
        "--items",
        str(tmp_path / "items.jsonl"),
        "--out",
        str(tmp_path / "o"),
        "--store",
        str(tmp_path / "s"),
        "--port",
        port,
    )
    assert result.returncode != 0 and f"port {port} is not a TCP port" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()
