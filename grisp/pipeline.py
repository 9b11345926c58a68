"""GRISP end to end: question -> skeletons (beam search) -> resolved, validated SPARQL (paper section 3).

Stage 1 decodes skeletons with beam search over the fine-tuned model, drops duplicates and those that
do not parse, and keeps the best `num_skeletons`. Stage 2 resolves them one after the other with the
KG-guided depth-first search of resolve.py and returns the first that yields a valid query. The two
interleave: the beam search runs only until the next skeleton is settled, and goes on only if that
skeleton fails (the same skeletons in the same order as generating all first, docs/method.md 2.5). Every
mechanism is a switch in `options.Options`, matching the paper's ablations; infer.py and evaluate.py
are thin command-line fronts over this class.

    grisp = Grisp(model_dir, adapter_dir, index_dir, endpoint_url, Options())
    answer = grisp.answer("Where was the Pulp Fiction director born?")
    answer.sparql, answer.result, answer.trace
    answer = grisp.answer(question, listener=print)   # each trace event as it happens (serve.py)
"""

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import torch

from grisp import confidence, peft_format
from grisp.generate import beam_search_stream
from grisp.options import GrispError, Options
from grisp.prompts import skeleton_messages
from grisp.rerank import ModelReranker
from grisp.resolve import Resolver
from grisp.skeleton import SEP, find_placeholders, merge_wordings, parses, sendable, wording_key
from grisp.sparql import Result, SparqlClient, Tally
from grisp.sparql_syntax import with_prefixes
from grisp.tracing import Listener, Stopwatch
from llm.cpu_speed import pick_precision
from llm.prompt_cache import PromptCache
from llm.tokenizer import Tokenizer, chat_prompt
from model import pick_device
from search import load_indices


@dataclass
class Answer:
    question: str
    sparql: str | None  # the final query with PREFIX lines, None if no skeleton resolved
    result: Result | None
    skeletons: list[tuple[str, float]]  # kept skeletons and their beam scores
    trace: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    backtracks: int = 0
    error: str | None = None  # why the answer is unverified, or the first endpoint fault of a failure
    failure: str | None = (
        None  # None, "no_skeleton", "dead_end", "timeout", "endpoint_error", "error", "declined"
    )
    # how sure the answer is (confidence.py; None without a query); below options.min_confidence it is
    # declined: sparql and result are None, the query found stays in guess (always the query found)
    confidence: float | None = None
    guess: str | None = None
    declined: bool = False
    choices: list[dict] = field(
        default_factory=list
    )  # the final query's choices (resolve.Resolution.choices)
    skeleton_number: int | None = None  # which skeleton (0 = the best) the query came from
    retried: bool = False  # the query came from the second pass (options.retry)
    # the endpoint during this question (docs/method.md 6.7): SPARQL queries sent, those answered, and
    # the faults by error type (sparql.ENDPOINT_FAULTS); verified: the final query returned a result,
    # False: accepted without one (a timeout or 5xx at final validation), None: no answer or not checked
    queries: int = 0
    queries_answered: int = 0
    endpoint_faults: dict[str, int] = field(default_factory=dict)
    verified: bool | None = None


