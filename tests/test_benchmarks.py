"""Tests for benchmarks.py: the data cache and the benchmark loader (no downloads)."""

import json

import pytest
import requests

from grisp import benchmarks

SAMPLE = {"id": "q1", "question": "where was X born?", "sparql": "SELECT ?x WHERE { wd:Q1 wdt:P19 ?x }"}


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_named_benchmark_is_copied_from_the_shared_folder_into_the_cache(tmp_path):
    cache, shared = tmp_path / "cache", tmp_path / "shared"
    write_jsonl(shared / "wwq" / "dev.jsonl", [SAMPLE])
    samples = benchmarks.load_benchmark("wwq-dev", data_dir=cache, shared_dir=shared)
    assert samples == [{**SAMPLE, "paraphrases": [], "info": {}}]
    assert (cache / "wwq" / "dev.jsonl").exists()
    # the cache now wins even when the shared copy is gone
    (shared / "wwq" / "dev.jsonl").unlink()
    assert benchmarks.load_benchmark("wwq-dev", data_dir=cache, shared_dir=shared)[0]["id"] == "q1"


def test_download_failure_gives_a_clear_error(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise requests.ConnectionError("no network")

    monkeypatch.setattr(benchmarks.requests, "get", offline)
    with pytest.raises(FileNotFoundError, match="download from .*val.jsonl failed"):
        benchmarks.load_benchmark("wwq-dev", data_dir=tmp_path / "c", shared_dir=tmp_path / "s")
    assert not (tmp_path / "c" / "wwq" / "dev.jsonl").exists()


def test_download_fills_the_cache(tmp_path, monkeypatch):
    class Response:
        content = (json.dumps(SAMPLE) + "\n").encode()

        def raise_for_status(self):
            pass

    monkeypatch.setattr(benchmarks.requests, "get", lambda url, timeout: Response())
    samples = benchmarks.load_benchmark("wwq-train", data_dir=tmp_path / "c", shared_dir=tmp_path / "s")
    assert samples[0]["id"] == "q1" and (tmp_path / "c" / "wwq" / "train.jsonl").exists()


def test_file_without_public_source_must_be_copied_by_hand(tmp_path):
    with pytest.raises(FileNotFoundError, match="no public source"):
        benchmarks.cached_file(benchmarks.ITEMS_FILE, data_dir=tmp_path / "c", shared_dir=tmp_path / "s")


def test_path_and_bad_input(tmp_path):
    path = tmp_path / "mine.jsonl"
    write_jsonl(path, [SAMPLE, {**SAMPLE, "id": "q2", "info": {"results": []}}])
    assert [s["id"] for s in benchmarks.load_benchmark(str(path))] == ["q1", "q2"]
    with pytest.raises(FileNotFoundError, match="neither a known name"):
        benchmarks.load_benchmark(str(tmp_path / "missing.jsonl"))
    write_jsonl(path, [SAMPLE, SAMPLE])
    with pytest.raises(ValueError, match="occurs twice"):
        benchmarks.load_benchmark(path)
    write_jsonl(path, [{"id": "q1", "question": "?"}])
    with pytest.raises(ValueError, match="lacks sparql"):
        benchmarks.load_benchmark(path)
    path.write_text('{"id": "q1",\n')
    with pytest.raises(ValueError, match="mine.jsonl:1 is not valid JSON"):
        benchmarks.load_benchmark(path)


def test_closed_kg_questions_need_build_eval_kg(tmp_path, monkeypatch):
    monkeypatch.setitem(benchmarks.EVAL_KGS, "wwq-dev-kg", (tmp_path, "closed"))
    with pytest.raises(FileNotFoundError, match="python tools/build_eval_kg.py --setting closed"):
        benchmarks.load_benchmark("wwq-dev-kg")
    write_jsonl(tmp_path / "questions.jsonl", [SAMPLE])
    assert benchmarks.load_benchmark("wwq-dev-kg")[0]["id"] == "q1"


def test_holdout_is_a_deterministic_disjoint_order_independent_fifth():
    records = [{"id": f"train_{i}"} for i in range(2000)]
    train, dev = benchmarks.holdout(records, "qald10-dev")
    assert 0.18 < len(dev) / len(records) < 0.22  # ~20% (a hash threshold, not an exact count)
    assert {r["id"] for r in train}.isdisjoint(r["id"] for r in dev) and len(train) + len(dev) == len(records)
    assert benchmarks.holdout(records, "qald10-dev") == (train, dev)  # deterministic
    shuffled = records[::-1][1000:] + records[::-1][:1000]
    assert {r["id"] for r in benchmarks.holdout(shuffled, "qald10-dev")[1]} == {r["id"] for r in dev}
    subset = records[::3]  # the same ids stay held out in any subset
    assert {r["id"] for r in benchmarks.holdout(subset, "qald10-dev")[1]} == {r["id"] for r in dev} & {
        r["id"] for r in subset
    }
    other_salt = benchmarks.holdout(records, "another-dev")[1]
    assert {r["id"] for r in other_salt} != {r["id"] for r in dev}


@pytest.fixture
def qald(tmp_path, monkeypatch):
    """A small stand-in for extra/qald10_train.jsonl registered under the held-out name qald10."""
    path = tmp_path / "qald10_train.jsonl"
    write_jsonl(
        path,
        [
            {
                "id": f"train_{i}",
                "question": f"where was X{i} born?",
                "sparql": f"SELECT ?x WHERE {{ wd:Q{i} wdt:P19 ?x }}",
            }
            for i in range(60)
        ],
    )
    monkeypatch.setitem(benchmarks.HELD_OUT, "qald10", (str(path), None, "qald10-dev"))
    monkeypatch.setattr(benchmarks, "TRAINING_MATERIAL", ("qald10-train",))
    return path


def test_qald10_dev_and_train_are_the_two_parts_and_training_never_sees_dev(qald):
    from grisp import samples

    dev = benchmarks.load_benchmark("qald10-dev")
    train = benchmarks.load_benchmark("qald10-train")
    assert dev and train and len(dev) + len(train) == 60
    assert ([r["id"] for r in train], [r["id"] for r in dev]) == tuple(
        [r["id"] for r in part] for part in benchmarks.holdout(benchmarks.read_jsonl(qald), "qald10-dev")
    )
    # training loads records through benchmarks.load_training: the whole file gives only its train part
    for data in ("qald10", "qald10-train", str(qald)):
        assert [r["id"] for r in samples.load_records(data)] == [r["id"] for r in train]
    with pytest.raises(ValueError, match="qald10-dev is held out .* train on qald10-train"):
        samples.load_records("qald10-dev")


def test_qald10_dev_drops_the_questions_a_training_source_also_asks(qald, tmp_path, monkeypatch, capsys):
    held = [r["id"] for r in benchmarks.holdout(benchmarks.read_jsonl(qald), "qald10-dev")[1]]
    assert len(held) >= 3 and len(benchmarks.load_benchmark("qald10-dev")) == len(
        held
    )  # nothing repeated yet
    a, b, c = held[:3]
    i, j = int(a.split("_")[1]), int(b.split("_")[1])
    # another source asks a's question in other words' case and punctuation, and b's query written otherwise
    other = tmp_path / "other.jsonl"
    write_jsonl(
        other,
        [
            {
                "id": "o1",
                "question": f"Where was x{i} born",
                "sparql": "SELECT ?y WHERE { wd:Q999 wdt:P19 ?y }",
            },
            {
                "id": "o2",
                "question": "a question of its own",
                "paraphrases": [],
                "sparql": f"PREFIX e: <http://www.wikidata.org/entity/> select $place where {{ e:Q{j} "
                "<http://www.wikidata.org/prop/direct/P19> ?place . }",
            },
            {
                "id": "o3",
                "question": "another one",
                "paraphrases": [f"where was X{int(c.split('_')[1])} born?"],
                "sparql": "ASK { wd:Q998 wdt:P19 wd:Q997 }",
            },
        ],
    )
    monkeypatch.setattr(benchmarks, "TRAINING_MATERIAL", ("qald10-train", str(other)))
    dev = [r["id"] for r in benchmarks.load_benchmark("qald10-dev")]
    assert dev == [r for r in held if r not in (a, b, c)]
    assert "3 of" in capsys.readouterr().err
    assert benchmarks.held_out_count("qald10") == len(held)  # what training leaves out is unchanged
    # a training source that is not here: the set cannot be told (it would be another under the same name)
    monkeypatch.setattr(benchmarks, "TRAINING_MATERIAL", ("qald10-train", str(tmp_path / "gone.jsonl")))
    with pytest.raises(FileNotFoundError, match="every training source is needed .*gone.jsonl"):
        benchmarks.load_benchmark("qald10-dev")


def test_training_never_reads_an_evaluation_set(tmp_path):
    from grisp import samples

    demo = benchmarks.defaults.DEMO_DIR / "questions.jsonl"
    for name in ("demo", str(demo), "wwq-dev", "wwq-dev-kg", "wwq-dev-full"):
        with pytest.raises(ValueError, match="is the evaluation set .* no training run may see"):
            samples.load_records(name)
    copy = tmp_path / "mine.jsonl"  # another file with the same questions is the user's own business
    copy.write_text(demo.read_text())
    assert benchmarks.evaluation_set(str(copy)) is None and samples.load_records(str(copy))


def test_the_real_qald10_split_is_fixed():
    try:  # the files of the data cache, filled from ../shared/data where it exists (no download here)
        source = benchmarks.cached_file(benchmarks.HELD_OUT["qald10"][0])
        for name in benchmarks.TRAINING_MATERIAL:
            if name in benchmarks.BENCHMARKS:
                benchmarks.cached_file(benchmarks.BENCHMARKS[name][0])
    except FileNotFoundError as error:
        pytest.skip(f"the QALD-10 file or a training source is not here: {error}")
    train, dev = benchmarks.holdout(benchmarks.read_jsonl(source), "qald10-dev")
    assert (len(train), len(dev)) == (326, 86)  # documented in docs/method.md section 7.7
    assert [r["id"] for r in dev[:3]] == ["train_2", "train_6", "train_15"]
    assert len(benchmarks.load_benchmark("qald10-dev")) == 63  # 23 asked by a training source too


def test_record_without_a_gold_query_is_refused(tmp_path):
    path = tmp_path / "b.jsonl"
    write_jsonl(path, [SAMPLE, {**SAMPLE, "id": "q2", "sparql": " "}])
    with pytest.raises(ValueError, match="record 2 \\(id 'q2'\\) has no gold SPARQL"):
        benchmarks.load_benchmark(path)


def test_the_tune_and_report_halves_are_stable_and_disjoint():
    """The split is a pure function of the question id, fixed once: these ids keep their halves forever (a
    changed rule would move questions that a choice has looked at into the reported half)."""
    assert [benchmarks.half(i) for i in ("WebQTrn-3129", "WebQTrn-3130", "WebQTrn-3131", "WebQTrn-3137")] == [
        "report",
        "tune",
        "report",
        "tune",
    ]
    ids = [f"WebQTrn-{n}" for n in range(2000)]
    tune = {i for i in ids if benchmarks.half(i) == "tune"}
    assert 0.45 < len(tune) / len(ids) < 0.55
    assert benchmarks.halved("wwq-dev-real-tune") == ("wwq-dev-real", "tune")
    assert (
        benchmarks.halved("wwq-dev-report") == ("wwq-dev", "report")
        and benchmarks.halved("qald10-dev") is None
    )
    assert benchmarks.evaluation_set("wwq-dev-kg-report") == "wwq-dev-kg"  # no training run may read a half


def test_halves_of_wwq_dev_cover_it_once():
    whole = benchmarks.load_benchmark("wwq-dev")
    halves = [benchmarks.load_benchmark(f"wwq-dev-{h}") for h in benchmarks.HALVES]
    assert sorted(r["id"] for h in halves for r in h) == sorted(r["id"] for r in whole)
