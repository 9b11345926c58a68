"""mixture.py: the --data spec, loading several sources (the QALD-10 hold-out never among them), the
label-service rewrite, what prepare skips and why, the weighted draw of an epoch, the summary table."""

import json
from collections import Counter

import pytest

from grisp import benchmarks, mixture
from grisp.mixture import Source, epoch_records, parse_data, prepare, without_label_service
from grisp.skeleton import parses

WD = "http://www.wikidata.org/entity/"


def test_parse_data():
    assert parse_data("wwq") == [Source("wwq", "wwq-train", 1.0)]
    assert parse_data("wwq:1, lcquad2:0.3,qald7:2,demo") == [
        Source("wwq", "wwq-train", 1.0),
        Source("lcquad2", "lcquad2-test", 0.3),
        Source("qald7", "qald7-train", 2.0),
        Source("demo", "demo", 1.0),
    ]
    assert parse_data("qald10")[0].benchmark == "qald10"  # load_training gives its train part
    assert parse_data("/data/my:file.jsonl") == [Source("/data/my:file.jsonl", "/data/my:file.jsonl", 1.0)]
    for bad, message in [
        ("wwq:0", "must be a finite number > 0"),
        ("wwq:nan", "must be a finite number > 0"),
        ("wwq:inf", "must be a finite number > 0"),
        ("lcquad2:-inf", "must be a finite number > 0"),
        ("wwq:x", "must be a number"),
        ("wwq,wwq", "name each source once"),
        ("", "name each source once"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_data(bad)


SERVICE = 'SERVICE wikibase:label { bd:serviceParam wikibase:language "[AUTO_LANGUAGE],en" . }'


@pytest.mark.parametrize(
    "query, expected",
    [
        # automatic bindings: ?xLabel, ?xDescription, ?xAltLabel of a variable ?x of the query
        (
            f"SELECT ?item ?itemLabel WHERE {{ ?item wdt:P31 wd:Q5 . {SERVICE} }} ORDER BY ?itemLabel",
            "SELECT ?item ?itemLabel WHERE { ?item wdt:P31 wd:Q5 . OPTIONAL { ?item rdfs:label ?itemLabel . "
            'FILTER(LANG(?itemLabel) = "en") } } ORDER BY ?itemLabel',
        ),
        (
            f"SELECT ?x ?xDescription ?xAltLabel ?yLabel WHERE {{ ?x wdt:P31 ?y . {SERVICE} }}",
            "SELECT ?x ?xDescription ?xAltLabel ?yLabel WHERE { ?x wdt:P31 ?y . "
            'OPTIONAL { ?x schema:description ?xDescription . FILTER(LANG(?xDescription) = "en") } '
            'OPTIONAL { ?x skos:altLabel ?xAltLabel . FILTER(LANG(?xAltLabel) = "en") } '
            'OPTIONAL { ?y rdfs:label ?yLabel . FILTER(LANG(?yLabel) = "en") } }',
        ),
        # explicit bindings inside the service; ?fooLabel without a ?foo is left alone
        (
            'SELECT ?name WHERE { ?x wdt:P31 wd:Q5 . SERVICE wikibase:label { bd:serviceParam wikibase:language "en" . '
            "?x rdfs:label ?name . } }",
            'SELECT ?name WHERE { ?x wdt:P31 wd:Q5 . OPTIONAL { ?x rdfs:label ?name . FILTER(LANG(?name) = "en") } }',
        ),
        (
            f"SELECT ?fooLabel WHERE {{ ?x wdt:P31 ?fooLabel . {SERVICE} }}",
            "SELECT ?fooLabel WHERE { ?x wdt:P31 ?fooLabel .  }",
        ),
        # an item's description, as 10 WWQ train queries ask for it
        (
            'SELECT DISTINCT ?x WHERE { SERVICE wikibase:label { bd:serviceParam wikibase:language "en" . '
            "wd:Q4675 schema:description ?x . } }",
            'SELECT DISTINCT ?x WHERE { OPTIONAL { wd:Q4675 schema:description ?x . FILTER(LANG(?x) = "en") } }',
        ),
        # no SERVICE: unchanged; another SERVICE: not rewritable
        ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 }", "SELECT ?x WHERE { ?x wdt:P31 wd:Q5 }"),
        ("SELECT ?x WHERE { SERVICE <http://other/sparql> { ?x ?p ?o } }", None),
        (f"SELECT ?x WHERE {{ {SERVICE} SERVICE <http://other/sparql> {{ ?x ?p ?o }} }}", None),
    ],
)
def test_label_service_is_rewritten_into_plain_patterns(query, expected):
    rewritten = without_label_service(query)
    assert rewritten == expected
    assert rewritten is None or parses(rewritten)


class Named:
    """An index stand-in that knows Q1, Q2, P31, P19."""

    def get(self, iri):
        if iri not in {WD + "Q1", WD + "Q2", WD + "P31", WD + "P19"}:
            return None
        return type("Item", (), {"label": iri.rsplit("/", 1)[1]})()


def test_prepare_skips_and_counts_by_source_and_reason():
    records = [
        {"id": "a", "source": "s", "sparql": "SELECT ?x WHERE { wd:Q1 wdt:P31 ?x }"},
        {"id": "b", "source": "s", "sparql": "SELECT ?x WHERE { wd:Q9 wdt:P31 ?x }"},  # Q9: not in the index
        {"id": "c", "source": "t", "sparql": f"SELECT ?x ?xLabel WHERE {{ ?x wdt:P19 wd:Q2 . {SERVICE} }}"},
        {"id": "d", "source": "t", "sparql": "SELECT ?x WHERE { SERVICE <http://o/s> { ?x ?p ?o } }"},
        {
            "id": "e",
            "source": "t",
            "sparql": "SELECT ?x WHERE { wd:Q1 wdt:P31 ?x . hint:Prior hint:rangeSafe true }",
        },
    ]
    usable, skipped = prepare(records, Named())
    assert [r["id"] for r in usable] == ["a", "c"] and "rdfs:label ?xLabel" in usable[1]["sparql"]
    assert records[2]["sparql"].endswith("} }"), "the input records are not changed"
    assert skipped == Counter(
        {
            ("s", "unknown_iri"): 1,
            ("t", "other_service"): 1,
            ("t", "does_not_parse"): 1,
            ("t", "label_service_rewritten"): 1,
        }
    )
    table = mixture.summary(
        [Source("s", "x", 1.0), Source("t", "y", 0.5)],
        records,
        usable,
        skipped,
        is_validation=lambda record_id: record_id == "a",
    )
    lines = table.splitlines()
    assert lines[0].startswith(
        "| source | read | held out (dev) | other_service | does_not_parse | unknown_iri"
    )
    assert lines[2] == "| s | 2 | 0 | 0 | 0 | 1 | 0 | 1 | 1 | 1 | 0 |"  # 1 usable, 1 of them validation
    assert lines[3] == "| t | 3 | 0 | 1 | 1 | 0 | 1 | 1 | 0 | 0.5 | 0 |"  # round(0.5 x 1)
    assert lines[4].startswith("| total | 5 | 0 | 1 | 1 | 1 | 1 | 2 | 1 |")


def test_the_table_counts_the_validation_records_validation_uses():
    """Validation draws min(1, weight) of a source's held-out records (train.load_data): a fractional weight
    validates on fewer than are held out, a weight above 1 repeats none."""
    usable = [{"id": f"{source}{i}", "source": source} for source in "st" for i in range(6)]
    table = mixture.summary(
        [Source("s", "x", 0.5), Source("t", "y", 3.0)],
        usable,
        usable,
        Counter(),
        is_validation=lambda record_id: record_id[1] in "0123",
    )  # 4 of each held out
    s_row, t_row = table.splitlines()[2:4]
    assert s_row.endswith("| 6 | 2 | 0.5 | 1 |") and t_row.endswith("| 6 | 4 | 3 | 6 |")


def test_epoch_records_draw_by_weight():
    records = [{"id": f"a{i}", "source": "a"} for i in range(10)] + [
        {"id": f"b{i}", "source": "b"} for i in range(20)
    ]
    epoch = epoch_records(records, {"a": 2, "b": 0.25}, seed=0, epoch=0)
    a = [(r["id"], copy) for r, copy in epoch if r["source"] == "a"]
    b = [r["id"] for r, copy in epoch if r["source"] == "b"]
    assert a == [(f"a{i}", 0) for i in range(10)] + [(f"a{i}", 1) for i in range(10)]
    assert len(b) == 5 and len(set(b)) == 5
    assert epoch == epoch_records(records, {"a": 2, "b": 0.25}, seed=0, epoch=0), "a pure function"
    other = [
        r["id"] for r, _ in epoch_records(records, {"a": 2, "b": 0.25}, seed=0, epoch=1) if r["source"] == "b"
    ]
    assert other != b, "a fresh subset every epoch"
    assert [
        r for r, _ in epoch_records(records, {}, 0, 0)
    ] == records  # no weights: every record once, in order
    draws = Counter(
        r["id"]
        for e in range(400)
        for r, _ in epoch_records(records, {"b": 0.25}, 0, e)
        if r["source"] == "b"
    )
    assert all(60 <= n <= 140 for n in draws.values()), draws  # each about 100 times in 400 epochs


@pytest.fixture
def qald(tmp_path, monkeypatch):
    """A 60-record QALD-10 file with its 20% hold-out (benchmarks.HELD_OUT), and a second source."""
    path = tmp_path / "qald10_train.jsonl"
    rows = [
        {"id": f"train_{i}", "question": f"q{i}?", "sparql": f"SELECT ?x WHERE {{ wd:Q{i} wdt:P31 ?x }}"}
        for i in range(60)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setitem(benchmarks.HELD_OUT, "qald10", (str(path), None, "qald10-dev"))
    monkeypatch.setattr(benchmarks, "TRAINING_MATERIAL", ("qald10-train",))
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(dict(r, question="other")) + "\n" for r in rows[:5]))
    return path, other