class Grisp:
    def __init__(
        self,
        model_dir: str | Path,
        adapter_dir: str | Path | None,
        index_dir: str | Path,
        endpoint_url: str,
        options: Options,
        device: str = "auto",
        rerank_adapter_dir: str | Path | None = None,
    ):
        """`rerank_adapter_dir`: re-rank with a second model, the base with this adapter (e.g. one trained
        further on re-ranking alone; the reference's `--selection-run`), instead of the skeletons' model."""
        model_dir, index_dir = Path(model_dir).expanduser(), Path(index_dir).expanduser()
        adapter_dir, rerank_adapter_dir = _expand(adapter_dir), _expand(rerank_adapter_dir)
        _check_model(model_dir, adapter_dir)
        if rerank_adapter_dir is not None:
            _check_model(model_dir, rerank_adapter_dir)
        if not (index_dir / "manifest.json").exists():
            raise GrispError(f"no search index at {index_dir}; build it with build_index.py or pass --index")
        self.client = SparqlClient(endpoint_url)
        if options.kg_guidance:  # fail fast, before loading the model: is the endpoint up?
            self.client.query("ASK { }", deadline=time.monotonic() + options.time_budget)
        self._load_model(model_dir, adapter_dir, options, device)
        self.indices = load_indices(index_dir)
        reranker = None
        if options.rerank and rerank_adapter_dir is None:
            reranker = ModelReranker(self.model, self.tokenizer, prompt_format=self.prompt_format)
        elif options.rerank:
            rerank_model = _load_weights(model_dir, rerank_adapter_dir, self.precision, self.device)
            reranker = ModelReranker(
                rerank_model, self.tokenizer, prompt_format=self._prompt_format(rerank_adapter_dir)
            )
        self.resolver = Resolver(self.indices, self.client, reranker, options)

    @classmethod
    def generator(
        cls, model_dir: str | Path, adapter_dir: str | Path | None, options: Options, device: str = "auto"
    ) -> "Grisp":
        """Stage 1 alone: a Grisp that only generates skeletons (`skeletons`), with no index and no
        endpoint (infer.py and evaluate.py --skeleton-only); `answer` raises GrispError."""
        model_dir, adapter_dir = Path(model_dir).expanduser(), _expand(adapter_dir)
        _check_model(model_dir, adapter_dir)
        grisp = cls.__new__(cls)
        grisp.client = grisp.indices = grisp.resolver = None
        grisp._load_model(model_dir, adapter_dir, options, device)
        return grisp

    def _load_model(
        self, model_dir: Path, adapter_dir: str | Path | None, options: Options, device: str
    ) -> None:
        try:
            self.device = pick_device(device)
        except ValueError as error:  # a bad --device: the scripts' message, before the weights load
            raise GrispError(str(error)) from None
        self.options = options
        # the precision this machine gets (options.precision "auto": bf16 where the CPU has native bf16)
        self.precision, self.why_precision = _precision(options.precision, self.device)
        self.tokenizer = Tokenizer(model_dir)
        # the adapter folded into the weights: inference runs at base speed
        self.model = _load_weights(model_dir, adapter_dir, self.precision, self.device)
        self.skeleton_prompts = PromptCache(
            self.model
        )  # every skeleton prompt starts alike (the instructions)
        self.prompt_format = self._prompt_format(adapter_dir)

    @staticmethod
    def _prompt_format(adapter_dir: str | Path | None) -> str:
        """The re-ranking prompt format the adapter was trained on (docs/method.md section 3.3)."""
        try:
            return peft_format.read_prompt_format(adapter_dir)
        except ValueError as error:
            raise GrispError(str(error)) from None

    def fixed_options(self) -> list[str]:
        """The options set when this Grisp was loaded, which a question cannot change (check_options): the
        precision of the weights, and rerank if it was loaded without the re-ranker (made at load time)."""
        return ["precision"] + (
            ["rerank"] if self.resolver is not None and self.resolver.reranker is None else []
        )

    def check_options(self, options: Options) -> None:
        """GrispError if this Grisp cannot answer with `options` (see fixed_options)."""
        if _precision(options.precision, self.device)[0] != self.precision:
            raise GrispError(
                f"this Grisp was loaded in {self.precision} ({self.why_precision}); it cannot "
                f"answer in {options.precision}"
            )
        if "rerank" in self.fixed_options() and options.rerank:
            raise GrispError("this Grisp was loaded with rerank off; it cannot re-rank")

    def use_options(self, options: Options) -> None:
        """Answer the next questions with `options` (serve.py: options per request), if check_options allows."""
        self.check_options(options)
        if self.resolver is not None:
            self.resolver.options = options
        self.options = options

    def skeletons(
        self, question: str, listener: Listener | None = None
    ) -> tuple[list[tuple[str, float]], list[dict]]:
        """Stage 1: the best distinct, parsing skeletons with their scores, and a trace of the beams."""
        trace: list[dict] = []
        return list(self.skeleton_stream(question, trace, listener)), trace

    def skeleton_stream(
        self, question: str, trace: list[dict], listener: Listener | None = None
    ) -> Iterator[tuple[str, float]]:
        """Stage 1, lazily: the distinct, parsing skeletons best first (at most num_skeletons), each as soon
        as the beam search has settled it (generate.beam_search_stream), so the search goes only as far
        as the skeletons taken need. Each beam's verdict is appended to `trace` (and told to `listener`).
        With skeleton_dedupe "merge" the skeletons come out at the end of the search, each with the
        wordings of the later beams that differ from it only in their placeholders' labels."""
        o = self.options
        prompt = self.tokenizer.encode(chat_prompt(skeleton_messages(question)))
        generator = torch.Generator(device=self.device).manual_seed(o.seed)
        needed, seen, merging = o.skeletons_wanted, set(), o.skeleton_dedupe == "merge"
        kept: dict[str, tuple[str, float]] = {}  # wording_key (merging) or text -> the skeleton and its score
        for h in beam_search_stream(
            self.model,
            prompt,
            self.tokenizer.eos_ids,
            num_beams=o.beam_width,
            max_new_tokens=o.max_new_tokens,
            sample=o.sample and o.beam_search,
            temperature=o.temperature,
            top_p=o.top_p,
            generator=generator,
            ranking=o.beam_ranking,
            prompt_cache=self.skeleton_prompts,
        ):
            text = self.tokenizer.decode(h.tokens).strip()
            verdict = (
                "unfinished"
                if not h.finished
                else "duplicate"
                if text in seen  # SEP: merging's own mark
                else "does not parse"
                if SEP in text or not parses(text)
                else "refused"
                if not sendable(text)
                else "kept"
            )  # e.g. SERVICE: never sent
            seen.add(text)
            key = text
            if verdict == "kept" and merging:
                key = wording_key(text)
                if key in kept:  # a kept skeleton in other words
                    merged = merge_wordings(kept[key][0], text)
                    verdict = "merged" if merged != kept[key][0] else "duplicate"
                    kept[key] = merged, kept[key][1]
                elif len(kept) == needed:  # the search went on only for wordings of the kept ones
                    verdict = "surplus"
            trace.append(
                {"event": "skeleton", "skeleton": text, "score": round(h.score, 3), "verdict": verdict}
            )
            if listener is not None:
                listener(trace[-1])
            if verdict == "kept":
                kept[key] = text, h.score
                if not merging:
                    yield text, h.score
                    if len(kept) == needed:
                        return
        if merging:
            yield from kept.values()

    def answer(self, question: str, listener: Listener | None = None) -> Answer:
        """`listener` sees every trace event as it happens (tracing.py); if it raises, answering stops.
        Skeletons are generated as resolution asks for them: the next one only when one fails (with
        skeleton_dedupe "merge" all of them before the first is resolved)."""
        if not question.strip():
            raise GrispError('the question is empty; ask something, e.g. "Who directed Pulp Fiction?"')
        start = time.perf_counter()
        trace: list[dict] = []
        generation = Stopwatch()
        skeletons = generation.timed(self.skeleton_stream(question, trace, listener))
        answer = self.answer_from_skeletons(question, skeletons, listener=listener, trace=trace)
        answer.timings["generate"] = generation.seconds
        answer.timings["resolve"] -= generation.seconds  # resolution ran the generation steps in between
        answer.timings["total"] = time.perf_counter() - start
        return answer

    def answer_from_skeletons(
        self,
        question: str,
        skeletons: Iterable[str | tuple[str, float]],
        deadline: float = float("inf"),
        listener: Listener | None = None,
        trace: list[dict] | None = None,
    ) -> Answer:
        """Stage 2 over given skeletons (the oracle-skeleton mode feeds the gold one), taken one at a time
        from `skeletons` (a list, or answer()'s lazy stream): the first that resolves to a valid query
        wins. `trace`: the list the answer's trace continues (the stream appends its beams to it). Each
        skeleton has its own time budget, as in the reference: a skeleton that runs out of time fails with
        "timeout" and the next one starts with a fresh budget (docs/method.md section 6.7), so a question
        takes at most num_skeletons x time_budget (one budget more with a retry); every endpoint query
        ends within its skeleton's budget (and by `deadline`, an optional overall cap), but for the final
        query's least wait (resolve.FINAL_QUERY_WAIT_S). Once the endpoint has answered no query of the
        question and failed one by more than a timeout, no further skeleton is tried. If no skeleton
        resolves, options.retry
        (with re-ranking on) resolves the ones that dead-ended (not those that timed out) once more with
        None's cut lifted (every hit in the re-ranked order, all within one time budget; a "retry" trace
        event; ours, not the paper's)."""
        if self.resolver is None:
            raise GrispError(
                "this Grisp only generates skeletons (Grisp.generator): resolving needs an index "
                "and an endpoint, so construct Grisp(model_dir, adapter_dir, index_dir, endpoint_url, options)"
            )
        start = time.perf_counter()
        client = self.resolver.client
        client.tally = Tally()  # this question's queries
        answer = Answer(question, None, None, [], trace if trace is not None else [], failure="no_skeleton")

        def numbered(items):  # the skeletons as they come, each kept in the answer
            for number, item in enumerate(items):
                skeleton, score = item if isinstance(item, tuple) else (item, 0.0)
                answer.skeletons.append((skeleton, score))
                yield number, skeleton

        failed = self._resolve_in_turn(
            question, numbered(skeletons), self.resolver, answer, deadline, listener
        )
        dead = [(number, skeleton) for number, skeleton, failure in failed if failure == "dead_end"]
        # without re-ranking, or with None's cut already lifted, a retry would repeat the first pass
        reranking = (
            self.options.rerank and self.resolver.reranker is not None and self.options.none_margin < math.inf
        )
        if answer.sparql is None and dead and self.options.retry and reranking:
            answer.trace.append({"event": "retry", "skeletons": [n for n, _ in dead]})
            if listener is not None:
                listener(answer.trace[-1])
            relaxed = self.resolver.relaxed(none_margin=float("inf"))
            shared_budget_end = min(
                time.monotonic() + self.options.time_budget, deadline
            )  # one budget for them all
            self._resolve_in_turn(question, dead, relaxed, answer, shared_budget_end, listener)
            answer.retried = answer.sparql is not None
        answer.timings["resolve"] = time.perf_counter() - start
        return judge_confidence(judge_endpoint(answer, client.tally), self.options.min_confidence, listener)

    def _resolve_in_turn(
        self,
        question: str,
        skeletons: Iterable[tuple[int, str]],
        resolver: Resolver,
        answer: Answer,
        deadline: float,
        listener: Listener | None,
    ) -> list[tuple[int, str, str]]:
        """Resolve the (number, skeleton) pairs one after the other into `answer` until one yields a valid
        query; returns the failed ones as (number, skeleton, failure), none if the endpoint was lost."""
        client, failed = resolver.client, []
        for number, skeleton in skeletons:
            answer.trace.append(
                {
                    "event": "resolve",
                    "skeleton": skeleton,
                    "number": number,
                    "placeholders": len(find_placeholders(skeleton)),
                }
            )
            if listener is not None:
                listener(answer.trace[-1])
            budget_end = min(time.monotonic() + self.options.time_budget, deadline)
            resolution = resolver.resolve(question, skeleton, budget_end, listener)
            answer.trace.extend(resolution.trace)
            answer.backtracks += resolution.backtracks
            for name, seconds in resolution.timings.items():
                answer.timings[name] = answer.timings.get(name, 0.0) + seconds
            answer.failure = resolution.failure
            if resolution.sparql is not None:
                answer.sparql, answer.result = with_prefixes(resolution.sparql), resolution.result
                answer.verified, answer.choices, answer.skeleton_number = (
                    resolution.verified,
                    resolution.choices,
                    number,
                )
                return failed
            failed.append((number, skeleton, resolution.failure))
            lost = any(name != "QueryTimeout" for name in client.tally.faults)  # a slow query is the query's
            if resolution.failure == "endpoint_error" or (lost and not client.tally.answered):
                return []  # the endpoint is lost or has answered nothing: another skeleton would fare no better
        return failed


