"""Evaluate GRISP on a benchmark with the GRASP protocol (paper section 4, docs/method.md section 7).

For every question, run the pipeline (`grisp.pipeline.Grisp`: skeletons by beam search, then placeholder
resolution with re-ranking, KG guidance and backtracking), execute the predicted and the gold query
on the SPARQL endpoint and score them (`metrics.py`: assignment row F1, EM). Writes to `--out`:

    config.json        the resolved configuration of the run
    predictions.jsonl  one record per question: id, question, predicted sparql, answers, skeletons,
                       trace summary, timings, seconds, backtracks, error, pipeline failure,
                       endpoint queries / faults / verified, gold status, gold_hash, failure kind
                       (no_skeleton, dead_end, timeout, error, endpoint_error, wrong_answer or
                       null when correct), f1, em, reused_skeletons
    summary.json       F1, EM, scored/skipped samples, seconds per question, backtracks per sample,
                       where failures arise (no skeleton, resolution dead end, wrong answer), and
                       the endpoint's faults counted apart from the method's (docs/method.md 7.3)

Runs resume: ids already in predictions.jsonl are skipped, unless their question or gold query changed
since (those are run again); each record is appended and flushed as soon as it is scored. Other code than
the run's goes on, or reuses an earlier run's skeletons (--skeletons-from), only with `--accept-other-code`;
`--redo-failed` runs again the questions an endpoint fault decided (docs/method.md 7.3).
`--oracle-skeleton` feeds the gold query's skeleton to the resolver (the paper's skeleton-vs-resolution
error split); `--skeletons-from` resolves the skeletons an earlier run generated (ablations of the
resolution only, or the same questions on another KG, without decoding again); `--score-only` re-scores
a predictions file without loading the model (the endpoint is still needed: gold and predicted queries
are executed again). `--skeleton-only` needs no endpoint: it scores the top-1 generated skeleton against
the gold query's skeleton (skeleton_score.py: structure and label match by question shape), writing
predictions.jsonl and summary.json the same way.

    python evaluate.py                                  # demo questions on the demo KG
    python evaluate.py --ablation no-rerank --skeletons-from ~/.cache/grisp/eval/demo-none
    python evaluate.py --score-only ~/.cache/grisp/eval/demo-none/predictions.jsonl
    python evaluate.py --skeleton-only --benchmark qald10-dev --index ~/.cache/grisp/indices/wikidata-items

About 800 lines, over a script's ~300: the run modes above (and --system agent) share the run directory, resumption and
the summary, so the evaluation stage stays one file; the scoring rules themselves live in metrics.py
and skeleton_score.py.
"""

import argparse
import hashlib
import itertools
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from common import defaults
from common.code_version import code_version
from common.jsonl import append_jsonl, read_finished, read_jsonl, write_json, write_jsonl
from grisp import benchmarks, confidence, coverage, metrics, sparql
from grisp.options import GrispError, Options, add_flags, preset
from grisp.skeleton_score import SHAPES
from grisp.skeleton_score import shape as question_shape
from grisp.sparql_syntax import query_key
from grisp.tracing import Stopwatch
from llm.cpu_speed import cpu_name, pick_precision
from model import DEVICES, pick_device

# paper table 5: ablation name -> the options.Options fields it switches off (w/o KG guidance also
# drops constrained search; "all disabled" leaves plain index search, "re-ranking only" adds re-ranking)
_ALL_OFF = {
    "beam_search": False,
    "rerank": False,
    "constrained": False,
    "kg_guidance": False,
    "backtracking": False,
}
ABLATIONS = {
    "none": preset(),
    "no-beam-search": preset(beam_search=False),
    "no-rerank": preset(rerank=False),
    "no-constrained": preset(constrained=False),
    "no-kg-guidance": preset(kg_guidance=False, constrained=False),
    "no-backtracking": preset(backtracking=False),
    "all-disabled": preset(**_ALL_OFF),
    "rerank-only": preset(**{**_ALL_OFF, "rerank": True}),
}
KNOBS = (
    "num_beams",
    "num_skeletons",
    "top_k",
    "none_margin",
    "time_budget",
    "seed",
    "beam_ranking",  # passed if set
    "skeleton_dedupe",
    "precision",
    "min_confidence",
)  # options.Options fields
# grisp.pipeline.Answer.failure values; "endpoint_error" is the endpoint's failure, not the method's
PIPELINE_FAILURES = ("no_skeleton", "dead_end", "timeout", "error", "endpoint_error", "declined")
FAILURES = (*PIPELINE_FAILURES, "wrong_answer")
# a 1-minute load average above this when a run starts means another job shares the CPU (warned of)
BUSY_LOAD = 1.0
RUN_KEYS = (
    "benchmark",
    "ablation",
    "options",
    "oracle_skeleton",
    "model_dir",
    "adapter",
    "rerank_adapter",
    "index",
    "endpoint",
    "skeletons_from",
    "system",
    "agent",
    "skeleton_only",
    "contents",
    "code",
)  # a resumed run must agree with the saved config on these
GENERATION_OPTIONS = (
    "beam_search",
    "num_beams",
    "num_skeletons",
    "seed",
    "beam_ranking",
    "skeleton_dedupe",
    "precision",
)  # what decides stage 1's output
SKELETON_RUN_KEYS = (
    "benchmark",
    "options",
    "model_dir",
    "adapter",
    "index",
    "skeleton_only",
    "system",
    "contents",
    "code",
)  # the same for --skeleton-only
LATER_KEYS = ("contents", "code")  # recorded since: a run from before is compared without them


def pipeline_options(args: argparse.Namespace) -> dict:
    """options.Options fields for this run: the ablation preset plus the knobs given on the CLI, with the
    precision that will run in place of "auto" (its runs on CPUs with and without native bf16 differ).
    Bad knobs (--num-beams 0, --top-k 50, --time-budget nan ...) raise a ValueError naming each."""
    options = {
        **ABLATIONS[args.ablation],
        **{knob: getattr(args, knob) for knob in KNOBS if getattr(args, knob, None) is not None},
    }
    try:
        Options(**options)  # checked here, before a run directory is written
    except GrispError as error:
        raise ValueError(str(error)) from None
    options["precision"] = pick_precision(
        options.get("precision", Options.precision), pick_device(args.device)
    )[0]
    return options


