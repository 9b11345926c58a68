"""tools/report.py: the tables of docs/results*.md come out of real evaluate.py summaries with the right numbers."""

import json

import pytest

import evaluate
from grasp import evaluation
from grisp import skeleton_score
from tools import report


def write_run(run_dir, records, summary, config):
    run_dir.mkdir()
    (run_dir / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "summary.json").write_text(json.dumps({**summary, "config": config}))
    return run_dir


def system_record(qid, failure, seconds, backtracks=0):
    return {
        "id": qid,
        "question": f"question {qid}",
        "sparql": None if failure == "dead_end" else "PREFIX wd: <x>\nSELECT ?x {}",
        "f1": 1.0 if failure is None else 0.0,
        "em": failure is None,
        "failure": failure,
        "seconds": seconds,
        "backtracks": backtracks,
        "gold_status": "ok",
        "timings": {"total": seconds},
    }


def system_run(tmp_path, name, ablation, outcomes, options=None, adapter="adapters/a"):
    records = [
        system_record(f"q{i}", failure, seconds=2.0 + i, backtracks=i % 2)
        for i, failure in enumerate(outcomes)
    ]
    config = {"ablation": ablation, "options": options or {}, "oracle_skeleton": False, "adapter": adapter}
    return write_run(tmp_path / name, records, evaluate.summarize(records), config)


def test_systems_table_rows_follow_the_summaries(tmp_path):
    full = system_run(tmp_path, "full", "none", [None, None, "dead_end", "wrong_answer"])
    no_rerank = system_run(
        tmp_path,
        "norr",
        "no-rerank",
        [None, None, None, "wrong_answer"],
        options=dict(evaluate.ABLATIONS["no-rerank"]),
    )
    lines = report.systems_table([full, no_rerank])
    # F1 | answered | precision | wrong | declined | index lacks: declined | EM | ...
    assert (
        lines[2]
        == "| GRISP (all mechanisms) | 50.0 | 3 | 66.7 | 1 | 1 | 0 of 0 | 50.0 | 3.5 / 3.5 | 0.50 | 1 / 1 / 2 | 4 |"
    )
    # the ablation's own preset is not repeated in the name
    assert (
        lines[3]
        == "| w/o re-ranking | 75.0 | 4 | 75.0 | 1 | 0 | 0 of 0 | 75.0 | 3.5 / 3.5 | 0.50 | 0 / 1 / 3 | 4 |"
    )
    slow = system_run(tmp_path, "slow", "none", [None, "timeout", "timeout", "dead_end"])
    assert report.systems_table([slow])[2].endswith("| 1 / 0 / 1 (2 timeout) | 4 |")  # no column of its own


def test_risk_table_and_plot_follow_the_confidences(tmp_path):
    """Four answered questions: at 25% coverage the surest (right), at 50% the two surest (one wrong), ...;
    without the retry the retry's answer (confidence 0.1) is gone."""
    outcomes = [(1.0, 0.9, False), (0.0, 0.8, False), (1.0, 0.5, False), (0.0, 0.1, True)]
    records = [
        {
            "id": f"q{i}",
            "f1": f1,
            "sparql": "Q",
            "guess": "Q",
            "confidence": c,
            "declined": False,
            "retried": retried,
            "index_lacks": [],
        }
        for i, (f1, c, retried) in enumerate(outcomes)
    ]
    run = write_run(tmp_path / "run", records, {}, {"ablation": "none", "options": {}, "adapter": "a"})
    curves = report.risk_curves([run], without_retry=True)
    lines = report.risk_table(curves)
    assert lines[0].startswith("| system | 10% | 20% | 30% |") and lines[0].endswith("| all answered |")
    cells = lines[2].split(" | ")
    assert cells[0] == "| GRISP (all mechanisms)" and cells[1] == "100.0 (0.90)" and cells[3] == "50.0 (0.80)"
    assert lines[2].endswith("| 50.0 at 100.0% |")
    assert lines[3].startswith("| GRISP (all mechanisms), w/o the retry |") and lines[3].endswith(
        "| 66.7 at 75.0% |"
    )
    report.plot_risk(curves, tmp_path / "risk.png")
    assert (tmp_path / "risk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("a.svg", "b.svg"):  # an SVG is text, the same bytes each time (what the repository keeps)
        report.plot_risk(curves, tmp_path / name)
    assert (tmp_path / "a.svg").read_text().startswith("<?xml")
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_systems_table_names_what_else_differs(tmp_path):
    a = system_run(tmp_path, "a", "none", [None], options={"beam_ranking": "length-normalised"})
    b = system_run(tmp_path, "b", "none", [None], adapter="/runs/mix/adapter")
    lines = report.systems_table([a, b])
    assert lines[2].startswith("| GRISP (all mechanisms) (beam_ranking=length-normalised, a) |")
    assert lines[3].startswith("| GRISP (all mechanisms) (mix) |")
    c = system_run(tmp_path, "c", "none", [None])
    config = json.loads((c / "summary.json").read_text())
    config["config"]["rerank_adapter"] = "/cache/mention/runs/worded/adapter"
    (c / "summary.json").write_text(json.dumps(config))
    assert report.systems_table([c])[2].startswith("| GRISP (all mechanisms) (re-ranker worded) |")


def test_systems_table_leaves_out_what_every_run_shares(tmp_path):
    common = {"precision": "bfloat16", "retry": True}
    full = system_run(tmp_path, "full", "none", [None], options=common)
    no_rerank = system_run(
        tmp_path, "norr", "no-rerank", [None], options=common | evaluate.ABLATIONS["no-rerank"]
    )
    f32 = system_run(tmp_path, "f32", "none", [None], options=common | {"precision": "float32"})
    lines = report.systems_table([f32, full, no_rerank])
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| GRISP (all mechanisms) (precision=float32)",
        "| GRISP (all mechanisms) (precision=bfloat16)",
        "| w/o re-ranking (precision=bfloat16)",
    ]
    lines = report.systems_table([full, no_rerank])
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| GRISP (all mechanisms)", "| w/o re-ranking"]