def judge_endpoint(answer: Answer, tally: Tally) -> Answer:
    """Fill in the endpoint's part of `answer` from the question's query tally (docs/method.md 6.7).

    An unverified answer (a timeout or 5xx at final validation, accepted as the reference does) stands
    only if the endpoint answered some other query of the question; else the endpoint is broken and
    the query unchecked. A failed answer is an "endpoint_error" when no query was answered and at
    least one failed with an endpoint fault (or the endpoint was lost), not a failure of the method."""
    answer.queries, answer.queries_answered = tally.sent, tally.answered
    answer.endpoint_faults = dict(tally.faults)
    if answer.verified is False and tally.answered == 0:  # an unchecked query from a broken endpoint
        answer.sparql, answer.result, answer.verified, answer.failure = None, None, None, "endpoint_error"
    if answer.sparql is None and (answer.failure == "endpoint_error" or tally.faults and not tally.answered):
        answer.failure, answer.error = "endpoint_error", tally.first_fault
    elif answer.verified is False:  # the final validation's error, kept in its trace event
        answer.error = next(e["accepted_error"] for e in reversed(answer.trace) if "accepted_error" in e)
    return answer


def judge_confidence(answer: Answer, min_confidence: float, listener: Listener | None = None) -> Answer:
    """Set the answer's confidence and guess (confidence.py), and decline it if the confidence is below
    `min_confidence`: no query, failure "declined", a "declined" trace event that keeps the guess."""
    if answer.sparql is None:
        return answer
    answer.guess, answer.confidence = answer.sparql, confidence.confidence(answer.choices)
    if confidence.decide(answer.confidence, min_confidence):
        answer.sparql, answer.result, answer.declined, answer.failure = None, None, True, "declined"
        answer.trace.append(
            {
                "event": "declined",
                "confidence": round(answer.confidence, 4),
                "min_confidence": min_confidence,
                "guess": answer.guess,
            }
        )
        if listener is not None:
            listener(answer.trace[-1])
    return answer