def load_pipeline(args: argparse.Namespace, options: dict, generate_only: bool = False):
    from grisp import pipeline  # the model stack is only imported when questions are really answered

    adapter = None if str(args.adapter).lower() == "none" else args.adapter
    try:
        if generate_only:  # --skeleton-only: the model alone, no index, no endpoint
            return pipeline.Grisp.generator(args.model_dir, adapter, Options(**options), device=args.device)
        rerank_adapter = getattr(args, "rerank_adapter", None)
        return pipeline.Grisp(
            args.model_dir,
            adapter,
            args.index,
            args.endpoint,
            Options(**options),
            device=args.device,
            rerank_adapter_dir=rerank_adapter,
        )
    except GrispError as error:  # a missing model, adapter or index: a message, no traceback
        raise ValueError(str(error)) from None


def load_skeletonizer(index_dir: Path) -> Callable[[str], str]:
    """gold SPARQL -> gold skeleton whose placeholders carry the index's labels (oracle mode);
    IRIs the index does not know stay IRIs, as they would for the resolver."""
    import search
    from grisp.skeleton_score import gold_skeleton

    lookup = search.load_indices(index_dir).get
    return lambda query: gold_skeleton(query, lookup).skeleton


def load_generated_skeletons(
    run_dir: Path, config: dict, samples: list[dict], accept_other_code: bool = False
) -> dict[str, dict]:
    """Stage 1's output per question id from an earlier run of the same model, adapter, generation
    settings and code (--skeletons-from; other code only with `accept_other_code`). Skeleton generation is
    deterministic for a seed and is most of a question's time on a CPU, so ablations that change only the
    resolution reuse it. The earlier run may be of another benchmark that asks the same questions under the
    same ids (wwq-dev-kg and wwq-dev-full: generation does not see the KG); an id whose question differs is
    refused."""
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"--skeletons-from {run_dir}: no evaluation run there (config.json missing)")
    saved = json.loads((run_dir / "config.json").read_text())
    differs = [
        key
        for key in ("model_dir", "adapter", "oracle_skeleton", "system", "skeleton_only")
        if saved.get(key) != config.get(key)
    ]
    if "contents" in saved and saved["contents"]["adapter"] != config["contents"]["adapter"]:
        differs.append("the adapter's files")
    differs += [key for key in GENERATION_OPTIONS if saved["options"].get(key) != config["options"].get(key)]
    if differs or saved.get("skeletons_from"):
        raise ValueError(
            f"--skeletons-from {run_dir}: that run's skeletons come from other settings "
            f"({', '.join(differs) or 'it reused skeletons itself'}); generate them here instead"
        )
    was, now = compared(saved, "code"), compared(config, "code")
    if was is None and not accept_other_code:
        raise ValueError(
            f"--skeletons-from {run_dir} was run before runs recorded their code, so its skeletons may "
            f"come from other code: generate them here, or pass --accept-other-code to reuse them"
        )
    if was is None:
        print(
            f"warning: --skeletons-from {run_dir} was run before runs recorded their code: its skeletons "
            f"may come from other code (--accept-other-code)"
        )
    elif was != now and not accept_other_code:
        raise ValueError(
            f"--skeletons-from {run_dir}: its skeletons come from other code (fingerprint {was[:12]}, "
            f"this code {now[:12]}): generate them here, or pass --accept-other-code to reuse them"
        )
    elif was != now:
        print(
            f"warning: --skeletons-from {run_dir}: reusing skeletons of other code ({was[:12]}, this code "
            f"{now[:12]}; --accept-other-code)"
        )
    generated = {
        record["id"]: record for record in read_finished(run_dir / "predictions.jsonl")
    }  # it may still run
    for sample in samples:  # generation sees the question alone: another gold query is fine
        if sample["id"] in generated and "question" in changes(generated[sample["id"]], sample):
            raise ValueError(
                f"--skeletons-from {run_dir}: its question {sample['id']} is "
                f"{generated[sample['id']]['question']!r}, here it is {sample['question']!r}; "
                f"that run is of another benchmark"
            )
    return generated


def answer_with_generated(pipeline, question: str, source: dict, options: Options):
    """A grisp.pipeline.Answer resolving the skeletons an earlier run generated, timed as if generated here
    (the recorded generation seconds are added to the timings); skeletons past the recorded ones are
    generated here if needed and if there can be any."""
    recorded = [tuple(s) for s in source["skeletons"]]
    trace = [step for step in source["trace"] if step.get("event") == "skeleton"]
    again, more = (
        Stopwatch(),
        Stopwatch(),
    )  # regenerating the recorded ones (already counted), the ones past them
    # that run took skeletons only until one resolved. If its search gave every beam, its kept ones
    # are all there are; else there may be more, up to the number wanted
    ended = len(trace) >= options.beam_width
    available = sum(step["verdict"] == "kept" for step in trace) if ended else options.skeletons_wanted

    def skeletons():
        yield from recorded
        if len(recorded) < available:  # the same settings and seed give the recorded ones first: skipped
            stream = iter(pipeline.skeleton_stream(question, []))
            for _ in again.timed(itertools.islice(stream, len(recorded))):
                pass
            yield from more.timed(stream)

    start = time.perf_counter()
    answer = pipeline.answer_from_skeletons(question, skeletons(), trace=trace)
    generation = source["timings"].get("generate", 0.0) + more.seconds
    answer.timings["generate"] = generation
    answer.timings["resolve"] -= again.seconds + more.seconds
    answer.timings["total"] = time.perf_counter() - start - again.seconds - more.seconds + generation
    return answer


def summarize_trace(trace: list[dict], max_chars: int = 200) -> list[dict]:
    """Each trace step with only its scalar fields (long candidate lists dropped, text cut)."""
    return [
        {
            key: value[:max_chars] if isinstance(value, str) else value
            for key, value in step.items()
            if value is None or isinstance(value, (str, int, float, bool))
        }
        for step in trace
    ]


