"""Tests for evaluate.py: a fake pipeline against a real oxigraph server over a tiny KG."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

import evaluate
from common import defaults

KG = """@prefix wd: <http://www.wikidata.org/entity/> .
@prefix wdt: <http://www.wikidata.org/prop/direct/> .
wd:Q1 wdt:P19 wd:Q2 .
wd:Q4 wdt:P26 wd:Q3 .
wd:Q5 wdt:P26 wd:Q3 .
"""
BORN = "SELECT ?x WHERE { wd:Q1 wdt:P19 ?x }"
SPOUSES = "PREFIX wd: <http://www.wikidata.org/entity/> SELECT ?x WHERE { ?x wdt:P26 wd:Q3 }"


@dataclass
class Answer:  # the fields of grisp.Answer that evaluate.py reads
    sparql: str | None
    failure: str | None = None
    backtracks: int = 0
    skeletons: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    error: str | None = None
    queries: int = 0
    endpoint_faults: dict = field(default_factory=dict)
    verified: bool | None = None


# id -> (gold query, what the fake pipeline answers)
CASES = {
    "exact": (
        BORN,
        Answer(
            BORN,
            timings={"search": 0.5},
            trace=[{"step": "pick", "iri": "wd:Q1", "alternatives": ["wd:Q1", "wd:Q9"]}],
        ),
    ),
    # predicts only one of two gold rows: TP = 1, FN = 1, FP = 0 -> F1 = 2/3
    "partial": (SPOUSES, Answer(SPOUSES.replace("}", "FILTER(?x = wd:Q4) }"), backtracks=2)),
    "no-skeleton": (BORN, Answer(None, failure="no_skeleton")),
    "dead-end": (SPOUSES, Answer(None, failure="dead_end", backtracks=3)),
    "gold-empty": ("SELECT ?x WHERE { wd:Q1 wdt:P999 ?x }", Answer(BORN)),
    "gold-fails": ("SELECT ?x WHERE {", Answer(BORN)),
    "ask": ("ASK { wd:Q1 wdt:P19 wd:Q2 }", Answer("ASK { ?s wdt:P19 wd:Q2 }", backtracks=1)),
}


class FakePipeline:
    def __init__(self):
        self.asked = []
        self.answers = {f"question {qid}?": answer for qid, (_, answer) in CASES.items()}

    def answer(self, question):
        self.asked.append(question)
        return self.answers[question]

    def answer_from_skeletons(self, question, skeletons):
        raise AssertionError("not in oracle mode")


@pytest.fixture(scope="module")
def endpoint_url(oxigraph_server, tmp_path_factory):
    kg = tmp_path_factory.mktemp("kg") / "kg.ttl"
    kg.write_text(KG)
    return oxigraph_server(kg)


@pytest.fixture
def bench(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"id": qid, "question": f"question {qid}?", "sparql": gold, "paraphrases": [], "info": {}}
            )
            + "\n"
            for qid, (gold, _) in CASES.items()
        )
    )
    return path


def make_args(bench, out, endpoint_url, **changes):
    args = dict(
        benchmark=str(bench),
        out=str(out),
        limit=None,
        score_only=None,
        endpoint=endpoint_url,
        index=defaults.DEMO_INDEX_DIR,
        query_timeout=10.0,
        model_dir=defaults.MODEL_DIR,
        adapter=str(defaults.ADAPTER_DIR),
        device="cpu",
        ablation="none",
        oracle_skeleton=False,
        num_beams=None,
        num_skeletons=None,
        top_k=None,
        time_budget=None,
        seed=None,
        beam_ranking=None,
        skeletons_from=None,
    )
    return argparse.Namespace(**{**args, **changes})


def check_handcrafted_summary(summary):
    # scored: exact 1, partial 2/3, no-skeleton 0, dead-end 0, ask 1
    assert summary["samples"] == 7 and summary["scored"] == 5
    assert summary["skipped"] == {"gold_empty": 1, "gold_failed": 1}
    assert summary["f1"] == pytest.approx((1 + 2 / 3 + 0 + 0 + 1) / 5)
    assert summary["em"] == pytest.approx(2 / 5)
    assert summary["failures"] == {
        "no_skeleton": 1,
        "dead_end": 1,
        "timeout": 0,
        "error": 0,
        "endpoint_error": 0,
        "declined": 0,
        "wrong_answer": 1,
        "correct": 2,
    }
    assert summary["endpoint"] == {
        "questions_failed": 0,
        "unverified_answers": 0,
        "queries": 0,
        "faulty_queries": {},
    }
    assert summary["backtracks_per_sample"] == pytest.approx(6 / 7)
    assert summary["samples_with_backtracks"] == 3


def test_run_scores_a_handcrafted_benchmark(bench, tmp_path, endpoint_url):
    summary = evaluate.main(make_args(bench, tmp_path / "run", endpoint_url), pipeline=FakePipeline())
    check_handcrafted_summary(summary)
    assert summary["seconds"]["median"] >= 0 and summary["seconds"]["mean"] >= 0
    assert summary["timings_mean"] == {"search": pytest.approx(0.5 / 7)}
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "predictions.jsonl").open())}
    assert records["exact"]["answers"]["results"]["bindings"] == [
        {"x": {"type": "uri", "value": "http://www.wikidata.org/entity/Q2"}}
    ]
    assert records["exact"]["trace"] == [{"step": "pick", "iri": "wd:Q1"}]  # lists dropped
    assert records["ask"]["answers"] == {"head": {}, "boolean": True}
    assert (
        records["gold-fails"]["gold_status"] == "failed" and "BadQuery" in records["gold-fails"]["gold_error"]
    )
    assert records["partial"]["failure"] == "wrong_answer" and records["exact"]["failure"] is None
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["f1"] == summary["f1"] and saved["config"]["ablation"] == "none"


def test_a_run_records_the_machine_load_and_warns_when_busy(
    bench, tmp_path, endpoint_url, monkeypatch, capsys
):
    monkeypatch.setattr(evaluate.os, "getloadavg", lambda: (2.345, 1.0, 0.5))
    evaluate.main(make_args(bench, tmp_path / "busy", endpoint_url), pipeline=FakePipeline())
    assert "the machine is busy (load 2.3" in capsys.readouterr().err
    assert json.loads((tmp_path / "busy" / "config.json").read_text())["load"] == 2.35
    monkeypatch.setattr(evaluate.os, "getloadavg", lambda: (0.2, 1.0, 0.5))
    evaluate.main(make_args(bench, tmp_path / "quiet", endpoint_url), pipeline=FakePipeline())
    assert "busy" not in capsys.readouterr().err
    assert json.loads((tmp_path / "quiet" / "config.json").read_text())["load"] == 0.2


def test_resume_skips_finished_ids(bench, tmp_path, endpoint_url):
    first = FakePipeline()
    summary = evaluate.main(make_args(bench, tmp_path / "run", endpoint_url, limit=3), pipeline=first)
    assert len(first.asked) == 3 and summary["samples"] == 3
    # a run killed mid-write leaves a cut-off last line: it is dropped and that question redone
    predictions = tmp_path / "run" / "predictions.jsonl"
    predictions.write_text(predictions.read_text() + '{"id": "dead-end", "quest')
    second = FakePipeline()
    summary = evaluate.main(make_args(bench, tmp_path / "run", endpoint_url), pipeline=second)
    assert second.asked == [f"question {qid}?" for qid in list(CASES)[3:]]
    check_handcrafted_summary(summary)
    assert len(predictions.read_text().splitlines()) == 7
    third = FakePipeline()  # nothing left to do
    evaluate.main(make_args(bench, tmp_path / "run", endpoint_url), pipeline=third)
    assert third.asked == []


def test_a_resumed_run_answers_again_the_questions_that_changed(bench, tmp_path, endpoint_url, capsys):
    """Before: an id in predictions.jsonl was done, whatever its question and gold query are now."""
    run = tmp_path / "run"
    evaluate.main(make_args(bench, run, endpoint_url), pipeline=FakePipeline())
    predictions = run / "predictions.jsonl"
    records = [json.loads(line) for line in predictions.open()]
    assert all(r["question"] == f"question {r['id']}?" and len(r["gold_hash"]) == 12 for r in records)
    for record in records:  # records of a run from before gold queries were recorded
        if record["id"] in ("dead-end", "no-skeleton", "ask"):
            del record["gold_hash"]
        if record["id"] == "ask":
            del record["question"]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in records))
    samples = {s["id"]: s for s in map(json.loads, bench.read_text().splitlines())}
    samples["partial"]["question"] = "question partial, reworded?"
    samples["gold-empty"]["sparql"] = BORN  # its gold query corrected: now it has an answer
    samples["exact"]["sparql"] = (
        "PREFIX wdt: <http://www.wikidata.org/prop/direct/> SELECT ?y WHERE {wd:Q1 wdt:P19 ?y.}"
    )
    samples["dead-end"]["question"] = (
        "question dead-end, reworded?"  # an old record: compared by its question
    )
    samples["ask"]["sparql"] = BORN  # an old record without question: trusted
    bench.write_text("".join(json.dumps(s) + "\n" for s in samples.values()))
    capsys.readouterr()
    pipeline = FakePipeline()
    pipeline.answers |= {
        "question partial, reworded?": CASES["partial"][1],
        "question dead-end, reworded?": CASES["dead-end"][1],
    }
    summary = evaluate.main(make_args(bench, run, endpoint_url), pipeline=pipeline)
    assert pipeline.asked == [
        "question partial, reworded?",
        "question dead-end, reworded?",
        "question gold-empty?",
    ]
    out = capsys.readouterr().out
    assert (
        "3 questions changed since they were answered (question or gold query), run again: partial, dead-end, "
        "gold-empty" in out
    )
    assert (
        "warning: 2 earlier answers were recorded before their gold query was: compared by question only "
        "(1 without one: trusted as they are)" in out
    )
    records = [json.loads(line) for line in predictions.open()]
    assert sorted(r["id"] for r in records) == sorted(CASES)  # each once: the old answers are gone
    assert summary["scored"] == 6 and summary["skipped"]["gold_empty"] == 0  # gold-empty's new answer counts
    assert next(r for r in records if r["id"] == "partial")["question"] == "question partial, reworded?"


def test_redo_failed_runs_again_the_questions_an_endpoint_fault_decided(
    bench, tmp_path, endpoint_url, capsys
):
    """Before: a question the endpoint failed (resolution, predicted or gold query) stayed failed in a resumed run."""
    run = tmp_path / "run"
    evaluate.main(make_args(bench, run, endpoint_url), pipeline=FakePipeline())
    predictions = run / "predictions.jsonl"
    faults = {  # as a run over a faulty endpoint records them
        "exact": {
            "sparql": None,
            "pipeline_failure": "endpoint_error",
            "failure": "endpoint_error",
            "f1": 0.0,
            "em": False,
            "error": "ServerError: 503",
        },  # resolution failed by the endpoint
        "partial": {
            "pred_error": "QueryTimeout: read timed out",
            "failure": "endpoint_error",
            "f1": 0.0,
        },  # scoring
        "ask": {
            "gold_status": "failed",
            "gold_error": "ServerError: 502",
            "f1": None,
            "em": None,
            "failure": None,
        },
    }
    records = [r | faults.get(r["id"], {}) for r in map(json.loads, predictions.open())]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in records))
    pipeline = FakePipeline()  # without the flag they are final: two endpoint errors, one gold query failed
    summary = evaluate.main(make_args(bench, run, endpoint_url), pipeline=pipeline)
    assert (
        pipeline.asked == []
        and summary["failures"]["endpoint_error"] == 2
        and summary["skipped"]["gold_failed"] == 2
    )
    capsys.readouterr()
    pipeline = FakePipeline()
    summary = evaluate.main(make_args(bench, run, endpoint_url, redo_failed=True), pipeline=pipeline)
    assert pipeline.asked == [
        "question exact?",
        "question partial?",
        "question ask?",
    ]  # not gold-fails: malformed
    assert "3 questions an endpoint fault decided, run again (--redo-failed)" in capsys.readouterr().out
    check_handcrafted_summary(summary)  # as if the endpoint had never failed
    assert len(predictions.read_text().splitlines()) == 7
    result = run_script("--help")
    assert "--redo-failed" in result.stdout and "a pipeline error" in " ".join(result.stdout.split())


def test_resume_refuses_other_settings(bench, tmp_path, endpoint_url):
    evaluate.main(make_args(bench, tmp_path / "run", endpoint_url, limit=1), pipeline=FakePipeline())
    with pytest.raises(ValueError, match="other settings \\(ablation, options\\)"):
        evaluate.main(
            make_args(bench, tmp_path / "run", endpoint_url, ablation="no-rerank"), pipeline=FakePipeline()
        )


def test_a_run_of_other_code_goes_on_only_when_accepted(bench, tmp_path, endpoint_url, monkeypatch, capsys):
    """Before: a resumed run mixed the answers of whatever code ran it, and config.json named none."""
    run = tmp_path / "run"
    evaluate.main(make_args(bench, run, endpoint_url, limit=1), pipeline=FakePipeline())
    first = json.loads((run / "config.json").read_text())["code"]
    assert first == evaluate.code_version() and len(first["fingerprint"]) == 64
    evaluate.main(
        make_args(bench, run, endpoint_url, limit=2), pipeline=FakePipeline()
    )  # the same code goes on
    edited = {"fingerprint": "b" * 64, "commit": None}
    monkeypatch.setattr(evaluate, "code_version", lambda: dict(edited))
    with pytest.raises(
        ValueError,
        match=f"{run} holds answers of other code \\(fingerprint {first['fingerprint'][:12]}, "
        f"this code bbbbbbbbbbbb\\): use another --out for the new code, or pass "
        f"--accept-other-code",
    ):
        evaluate.main(make_args(bench, run, endpoint_url, limit=3), pipeline=FakePipeline())
    with pytest.raises(
        ValueError, match="other settings \\(ablation, options, code\\)"
    ):  # the flag accepts code alone
        evaluate.main(
            make_args(bench, run, endpoint_url, ablation="no-rerank", accept_other_code=True),
            pipeline=FakePipeline(),
        )
    capsys.readouterr()
    pipeline = FakePipeline()
    evaluate.main(make_args(bench, run, endpoint_url, limit=3, accept_other_code=True), pipeline=pipeline)
    assert pipeline.asked == ["question no-skeleton?"]
    assert (
        f"warning: {run} goes on with other code ({first['fingerprint'][:12]} -> bbbbbbbbbbbb)"
        in capsys.readouterr().out
    )
    spans = edited | {"fingerprints": [first["fingerprint"], "b" * 64]}
    assert json.loads((run / "config.json").read_text())["code"] == spans
    evaluate.main(
        make_args(bench, run, endpoint_url, limit=4), pipeline=FakePipeline()
    )  # the new code goes on
    assert json.loads((run / "config.json").read_text())["code"] == spans
    # a run from before runs recorded their code (say, rows of an older protocol at the same --out) goes
    # on only when accepted (before: with a warning alone), and records the code from then on
    config = json.loads((run / "config.json").read_text())
    del config["code"]
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match="was started before runs recorded their code, so its answers may come "
        "from other code: use another --out, or pass --accept-other-code",
    ):
        evaluate.main(make_args(bench, run, endpoint_url, limit=5), pipeline=FakePipeline())
    evaluate.main(
        make_args(bench, run, endpoint_url, limit=5, accept_other_code=True), pipeline=FakePipeline()
    )
    assert "was started before runs recorded their code" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["code"] == edited
    # the command line: a one-line error before any model loads (its one question is answered)
    monkeypatch.undo()
    evaluate.main(
        make_args(bench, tmp_path / "script", endpoint_url, limit=1, precision="float32"),
        pipeline=FakePipeline(),
    )
    config = json.loads((tmp_path / "script" / "config.json").read_text())
    (tmp_path / "script" / "config.json").write_text(json.dumps(config | {"code": edited}))
    result = run_script(
        "--benchmark",
        str(bench),
        "--endpoint",
        endpoint_url,
        "--out",
        str(tmp_path / "script"),
        "--limit",
        "1",
        "--precision",
        "float32",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {tmp_path / 'script'} holds answers of other code (fingerprint bbbbbbbbbbbb, this code "
        )
    )
    assert "--accept-other-code" in run_script("--help").stdout


def test_a_start_that_failed_binds_nothing_and_a_repeated_answer_counts_once(bench, tmp_path, endpoint_url):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"benchmark": "elsewhere", "ablation": "no-rerank"})
    )  # no answers
    summary = evaluate.main(make_args(bench, run, endpoint_url), pipeline=FakePipeline())
    check_handcrafted_summary(summary)
    predictions = run / "predictions.jsonl"  # two processes on one --out: one question answered twice
    predictions.write_text(predictions.read_text() + predictions.read_text().splitlines()[0] + "\n")
    check_handcrafted_summary(evaluate.main(make_args(bench, run, endpoint_url), pipeline=FakePipeline()))


def test_an_adapter_changed_under_the_same_path_is_another_setting(bench, tmp_path, endpoint_url):
    adapter = tmp_path / "adapter"
    shutil.copytree(defaults.ADAPTER_DIR, adapter)
    evaluate.main(
        make_args(bench, tmp_path / "run", endpoint_url, limit=1, adapter=str(adapter)),
        pipeline=FakePipeline(),
    )
    weights = adapter / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # retrained in place, say
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="other settings \\(contents\\)"):
        evaluate.main(
            make_args(bench, tmp_path / "run", endpoint_url, adapter=str(adapter)), pipeline=FakePipeline()
        )
    with pytest.raises(ValueError, match="the adapter's files"):
        evaluate.main(
            make_args(
                bench,
                tmp_path / "ablation",
                endpoint_url,
                ablation="no-rerank",
                limit=1,
                adapter=str(adapter),
                skeletons_from=str(tmp_path / "run"),
            ),
            pipeline=FakePipeline(),
        )


def test_an_index_rebuilt_under_the_same_path_is_another_setting(bench, tmp_path, endpoint_url):
    import build_index

    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "Q1", "label": "alpha", "count": 1}) + "\n")
    build_index.build(tmp_path / "index", items=items, embed="none")
    evaluate.main(
        make_args(bench, tmp_path / "run", endpoint_url, limit=1, index=tmp_path / "index"),
        pipeline=FakePipeline(),
    )
    build_index.build(tmp_path / "index", items=items, embed="none")  # reused: the same index
    evaluate.main(
        make_args(bench, tmp_path / "run", endpoint_url, limit=2, index=tmp_path / "index"),
        pipeline=FakePipeline(),
    )
    items.write_text(json.dumps({"id": "Q1", "label": "alpha beta", "count": 1}) + "\n")
    build_index.build(tmp_path / "index", items=items, embed="none")  # rebuilt from an edited file
    with pytest.raises(ValueError, match="other settings \\(contents\\)"):
        evaluate.main(
            make_args(bench, tmp_path / "run", endpoint_url, index=tmp_path / "index"),
            pipeline=FakePipeline(),
        )


def test_runs_of_another_kind_are_neither_resumed_nor_reused(bench, tmp_path, endpoint_url):
    evaluate.main(make_args(bench, tmp_path / "full", endpoint_url, limit=1), pipeline=FakePipeline())
    for kind in ({"system": "agent"}, {"skeleton_only": True}):
        other = tmp_path / "-".join(kind)
        shutil.copytree(tmp_path / "full", other)
        config = json.loads((other / "config.json").read_text()) | kind
        (other / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match="other settings"):  # its records are not this kind's
            evaluate.main(make_args(bench, other, endpoint_url, limit=1), pipeline=FakePipeline())
        with pytest.raises(ValueError, match=f"other settings \\({next(iter(kind))}\\)"):
            evaluate.main(
                make_args(
                    bench,
                    tmp_path / "new",
                    endpoint_url,
                    ablation="no-rerank",
                    limit=1,
                    skeletons_from=str(other),
                ),
                pipeline=FakePipeline(),
            )


def test_a_run_records_the_retry_where_it_can_act(bench, tmp_path, endpoint_url):
    """Runs from before the retry saved no "retry": resuming one with the retry on (the default) is refused."""

    def config(run):
        return json.loads((tmp_path / run / "config.json").read_text())["options"]

    evaluate.main(
        make_args(bench, tmp_path / "paper", endpoint_url, limit=1, no_retry=True), pipeline=FakePipeline()
    )
    assert config("paper")["retry"] is False
    with pytest.raises(ValueError, match="other settings \\(options\\)"):
        evaluate.main(make_args(bench, tmp_path / "paper", endpoint_url, limit=1), pipeline=FakePipeline())
    evaluate.main(make_args(bench, tmp_path / "full", endpoint_url, limit=1), pipeline=FakePipeline())
    assert config("full")["retry"] is True
    evaluate.main(
        make_args(bench, tmp_path / "plain", endpoint_url, limit=1, ablation="no-rerank"),
        pipeline=FakePipeline(),
    )
    assert "retry" not in config(
        "plain"
    )  # nothing to retry without re-ranking: such runs from before stay valid


def test_oracle_mode_feeds_the_gold_skeleton_with_index_labels(bench, tmp_path, endpoint_url):
    items = tmp_path / "items.jsonl"
    items.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"id": "Q1", "label": "Douglas Adams", "aliases": [], "description": "writer", "count": 1},
                {"id": "P19", "label": "place of birth", "aliases": [], "description": "", "count": 1},
            ]
        )
    )
    built = subprocess.run(
        [
            sys.executable,
            "build_index.py",
            "--items",
            str(items),
            "--out",
            str(tmp_path / "index"),
            "--embed",
            "none",
        ],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr

    class OraclePipeline(FakePipeline):
        def answer(self, question):
            raise AssertionError("oracle mode must not generate skeletons")

        def answer_from_skeletons(self, question, skeletons):
            self.asked.append((question, skeletons))
            return Answer(BORN)

    pipeline = OraclePipeline()
    args = make_args(
        bench, tmp_path / "run", endpoint_url, oracle_skeleton=True, limit=1, index=tmp_path / "index"
    )
    summary = evaluate.main(args, pipeline=pipeline)
    [(question, [skeleton])] = pipeline.asked
    assert question == "question exact?"
    assert "<iri>Douglas Adams</iri> <iri>place of birth (wdt)</iri> ?x" in skeleton
    assert "wd:" not in skeleton and summary["f1"] == 1.0


def test_a_rerank_adapter_reranks_the_skeletons_of_the_run_adapter(
    bench, tmp_path, endpoint_url, monkeypatch
):
    """--rerank-adapter: the pipeline gets a second adapter for re-ranking; the run records it, and the
    skeletons reused from a run of --adapter stay acceptable (they are --adapter's)."""

    class Generating(FakePipeline):
        def answer(self, question):
            return Answer(
                BORN,
                skeletons=[(f"skeleton of {question}", -1.5)],
                timings={"generate": 5.0},
                trace=[{"event": "skeleton", "skeleton": "S", "verdict": "kept"}],
            )

    evaluate.main(make_args(bench, tmp_path / "full", endpoint_url, limit=1), pipeline=Generating())
    made = {}

    class Resolving(Generating):
        def __init__(self, *args, **kwargs):
            super().__init__()
            made.update(adapter=args[1], rerank_adapter=kwargs["rerank_adapter_dir"])

        def answer_from_skeletons(self, question, skeletons, trace=None):
            next(iter(skeletons))
            return Answer(BORN, trace=trace or [], timings={"resolve": 0.3})

    from grisp import pipeline

    monkeypatch.setattr(pipeline, "Grisp", Resolving)
    rerank_adapter = tmp_path / "rerank-adapter"
    evaluate.main(
        make_args(
            bench,
            tmp_path / "reranked",
            endpoint_url,
            limit=1,
            rerank_adapter=str(rerank_adapter),
            skeletons_from=str(tmp_path / "full"),
        )
    )
    assert made == {"adapter": str(defaults.ADAPTER_DIR), "rerank_adapter": str(rerank_adapter)}
    config = json.loads((tmp_path / "reranked" / "config.json").read_text())
    assert config["rerank_adapter"] == str(rerank_adapter) and config["adapter"] == str(defaults.ADAPTER_DIR)
    with pytest.raises(ValueError, match=r"holds a run with other settings \(rerank_adapter\)"):
        evaluate.main(
            make_args(
                bench, tmp_path / "reranked", endpoint_url, limit=1, skeletons_from=str(tmp_path / "full")
            )
        )


def test_skeletons_of_other_code_are_reused_only_when_accepted(
    bench, tmp_path, endpoint_url, monkeypatch, capsys
):
    """Before: --skeletons-from compared the settings but not the code, so an ablation could resolve the
    skeletons an older generate.py or model.py made and report them as this code's."""

    class Generating(FakePipeline):
        def answer(self, question):
            self.asked.append(question)
            return Answer(
                BORN,
                skeletons=[(f"skeleton of {question}", -1.5)],
                timings={"generate": 5.0},
                trace=[{"event": "skeleton", "skeleton": "S", "verdict": "kept"}],
            )

        def answer_from_skeletons(self, question, skeletons, trace=None):
            self.asked.append((question, [next(iter(skeletons))]))
            return Answer(BORN, trace=trace or [], timings={"resolve": 0.3})

    evaluate.main(make_args(bench, tmp_path / "full", endpoint_url, limit=1), pipeline=Generating())
    source = json.loads((tmp_path / "full" / "config.json").read_text())["code"]["fingerprint"]
    monkeypatch.setattr(evaluate, "code_version", lambda: {"fingerprint": "c" * 64, "commit": None})
    with pytest.raises(
        ValueError,
        match=f"its skeletons come from other code \\(fingerprint {source[:12]}, this code "
        f"cccccccccccc\\): generate them here, or pass --accept-other-code",
    ):
        evaluate.main(
            make_args(
                bench,
                tmp_path / "no-rerank",
                endpoint_url,
                ablation="no-rerank",
                limit=1,
                skeletons_from=str(tmp_path / "full"),
            ),
            pipeline=Generating(),
        )
    capsys.readouterr()
    pipeline = Generating()
    evaluate.main(
        make_args(
            bench,
            tmp_path / "no-rerank",
            endpoint_url,
            ablation="no-rerank",
            limit=1,
            skeletons_from=str(tmp_path / "full"),
            accept_other_code=True,
        ),
        pipeline=pipeline,
    )
    assert pipeline.asked == [
        ("question exact?", [("skeleton of question exact?", -1.5)])
    ]  # reused, not generated
    assert "reusing skeletons of other code" in capsys.readouterr().out
    # a source run from before runs recorded their code: reused only when accepted, with a warning
    config_path = tmp_path / "full" / "config.json"
    config_path.write_text(
        json.dumps({k: v for k, v in json.loads(config_path.read_text()).items() if k != "code"})
    )
    with pytest.raises(
        ValueError, match="was run before runs recorded their code, so its skeletons may come"
    ):
        evaluate.main(
            make_args(
                bench,
                tmp_path / "older",
                endpoint_url,
                ablation="no-rerank",
                limit=1,
                skeletons_from=str(tmp_path / "full"),
            ),
            pipeline=Generating(),
        )
    pipeline = Generating()
    evaluate.main(
        make_args(
            bench,
            tmp_path / "older",
            endpoint_url,
            ablation="no-rerank",
            limit=1,
            skeletons_from=str(tmp_path / "full"),
            accept_other_code=True,
        ),
        pipeline=pipeline,
    )
    assert pipeline.asked == [("question exact?", [("skeleton of question exact?", -1.5)])]
    assert "was run before runs recorded their code" in capsys.readouterr().out


def test_ablations_reuse_the_skeletons_an_earlier_run_generated(bench, tmp_path, endpoint_url, monkeypatch):
    class Generating(FakePipeline):
        def answer(self, question):
            self.asked.append(question)
            return Answer(
                BORN,
                skeletons=[(f"skeleton of {question}", -1.5)],
                timings={"generate": 5.0},
                trace=[{"event": "skeleton", "skeleton": "S", "verdict": "kept"}, {"event": "pick"}],
            )

    evaluate.main(make_args(bench, tmp_path / "full", endpoint_url, limit=2), pipeline=Generating())

    class Resolving(Generating):
        def answer_from_skeletons(self, question, skeletons, trace=None):
            self.asked.append(
                (question, [next(iter(skeletons))])
            )  # the first resolves: no more are asked for
            return Answer(
                BORN, trace=(trace or []) + [{"event": "resolved"}], timings={"search": 0.25, "resolve": 0.3}
            )

    pipeline = Resolving()
    args = make_args(
        bench,
        tmp_path / "no-rerank",
        endpoint_url,
        ablation="no-rerank",
        limit=3,
        skeletons_from=str(tmp_path / "full"),
    )
    evaluate.main(args, pipeline=pipeline)
    (question, skeletons), _, third = pipeline.asked
    assert question == "question exact?" and skeletons == [("skeleton of question exact?", -1.5)]
    assert third == "question no-skeleton?"  # not generated by the earlier run: generated here
    records = [json.loads(line) for line in (tmp_path / "no-rerank" / "predictions.jsonl").open()]
    assert [r["reused_skeletons"] for r in records] == [True, True, False]
    assert records[0]["seconds"] >= 5.0 and records[0]["timings"]["generate"] == 5.0
    assert [step["event"] for step in records[0]["trace"]] == ["skeleton", "resolved"]
    # skeletons from other generation settings (here greedy instead of beam search) are refused
    with pytest.raises(ValueError, match="other settings \\(beam_search\\)"):
        evaluate.main(
            make_args(
                bench,
                tmp_path / "greedy",
                endpoint_url,
                ablation="no-beam-search",
                skeletons_from=str(tmp_path / "full"),
            ),
            pipeline=Resolving(),
        )
    with pytest.raises(FileNotFoundError, match="no evaluation run there"):
        evaluate.main(
            make_args(bench, tmp_path / "x", endpoint_url, skeletons_from=str(tmp_path / "nothing")),
            pipeline=Resolving(),
        )
    # the same adapter named by a relative path from another directory is the same setting
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(defaults.ADAPTER_DIR, tmp_path)
    evaluate.main(
        make_args(
            bench,
            tmp_path / "relative",
            endpoint_url,
            ablation="no-rerank",
            limit=1,
            adapter=relative,
            skeletons_from=str(tmp_path / "full"),
        ),
        pipeline=Resolving(),
    )
    config = json.loads((tmp_path / "relative" / "config.json").read_text())
    assert config["adapter"] == str(defaults.ADAPTER_DIR)

    # another benchmark with the same questions under the same ids (another KG) reuses them too;
    # one whose question under a shared id differs is refused
    same_questions = tmp_path / "other-kg.jsonl"
    same_questions.write_text(bench.read_text())
    pipeline = Resolving()
    evaluate.main(
        make_args(
            same_questions,
            tmp_path / "other-kg",
            endpoint_url,
            limit=1,
            skeletons_from=str(tmp_path / "full"),
        ),
        pipeline=pipeline,
    )
    assert pipeline.asked == [("question exact?", [("skeleton of question exact?", -1.5)])]
    other_questions = tmp_path / "other-questions.jsonl"
    other_questions.write_text(bench.read_text().replace("question exact?", "who wrote it?"))
    with pytest.raises(
        ValueError, match="question exact is 'question exact\\?', here it is 'who wrote it\\?'"
    ):
        evaluate.main(
            make_args(
                other_questions,
                tmp_path / "other-questions",
                endpoint_url,
                limit=1,
                skeletons_from=str(tmp_path / "full"),
            ),
            pipeline=Resolving(),
        )

    # the earlier run stopped generating once its first skeleton resolved; an ablation whose first one
    # fails gets the next from a fresh generation, which repeats the recorded ones first (skipped)
    class NeedingMore(Resolving):
        def skeleton_stream(self, question, trace):
            for skeleton in [(f"skeleton of {question}", -1.5), ("second", -2.0), ("third", -2.5)]:
                time.sleep(0.3)
                yield skeleton

        def answer_from_skeletons(self, question, skeletons, trace=None):
            self.asked.append((question, list(skeletons)))  # all fail
            return Answer(BORN, trace=trace or [], timings={"resolve": 0.3})

    pipeline = NeedingMore()
    evaluate.main(
        make_args(
            bench,
            tmp_path / "no-backtracking",
            endpoint_url,
            ablation="no-backtracking",
            limit=1,
            skeletons_from=str(tmp_path / "full"),
        ),
        pipeline=pipeline,
    )
    assert pipeline.asked == [
        ("question exact?", [("skeleton of question exact?", -1.5), ("second", -2.0), ("third", -2.5)])
    ]
    # its generation time: the recorded one's, plus the two past it (not the recorded one made again)
    timings = json.loads((tmp_path / "no-backtracking" / "predictions.jsonl").read_text().splitlines()[0])[
        "timings"
    ]
    recorded = json.loads((tmp_path / "full" / "predictions.jsonl").read_text().splitlines()[0])["timings"][
        "generate"
    ]
    assert 0.59 < timings["generate"] - recorded < 0.8, (timings, recorded)  # 0.9 if the recorded one counted

    # an earlier run whose search gave every beam (8) but kept one: there is no other to generate here
    class Exhausted(Generating):
        def answer(self, question):
            beams = [
                {"event": "skeleton", "skeleton": f"S{i}", "verdict": "duplicate" if i else "kept"}
                for i in range(8)
            ]
            return Answer(
                BORN, skeletons=[(f"skeleton of {question}", -1.5)], timings={"generate": 5.0}, trace=beams
            )

    class NothingMore(NeedingMore):
        def skeleton_stream(self, question, trace):
            raise AssertionError("the earlier search gave every beam: generating again is wasted")

    evaluate.main(make_args(bench, tmp_path / "full-8", endpoint_url, limit=1), pipeline=Exhausted())
    pipeline = NothingMore()
    evaluate.main(
        make_args(
            bench,
            tmp_path / "no-backtracking-8",
            endpoint_url,
            ablation="no-backtracking",
            limit=1,
            skeletons_from=str(tmp_path / "full-8"),
        ),
        pipeline=pipeline,
    )
    assert pipeline.asked == [("question exact?", [("skeleton of question exact?", -1.5)])]


def test_score_only_rescores_without_a_pipeline(bench, tmp_path, endpoint_url):
    evaluate.main(make_args(bench, tmp_path / "run", endpoint_url), pipeline=FakePipeline())
    predictions = tmp_path / "run" / "predictions.jsonl"
    # fix the partial answer by hand and wipe the stored scores: re-scoring must recompute them
    records = [json.loads(line) for line in predictions.open()]
    for record in records:
        if record["id"] == "partial":
            record["sparql"] = SPOUSES
        record["f1"] = record["em"] = record["answers"] = None
    predictions.write_text("".join(json.dumps(r) + "\n" for r in records))
    # benchmark and endpoint come from the run's config.json
    result = subprocess.run(
        [sys.executable, "evaluate.py", "--score-only", str(predictions)],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "F1 / EM            60.0 / 60.0" in result.stdout  # (1 + 1 + 0 + 0 + 1) / 5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["f1"] == pytest.approx(3 / 5) and summary["failures"]["wrong_answer"] == 0
    rescored = {r["id"]: r for r in map(json.loads, predictions.open())}
    assert rescored["partial"]["em"] is True and rescored["exact"]["answers"] is not None
    # scoring a selection re-scores those records and keeps every other one in the file
    summary = evaluate.main(
        make_args(bench, tmp_path, None, benchmark=None, limit=2, score_only=str(predictions))
    )
    assert summary["samples"] == 2 and len(predictions.read_text().splitlines()) == 7


def test_failure_kind_of_single_records(endpoint_url):
    client = evaluate.sparql.SparqlClient(endpoint_url)

    def kind(sparql, pipeline_failure):
        record = {"sparql": sparql, "pipeline_failure": pipeline_failure}
        return evaluate.score_record(record, BORN, client)["failure"]

    assert kind(None, None) == "error"  # no query and no reason
    assert kind(None, "timeout") == "timeout"
    assert kind(BORN, None) is None
    assert kind(BORN, "timeout") is None  # a correct answer is correct, whatever the pipeline says
    assert kind(SPOUSES, None) == "wrong_answer"
    assert kind("SELECT ?x WHERE { wd:Q1 wdt:P19 ?x", None) == "wrong_answer"  # does not execute


def test_a_scored_record_knows_its_questions_shape(endpoint_url):
    client = evaluate.sparql.SparqlClient(endpoint_url)
    record = evaluate.score_record({"sparql": BORN, "pipeline_failure": None}, BORN, client)
    assert record["shape"] == "one triple"
    ask = "PREFIX wd: <http://www.wikidata.org/entity/> ASK { wd:Q1 ?p ?o }"
    assert (
        evaluate.score_record({"sparql": None, "pipeline_failure": "dead_end"}, ask, client)["shape"] == "ask"
    )


def test_a_declined_answer_scores_as_no_answer_and_its_guess_apart(endpoint_url):
    client = evaluate.sparql.SparqlClient(endpoint_url)
    declined = {"sparql": None, "guess": BORN, "declined": True, "pipeline_failure": "declined"}
    record = evaluate.score_record(declined, BORN, client)
    assert record["f1"] == 0.0 and record["guess_f1"] == 1.0 and record["answers"] is None
    assert record["guess_answers"] is not None and record["failure"] == "declined"


def test_score_only_declines_anew_at_another_threshold(endpoint_url):
    """--score-only --min-confidence: the recorded choices give the confidence; below the threshold the
    answer is declined, above it the guess is answered again."""
    record = {
        "sparql": BORN,
        "guess": BORN,
        "declined": False,
        "pipeline_failure": None,
        "choices": [{"p": 0.9}, {"p": 0.3}],
    }
    evaluate.redecide(record, 0.7)
    assert record["confidence"] == pytest.approx(0.6) and record["declined"] and record["sparql"] is None
    assert record["pipeline_failure"] == "declined"
    evaluate.redecide(record, 0.2)
    assert not record["declined"] and record["sparql"] == BORN and record["pipeline_failure"] is None
    nothing = {"sparql": None, "guess": None, "pipeline_failure": "dead_end"}
    evaluate.redecide(nothing, 0.5)
    assert nothing["sparql"] is None and nothing["pipeline_failure"] == "dead_end"


def test_summary_of_handmade_records():
    def record(f1, seconds, backtracks, failure=None, status="ok"):
        return {
            "f1": f1,
            "em": None if f1 is None else f1 == 1.0,
            "seconds": seconds,
            "backtracks": backtracks,
            "failure": failure,
            "gold_status": status,
            "timings": {"search": seconds / 2},
        }

    summary = evaluate.summarize(
        [
            record(1.0, 1.0, 0),
            record(0.5, 2.0, 1, "wrong_answer"),
            record(0.0, 6.0, 5, "dead_end"),
            record(None, 3.0, 0, status="empty"),
        ]
    )
    assert summary["f1"] == pytest.approx(0.5) and summary["em"] == pytest.approx(1 / 3)
    assert summary["seconds"] == {"median": 2.5, "mean": 3.0}
    assert summary["backtracks_per_sample"] == 1.5 and summary["samples_with_backtracks"] == 2
    assert summary["timings_mean"] == {"search": 1.5}
    assert "f1_by_shape" in summary and not summary["f1_by_shape"]  # records without a shape: none to report


def test_summary_splits_f1_by_shape_in_skeleton_scores_order():
    def record(f1, shape):
        return {
            "f1": f1,
            "em": f1 == 1.0,
            "seconds": 1.0,
            "backtracks": 0,
            "failure": None,
            "gold_status": "ok",
            "shape": shape,
        }

    summary = evaluate.summarize(
        [
            record(1.0, "one triple"),
            record(0.0, "one triple"),
            record(0.5, "two-hop"),
            record(1.0, "ask"),
            {**record(None, "ask"), "gold_status": "empty"},
        ]
    )
    assert summary["f1_by_shape"] == {
        "ask": {"scored": 1, "f1": 1.0},
        "two-hop": {"scored": 1, "f1": 0.5},
        "one triple": {"scored": 2, "f1": 0.5},
    }
    assert list(summary["f1_by_shape"]) == ["ask", "two-hop", "one triple"]


def test_ablation_presets_map_to_pipeline_options(tmp_path):
    args = make_args(tmp_path, tmp_path, "http://x", ablation="rerank-only", top_k=5)
    options = evaluate.pipeline_options(args)
    assert options["rerank"] and not options["beam_search"] and not options["backtracking"]
    assert options["top_k"] == 5 and "num_beams" not in options
    assert evaluate.pipeline_options(make_args(tmp_path, tmp_path, "http://x")).keys() == {"precision"}


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_a_run_records_the_precision_that_runs_not_auto(tmp_path, mock_native_bf16, native, expected):
    mock_native_bf16(native)
    args = make_args(tmp_path, tmp_path, "http://x", device="cpu", precision="auto")
    assert evaluate.pipeline_options(args)["precision"] == expected  # auto: as the CPU has it
    args = make_args(tmp_path, tmp_path, "http://x", device="cpu", precision="bfloat16")
    assert evaluate.pipeline_options(args)["precision"] == "bfloat16"  # asked for: as asked
    assert (
        evaluate.pipeline_options(make_args(tmp_path, tmp_path, "http://x"))["precision"] == expected
    )  # default: auto


def run_script(*args):
    return subprocess.run(
        [sys.executable, "evaluate.py", *args],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_exits_zero():
    result = run_script("--help")
    assert result.returncode == 0 and "--oracle-skeleton" in result.stdout
    assert "(default: None)" not in " ".join(
        result.stdout.split()
    )  # a None default: the help says what unset means


def test_help_names_every_benchmark_name_it_takes():
    result = subprocess.run(
        [sys.executable, "evaluate.py", "--help"],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000"},
    )  # no line breaks in names
    for name in ("qald7-train", "lcquad2-test", "simplequestions-val", "spinach-val"):  # the help lacked them
        assert name in result.stdout, name
    assert all(name in result.stdout for name in evaluate.benchmarks.NAMES)  # the list it is made from


def test_bad_input_exits_with_a_message(bench, tmp_path, endpoint_url):
    result = run_script("--benchmark", str(tmp_path / "missing.jsonl"), "--endpoint", endpoint_url)
    assert result.returncode != 0 and "missing.jsonl" in result.stderr and "Traceback" not in result.stderr
    # main() raises the errors that the script turns into a message and exit status 1
    with pytest.raises(FileNotFoundError, match="nothing.jsonl does not exist"):
        evaluate.main(make_args(bench, tmp_path, endpoint_url, score_only=str(tmp_path / "nothing.jsonl")))
    with pytest.raises(FileNotFoundError, match="127.0.0.1:9/query does not answer"):
        evaluate.main(make_args(bench, tmp_path, "http://127.0.0.1:9/query"))
    with pytest.raises(ValueError, match="--limit must be positive"):
        evaluate.main(make_args(bench, tmp_path, endpoint_url, limit=0))
    # bad knobs: a message before the run directory is written (was a GrispError traceback after config.json)
    for knob, value, message in [
        ("num_beams", 0, "num_beams = 0 must be >= 1"),
        ("top_k", 50, "top_k = 50 must be in"),
        ("time_budget", float("nan"), "time_budget = nan must be > 0"),
        ("seed", -1, "seed = -1 must be in"),
    ]:
        with pytest.raises(ValueError, match=message):
            evaluate.main(
                make_args(bench, tmp_path / "run", endpoint_url, **{knob: value}), pipeline=FakePipeline()
            )
    assert not (tmp_path / "run").exists()
    result = run_script(
        "--benchmark",
        str(bench),
        "--endpoint",
        endpoint_url,
        "--num-beams",
        "0",
        "--out",
        str(tmp_path / "run"),
    )
    assert (
        result.returncode != 0
        and "num_beams = 0 must be >= 1" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- --skeleton-only (no endpoint)
NO_ENDPOINT = "http://127.0.0.1:9/query"  # nothing listens there: --skeleton-only must not need it
SKELETON_BENCH = {  # id -> (question, gold query)
    "born": ("where was douglas adams born?", BORN),
    "ask": ("was douglas adams born in cambridge?", "ASK { wd:Q1 wdt:P19 wd:Q2 }"),
    "unknown": ("who is Q999?", "SELECT ?x WHERE { wd:Q999 wdt:P19 ?x }"),  # Q999 has no label: not scored
}


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory):
    """An index of three items (Q1 with an alias) built from an items file, as build_index.py does."""
    tmp = tmp_path_factory.mktemp("skeleton-index")
    (tmp / "items.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {
                    "id": "Q1",
                    "label": "Douglas Adams",
                    "aliases": ["DNA"],
                    "description": "writer",
                    "count": 1,
                },
                {"id": "Q2", "label": "Cambridge", "aliases": [], "description": "city", "count": 1},
                {
                    "id": "P19",
                    "label": "place of birth",
                    "aliases": ["birthplace"],
                    "description": "",
                    "count": 1,
                },
            ]
        )
    )
    built = subprocess.run(
        [
            sys.executable,
            "build_index.py",
            "--items",
            str(tmp / "items.jsonl"),
            "--out",
            str(tmp / "index"),
            "--embed",
            "none",
        ],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    return tmp / "index"


@pytest.fixture
def skeleton_bench(tmp_path):
    path = tmp_path / "skeleton-bench.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": qid, "question": q, "sparql": gold}) + "\n"
            for qid, (q, gold) in SKELETON_BENCH.items()
        )
    )
    return path


