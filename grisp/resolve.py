"""Placeholder resolution: GRISP's KG-guided depth-first search over a skeleton (paper section 3).

Placeholders are resolved left to right. For the next one the resolver
  1. position:   infers where it stands (subject/object -> entity index, property -> property index,
                 unknown -> both),
  2. constraint: turns the triple patterns of the resolved prefix connected to it into a single-column
                 query whose answers are the only allowed IRIs (KG-constrained search),
  3. search:     searches the index with the placeholder's label (top-k, within the allowed IRIs),
  4. re-rank:    scores the hits plus a None alternative with the model in one forward pass (rerank.py)
                 and keeps the alternatives ranked above None, best first, on a stack,
and takes the best one. A dead end (no candidates, or None ranked first) backtracks to the previous
placeholder, drops the alternative that led there and re-ranks what remains. A fully resolved query
must execute and return a non-empty result (final validation), else the search backtracks one step.
A merged placeholder (skeleton.py: several wordings) searches its next wording before it is a dead end.
The search is an explicit stack of frames (no recursion); every step is recorded in the trace
(tracing.py), which infer.py prints.

    resolver = Resolver(indices, client, ModelReranker(model, tokenizer), Options())
    resolution = resolver.resolve("where was the pulp fiction director born?", skeleton)
"""

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from grisp.constraints import allowed_items, constraint_query
from grisp.options import Options
from grisp.positions import infer_position
from grisp.prompts import Alternative, mark_current, to_alternative
from grisp.skeleton import Placeholder, find_placeholders, first_wordings, sendable, substitute, wordings
from grisp.sparql import EndpointUnreachable, QueryTimeout, Result, ServerError, SparqlClient, SparqlError
from grisp.tracing import Listener, Trace
from search import Hit, Indices

# the least time the final query gets to answer, even where it starts at the end of the time budget (the
# reference's read timeout for it): a query cut after a moment is not one a busy KG failed to answer
FINAL_QUERY_WAIT_S = 6.0

# (question, marked query, alternatives, items resolved so far) -> scores for the alternatives + a final
# None alternative (higher is better); rerank.ModelReranker is one
Reranker = Callable[[str, str, list[Alternative], list[Alternative]], list[float]]


@dataclass
class Frame:
    """One node of the search: a query text with its next placeholder and the alternatives left."""

    text: str  # the partially resolved query, placeholders from `placeholder` on unresolved
    placeholder: Placeholder
    kind: str  # "entity", "property" or "both"
    alternatives: list[Hit]  # still to try, best first
    resolved: list[Alternative] = field(
        default_factory=list
    )  # the items chosen before it, as the re-ranker shows them
    allowed: set[str] | None = None  # a merged placeholder's constraint (None = any), for its next wordings
    wording_index: int = 0  # which of the placeholder's wordings the alternatives came from
    tried: set[str] = field(
        default_factory=set
    )  # IRIs chosen here already: a next wording offers them no more
    # the last re-ranking's probabilities (softmax over the shown hits and None; None's under the key None),
    # empty without re-ranking; and the IRI chosen here last
    probabilities: dict[str | None, float] = field(default_factory=dict)
    chosen: str | None = None
    # an entity placeholder's: whether the chosen item is named by one of its wordings (Item.named_by;
    # confidence.py); None at property placeholders, whose wordings describe rather than name
    named: bool | None = None


@dataclass
class Resolution:
    sparql: str | None  # the resolved query (no PREFIX lines), None if the skeleton failed
    result: Result | None  # its result from the final validation (None without KG guidance)
    backtracks: int
    failure: str | None = None  # None, "dead_end", "timeout" or "endpoint_error" (the endpoint was lost)
    trace: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    verified: bool | None = (
        None  # the final query returned a result; False: accepted unchecked; None: not run
    )
    # the final query's choices, one per placeholder in order: {"placeholder", "iri", "p", "p_none", "named"},
    # p and p_none the re-ranker's probabilities of the IRI and of None there (None without re-ranking),
    # named whether a wording of an entity placeholder names the IRI (None at property placeholders)
    choices: list[dict] = field(default_factory=list)


