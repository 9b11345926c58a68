"""Answer a question with GRISP: skeletons by beam search, KG-guided placeholder resolution, SPARQL.

Reads the base model, a LoRA adapter (PEFT layout), a search index and a SPARQL endpoint; prints the
final query, its confidence, the answer table with labels and a readable trace of every step (paper
section 3). An answer less confident than --min-confidence is declined: "no confident answer", its
query kept in the trace and the JSON as the best guess (docs/method.md 6.10).
Defaults are the embedded offline setup (see README: base model from get_model.py, the demo KG served
by endpoint.py, its index from build_index.py, the shipped adapter).

    python infer.py "Where was the Pulp Fiction director born?"
    python infer.py "Who directed Pulp Fiction?" --no-rerank --json answer.json
    python infer.py "..." --endpoint https://qlever.cs.uni-freiburg.de/api/wikidata \\
        --index ~/.cache/grisp/indices/wikidata-items
    python infer.py "Who directed Pulp Fiction?" --skeleton-only --num-skeletons 8 \\
        --json skeletons.json   # no index, no KG

Exit codes:
  0  answered: the final query ran and returned a result (or KG guidance is off: nothing was checked)
  1  no answer, the method failed: no skeleton parses, every skeleton dead-ended, the time budget ran out,
     or the answer found was declined as not confident enough (--min-confidence)
  2  bad input or setup: empty question, bad settings, missing model/adapter/index, unreachable endpoint
  3  no answer, the endpoint failed: it answered none of the question's queries (HTTP 5xx, invalid JSON,
     no answer in time, connection lost), or it became unreachable; the message counts the faults
  4  answered but unverified: the final query timed out or got HTTP 5xx (accepted as the reference does,
     because the endpoint answered other queries of the question); there is no result to show
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from common import defaults
from grisp.options import add_flags, from_flags
from grisp.pipeline import Answer, Grisp, GrispError, answer_to_json
from grisp.sparql import EndpointUnreachable, SparqlError
from grisp.sparql_syntax import compact
from model import DEVICES


def describe(event: dict) -> str:
    """One trace event as a line (or a few) of text."""
    kind = event["event"]
    if kind == "skeleton":
        return f"  skeleton {event['score']:8.3f} [{event['verdict']}] {event['skeleton']}"
    if kind == "resolve":
        return f"resolving skeleton {event['number'] + 1} ({event['placeholders']} placeholders): {event['skeleton']}"
    if kind == "placeholder":
        lines = [f"  {event['placeholder']}: {event['position']} -> {event['kind']} search"]
        if "constraint_size" in event:
            lines.append(f"    constrained to {event['constraint_size']} IRIs by: {event['constraint']}")
        elif "constraint_error" in event:
            lines.append(f"    constraint failed ({event['constraint_error']}); searching unconstrained")
        if "hits" in event:  # else the endpoint was lost in the constraint step, before the search
            lines.append(candidates(event))
        return "\n".join(lines)
    if kind == "wording":
        line = f"  {event['placeholder']}: used up; next wording {event['wording']!r}"
        return line + ("\n" + candidates(event) if "hits" in event else "")
    if kind == "choose":
        return f"    -> {compact(event['iri'])} ({event['label']})"
    if kind == "backtrack":
        ranked = f", {len(event['kept'])} still above None after re-ranking" if "kept" in event else ""
        return f"  backtrack to {event['to']} ({event['left']} alternatives left{ranked})"
    if kind == "validate":
        outcome = "ok" if event["ok"] else "rejected"
        detail = event.get("error") or (
            f"unverified, accepted despite {event['accepted_error']}"
            if "accepted_error" in event
            else f"boolean {event['boolean']}"
            if event.get("boolean") is not None
            else f"{event['rows']} rows"
        )
        return f"  validate: {outcome} ({detail})"
    if kind == "retry":
        skeletons = ", ".join(str(n + 1) for n in event["skeletons"])
        return (
            f"every skeleton dead-ended: skeleton(s) {skeletons} once more, every hit in the re-ranked order"
        )
    if kind == "refused":
        return f"  refused: {event['reason']}"
    if kind == "declined":
        return (
            f"declined: confidence {event['confidence']:.2f} is below --min-confidence {event['min_confidence']:g}; "
            f"the best guess was: {' '.join(event['guess'].split())}"
        )
    if kind == "endpoint_lost":
        return f"  endpoint lost: {event['error']}"
    return f"  {kind}"


def candidates(event: dict) -> str:
    """A search's hits, or their re-ranking with None's place, as one line."""
    ranked = event.get("reranked") or [(iri, score) for iri, _, score in event["hits"]]
    labels = {iri: label for iri, label, _ in event["hits"]}
    shown = [f"{compact(iri) if iri else 'None'} {labels.get(iri, '')!r} {score}" for iri, score in ranked]
    return f"    {'re-ranked' if 'reranked' in event else 'hits'}: " + ("; ".join(shown) or "none")


def answer_table(grisp: Grisp, answer: Answer, limit: int = 20) -> str:
    """The result rows with labels for IRIs the index knows."""
    result = answer.result
    if answer.verified is False:
        return (
            f"(unverified: the final query was not checked, {answer.error}; kept because the endpoint "
            f"answered {answer.queries_answered} other queries of this question)"
        )
    if result is None:
        return "(no result: KG guidance is off, the query was not run)"
    if result.boolean is not None:
        return f"ASK: {'yes' if result.boolean else 'no'}"

    def show(term: dict) -> str:
        if term["type"] != "uri":
            return term["value"]
        try:
            return f"{grisp.indices.item(term['value']).label} ({compact(term['value'])})"
        except KeyError:
            return compact(term["value"])

    lines = [" | ".join(f"?{v}" for v in result.variables)]
    lines += [
        " | ".join(show(row[v]) if v in row else "" for v in result.variables) for row in result.rows[:limit]
    ]
    if len(result.rows) > limit:
        lines.append(f"... {len(result.rows) - limit} more rows")
    return "\n".join(lines)


# what each endpoint fault (sparql.ENDPOINT_FAULTS) means, for the final message
FAULT_TEXT = {
    "ServerError": "answered HTTP 5xx",
    "InvalidResponse": "sent invalid JSON or a broken answer",
    "QueryTimeout": "did not answer in time",
    "EndpointUnreachable": "could not be reached or refused the request",
}


def fault_report(answer: Answer) -> str:
    """E.g. 'sent invalid JSON or a broken answer for 14 of 14 queries; first error: InvalidResponse: ...'."""
    faults = "; ".join(
        f"{FAULT_TEXT.get(kind, kind)} for {count} of {answer.queries} queries"
        for kind, count in answer.endpoint_faults.items()
    )
    return f"{faults or f'answered none of {answer.queries} queries'}; first error: {answer.error}"


def exit_code(answer: Answer) -> int:
    """0 answered, 1 the method found no answer, 3 the endpoint failed, 4 answered but unverified."""
    if answer.sparql is None:
        return 3 if answer.failure == "endpoint_error" else 1
    return 4 if answer.verified is False else 0


def print_skeletons(args: argparse.Namespace, adapter: str | None) -> int:
    """--skeleton-only: stage 1 alone, no index and no endpoint; the kept skeletons, best first."""
    try:
        options = from_flags(args)
        generator = Grisp.generator(args.model_dir, adapter, options, args.device)
        start = time.perf_counter()
        skeletons, trace = generator.skeletons(args.question)
    except GrispError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    if (
        not args.quiet
    ):  # every beam with its verdict (kept, duplicate, does not parse, refused, unfinished, merged, surplus)
        print(f"precision {generator.why_precision}")
        print("\n".join(describe(e) for e in trace) + f"\ntimings: generate {seconds:.2f}s\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "question": args.question,
                    "skeletons": [list(s) for s in skeletons],
                    "trace": trace,
                    "timings": {"generate": seconds},
                    "precision": generator.precision,
                    "options": vars(args),
                },
                f,
                indent=2,
            )
    if not skeletons:
        print("no skeleton: the model produced no skeleton that parses", file=sys.stderr)
        return 1
    for rank, (skeleton, score) in enumerate(skeletons, start=1):
        print(f"{rank}. {score:8.3f}  {skeleton}")
    return 0


def setup_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the question or the runtime and output flags, found before the model loads (an
    unwritable --json would only fail after the whole run, losing the answer); None if nothing."""
    if not args.question.strip():
        return 'the question is empty; e.g. python infer.py "Who directed Pulp Fiction?"'
    if args.threads < 0:
        return f"--threads must be >= 0 (0: torch's default), not {args.threads}"
    if args.json:
        folder = Path(args.json).parent
        if Path(args.json).is_dir():
            return f"--json {args.json} is a directory; pass a file name"
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            return f"--json {args.json}: the directory {folder} does not exist or is not writable"
    return None