def execute(client: sparql.SparqlClient, query: str) -> tuple[sparql.Result | None, str | None]:
    """(result, None) or (None, error text): a failing query is data here, not a crash. An endpoint that
    no longer answers at all (after the client's retries) stops the run instead: every later question
    would be recorded as done with its gold unscored or its answer lost; a resumed run redoes it."""
    try:
        return client.query(query), None
    except sparql.EndpointUnreachable as error:
        raise EndpointGone(
            f"the SPARQL endpoint stopped answering ({error}); start it again and rerun "
            f"the same command: the run resumes at this question"
        ) from None
    except sparql.SparqlError as error:
        return None, f"{type(error).__name__}: {error}"


class EndpointGone(RuntimeError):
    """The endpoint went away during a run (see execute)."""


def is_endpoint_fault(error: str | None) -> bool:
    """Whether a query's recorded error (execute's "Type: message") is the endpoint's fault
    (sparql.ENDPOINT_FAULTS: a timeout, a server error ...), not the query's."""
    return (error or "").split(":")[0] in {e.__name__ for e in sparql.ENDPOINT_FAULTS}


def failed_by_endpoint(record: dict) -> bool:
    """Whether the endpoint failed the question: during resolution, or running the predicted query for
    scoring (failure kind "endpoint_error")."""
    return "endpoint_error" in (record.get("failure"), record.get("pipeline_failure"))


def answer_record(sample: dict, answer, seconds: float) -> dict:
    """The prediction part of a record, from a grisp.pipeline.Answer (or the agent's answer)."""
    return {
        "id": sample["id"],
        "question": sample["question"],
        "sparql": answer.sparql,
        "skeletons": [list(s) for s in answer.skeletons],
        "trace": summarize_trace(answer.trace),
        "timings": answer.timings,
        "seconds": seconds,
        "backtracks": answer.backtracks,
        "error": answer.error,
        "pipeline_failure": answer.failure,
        "queries": answer.queries,
        "endpoint_faults": answer.endpoint_faults,
        "verified": answer.verified,
        # how sure it is (grisp/confidence.py) and the query found, declined or not
        "confidence": getattr(answer, "confidence", None),
        "guess": getattr(answer, "guess", answer.sparql),
        "declined": getattr(answer, "declined", False),
        "choices": getattr(answer, "choices", []),
        "skeleton_number": getattr(answer, "skeleton_number", None),
        "retried": getattr(answer, "retried", False),
        "index_lacks": sample["info"].get("index_lacks") or [],
    }


def redecide(record: dict, min_confidence: float) -> None:
    """Apply grisp/confidence.py's rule again to a recorded answer (--score-only): its confidence from its
    recorded choices, declined below `min_confidence`, else answered with its guess."""
    if record.get("guess") is None:
        return
    record["confidence"] = confidence.confidence(record.get("choices") or [])
    record["declined"] = confidence.decide(record["confidence"], min_confidence)
    record["sparql"] = None if record["declined"] else record["guess"]
    if record["declined"]:
        record["pipeline_failure"] = "declined"
    elif record.get("pipeline_failure") == "declined":
        record["pipeline_failure"] = None


def score_record(record: dict, gold_sparql: str, client: sparql.SparqlClient) -> dict:
    """Execute gold and predicted query, then set answers, gold status, f1, em and failure kind; a declined
    answer's guess is executed and scored too (guess_f1: what answering it would have scored)."""
    gold, gold_error = execute(client, gold_sparql)
    record["gold_status"] = "failed" if gold is None else "empty" if gold.is_empty else "ok"
    record["gold_error"], record["gold_hash"] = gold_error, gold_hash(gold_sparql)
    query = (
        record["guess"] if record.get("declined") else record["sparql"]
    )  # the answer, or the declined guess
    pred, pred_error = execute(client, query) if query else (None, None)
    gold_rows = metrics.from_result(gold) if gold is not None else None
    f1 = metrics.sample_score(metrics.from_result(pred) if pred is not None else None, gold_rows)
    if record.get("declined"):  # scored as no answer; what the guess would have scored is kept apart
        record["guess_f1"], record["guess_answers"] = f1, pred.to_json() if pred is not None else None
        pred, pred_error, f1 = None, None, metrics.sample_score(None, gold_rows)
    record["pred_error"] = pred_error
    record["answers"] = pred.to_json() if pred is not None else None  # a SPARQL 1.1 JSON results document
    record["f1"], record["em"] = f1, None if f1 is None else metrics.exact_match(f1)
    record["shape"] = question_shape(gold_sparql)  # what kind of question, from its gold query
    # where it failed: the pipeline's own verdict first, else a wrong (or unexecutable) answer
    pipeline_failure = record["pipeline_failure"]
    if record["em"]:
        record["failure"] = None
    elif pipeline_failure in PIPELINE_FAILURES:
        record["failure"] = pipeline_failure
    elif is_endpoint_fault(record["pred_error"]):
        record["failure"] = "endpoint_error"  # the prediction may be right; the endpoint failed to run it
    elif not record["sparql"]:
        record["failure"] = "error"  # no query and no reason given: count it against the pipeline
    else:
        record["failure"] = "wrong_answer" if f1 is not None else None
    return record


def seconds_summary(records: list[dict]) -> dict:
    """Median and mean seconds per question over the records that were timed."""
    seconds = [r["seconds"] for r in records if r.get("seconds") is not None]
    return {
        "median": statistics.median(seconds) if seconds else None,
        "mean": statistics.fmean(seconds) if seconds else None,
    }