class Resolver:
    """The depth-first search. Reads the options rerank, top_k, none_margin, constrained, kg_guidance,
    backtracking."""

    def __init__(self, indices: Indices, client: SparqlClient, reranker: Reranker | None, options: Options):
        self.indices, self.client, self.reranker, self.options = indices, client, reranker, options

    def relaxed(self, none_margin: float) -> "Resolver":
        """The same search with another None cut (the pipeline's second pass over dead skeletons)."""
        return Resolver(
            self.indices, self.client, self.reranker, replace(self.options, none_margin=none_margin)
        )

    def resolve(
        self, question: str, skeleton: str, deadline: float = float("inf"), listener: Listener | None = None
    ) -> Resolution:
        """Resolve every placeholder of `skeleton`; Resolution.sparql is None if the skeleton failed.
        Every endpoint query ends by `deadline` (time.monotonic() seconds) but the final query, which gets
        at least FINAL_QUERY_WAIT_S (validate); an endpoint that cannot be reached any more ends the search
        with failure "endpoint_error" (docs/method.md 6.7). A skeleton the client would refuse however its
        placeholders resolve (SERVICE, an update) is a dead end at once, with a "refused" event.
        `listener` sees each trace event as it happens (tracing.py)."""
        trace = Trace(listener)
        try:
            return self.dfs(question, skeleton, deadline, trace)
        except EndpointUnreachable as e:  # nothing more can be checked; searching on would hide it
            trace.event("endpoint_lost", error=f"{type(e).__name__}: {e}")
            backtracks = sum(event["event"] == "backtrack" for event in trace.events)
            return Resolution(None, None, backtracks, "endpoint_error", trace.events, trace.timings)

    def dfs(self, question: str, skeleton: str, deadline: float, trace: Trace) -> Resolution:
        """The depth-first search of `resolve` (module docstring), recorded in `trace`."""
        backtracks = 0
        stack: list[Frame] = []  # the frames of the placeholders resolved so far and the one at hand

        def finish(sparql: str | None, result: Result | None, failure: str | None = None) -> Resolution:
            # verified: the final query returned a result; False: accepted despite a busy endpoint (validate)
            verified = None if sparql is None or not self.options.kg_guidance else result is not None
            choices = [] if sparql is None else path_choices(stack)
            return Resolution(
                sparql, result, backtracks, failure, trace.events, trace.timings, verified, choices
            )

        def out_of_time() -> bool:  # the skeleton's time budget is used up (recorded in the trace)
            if time.monotonic() < deadline:
                return False
            trace.event("timeout")
            return True

        if out_of_time():  # the deadline passed before the search began
            return finish(None, None, "timeout")
        if not sendable(skeleton):  # no filling of its placeholders could be sent (skeleton.sendable)
            trace.event(
                "refused", reason="the skeleton federates (SERVICE) or updates: none of its queries is sent"
            )
            return finish(None, None, "dead_end")
        if not find_placeholders(skeleton):  # nothing to resolve: only validate
            ok, result = (
                self.validate(skeleton, trace, deadline) if self.options.kg_guidance else (True, None)
            )
            if not ok and out_of_time():
                return finish(None, None, "timeout")
            return finish(skeleton if ok else None, result, None if ok else "dead_end")
        stack = [self.candidates(question, skeleton, trace, deadline)]
        while stack:
            if out_of_time():
                return finish(None, None, "timeout")
            frame = stack[-1]
            if frame.alternatives:  # take the best alternative left
                choice = frame.alternatives.pop(0)
                frame.tried.add(choice.id)
                frame.chosen = choice.id
                if frame.kind == "entity":
                    frame.named = any(map(choice.named_by, wordings(frame.placeholder)))
                text = substitute(frame.text, frame.placeholder, choice.id)
                trace.event("choose", placeholder=frame.placeholder.text, iri=choice.id, label=choice.label)
                if find_placeholders(text):  # go deeper: the next placeholder
                    # what the next re-ranking prompt lists
                    resolved = frame.resolved + [self.shown(choice, frame)]
                    stack.append(self.candidates(question, text, trace, deadline, resolved))
                    continue
                if not self.options.kg_guidance:
                    return finish(text, None)
                ok, result = self.validate(text, trace, deadline)  # final validation
                if ok:
                    return finish(text, result)
                if out_of_time():  # the budget ended while the query ran: no time to backtrack
                    return finish(None, None, "timeout")
                # an invalid query: back to this placeholder's next alternative
            elif self.next_wording(question, frame, trace):  # used up, but the placeholder has other words
                continue
            else:  # dead end: no candidates, None on top, or all tried
                stack.pop()
            # backtrack: re-rank the alternatives left at the top of the stack (not their old order)
            if not stack or not self.options.backtracking:
                break
            backtracks += 1
            back = stack[-1]
            trace.event("backtrack", to=back.placeholder.text, left=len(back.alternatives))
            if out_of_time():  # no re-ranking after the budget: the loop ends on it
                return finish(None, None, "timeout")
            self.rerank(question, back, trace)
        trace.event("exhausted")
        return finish(None, None, "dead_end")

    # --- one placeholder: its candidates, in the four steps of the paper
    def candidates(
        self,
        question: str,
        text: str,
        trace: Trace,
        deadline: float = float("inf"),
        resolved: list[Alternative] = (),
    ) -> Frame:
        """The frame of the first unresolved placeholder of `text` (after the items `resolved`), its
        alternatives re-ranked."""
        placeholder = find_placeholders(text)[0]
        position, kind = self.position(text, placeholder)
        trace.event("placeholder", placeholder=placeholder.text, position=position, kind=kind)
        allowed = self.constraint(text, placeholder, trace, deadline)
        labels = wordings(placeholder)
        if (
            time.monotonic() >= deadline
        ):  # the budget ran out in the constraint query: no search, no re-ranking
            return Frame(text, placeholder, kind, [], list(resolved))
        hits = self.search(labels[0], kind, allowed, trace)
        frame = Frame(text, placeholder, kind, hits, list(resolved), allowed if len(labels) > 1 else None)
        self.rerank(question, frame, trace)
        return frame

    def next_wording(self, question: str, frame: Frame, trace: Trace) -> bool:
        """Steps 3 and 4 again for a merged placeholder whose alternatives are used up: search its next
        wording (within the same constraint) and re-rank the hits not chosen here before. False if it
        has no wording left, or the constraint admits nothing."""
        labels = wordings(frame.placeholder)
        if frame.wording_index + 1 >= len(labels) or frame.allowed == set():
            return False
        frame.wording_index += 1
        trace.event("wording", placeholder=frame.placeholder.text, wording=labels[frame.wording_index])
        hits = self.search(labels[frame.wording_index], frame.kind, frame.allowed, trace)
        frame.alternatives = [hit for hit in hits if hit.id not in frame.tried]
        self.rerank(question, frame, trace)
        return True

    def position(self, text: str, placeholder: Placeholder) -> tuple[str, str]:
        """Step 1: the placeholder's position and the index to search ("entity", "property", "both")."""
        position = infer_position(text, placeholder)
        kind = {"subject": "entity", "object": "entity", "property": "property"}.get(position, "both")
        if kind == "both" and placeholder.variant is not None:
            kind = "property"  # a variant hint (wdt, p, ps, pq) only fits a property
        return position, kind

    def constraint(
        self, text: str, placeholder: Placeholder, trace: Trace, deadline: float = float("inf")
    ) -> set[str] | None:
        """Step 2: the IRIs the resolved prefix allows here (from the constraint query), None = any."""
        if not (self.options.constrained and self.options.kg_guidance):
            return None
        query = constraint_query(text, placeholder)
        if query is None:  # nothing resolved is connected to the placeholder
            return None
        with trace.timed("constraint"):
            try:
                rows = self.client.query(query, deadline=deadline)
            except EndpointUnreachable:
                raise  # no endpoint any more: resolve() ends the search
            except SparqlError as e:  # an engine error only costs the constraint, not the search
                trace.note(constraint=query, constraint_error=f"{type(e).__name__}: {e}")
                return None
        trace.note(constraint=query, constraint_size=len(rows.rows))
        return allowed_items(rows)  # None if too many to be a constraint

    def search(self, label: str, kind: str, allowed: set[str] | None, trace: Trace) -> list[Hit]:
        """Step 3: the top-k index hits for a placeholder's label, within `allowed` if given."""
        k = self.options.top_k
        with trace.timed("search"):
            if allowed is not None and not allowed:
                hits = []  # the prefix admits nothing here: a dead end without searching
            elif kind == "both":
                hits = self.indices.search("entity", label, k, allowed) + self.indices.search(
                    "property", label, k, allowed
                )
            else:
                hits = self.indices.search(kind, label, k, allowed)
        trace.note(hits=[(h.id, h.label, round(h.score, 3)) for h in hits])
        return hits

    def rerank(self, question: str, frame: Frame, trace: Trace) -> None:
        """Step 4: re-rank the frame's alternatives with None among them and keep those above None (less
        options.none_margin), best first (without re-ranking: all of them, in index order). Also
        re-ranks after a backtrack."""
        if not self.options.rerank or not frame.alternatives:
            trace.note(kept=[h.id for h in frame.alternatives])
            return
        with trace.timed("rerank"):
            shown = [self.shown(h, frame) for h in frame.alternatives]
            scores = self.reranker(question, self.marked(frame.text), shown, frame.resolved)
            assert len(scores) == len(shown) + 1, (
                f"re-ranker gave {len(scores)} scores for {len(shown)} + None"
            )
            none_score = scores[-1]
            probabilities = softmax(scores)
            frame.probabilities = {h.id: p for h, p in zip(frame.alternatives, probabilities)} | {
                None: probabilities[-1]
            }
            order = sorted(range(len(shown)), key=lambda i: -scores[i])
            ranking = [(None, none_score)] + [
                (frame.alternatives[i].id, scores[i]) for i in order
            ]  # ties: None first
            cut = none_score - self.options.none_margin
            frame.alternatives = [frame.alternatives[i] for i in order if scores[i] > cut]
        trace.note(
            reranked=[(iri, round(score, 3)) for iri, score in sorted(ranking, key=lambda r: -r[1])],
            kept=[h.id for h in frame.alternatives],
        )

    @staticmethod
    def marked(text: str) -> str:
        """The query as the re-ranking prompt shows it: the placeholder to fill (the first) marked, each
        merged placeholder in its first wording (the best beam's, as the model was trained on)."""
        text = first_wordings(text)
        return mark_current(text, find_placeholders(text)[0])

    def shown(self, hit: Hit, frame: Frame) -> Alternative:
        """A hit of the frame's search as the re-ranker shows it: in the placeholder's variant, with its kind."""
        kind = (
            frame.kind
            if frame.kind != "both"
            else ("property" if self.indices.stores["property"].get(hit.id) is not None else "entity")
        )
        return to_alternative(hit, frame.placeholder.variant, kind)

    def validate(
        self, sparql: str, trace: Trace, deadline: float = float("inf")
    ) -> tuple[bool, Result | None]:
        """Final validation: the query must execute and return something (an ASK answer counts). As in
        the reference, a timeout or server error is accepted: the KG was busy, not the query wrong. Such
        a query is unverified (no result); grisp/pipeline.py keeps it only if the endpoint answered other queries
        of the question. The query gets at least FINAL_QUERY_WAIT_S to answer, past `deadline` if need be:
        a timeout is accepted only after the KG had a fair time to answer. An invalid or broken answer
        (InvalidResponse) rejects the query: oxigraph reports an error met while evaluating the query as
        an HTTP 200 whose JSON breaks off, so such an answer may be the query's fault."""
        with trace.timed("validate"):
            try:
                result = self.client.query(
                    sparql, deadline=max(deadline, time.monotonic() + FINAL_QUERY_WAIT_S)
                )
                ok, fields = not result.is_empty, {"rows": len(result.rows), "boolean": result.boolean}
            except EndpointUnreachable:
                raise
            except (QueryTimeout, ServerError) as e:
                result, ok, fields = None, True, {"accepted_error": f"{type(e).__name__}: {e}"}
            except SparqlError as e:
                result, ok, fields = None, False, {"error": f"{type(e).__name__}: {e}"}
        trace.event("validate", query=sparql, ok=ok, **fields)
        return ok, result


def path_choices(stack: list[Frame]) -> list[dict]:
    """Resolution.choices of the path the stack holds: per placeholder the IRI chosen, the last
    re-ranking's probabilities of it and of None (None without re-ranking), and whether a wording of
    the placeholder names it (Frame.named)."""
    return [
        {
            "placeholder": frame.placeholder.text,
            "iri": frame.chosen,
            "p": frame.probabilities.get(frame.chosen),
            "p_none": frame.probabilities.get(None),
            "named": frame.named,
        }
        for frame in stack
    ]


def softmax(scores: list[float]) -> list[float]:
    """The re-ranker's scores (logits) as probabilities that sum to 1."""
    top = max(scores)
    weights = [math.exp(score - top) for score in scores]
    return [weight / sum(weights) for weight in weights]
