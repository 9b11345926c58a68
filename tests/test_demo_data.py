"""The demo knowledge graph and demo questions (data/demo/, issue 3 item 4).

Checks the committed files themselves (kg.ttl parses, is big enough, holds the README example,
names every id it uses, keeps statements and truthy triples consistent; questions.jsonl is a
well-formed benchmark whose every gold query answers on a real oxigraph server exactly what
`info.answers` records) and the checking logic of data/demo/build_demo.py on tiny tables.
"""

import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter

import pyoxigraph as ox
import pytest

from common import defaults
from grisp import benchmarks
from grisp.sparql import SparqlClient
from grisp.sparql_syntax import PREFIXES

KG = defaults.DEMO_DIR / "kg.ttl"
QUESTIONS = defaults.DEMO_DIR / "questions.jsonl"
WD, WDT, RDFS_LABEL = PREFIXES["wd"], PREFIXES["wdt"], PREFIXES["rdfs"] + "label"
VARIANTS = {name: PREFIXES[name] for name in ("wdt", "p", "ps", "pq")}


def load_build_demo():
    """data/demo/build_demo.py as a module (it lives outside the top-level package path)."""
    spec = importlib.util.spec_from_file_location("build_demo", defaults.DEMO_DIR / "build_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def triples() -> list[ox.Triple]:
    return list(ox.parse(path=KG, format=ox.RdfFormat.TURTLE))


@pytest.fixture(scope="module")
def labels(triples) -> dict[str, str]:
    return {t.subject.value: t.object.value for t in triples if t.predicate.value == RDFS_LABEL}


def property_id(iri: str) -> str | None:
    """P19 for wdt:P19, p:P19, ps:P19 or pq:P19 (as full IRIs), else None."""
    for namespace in VARIANTS.values():
        if re.fullmatch(re.escape(namespace) + r"P\d+", iri):
            return iri[len(namespace) :]
    return None


# ---------------------------------------------------------------------------- the knowledge graph


def test_kg_parses_and_is_big_enough(triples, labels):
    entities = [iri for iri in labels if re.fullmatch(re.escape(WD) + r"Q\d+", iri)]
    truthy = [t for t in triples if t.predicate.value.startswith(WDT)]
    assert len(triples) >= 3000, len(triples)
    assert len(entities) >= 300, len(entities)
    assert len(truthy) >= 1500, len(truthy)
    assert all(label.strip() for label in labels.values())


def test_readme_example_and_distractors_are_present(triples, labels):
    facts = {(t.subject.value, t.predicate.value, t.object.value) for t in triples}
    # Pulp Fiction -> director -> Quentin Tarantino -> place of birth -> Knoxville
    assert (WD + "Q104123", WDT + "P57", WD + "Q3772") in facts
    assert (WD + "Q3772", WDT + "P19", WD + "Q185582") in facts
    assert [labels[WD + i] for i in ("Q104123", "Q3772", "Q185582", "P57", "P19")] == [
        "Pulp Fiction",
        "Quentin Tarantino",
        "Knoxville",
        "director",
        "place of birth",
    ]
    # name-sharing distractors: the genre pulp fiction, several Parises, two John Williamses
    assert labels[WD + "Q351718"] == "pulp fiction"
    names = Counter(labels.values())
    assert names["Paris"] >= 5 and names["John Williams"] == 2 and names["Star Wars"] >= 3


def test_every_id_used_has_a_label(triples, labels):
    used = set()
    for t in triples:
        for node in (t.subject, t.object):
            if isinstance(node, ox.NamedNode) and re.fullmatch(re.escape(WD) + r"[QP]\d+", node.value):
                used.add(node.value)
        if (pid := property_id(t.predicate.value)) is not None:
            used.add(WD + pid)
    missing = sorted(used - set(labels))
    assert not missing, f"ids without rdfs:label: {missing[:10]}"


def test_statements_agree_with_truthy_triples(triples):
    # every p: -> statement -> ps: value has its wdt: triple, and every wdt: triple has a statement
    links = {
        (t.subject.value, t.object.value): property_id(t.predicate.value)
        for t in triples
        if re.fullmatch(re.escape(VARIANTS["p"]) + r"P\d+", t.predicate.value)
    }
    values = {
        (t.subject.value, property_id(t.predicate.value)): t.object
        for t in triples
        if t.predicate.value.startswith(VARIANTS["ps"])
    }
    from_statements = {(s, p, values[(node, p)]) for (s, node), p in links.items()}
    truthy = {
        (t.subject.value, property_id(t.predicate.value), t.object)
        for t in triples
        if t.predicate.value.startswith(WDT)
    }
    assert from_statements == truthy
    qualified = {t.subject.value for t in triples if t.predicate.value.startswith(VARIANTS["pq"])}
    assert len(qualified) >= 30 and qualified <= {node for _, node in links}


# ---------------------------------------------------------------------------- the demo questions


def test_questions_are_a_wellformed_benchmark():
    lines = [line for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert len(records) >= 30
    assert len({r["id"] for r in records}) == len(records)
    empty = ox.Store()
    for record in records:
        assert set(record) == {"id", "question", "sparql", "paraphrases", "info"}, record["id"]
        assert record["question"] == record["question"].lower().strip() and record["question"].endswith("?")
        assert record["info"]["answers"] and record["info"]["shape"], record["id"]
        empty.query(record["sparql"])  # parses as is: declares every prefix it uses, like WWQ gold
    assert benchmarks.load_benchmark("demo") == records  # the project's loader reads it as "demo"
    # a variety of query shapes, as in WikiWebQuestions
    queries = [r["sparql"] for r in records]
    for construct, least in (("pq:", 8), ("ASK", 3), ("COUNT", 3), ("FILTER", 3), ("ORDER BY", 3)):
        assert sum(construct in q for q in queries) >= least, construct


def test_gold_queries_answer_on_a_real_oxigraph_server(demo_endpoint, labels):
    client = SparqlClient(demo_endpoint)
    try:
        for record in benchmarks.load_benchmark("demo"):
            result = client.query(record["sparql"])
            assert not result.is_empty, record["id"]
            if result.boolean is not None:
                answers = [str(result.boolean).lower()]
            else:
                answers = sorted(
                    {labels.get(term["value"], term["value"]) for row in result.rows for term in row.values()}
                )
            assert answers == record["info"]["answers"], record["id"]
    finally:
        client.close()


def test_films_questions_answer_the_same_when_typed_as_wwq_types_them():
    """Every film the questions ask about is typed, so a skeleton typed as WWQ's (`?x wdt:P31 / wdt:P279 *
    wd:Q11424 ; ...`) loses no answer here."""
    store = ox.Store()
    store.load(path=str(defaults.DEMO_DIR / "kg.ttl"), format=ox.RdfFormat.TURTLE)
    answers = lambda query: sorted(str(row[0]) for row in store.query(query))  # noqa: E731
    films = [
        r
        for r in benchmarks.load_benchmark("demo")
        if re.search(r"\b(movies?|films?)\b", r["question"]) and "WHERE { ?x wdt:" in r["sparql"]
    ]
    assert len(films) >= 10
    for record in films:
        typed = record["sparql"].replace(
            "WHERE { ?x wdt:", "WHERE { ?x wdt:P31 / wdt:P279 * wd:Q11424 ; wdt:", 1
        )
        assert answers(typed) == answers(record["sparql"]), record["question"]


# ---------------------------------------------------------------------------- build_demo.py


@pytest.mark.parametrize("script, word", [("build_demo.py", "facts.tsv"), ("answer_questions.py", "--check")])
def test_scripts_help_exits_zero(script, word):
    run = subprocess.run(
        [sys.executable, str(defaults.DEMO_DIR / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and word in run.stdout


def test_recorded_answers_are_up_to_date():
    run = subprocess.run(
        [sys.executable, str(defaults.DEMO_DIR / "answer_questions.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_dev_facts_reads_the_three_gold_query_shapes():
    build_demo = load_build_demo()
    uri = lambda i: {"type": "uri", "value": WD + i}  # noqa: E731
    single = {
        "sparql": "PREFIX wd: <x> PREFIX wdt: <y> SELECT DISTINCT ?x WHERE { wd:Q3772 wdt:P19 ?x . }",
        "info": {"results": [{"x": uri("Q185582")}]},
    }
    typed = {
        "sparql": "SELECT DISTINCT ?x WHERE { ?x wdt:P161 wd:Q13909 ; wdt:P31 / wdt:P279 * wd:Q11424 . }",
        "info": {"results": [{"x": uri("Q191040")}, {"x": uri("Q172271")}]},
    }
    typed_first = {
        "sparql": "SELECT DISTINCT ?x WHERE { ?x wdt:P31 / wdt:P279 * wd:Q570116 ; wdt:P131 wd:Q812 . }",
        "info": {"results": [{"x": uri("Q6166234")}]},
    }
    statement = {
        "sparql": "SELECT DISTINCT ?x WHERE { wd:Q193695 p:P161 ?p . "
        "?p ps:P161 ?x ; pq:P453 wd:Q111974794 . }",
        "info": {"results": [{"x": uri("Q11637")}]},
    }
    other = {
        "sparql": "SELECT DISTINCT ?x WHERE { wd:Q76 wdt:P19 / wdt:P131 + ?x . }",
        "info": {"results": [{"x": uri("Q782")}]},
    }
    assert build_demo.dev_facts(single) == {("Q3772", "P19", "Q185582")}
    # a typed query's answers have its type too (written as the direct type)
    assert build_demo.dev_facts(typed) == {
        ("Q191040", "P161", "Q13909"),
        ("Q172271", "P161", "Q13909"),
        ("Q191040", "P31", "Q11424"),
        ("Q172271", "P31", "Q11424"),
    }
    assert build_demo.dev_facts(typed_first) == {("Q6166234", "P131", "Q812"), ("Q6166234", "P31", "Q570116")}
    assert build_demo.dev_facts(statement) == {
        ("Q193695", "P161", "Q11637"),
        ("Q193695", "P161", "Q11637", "P453", "Q111974794"),
    }
    assert build_demo.dev_facts(other) == set()


def test_check_reports_wrong_ids_labels_literals_duplicates_and_unbacked_rows():
    build_demo = load_build_demo()
    items = {
        i: {"id": i, "label": label}
        for i, label in [
            ("Q3772", "Quentin Tarantino"),
            ("Q185582", "Knoxville"),
            ("P19", "place of birth"),
            ("P569", "date of birth"),
            ("P57", "director"),
        ]
    }
    dev = {
        "WebQTrn-1": {
            "sparql": "SELECT DISTINCT ?x WHERE { wd:Q3772 wdt:P19 ?x . }",
            "info": {"results": [{"x": {"type": "uri", "value": WD + "Q185582"}}]},
        }
    }

    def row(subject, subject_label, prop, value, value_label, source="hand"):
        return dict(
            zip(
                build_demo.FACT_COLUMNS,
                [subject, subject_label, prop, value, value_label, "", "", "", "", source],
            )
        )

    good = [
        (1, row("Q3772", "Quentin Tarantino", "P19", "Q185582", "Knoxville", "wwq-dev:WebQTrn-1")),
        (2, row("Q3772", "Quentin Tarantino", "P569", "1963-03-27", "")),
    ]
    assert build_demo.check(good, [], items, dev) == []
    bad = [
        (3, row("Q3772", "Quentin Tarantin", "P19", "Q185582", "Knoxville")),  # label typo
        (4, row("Q3772", "Quentin Tarantino", "P19", "Q999", "Nowhere")),  # unknown id
        (5, row("Q3772", "Quentin Tarantino", "P57", "1999", "")),  # literal on an item property
        (6, row("Q3772", "Quentin Tarantino", "P569", "27 March 1963", "")),  # malformed date
        (7, row("Q185582", "Knoxville", "P19", "Q3772", "Quentin Tarantino", "wwq-dev:WebQTrn-1")),
    ]
    problems = build_demo.check(good + bad + [good[1]], [], items, dev)
    for expected in (
        "facts.tsv:3: Q3772 is 'Quentin Tarantino'",
        "facts.tsv:4: Q999 is not in items.jsonl",
        "facts.tsv:5: P57 takes items",
        "facts.tsv:6: date '27 March 1963'",
        "facts.tsv:7: ('Q185582', 'P19', 'Q3772') is not asserted",
        "occurs 2 times",
    ):
        assert any(p.startswith(expected) or expected in p for p in problems), (expected, problems)


def test_turtle_has_truthy_triples_statements_and_qualifiers():
    build_demo = load_build_demo()
    items = {
        i: {
            "id": i,
            "label": label,
            "aliases": ["Tarantino"] if i == "Q3772" else [],
            "description": None,
            "count": 3,
        }
        for i, label in [
            ("Q17738", "Star Wars"),
            ("Q210447", "Mark Hamill"),
            ("Q51746", "Luke Skywalker"),
            ("Q3772", "Quentin Tarantino"),
            ("P161", "cast member"),
            ("P453", "character role"),
            ("P569", "date of birth"),
        ]
    }
    rows = [
        dict(zip(build_demo.FACT_COLUMNS, cells))
        for cells in [
            ["Q17738", "", "P161", "Q210447", "", "", "P453", "Q51746", "", "hand"],
            ["Q3772", "", "P569", "1963-03-27", "", "", "", "", "", "hand"],
        ]
    ]
    graph = {
        (t.subject.value, t.predicate.value, t.object.value)
        for t in ox.parse(build_demo.to_turtle(rows, set(items), items), format=ox.RdfFormat.TURTLE)
    }
    node = PREFIXES["wds"] + "Q17738-P161-Q210447"
    assert {
        (WD + "Q17738", WDT + "P161", WD + "Q210447"),
        (WD + "Q17738", PREFIXES["p"] + "P161", node),
        (node, PREFIXES["ps"] + "P161", WD + "Q210447"),
        (node, PREFIXES["pq"] + "P453", WD + "Q51746"),
        (WD + "Q3772", WDT + "P569", "1963-03-27T00:00:00Z"),
        (WD + "Q3772", RDFS_LABEL, "Quentin Tarantino"),
        (WD + "Q3772", PREFIXES["skos"] + "altLabel", "Tarantino"),
        (WD + "Q3772", PREFIXES["wikibase"] + "sitelinks", "3"),
        (WD + "P161", PREFIXES["wikibase"] + "directClaim", WDT + "P161"),
    } <= graph


def test_committed_kg_is_rebuilt_identically_from_the_tables(tmp_path):
    # needs the data cache (items.jsonl, WWQ dev); the committed kg.ttl itself does not
    folders = (defaults.DATA_DIR, defaults.SHARED_DATA_DIR)
    sources = [
        next((d / relative for d in folders if (d / relative).is_file()), None)
        for relative in (benchmarks.ITEMS_FILE, "wwq/dev.jsonl")
    ]
    if None in sources:
        pytest.skip("items.jsonl or WWQ dev is not in the data cache; cannot rebuild kg.ttl here")
    out = tmp_path / "kg.ttl"
    command = [
        sys.executable,
        str(defaults.DEMO_DIR / "build_demo.py"),
        "--items",
        str(sources[0]),
        "--dev",
        str(sources[1]),
        "--out",
        str(out),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert out.read_text(encoding="utf-8") == KG.read_text(encoding="utf-8"), "kg.ttl is stale: rebuild it"
