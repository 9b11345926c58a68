"""Tests for benchmarks.py: the data cache and the benchmark loader (no downloads)."""
import json

import pytest
import requests

import benchmarks

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
    monkeypatch.setattr(benchmarks, "EVAL_KG_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="python build_eval_kg.py"):
        benchmarks.load_benchmark("wwq-dev-kg")
    write_jsonl(tmp_path / "questions.jsonl", [SAMPLE])
    assert benchmarks.load_benchmark("wwq-dev-kg")[0]["id"] == "q1"