def _expand(path: str | Path | None) -> Path | None:
    """`~` expanded (a flag written `--adapter=~/...` reaches us unexpanded), None kept."""
    return None if path is None else Path(path).expanduser()


def _check_model(model_dir: Path, adapter_dir: str | Path | None) -> None:
    """GrispError naming the fix when the base model or the adapter is missing."""
    if not (model_dir / "config.json").exists():
        raise GrispError(f"no base model at {model_dir}; run `python get_model.py` or pass --model-dir")
    if adapter_dir is not None and not (Path(adapter_dir) / peft_format.CONFIG_NAME).exists():
        raise GrispError(
            f"no adapter at {adapter_dir} ({peft_format.CONFIG_NAME} missing); train one with "
            f"train.py, or pass --adapter none to run the base model"
        )


def _precision(choice: str, device) -> tuple[str, str]:
    """pick_precision, its refusals (e.g. int8 off the CPU) as GrispError."""
    try:
        return pick_precision(choice, device)
    except ValueError as error:
        raise GrispError(str(error)) from None


def _load_weights(model_dir: Path, adapter_dir: str | Path | None, precision: str, device: str):
    """The base model with the adapter folded in; GrispError for an adapter that does not fit (a file
    missing, settings we do not support, shapes of another model)."""
    try:
        return peft_format.load_for_inference(model_dir, adapter_dir, precision, device)
    except (ValueError, FileNotFoundError, KeyError) as error:
        what = f"the adapter at {adapter_dir}" if adapter_dir is not None else f"the model at {model_dir}"
        raise GrispError(f"cannot load {what}: {error}") from None


def answer_to_json(answer: Answer) -> dict:
    """Everything of an Answer as plain JSON (the result as a SPARQL 1.1 JSON results document)."""
    return asdict(answer) | {"result": answer.result.to_json() if answer.result is not None else None}