def main(args: argparse.Namespace) -> int:
    # --- setup
    if problem := setup_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    adapter = None if args.adapter.lower() == "none" else args.adapter
    if args.skeleton_only:
        return print_skeletons(args, adapter)
    start = time.perf_counter()
    try:
        options = from_flags(args)
        grisp = Grisp(args.model_dir, adapter, args.index, args.endpoint, options, args.device)
        loaded = time.perf_counter() - start
        answer = grisp.answer(args.question)
    except GrispError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SparqlError as e:  # the start-up check `ASK { }`: no endpoint there (2) or a faulty one (3)
        print(
            f"error: the endpoint {args.endpoint} failed the start-up query ASK {{ }}: {type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return 2 if isinstance(e, EndpointUnreachable) else 3

    # --- report
    if not args.quiet:
        print(f"precision {grisp.why_precision}")
        print("\n".join(describe(e) for e in answer.trace))
        timings = ", ".join(f"{k} {v:.2f}s" for k, v in answer.timings.items())
        print(
            f"timings: load {loaded:.2f}s, {timings}; backtracks {answer.backtracks}; SPARQL queries "
            f"{answer.queries} ({answer.queries_answered} answered, faults {answer.endpoint_faults or 'none'})\n"
        )
    code = exit_code(answer)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                answer_to_json(answer)
                | {"exit_code": code, "precision": grisp.precision, "options": vars(args)},
                f,
                indent=2,
            )
    if answer.sparql is None:
        reason = {
            "no_skeleton": "the model produced no skeleton that parses",
            "dead_end": "no skeleton resolved to a query with a non-empty result",
            "timeout": f"the time budget of {options.time_budget:g} s per skeleton ran out",
            "endpoint_error": f"the endpoint {args.endpoint} failed: it {fault_report(answer)}",
            "declined": f"no confident answer (confidence {answer.confidence or 0:.2f} < --min-confidence "
            f"{options.min_confidence:g}; the guess is in the trace)",
        }.get(answer.failure, answer.failure)
        print(f"no answer: {reason}", file=sys.stderr)
        return code
    print(answer.sparql)
    print(
        f"confidence {answer.confidence:.2f}"
        + (" (from the second pass, the retry)" if answer.retried else "")
    )
    print()
    print(answer_table(grisp, answer))
    if answer.verified is False:
        print(f"warning: unverified answer: {answer.error}", file=sys.stderr)
    return code