def test_the_qald10_hold_out_stays_out_of_every_mixture(qald):
    path, other = qald
    dev = {r["id"] for r in benchmarks.load_benchmark("qald10-dev")}
    assert 0 < len(dev) < 60
    for spec in ("qald10", f"qald10:3,{other}", str(path), f"{other},{path}:0.5"):
        sources = parse_data(spec)
        records = mixture.load(sources)
        qald_ids = [
            r["id"].rpartition(":")[2] if len(sources) > 1 else r["id"]
            for r in records
            if r["question"] != "other"
        ]
        assert qald_ids and not dev & set(qald_ids), spec
        assert len(qald_ids) == 60 - len(dev)
        if len(sources) > 1:  # the files reuse ids: prefixed with the source
            assert all(r["id"] == f"{r['source']}:{r['id'].rpartition(':')[2]}" for r in records)
            assert len({r["id"] for r in records}) == len(records)
        held = mixture.summary(sources, records, records, Counter())
        assert (
            f"| {len(dev)} |" in held.splitlines()[2 if spec.startswith("qald10") or spec == str(path) else 3]
        )
    with pytest.raises(ValueError, match="held out"):
        mixture.load(parse_data("qald10-dev"))


def test_the_extra_sources_are_registered():
    for name in ("qald7", "lcquad2", "sq", "spinach"):
        relative, url = benchmarks.BENCHMARKS[mixture.SOURCES[name]]
        assert relative.startswith("extra/") and url.startswith(benchmarks.GRASP_DATA_URL)


@pytest.mark.parametrize("weight", [1, 1.5, 0.3, 2.25, 0.1])
def test_the_table_counts_the_records_an_epoch_draws(weight):
    records = [{"id": f"r{i}", "source": "a", "question": "q", "sparql": "ASK {}"} for i in range(5)]
    drawn = len(epoch_records(records, {"a": weight}, seed=0, epoch=0))
    table = mixture.summary([Source("a", "a", weight)], records, records, Counter())
    assert table.splitlines()[2].endswith(f"| {weight:g} | {drawn} |"), table


def test_an_unknown_source_names_the_short_names():
    with pytest.raises(FileNotFoundError, match="short names wwq, qald10, qald7, lcquad2, sq, spinach"):
        mixture.load(parse_data("wwq,lcquad"))