class FakeGenerator:
    """grisp.Grisp.generator's interface: skeletons(question) -> (kept skeletons with scores, trace)."""

    answers = {
        "where was douglas adams born?": [
            ("SELECT ?x WHERE { <iri>DNA</iri> <iri>birthplace (wdt)</iri> ?x }", -0.5)
        ],
        # right structure, wrong object label
        "was douglas adams born in cambridge?": [
            ("ASK { <iri>Douglas Adams</iri> <iri>place of birth (wdt)</iri> <iri>Oxford</iri> }", -0.7)
        ],
    }

    def __init__(self):
        self.asked = []

    def skeletons(self, question):
        self.asked.append(question)
        return self.answers[question], []


def test_skeleton_only_scores_generated_skeletons_without_an_endpoint(skeleton_bench, tiny_index, tmp_path):
    out = tmp_path / "run"
    first = FakeGenerator()
    args = make_args(skeleton_bench, out, NO_ENDPOINT, index=tiny_index, skeleton_only=True, limit=1)
    summary = evaluate.main(args, pipeline=first)
    assert first.asked == ["where was douglas adams born?"] and summary["scored"] == 1
    # resumed: only the questions not done yet are generated; the unknown one is not generated at all
    second = FakeGenerator()
    summary = evaluate.main(
        make_args(skeleton_bench, out, NO_ENDPOINT, index=tiny_index, skeleton_only=True), pipeline=second
    )
    assert second.asked == ["was douglas adams born in cambridge?"]
    assert (summary["questions"], summary["scored"], summary["unskeletonisable"]) == (3, 2, 1)
    assert summary["all"] == {"questions": 2, "structure": 1.0, "label": 0.5}
    assert summary["by_shape"] == {
        "ask": {"questions": 1, "structure": 1.0, "label": 0.0},
        "one triple": {"questions": 1, "structure": 1.0, "label": 1.0},
    }
    records = {r["id"]: r for r in map(json.loads, (out / "predictions.jsonl").open())}
    assert len(records) == 3
    born = records["born"]
    assert (
        born["gold_skeleton"]
        == "SELECT ?x WHERE { <iri>Douglas Adams</iri> <iri>place of birth (wdt)</iri> ?x }"
    )
    assert born["generated"] == FakeGenerator.answers["where was douglas adams born?"][0][0]
    assert (born["structure_match"], born["label_match"], born["shape"]) == (True, True, "one triple")
    assert records["unknown"]["status"] == "unskeletonisable"
    assert records["unknown"]["unknown"] == ["http://www.wikidata.org/entity/Q999"]
    saved = json.loads((out / "summary.json").read_text())
    assert saved["all"] == summary["all"] and saved["config"]["skeleton_only"] is True
    with pytest.raises(ValueError, match="other settings \\(options\\)"):
        evaluate.main(
            make_args(skeleton_bench, out, NO_ENDPOINT, index=tiny_index, skeleton_only=True, num_beams=2),
            pipeline=FakeGenerator(),
        )
    with pytest.raises(ValueError, match="rerank change resolution: drop them"):
        evaluate.main(
            make_args(
                skeleton_bench, out, NO_ENDPOINT, index=tiny_index, skeleton_only=True, ablation="no-rerank"
            ),
            pipeline=FakeGenerator(),
        )