def summarize(records: list[dict]) -> dict:
    """Benchmark numbers over the records (F1/EM over scored samples only)."""
    scored = [r for r in records if r["f1"] is not None]
    backtracks = [r["backtracks"] for r in records if r.get("backtracks") is not None]
    failures = Counter(r["failure"] or "correct" for r in scored)
    timing_keys = sorted({key for r in records for key in (r.get("timings") or {})})
    return {
        "samples": len(records),
        "scored": len(scored),
        "skipped": {
            "gold_empty": sum(r["gold_status"] == "empty" for r in records),
            "gold_failed": sum(r["gold_status"] == "failed" for r in records),
        },
        "f1": statistics.fmean(r["f1"] for r in scored) if scored else None,
        "em": statistics.fmean(bool(r["em"]) for r in scored) if scored else None,
        "seconds": seconds_summary(records),
        "backtracks_per_sample": statistics.fmean(backtracks) if backtracks else None,
        "samples_with_backtracks": sum(b > 0 for b in backtracks),
        "failures": {kind: failures[kind] for kind in (*FAILURES, "correct")},
        # F1 by question shape (skeleton_score.SHAPES; records scored before shapes were recorded have none)
        "f1_by_shape": {
            shape: {"scored": len(rows), "f1": statistics.fmean(r["f1"] for r in rows)}
            for shape in SHAPES
            if (rows := [r for r in scored if r.get("shape") == shape])
        },
        # what was answered, its precision, what was declined (grisp/coverage.py), overall and by shape
        "trust": coverage.summary(records),
        "trust_by_shape": {
            shape: coverage.summary(rows)
            for shape in SHAPES
            if (rows := [r for r in scored if r.get("shape") == shape])
        },
        # over all questions (a dead endpoint also fails the gold queries, which skips them above)
        "endpoint": {
            "questions_failed": sum(failed_by_endpoint(r) for r in records),
            "unverified_answers": sum(r.get("verified") is False for r in records),
            "queries": sum(r.get("queries") or 0 for r in records),
            "faulty_queries": dict(
                sum((Counter(r.get("endpoint_faults") or {}) for r in records), Counter())
            ),
        },
        # seconds per question in each pipeline stage (a stage a question never reached counts 0)
        "timings_mean": {
            key: statistics.fmean(r["timings"].get(key, 0.0) for r in records if r.get("timings") is not None)
            for key in timing_keys
        },
    }


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal ("-" for none): the summaries' and report.py's tables."""
    return "-" if x is None else f"{100 * x:.1f}"


def print_summary(summary: dict, name: str) -> None:
    def sec(x):
        return "-" if x is None else f"{x:.2f}"

    skipped, failures = summary["skipped"], summary["failures"]
    backtracks = summary["backtracks_per_sample"]
    print(f"\n{name}: {summary['samples']} questions")
    print(
        f"  F1 / EM            {pct(summary['f1'])} / {pct(summary['em'])}   ({summary['scored']} scored; "
        f"skipped {skipped['gold_empty']} gold empty, {skipped['gold_failed']} gold failed)"
    )
    print(
        f"  seconds/question   median {sec(summary['seconds']['median'])}, mean {sec(summary['seconds']['mean'])}"
    )
    print(
        f"  backtracks/sample  {sec(backtracks)} ({summary['samples_with_backtracks']} samples backtracked)"
    )
    print(
        "  failures           " + ", ".join(f"{kind.replace('_', ' ')} {failures[kind]}" for kind in failures)
    )
    trust = summary.get("trust")
    if trust:
        lacks = trust["index_lacks"]
        print(
            f"  answered           {trust['answered']} of {summary['scored']} ({pct(trust['coverage'])}%), precision "
            f"{pct(trust['precision'])} (mean F1 of the answered), {trust['wrong']} wrong, {trust['partial']} partial; "
            f"declined {trust['declined']} ({trust['declined_for_confidence']} for low confidence)"
        )
        if lacks["questions"]:
            print(
                f"  index lacks entity {lacks['questions']} questions: {lacks['declined']} declined, {lacks['wrong']} "
                f"wrong; F1 on the others {pct(trust['f1_index_names'])} (with no threshold "
                f"{pct(trust['no_threshold']['f1_index_names'])})"
            )
    if summary.get("f1_by_shape"):
        print(
            "  F1 by shape        "
            + ", ".join(
                f"{shape} {pct(block['f1'])} ({block['scored']})"
                for shape, block in summary["f1_by_shape"].items()
            )
        )
    endpoint = summary["endpoint"]
    faults = ", ".join(f"{kind} {count}" for kind, count in endpoint["faulty_queries"].items()) or "none"
    print(
        f"  endpoint           {endpoint['questions_failed']} questions failed by the endpoint, "
        f"{endpoint['unverified_answers']} unverified answers; faulty queries of {endpoint['queries']}: {faults}"
    )


def absolute(path: str | Path) -> str:
    """A directory as a run's config.json records it: absolute, so that runs started from different
    directories compare equal when resuming and for --skeletons-from ("none", no adapter, as it is)."""
    return str(path) if str(path).lower() == "none" else os.path.abspath(Path(path).expanduser())


def contents(adapter, rerank_adapter, index) -> dict:
    """Digests of what the run's paths hold, so that a resumed run notices an adapter retrained or an index
    rebuilt under the same path: the adapters' files and the index parts' build stamps (None: none)."""

    def digest(files: list[Path]) -> str | None:
        files = [f for f in files if f.is_file()]
        return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16] if files else None

    def adapter_digest(path) -> str | None:
        path = Path(str(path)).expanduser() if path and str(path).lower() != "none" else None
        return digest(sorted(path.glob("*.json")) + [path / "adapter_model.safetensors"]) if path else None

    return {
        "adapter": adapter_digest(adapter),
        "rerank_adapter": adapter_digest(rerank_adapter),
        "index": digest(sorted(Path(index).expanduser().glob("*/*/build.json"))),
    }


def read_predictions(path: Path) -> list[dict]:
    """Records of a predictions file ([] before the first); a cut-off last line (killed mid-write) is
    dropped from disk."""
    return read_jsonl(path, appended=True)


def first_per_id(records: list[dict]) -> dict[str, dict]:
    """id -> its first record, in file order (two processes on one --out may both have answered a question:
    it counts once)."""
    first = {}
    for record in records:
        first.setdefault(record["id"], record)
    return first


def selected_records(records: list[dict], samples: list[dict]) -> list[dict]:
    """The first record of each question of `samples`, in file order (first_per_id)."""
    wanted = {sample["id"] for sample in samples}
    return [record for record_id, record in first_per_id(records).items() if record_id in wanted]


def select_questions(args: argparse.Namespace) -> list[dict]:
    """The benchmark's questions this run evaluates: those whose gold query has one of --shapes'
    shapes (skeleton_score.shape), then the first --limit of them."""
    samples = benchmarks.load_benchmark(args.benchmark)
    if args.shapes:
        from grisp.skeleton_score import shape

        samples = [sample for sample in samples if shape(sample["sparql"]).replace(" ", "-") in args.shapes]
    return samples[: args.limit]


def gold_hash(query: str) -> str:
    """A short hash of a gold query with its writing undone (sparql_syntax.query_key): a record keeps the
    gold query it was scored against, so a resumed run notices a gold query corrected since."""
    return hashlib.sha256(query_key(query).encode()).hexdigest()[:12]


def changes(record: dict, sample: dict) -> list[str]:
    """What differs between the question a record answered and the benchmark's question of its id:
    "question" (the text), "gold query" (gold_hash). A field the record lacks (runs from before it was
    recorded) is not compared."""
    return [
        name
        for name, field, now in [
            ("question", "question", sample["question"]),
            ("gold query", "gold_hash", gold_hash(sample["sparql"])),
        ]
        if field in record and record[field] != now
    ]


def compared(config: dict, key: str):
    """What of a run's setting `key` a resumed run must agree on: the code by its fingerprint alone (the
    commit is for information)."""
    value = config.get(key)
    return value["fingerprint"] if key == "code" and value else value


def machine_load() -> float:
    """The machine's 1-minute load average as this run starts (saved in config.json), with a warning when
    another job shares the CPU: time budgets are wall-clock, so there answers can change, not only timings."""
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        print(
            f"warning: the machine is busy (load {load:.1f} over the last minute): the time budgets are "
            "wall-clock, so answers, not only timings, can differ from a run on a quiet machine",
            file=sys.stderr,
        )
    return round(load, 2)


def start_run(
    out: Path,
    config: dict,
    keys: tuple[str, ...],
    samples: list[dict],
    accept_other_code: bool = False,
    redo_failed: bool = False,
) -> tuple[Path, list[dict]]:
    """Create the run directory and save `config` there (a run already there must agree on `keys`; on the
    code only with `accept_other_code`, and config.json then lists in code.fingerprints every version the
    run's answers come from); return the predictions file and the samples it does not hold yet (runs
    resume). Records whose question or gold query changed since (`changes`) are dropped from the file, and
    with `redo_failed` those an endpoint fault decided: those questions are run again."""
    out.mkdir(parents=True, exist_ok=True)
    predictions_path = out / "predictions.jsonl"
    if (out / "config.json").exists() and read_predictions(
        predictions_path
    ):  # a start that failed binds nothing
        saved = json.loads((out / "config.json").read_text())
        # runs from before "contents" or "code" was recorded are compared without it
        changed = [
            key
            for key in keys
            if compared(saved, key) != compared(config, key) and (key in saved or key not in LATER_KEYS)
        ]
        if changed and changed != ["code"]:
            raise ValueError(
                f"{out} holds a run with other settings ({', '.join(changed)}); "
                f"pass another --out or delete {out}"
            )
        was, now = compared(saved, "code"), compared(config, "code")
        if changed and not accept_other_code:
            raise ValueError(
                f"{out} holds answers of other code (fingerprint {was[:12]}, this code {now[:12]}): "
                f"use another --out for the new code, or pass --accept-other-code to continue the run"
            )
        if "code" in keys and was is None and not accept_other_code:  # e.g. rows of an older protocol
            raise ValueError(
                f"{out} was started before runs recorded their code, so its answers may come from "
                f"other code: use another --out, or pass --accept-other-code to continue the run"
            )
        if "code" in keys and was is None:
            print(
                f"warning: {out} was started before runs recorded their code: its answers so far may come "
                f"from other code (--accept-other-code)"
            )
        elif "code" in keys:
            versions = saved["code"].get("fingerprints", [was])
            if changed:  # accepted: the run spans code versions from now on
                print(
                    f"warning: {out} goes on with other code ({was[:12]} -> {now[:12]}); its config.json lists "
                    f"every version its answers come from"
                )
                versions = versions + [now]
            if len(versions) > 1:
                config["code"]["fingerprints"] = versions
    write_json(out / "config.json", config)
    records = read_predictions(predictions_path)
    by_id = {sample["id"]: sample for sample in samples}
    stale = {
        record["id"] for record in records if record["id"] in by_id and changes(record, by_id[record["id"]])
    }
    if stale:  # answers to other questions than this benchmark's: not reused
        print(
            f"{len(stale)} questions changed since they were answered (question or gold query), run again: "
            + ", ".join(sample["id"] for sample in samples if sample["id"] in stale)
        )
    # the endpoint's faults may have passed; a gold query the endpoint rejects as malformed would fail again
    failed = {
        record["id"]
        for record in records
        if redo_failed
        and record["id"] in by_id.keys() - stale
        and (failed_by_endpoint(record) or is_endpoint_fault(record.get("gold_error")))
    }
    if redo_failed:
        print(f"{len(failed)} questions an endpoint fault decided, run again (--redo-failed)")
    if stale or failed:
        records = [record for record in records if record["id"] not in stale | failed]
        write_jsonl(predictions_path, records)
    unhashed = [record for record in records if record["id"] in by_id and "gold_hash" not in record]
    if unhashed:
        untold = sum("question" not in record for record in unhashed)
        print(
            f"warning: {len(unhashed)} earlier answers were recorded before their gold query was: compared by "
            f"question only" + (f" ({untold} without one: trusted as they are)" if untold else "")
        )
    done = {record["id"] for record in records}
    todo = [sample for sample in samples if sample["id"] not in done]
    print(f"{len(samples)} questions, {len(samples) - len(todo)} already done, {len(todo)} to run")
    return predictions_path, todo


def evaluate_skeletons(args: argparse.Namespace, generator=None) -> dict:
    """--skeleton-only: the top-1 generated skeleton of each question against its gold skeleton, no
    endpoint (skeleton_score.py). `generator` replaces grisp.pipeline.Grisp.generator (anything with
    `skeletons(question) -> (kept, trace)`). Resumable like a full run; returns the summary."""
    import search
    from grisp import skeleton_score

    if (
        args.score_only
        or args.oracle_skeleton
        or args.skeletons_from
        or getattr(args, "rerank_adapter", None)
    ):
        raise ValueError(
            "--skeleton-only generates and scores skeletons itself; drop --score-only, "
            "--oracle-skeleton, --skeletons-from and --rerank-adapter"
        )
    options = pipeline_options(args)
    if resolution := sorted(set(options) - set(GENERATION_OPTIONS)):
        raise ValueError(
            f"--skeleton-only scores skeleton generation only, and {', '.join(resolution)} change "
            f"resolution: drop them (--ablation none or no-beam-search)"
        )
    args.benchmark = args.benchmark or "demo"
    samples = select_questions(args)
    lookup = search.load_indices(args.index).get  # IRI -> the gold item's labels and aliases, or None
    name = Path(args.benchmark).stem if args.benchmark.endswith(".jsonl") else args.benchmark
    suffix = "skeletons" + ("" if args.ablation == "none" else f"-{args.ablation}")
    out = Path(args.out).expanduser() if args.out else defaults.GRISP_HOME / "eval" / f"{name}-{suffix}"
    config = {
        "skeleton_only": True,
        "benchmark": args.benchmark,
        "ablation": args.ablation,
        "options": options,
        "model_dir": absolute(args.model_dir),
        "adapter": absolute(args.adapter),
        "index": absolute(args.index),
        "device": args.device,
        "cpu": cpu_name(),
        "limit": args.limit,
        "shapes": args.shapes,
        "out": str(out),
        "contents": contents(args.adapter, None, args.index),
        "code": code_version(),
        "load": machine_load(),
    }
    print(f"config: {json.dumps(config)}")
    predictions_path, todo = start_run(
        out, config, SKELETON_RUN_KEYS, samples, getattr(args, "accept_other_code", False)
    )
    if todo:
        generator = generator or load_pipeline(args, options, generate_only=True)
        with open(predictions_path, "a", encoding="utf-8") as file:
            for sample in tqdm(todo, desc="skeletons", unit="q"):
                start = time.perf_counter()
                record = skeleton_score.score_sample(sample, lookup, lambda q: generator.skeletons(q)[0])
                record["seconds"], record["gold_hash"] = (
                    time.perf_counter() - start,
                    gold_hash(sample["sparql"]),
                )
                append_jsonl(file, record)

    records = selected_records(read_predictions(predictions_path), samples)
    summary = skeleton_score.summarize(records) | {"seconds": seconds_summary(records)}
    write_json(out / "summary.json", {**summary, "config": config})
    print(f"\n{name}: skeleton score of the top-1 generated skeleton\n")
    print(skeleton_score.format_table(summary))
    if summary["unskeletonisable"]:
        print(
            f'(status "unskeletonisable" in the predictions; is {args.index} the index of this benchmark\'s KG?)'
        )
    print(f"wrote {predictions_path} and {out / 'summary.json'}")
    return summary


def parse_shapes(text: str | list[str] | None) -> list[str] | None:
    """--shapes "two-hop,intersection" -> ["two-hop", "intersection"] (skeleton_score.SHAPES, a space as
    "-"); a ValueError names the known shapes."""
    if text is None or isinstance(text, list):
        return text
    from grisp.skeleton_score import SHAPES

    known = [s.replace(" ", "-") for s in SHAPES]
    shapes = [part.strip() for part in text.split(",") if part.strip()]
    if not shapes or set(shapes) - set(known):
        raise ValueError(
            f"--shapes takes question shapes from {', '.join(known)}, comma-separated; got {text!r}"
        )
    return shapes


def saved_run_of(predictions: str) -> tuple[Path, dict]:
    """--score-only PREDICTIONS: the predictions file and its run's config.json ({} if it has none); a
    FileNotFoundError if the file is missing."""
    path = Path(predictions).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"predictions file {path} does not exist; pass the "
            f"predictions.jsonl of an earlier run to --score-only"
        )
    config = path.parent / "config.json"
    return path, json.loads(config.read_text()) if config.is_file() else {}


def connect(endpoint: str, query_timeout: float) -> sparql.SparqlClient:
    """The client that runs the gold and predicted queries on `endpoint`; a FileNotFoundError with the fix
    if the endpoint does not answer now."""
    client = sparql.SparqlClient(endpoint, read_timeout_s=query_timeout)
    try:
        sparql.SparqlClient(endpoint, retries=0).query("ASK {}")
    except sparql.SparqlError:
        raise FileNotFoundError(
            f"the SPARQL endpoint {endpoint} does not answer; start it "
            f"(python endpoint.py start) or pass --endpoint"
        ) from None
    return client


def score_only(
    args: argparse.Namespace,
    path: Path,
    saved_run: dict,
    samples: list[dict],
    client: sparql.SparqlClient,
    name: str,
) -> dict:
    """--score-only: re-score the records of `samples` in the predictions file `path` (with
    --min-confidence, declined anew first), write every record back and the summary beside it."""
    gold_by_id = {sample["id"]: sample["sparql"] for sample in samples}
    records = read_predictions(path)  # all are written back; those of this selection are re-scored
    selected = selected_records(records, samples)
    threshold = getattr(args, "min_confidence", None)  # given: decline the recorded answers anew
    if threshold is not None:
        saved_run.setdefault("options", {})["min_confidence"] = threshold
    for record in tqdm(selected, desc="scoring", unit="q"):
        if threshold is not None:
            redecide(record, threshold)
        score_record(record, gold_by_id[record["id"]], client)
    write_jsonl(path, records)
    summary = {
        **summarize(selected),
        "config": {
            **saved_run,
            "score_only": str(path),
            "benchmark": args.benchmark,
            "endpoint": args.endpoint,
            "limit": args.limit,
            "shapes": args.shapes,
        },
    }
    if saved_run.get("system") == "agent":
        from grasp import evaluation

        summary["agent"] = evaluation.agent_summary(selected)
    write_json(path.parent / "summary.json", summary)
    print_summary(summary, name)
    return summary


def run_config(args: argparse.Namespace, name: str) -> tuple[dict, str, Callable | None]:
    """The run's configuration (saved next to its predictions; a resumed run must match it), the suffix
    of its default directory, and with --system agent what makes the agent (None: GRISP answers)."""
    options = pipeline_options(args)
    suffix = args.ablation + ("-oracle" if args.oracle_skeleton else "")
    system = getattr(args, "system", "grisp")
    make_agent = None
    if system == "grisp" and options.get("rerank", True):  # saved where it acts: a run from before it differs
        options["retry"] = not getattr(args, "no_retry", False)
    if system == "agent":  # the GRASP agent (agent.py) instead of GRISP; same scoring
        if (
            args.oracle_skeleton
            or args.skeletons_from
            or args.ablation != "none"
            or getattr(args, "rerank_adapter", None)
        ):
            raise ValueError(
                "--oracle-skeleton, --skeletons-from, --ablation and --rerank-adapter are GRISP's; not "
                "with --system agent"
            )
        from agent import build_agent  # the model stack only for the agent
        from grasp import evaluation

        agent_settings, make_agent = evaluation.eval_setup(
            args.agent_config, args.endpoint, args.index, build_agent
        )
        suffix = "agent"
    out = Path(args.out).expanduser() if args.out else defaults.GRISP_HOME / "eval" / f"{name}-{suffix}"
    config = {
        "benchmark": args.benchmark,
        "ablation": args.ablation,
        "options": options,
        "oracle_skeleton": args.oracle_skeleton,
        "model_dir": absolute(args.model_dir),
        "adapter": absolute(args.adapter),
        "index": absolute(args.index),
        "endpoint": args.endpoint,
        "rerank_adapter": absolute(args.rerank_adapter) if getattr(args, "rerank_adapter", None) else None,
        "device": args.device,
        "cpu": cpu_name(),
        "limit": args.limit,
        "shapes": args.shapes,
        "out": str(out),
        "skeletons_from": str(Path(args.skeletons_from).expanduser()) if args.skeletons_from else None,
    }
    adapter = (
        agent_settings["model"]["adapter"] if system == "agent" else args.adapter
    )  # the agent config's own
    config["contents"] = contents(adapter, getattr(args, "rerank_adapter", None), args.index)
    config["code"] = code_version()  # what decides the answers besides the settings
    config["load"] = machine_load()
    if system == "agent":
        config |= {"system": "agent", "agent": agent_settings}
    return config, suffix, make_agent


def answer_questions(
    args: argparse.Namespace,
    config: dict,
    todo: list[dict],
    predictions_path: Path,
    client: sparql.SparqlClient,
    load: Callable[[], object],
) -> None:
    """Answer each question of `todo` (generating skeletons, or reusing --skeletons-from's, or resolving
    the gold skeleton with --oracle-skeleton), score it and append its record to `predictions_path` as
    soon as it is scored. `load()` gives what answers (called once, after the reused skeletons are
    checked, so a refused run loads no model)."""
    generated = (
        load_generated_skeletons(
            Path(config["skeletons_from"]), config, todo, getattr(args, "accept_other_code", False)
        )
        if args.skeletons_from
        else {}
    )
    run_options = Options(**config["options"])
    pipeline = load()
    skeletonize = load_skeletonizer(args.index) if args.oracle_skeleton else None
    with open(predictions_path, "a", encoding="utf-8") as file:
        for sample in tqdm(todo, desc="evaluating", unit="q"):
            start = time.perf_counter()
            if skeletonize is not None:
                answer = pipeline.answer_from_skeletons(sample["question"], [skeletonize(sample["sparql"])])
            elif sample["id"] in generated:
                answer = answer_with_generated(
                    pipeline, sample["question"], generated[sample["id"]], run_options
                )
            else:  # (with --skeletons-from: a question that run has not reached yet)
                answer = pipeline.answer(sample["question"])
            record = answer_record(sample, answer, answer.timings.get("total", time.perf_counter() - start))
            record["reused_skeletons"] = sample["id"] in generated
            record.update(getattr(answer, "extra", {}))  # the agent's steps, calls and status
            score_record(record, sample["sparql"], client)
            append_jsonl(file, record)


def summarise_run(out: Path, config: dict, samples: list[dict], label: str) -> dict:
    """The summary of the run in `out` over the questions of `samples` (its first record of each),
    written to summary.json and printed; returned."""
    predictions_path = out / "predictions.jsonl"
    records = selected_records(read_predictions(predictions_path), samples)
    summary = {**summarize(records), "config": config}
    agent = config.get("system") == "agent"
    if agent:
        from grasp import evaluation

        summary["agent"] = evaluation.agent_summary(records)
    write_json(out / "summary.json", summary)
    print_summary(summary, label)
    if agent:
        print(f"  agent              {json.dumps(summary['agent'])}")
    print(f"wrote {predictions_path} and {out / 'summary.json'}")
    return summary


def main(args: argparse.Namespace, pipeline=None) -> dict:
    """Run (or only score) an evaluation; returns the summary. `pipeline` replaces grisp.pipeline.Grisp
    (anything with `answer(question)` and `answer_from_skeletons(question, skeletons)`)."""
    # --- load: the questions and the endpoint
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be positive, not {args.limit}")
    args.shapes = parse_shapes(getattr(args, "shapes", None))
    if getattr(args, "skeleton_only", False):
        return evaluate_skeletons(args, pipeline)
    if args.skeletons_from and args.oracle_skeleton:
        raise ValueError("--skeletons-from and --oracle-skeleton both choose the skeletons; pass one")
    # --score-only: the run's own benchmark and endpoint unless given on the command line
    path, saved_run = saved_run_of(args.score_only) if args.score_only else (None, {})
    args.benchmark = args.benchmark or saved_run.get("benchmark") or "demo"
    args.endpoint = args.endpoint or saved_run.get("endpoint") or defaults.ENDPOINT_URL
    samples = select_questions(args)
    client = connect(args.endpoint, args.query_timeout)
    name = Path(args.benchmark).stem if args.benchmark.endswith(".jsonl") else args.benchmark
    if args.score_only:
        return score_only(args, path, saved_run, samples, client, name)

    # --- run: answer the questions not answered yet
    config, suffix, make_agent = run_config(args, name)
    print(f"config: {json.dumps(config)}")
    out = Path(config["out"])
    predictions_path, todo = start_run(
        out,
        config,
        RUN_KEYS,
        samples,
        getattr(args, "accept_other_code", False),
        getattr(args, "redo_failed", False),
    )
    if todo:

        def load():
            return pipeline or (make_agent() if make_agent else load_pipeline(args, config["options"]))

        answer_questions(args, config, todo, predictions_path, client, load)

    # --- summarise over this benchmark selection
    return summarise_run(out, config, samples, f"{name} ({suffix})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Run GRISP over a benchmark, execute gold and predicted queries and score them "
        "with the GRASP protocol (row F1 with assignment, EM); resumable.",
        formatter_class=defaults.HelpFormatter,
    )
    # data
    parser.add_argument(
        "--benchmark",
        default=None,
        help=f"benchmark name ({', '.join(benchmarks.NAMES)}) or a JSONL file "
        "({id, question, sparql, paraphrases, info} per line); default: demo, or "
        "with --score-only the run's own",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="run directory; default $GRISP_HOME/eval/<benchmark>-<ablation>[-oracle] "
        "(GRISP_HOME: ~/.cache/grisp), <benchmark>-skeletons[-<ablation>] with --skeleton-only, "
        "<benchmark>-agent with --system agent",
    )
    parser.add_argument(
        "--accept-other-code",
        action="store_true",
        help="continue the run in --out although its answers so far came from other code (its "
        "config.json's code fingerprint, a SHA-256 of the project's Python sources, differs): "
        "the run then spans code versions, all listed in config.json; without it such a run "
        "is refused. Likewise reuse the skeletons of a --skeletons-from run of other code",
    )
    parser.add_argument(
        "--redo-failed",
        action="store_true",
        help="resuming, run again the questions an endpoint fault decided: the endpoint failed "
        "resolution or the predicted query (failure endpoint_error), or the gold query "
        "(a timeout, a server error; not a malformed one). Errors count so: a pipeline error "
        "(no skeleton, dead end, timeout, error, endpoint_error) or a predicted query that "
        "fails scores 0; a gold query that fails or returns nothing leaves the question out "
        "of the mean (docs/method.md 7.3, 8)",
    )
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N questions")
    parser.add_argument(
        "--shapes",
        default=None,
        help="evaluate only the questions whose gold query has one of these shapes, comma-separated: "
        "ask, aggregate, filter/order, qualifier, other, two-hop, intersection, one-triple "
        "(docs/method.md 7.6; e.g. two-hop,intersection)",
    )
    parser.add_argument(
        "--score-only",
        default=None,
        metavar="PREDICTIONS",
        help="re-score this predictions.jsonl (gold and predicted queries are "
        "executed again) without loading the model; with --min-confidence, its answers "
        "are declined anew at that threshold (their recorded choices' confidence)",
    )
    # knowledge graph
    parser.add_argument(
        "--endpoint",
        default=None,
        help=f"SPARQL endpoint URL; default: {defaults.ENDPOINT_URL}, or with --score-only the run's own",
    )
    parser.add_argument(
        "--index", type=Path, default=defaults.DEMO_INDEX_DIR, help="search index directory (build_index.py)"
    )
    parser.add_argument(
        "--query-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for a gold or predicted query when scoring",
    )
    # model
    parser.add_argument("--model-dir", type=Path, default=defaults.MODEL_DIR, help="base model directory")
    parser.add_argument(
        "--adapter",
        default=str(defaults.ADAPTER_DIR),
        help="LoRA adapter directory (PEFT layout), or 'none' for the base model",
    )
    parser.add_argument(
        "--rerank-adapter",
        default=None,
        metavar="DIR",
        help="re-rank with the base model and this adapter instead of --adapter's (a second model "
        "in memory; e.g. an adapter trained further on re-ranking alone); the skeletons "
        "stay --adapter's",
    )
    parser.add_argument("--device", default="auto", help=f"{DEVICES}; auto: cuda, then mps, then cpu")
    # pipeline: ablations (paper table 5) and knobs; unset knobs keep the options.Options defaults
    parser.add_argument(
        "--ablation",
        default="none",
        choices=list(ABLATIONS),
        help="switch off GRISP mechanisms as in the paper's ablation table",
    )
    parser.add_argument(
        "--oracle-skeleton",
        action="store_true",
        help="resolve the gold query's skeleton instead of generating skeletons",
    )
    parser.add_argument(
        "--skeletons-from",
        default=None,
        metavar="RUN_DIR",
        help="reuse the skeletons (and their recorded generation time) of an earlier run "
        "with the same model and generation settings; for ablations that change "
        "only resolution (no-rerank, no-constrained, no-kg-guidance, no-backtracking), "
        "or the same questions on another KG (wwq-dev-kg from a wwq-dev-full run)",
    )
    parser.add_argument(
        "--skeleton-only",
        action="store_true",
        help="no endpoint: score the top-1 generated skeleton against the gold query's "
        "skeleton (structure and label match by question shape; labels from --index)",
    )
    add_flags(parser, KNOBS, unset=True)
    add_flags(parser, ["retry"])
    # the GRASP agent instead of GRISP (agent.py, evaluation.py): its model and options come from a config file
    parser.add_argument(
        "--system",
        choices=["grisp", "agent"],
        default="grisp",
        help="what answers the questions: GRISP, or the GRASP agent over --endpoint and --index",
    )
    parser.add_argument(
        "--agent-config",
        default=None,
        help="--system agent: TOML/JSON config (grasp.toml); its first knowledge graph is "
        "replaced by --endpoint and --index; default $GRASP_CONFIG or built-in defaults",
    )
    try:
        main(parser.parse_args())
    except (FileNotFoundError, ValueError, EndpointGone) as error:
        sys.exit(f"error: {error}")