def test_shapes_table_splits_f1_by_the_gold_querys_shape(tmp_path):
    def run(name, outcomes):  # (shape, failure) per question
        records = [
            {**system_record(f"q{i}", failure, 1.0), "shape": shape}
            for i, (shape, failure) in enumerate(outcomes)
        ]
        return write_run(tmp_path / name, records, evaluate.summarize(records), {"ablation": "none"})

    old = run("old", [("one triple", None), ("one triple", "dead_end"), ("two-hop", "wrong_answer")])
    new = run("new", [("one triple", None), ("one triple", None), ("two-hop", None), ("ask", "dead_end")])
    lines = report.shapes_table([old, new])
    assert lines[0] == "| shape | old | new |"
    assert lines[2:] == [
        "| ask | - | 1: 0.0 |",
        "| two-hop | 1: 0.0 | 1: 100.0 |",
        "| one triple | 2: 50.0 | 2: 100.0 |",
        "| all | 3: 33.3 | 4: 75.0 |",
    ]
    # runs of the same name (one per adapter, as runs/results.sh lays them out) are told apart by their parent
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same = [old.rename(tmp_path / "a" / "demo-none"), new.rename(tmp_path / "b" / "demo-none")]
    assert report.shapes_table(same)[0] == "| shape | a/demo-none | b/demo-none |"


def test_shapes_table_refuses_runs_without_shapes(tmp_path):
    records = [system_record("q0", None, 1.0)]  # scored before records carried their shape
    summary = {k: v for k, v in evaluate.summarize(records).items() if k != "f1_by_shape"}
    before = write_run(tmp_path / "before", records, summary, {"ablation": "none"})
    with pytest.raises(SystemExit, match="re-score it with evaluate.py --score-only"):
        report.shapes_table([before])


def skeleton_record(qid, shape, structure, label, seconds=1.0):
    return {
        "id": qid,
        "question": qid,
        "shape": shape,
        "status": "scored",
        "generated": "SELECT ?x {}",
        "structure_match": structure,
        "label_match": label,
        "seconds": seconds,
    }


def test_skeletons_table_has_one_column_per_run(tmp_path):
    records_a = [
        skeleton_record("1", "one triple", True, True, 1.0),
        skeleton_record("2", "one triple", True, False, 3.0),
        skeleton_record("3", "two-hop", False, False, 5.0),
        {"id": "4", "question": "4", "status": "unskeletonisable"},
    ]
    records_b = [skeleton_record("1", "ask", False, False)]

    def summary(records):  # as evaluate.py --skeleton-only writes it
        return skeleton_score.summarize(records) | {"seconds": evaluate.seconds_summary(records)}

    a = write_run(tmp_path / "a", records_a, summary(records_a), {"ablation": "none"})
    b = write_run(
        tmp_path / "b",
        records_b + [skeleton_record("9", "ask", True, True, 99.0)],
        summary(records_b),
        {"ablation": "none"},
    )  # a record outside the run's selection (an earlier --limit) is not timed
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.skeletons_table([a, b])}
    assert rows["ask"] == "| ask | - | 1: 0.0, 0.0 |"
    assert rows["two-hop"] == "| two-hop | 1: 0.0, 0.0 | - |"
    assert rows["one triple"] == "| one triple | 2: 100.0, 50.0 | - |"
    assert rows["all"] == "| all | 3: 66.7, 33.3 | 1: 0.0, 0.0 |"
    assert "1 not skeletonisable, 0 without a skeleton, median 3.0 s" in rows["not scored"]
    assert rows["not scored"].endswith("| 0 not skeletonisable, 0 without a skeleton, median 1.0 s |")
    assert list(rows)[2:6] == ["ask", "two-hop", "one triple", "all"]  # skeleton_score's shape order