def test_shapes_select_the_questions_of_those_gold_shapes(skeleton_bench, tiny_index, tmp_path):
    out = tmp_path / "run"
    generator = FakeGenerator()
    summary = evaluate.main(
        make_args(skeleton_bench, out, NO_ENDPOINT, index=tiny_index, skeleton_only=True, shapes="ask"),
        pipeline=generator,
    )
    assert generator.asked == ["was douglas adams born in cambridge?"] and summary["questions"] == 1
    assert json.loads((out / "config.json").read_text())["shapes"] == ["ask"]
    generator = FakeGenerator()  # the same run directory takes the other shapes' questions, as with --limit
    summary = evaluate.main(
        make_args(
            skeleton_bench,
            out,
            NO_ENDPOINT,
            index=tiny_index,
            skeleton_only=True,
            shapes="one-triple,two-hop",
        ),
        pipeline=generator,
    )
    assert generator.asked == ["where was douglas adams born?"] and summary["by_shape"].keys() == {
        "one triple"
    }
    # its seconds are those of the selected questions, not of every record in the directory
    records = [json.loads(line) for line in (out / "predictions.jsonl").open()]
    (out / "predictions.jsonl").write_text(
        "".join(json.dumps(r | {"seconds": 100.0 if r["id"] == "ask" else 1.0}) + "\n" for r in records)
    )
    summary = evaluate.main(
        make_args(
            skeleton_bench,
            out,
            NO_ENDPOINT,
            index=tiny_index,
            skeleton_only=True,
            shapes="one-triple,two-hop",
        ),
        pipeline=FakeGenerator(),
    )
    assert summary["seconds"] == {"median": 1.0, "mean": 1.0}
    with pytest.raises(ValueError, match="--shapes takes question shapes from ask, .*one-triple"):
        evaluate.main(
            make_args(
                skeleton_bench, out, NO_ENDPOINT, index=tiny_index, skeleton_only=True, shapes="one triple"
            ),
            pipeline=FakeGenerator(),
        )