class HelpFormatter(defaults.HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each flag (but None); the epilog (the exit codes) keeps its line breaks."""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Exit codes:") :],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("question", help="the natural-language question")
    # model, index and knowledge graph
    parser.add_argument(
        "--model-dir", default=str(defaults.MODEL_DIR), help="base model directory (get_model.py)"
    )
    parser.add_argument(
        "--adapter",
        default=str(defaults.ADAPTER_DIR),
        help="LoRA adapter directory (PEFT layout), or 'none' for the base model",
    )
    parser.add_argument(
        "--index", default=str(defaults.DEMO_INDEX_DIR), help="search index directory (build_index.py)"
    )
    parser.add_argument("--endpoint", default=defaults.ENDPOINT_URL, help="SPARQL endpoint URL")
    # skeleton generation and placeholder resolution (the paper's ablations): one flag per options.Options field
    add_flags(parser)
    # output and runtime
    parser.add_argument(
        "--skeleton-only",
        action="store_true",
        help="only generate: print the ranked skeletons with their scores (no index, no endpoint)",
    )
    parser.add_argument(
        "--json",
        help="write the answer (or with --skeleton-only the skeletons), trace and timings to this JSON file",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the query and the answers")
    parser.add_argument("--device", default="auto", help=f"{DEVICES}; auto: cuda, then mps, then cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    sys.exit(main(parser.parse_args()))