def test_compare_counts_transitions(tmp_path):
    a = system_run(tmp_path, "a", "none", [None, "dead_end", "dead_end"])
    b = system_run(tmp_path, "b", "no-rerank", [None, None, "dead_end"])
    lines = report.compare(a, b, show=5)
    assert "| correct | correct | 1 |" in lines and "| dead_end | correct | 1 |" in lines
    assert "| dead_end | dead_end | 1 |" in lines
    assert "q1: question q1  (dead_end -> correct)" in lines
    assert "  B: SELECT ?x {}" in lines  # PREFIX lines dropped
    # a question whose gold query failed in one run is not scored there: not "correct"
    records = [json.loads(line) for line in (a / "predictions.jsonl").read_text().splitlines()]
    records[0] |= {"f1": None, "em": None, "gold_status": "failed"}
    (a / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "| not scored | correct | 1 |" in report.compare(a, b, show=5)
    # also when the pipeline failed on it: a question whose gold failed is "not scored", not a dead end
    records[1] |= {"f1": None, "em": None, "gold_status": "failed"}
    # and a question answered twice (a resumed run) counts by its first record, as evaluate.py counts it
    records.append({**records[2], "failure": None, "f1": 1.0, "em": True})
    (a / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = report.compare(a, b, show=5)
    assert "| not scored | correct | 2 |" in lines and "| dead_end | dead_end | 1 |" in lines


def test_wrong_kind_of_run_is_a_clear_error(tmp_path):
    records = [skeleton_record("1", "ask", False, False)]
    skel = write_run(tmp_path / "s", records, skeleton_score.summarize(records), {"ablation": "none"})
    with pytest.raises(SystemExit, match="skeleton-only run"):
        report.systems_table([skel])
    with pytest.raises(SystemExit, match="does not exist"):
        report.load_summary(tmp_path)


def test_compare_refuses_a_folder_without_predictions_and_a_negative_show(tmp_path):
    a = system_run(tmp_path, "a", "none", [None])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="predictions.jsonl does not exist"):
        report.main(report.make_parser().parse_args(["compare", str(a), str(tmp_path / "empty")]))
    with pytest.raises(SystemExit, match="--show -1"):
        report.main(report.make_parser().parse_args(["compare", str(a), str(a), "--show", "-1"]))


def agent_config(model_dir="/models/qwen2.5-coder-0.5b-instruct", adapter=None):
    return {
        "system": "agent",
        "ablation": "none",
        "options": {},
        "adapter": "none",
        "agent": {"model": {"backend": "local", "model": "", "model_dir": model_dir, "adapter": adapter}},
    }


def test_agent_table_counts_steps_calls_and_endings(tmp_path):
    records = [
        system_record("q0", None, 10.0)
        | {"steps": 4, "calls": {"search_entity": 2, "execute": 1}, "agent_status": "answered"},
        system_record("q1", "dead_end", 30.0)
        | {"steps": 6, "calls": {"search_entity": 1}, "agent_status": "loop"},
    ]
    summary = evaluate.summarize(records) | {"agent": evaluation.agent_summary(records)}
    run = write_run(tmp_path / "demo-agent", records, summary, agent_config())
    lines = report.agent_table([run])
    assert lines[2] == (
        "| demo-agent | local: qwen2.5-coder-0.5b-instruct | 50.0 | 50.0 | 20.0 / 20.0 | 5.00 | 2.00 | "
        "search_entity 1.50, execute 0.50 | answered 1, loop 1 | 2 |"
    )
    # in the systems table an agent run is named as the agent, not as GRISP
    assert report.systems_table([run])[2].startswith(
        "| GRASP agent (local: qwen2.5-coder-0.5b-instruct) | 50.0 |"
    )
    tuned = write_run(
        tmp_path / "demo-agent-adapter", records, summary, agent_config(adapter="/x/grasp-agent-0.5b")
    )
    assert report.agent_table([tuned])[2].startswith(
        "| demo-agent-adapter | local: qwen2.5-coder-0.5b-instruct + grasp-agent-0.5b |"
    )
    grisp = system_run(tmp_path, "grisp", "none", [None])
    with pytest.raises(SystemExit, match="not an evaluate.py --system agent run"):
        report.agent_table([grisp])