def test_skeleton_only_end_to_end_with_a_tiny_model(skeleton_bench, tiny_index, tmp_path):
    from tests.tiny import make_model_dir

    model = make_model_dir(tmp_path / "tiny")
    result = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            "--skeleton-only",
            "--benchmark",
            str(skeleton_bench),
            "--index",
            str(tiny_index),
            "--model-dir",
            str(model),
            "--adapter",
            "none",
            "--device",
            "cpu",
            "--ablation",
            "no-beam-search",
            "--out",
            str(tmp_path / "run"),
            "--endpoint",
            NO_ENDPOINT,
        ],
        cwd=defaults.REPO_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "| shape | questions | structure match % | label match % |" in result.stdout
    assert "3 questions: 2 scored, 1 not skeletonisable" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").open()]
    assert [r["id"] for r in records] == list(SKELETON_BENCH)
    # a random model writes no skeleton that parses: scored as misses, not as errors
    assert all(r["structure_match"] is False for r in records if r["status"] == "scored")


def test_skeleton_only_bad_input_exits_with_a_message(skeleton_bench, tiny_index, tmp_path):
    no_sparql = tmp_path / "no-sparql.jsonl"
    no_sparql.write_text(json.dumps({"id": "q1", "question": "who?"}) + "\n")
    result = run_script("--skeleton-only", "--benchmark", str(no_sparql), "--index", str(tiny_index))
    assert result.returncode != 0 and "lacks sparql" in result.stderr and "Traceback" not in result.stderr
    result = run_script(
        "--skeleton-only", "--benchmark", str(skeleton_bench), "--index", str(tmp_path / "no-index")
    )
    assert result.returncode != 0 and "no index at" in result.stderr and "build_index.py" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_script(
        "--skeleton-only",
        "--benchmark",
        str(skeleton_bench),
        "--index",
        str(tiny_index),
        "--model-dir",
        str(tmp_path / "no-model"),
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode != 0 and "get_model.py" in result.stderr and "Traceback" not in result.stderr
    result = run_script(
        "--skeleton-only",
        "--benchmark",
        str(skeleton_bench),
        "--index",
        str(tiny_index),
        "--num-beams",
        "0",
        "--out",
        str(tmp_path / "no-beams"),
    )
    assert (
        result.returncode != 0
        and "num_beams = 0 must be >= 1" in result.stderr
        and "Traceback" not in result.stderr
    )
    assert not (tmp_path / "no-beams").exists()  # checked before the run directory is written
    result = run_script(
        "--skeleton-only",
        "--benchmark",
        str(skeleton_bench),
        "--index",
        str(tiny_index),
        "--device",
        "bogus",
        "--out",
        str(tmp_path / "bogus"),
    )
    assert (
        result.returncode != 0
        and "unknown device 'bogus'" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_an_endpoint_that_goes_away_stops_the_run_and_the_rerun_resumes(
    bench, tmp_path, endpoint_url, monkeypatch
):
    # before: every later question was recorded as done with its gold unscored (gold_failed) and never redone
    real_query, gone = evaluate.sparql.SparqlClient.query, {"now": False}

    def query(self, *args, **kwargs):
        if gone["now"]:
            raise evaluate.sparql.EndpointUnreachable("connection refused")
        return real_query(self, *args, **kwargs)

    monkeypatch.setattr(evaluate.sparql.SparqlClient, "query", query)

    class Dying(FakePipeline):
        def answer(self, question):
            gone["now"] = len(self.asked) == 2  # the endpoint dies while the third question is answered
            return super().answer(question)

    with pytest.raises(evaluate.EndpointGone, match="rerun the same command"):
        evaluate.main(make_args(bench, tmp_path / "run", endpoint_url), pipeline=Dying())
    predictions = tmp_path / "run" / "predictions.jsonl"
    assert [json.loads(line)["id"] for line in predictions.open()] == list(CASES)[:2]
    gone["now"] = False  # started again: the same command resumes at the third question
    second = FakePipeline()
    check_handcrafted_summary(
        evaluate.main(make_args(bench, tmp_path / "run", endpoint_url), pipeline=second)
    )
    assert second.asked == [f"question {qid}?" for qid in list(CASES)[2:]]
