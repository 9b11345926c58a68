"""Placeholder resolution: GRISP's KG-guided depth-first search over a skeleton (paper section 3).

Placeholders are resolved left to right. At each one the resolver
  1. infers its position (subject/object -> entity index, property -> property index, unknown -> both),
  2. constrains the search: the triple patterns of the resolved prefix connected to the placeholder
     become a single-column query whose answers are the only allowed IRIs (KG-constrained search),
  3. searches the index with the placeholder's label (top-k) and re-ranks the hits plus a None
     alternative with the model in one forward pass (identifier-logit re-ranking),
  4. keeps the alternatives ranked above None on a stack and takes the best one.
A dead end (no candidates, or None ranked first) backtracks to the previous placeholder, drops the
alternative that led there and re-ranks what remains. A fully resolved query must execute and return
a non-empty result (final validation), else the search backtracks one step. The search is an explicit
stack of frames (no recursion), so every step is visible in the trace.

    resolver = Resolver(indices, client, ModelReranker(model, tokenizer), Switches())
    resolution = resolver.resolve("where was the pulp fiction director born?", skeleton)
"""
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from model import Transformer
from prompts import IDENTIFIERS, Alternative, mark_current, rerank_messages, to_alternative
from search import Hit, Indices
from constraints import CONSTRAINT_LIMIT, constraint_query
from positions import infer_position
from skeleton import Placeholder, find_placeholders, split_variant, substitute
from sparql import EndpointUnreachable, QueryTimeout, Result, ServerError, SparqlClient, SparqlError
from tokenizer import Tokenizer, chat_prompt

# scores for `alternatives` + a final None alternative (higher is better)
Reranker = Callable[[str, str, list[Alternative]], list[float]]


@dataclass
class Switches:
    """The mechanisms of the resolver, each switchable for the paper's ablations (Table 5)."""

    rerank: bool = True  # re-rank search hits with the model (off: index order, no None)
    top_k: int = 10  # search hits per placeholder
    constrained: bool = True  # restrict searches to the IRIs the resolved prefix allows
    kg_guidance: bool = True  # constraints and final validation (off: neither)
    backtracking: bool = True  # on a dead end go back (off: the skeleton fails)


@dataclass
class Frame:
    """One node of the search: a query text with its next placeholder and the alternatives left."""

    text: str  # the partially resolved query, placeholders from `placeholder` on unresolved
    placeholder: Placeholder
    kind: str  # "entity", "property" or "both"
    alternatives: list[Hit]  # still to try, best first


@dataclass
class Resolution:
    sparql: str | None  # the resolved query (no PREFIX lines), None if the skeleton failed
    result: Result | None  # its result from the final validation (None without KG guidance)
    backtracks: int
    failure: str | None = None  # None, "dead_end" or "timeout"
    trace: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class ModelReranker:
    """List-wise re-ranking by the next-token logits of the identifiers (A, B, ...) after the prompt.

    Successive prompts share a long start: always the system message and chat header, within one
    question also the question line, the query up to its first changed placeholder and, on a backtrack,
    the whole query. So the re-ranker keeps the KV cache of its previous prompt, cuts it back to the
    tokens the new prompt shares with it and runs only the rest; cutting back is free, so reuse always
    pays. prefix_cache=False runs every prompt in full (the reference; scores agree up to rounding).
    `tokens` counts prompt tokens seen and tokens actually run through the model."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, show_infos: bool = True, prefix_cache: bool = True):
        self.model, self.tokenizer, self.show_infos, self.prefix_cache = model, tokenizer, show_infos, prefix_cache
        self.identifier_ids = {}  # identifier letter -> its token id; the scores are these logits
        for identifier in IDENTIFIERS:
            ids = tokenizer.encode(identifier)
            if len(ids) != 1:
                raise ValueError(f"the tokenizer splits the identifier {identifier!r} into {ids}; re-ranking needs "
                                 f"single-token identifiers (use a Qwen2 tokenizer)")
            self.identifier_ids[identifier] = ids[0]
        self.cache, self.cached_ids = None, []  # the KV cache of the previous prompt and its tokens
        self.tokens = {"prompt": 0, "computed": 0}

    def __call__(self, question: str, marked_query: str, alternatives: list[Alternative]) -> list[float]:
        messages, identifiers = rerank_messages(question, marked_query, alternatives, self.show_infos)
        logits = self.next_token_logits(self.tokenizer.encode(chat_prompt(messages)))  # [V]
        return logits[[self.identifier_ids[i] for i in identifiers]].float().tolist()

    @torch.inference_mode()
    def next_token_logits(self, ids: list[int]) -> torch.Tensor:
        """Logits [V] of the token after the prompt `ids`, reusing the start it shares with the last prompt."""
        tokens = torch.tensor([ids], device=self.model.model.norm.weight.device)  # [1, P]
        self.tokens["prompt"] += len(ids)
        if not self.prefix_cache:
            self.tokens["computed"] += len(ids)
            return self.model(tokens, logits_at=-1)[0]
        # the longest common start, but at least the last token runs: its logits are the answer
        shared, limit = 0, min(len(ids) - 1, len(self.cached_ids))
        while shared < limit and ids[shared] == self.cached_ids[shared]:
            shared += 1
        if self.cache is None:
            self.cache = self.model.new_cache(1, 2 * len(ids))
        self.cache.truncate(shared)
        self.cached_ids = ids[:shared]  # what the cache holds, should the forward below fail
        logits = self.model(tokens[:, shared:], cache=self.cache, logits_at=-1)[0]  # [V]
        self.cached_ids = ids
        self.tokens["computed"] += len(ids) - shared
        return logits


class Resolver:
    def __init__(self, indices: Indices, client: SparqlClient, reranker: Reranker | None, switches: Switches):
        self.indices, self.client, self.reranker, self.switches = indices, client, reranker, switches

    # --- one step: candidates for the next placeholder of `text`
    def expand(self, question: str, text: str, trace: list[dict], timings: dict[str, float]) -> Frame:
        ph = find_placeholders(text)[0]
        position = infer_position(text, ph)
        kind = {"subject": "entity", "object": "entity", "property": "property"}.get(position, "both")
        if kind == "both" and ph.variant is not None:
            kind = "property"  # a variant hint (wdt, p, ps, pq) only fits a property
        event = {"event": "placeholder", "placeholder": ph.text, "position": position, "kind": kind}
        trace.append(event)

        allowed = None
        query = constraint_query(text, ph) if self.switches.constrained and self.switches.kg_guidance else None
        if query is not None:
            start = time.perf_counter()
            try:
                rows = self.client.query(query)
                if len(rows.rows) < CONSTRAINT_LIMIT:
                    # a property is bound in one variant (wdt:P57); the index knows its entity IRI
                    allowed = {split_variant(iri)[0] for iri in rows.iris()}
                event |= {"constraint": query, "constraint_size": len(rows.rows)}
            except EndpointUnreachable:
                raise  # no endpoint at all: the user must fix that, searching on would hide it
            except SparqlError as e:  # an engine error only costs the constraint, not the search
                event |= {"constraint": query, "constraint_error": f"{type(e).__name__}: {e}"}
            timings["constraint"] = timings.get("constraint", 0.0) + time.perf_counter() - start

        start = time.perf_counter()
        k = self.switches.top_k
        if allowed is not None and not allowed:
            hits = []  # the prefix admits nothing here: a dead end without searching
        elif kind == "both":
            hits = self.indices.search("entity", ph.label, k, allowed) + self.indices.search("property", ph.label, k, allowed)
        else:
            hits = self.indices.search(kind, ph.label, k, allowed)
        timings["search"] = timings.get("search", 0.0) + time.perf_counter() - start
        event["hits"] = [(h.id, h.label, round(h.score, 3)) for h in hits]
        frame = Frame(text, ph, kind, hits)
        self.rank(question, frame, event, timings)
        return frame

    def rank(self, question: str, frame: Frame, event: dict, timings: dict[str, float]) -> None:
        """Re-rank the frame's alternatives and keep those above None (all of them without re-ranking)."""
        if not self.switches.rerank or not frame.alternatives:
            event["kept"] = [h.id for h in frame.alternatives]
            return
        start = time.perf_counter()
        shown = [to_alternative(h, frame.placeholder.variant) for h in frame.alternatives]
        scores = self.reranker(question, mark_current(frame.text, frame.placeholder), shown)
        assert len(scores) == len(shown) + 1, f"re-ranker gave {len(scores)} scores for {len(shown)} + None"
        none_score = scores[-1]
        order = sorted(range(len(shown)), key=lambda i: -scores[i])
        ranking = [(None, none_score)] + [(frame.alternatives[i].id, scores[i]) for i in order]  # ties: None first
        event["reranked"] = [(iri, round(score, 3)) for iri, score in sorted(ranking, key=lambda r: -r[1])]
        frame.alternatives = [frame.alternatives[i] for i in order if scores[i] > none_score]
        event["kept"] = [h.id for h in frame.alternatives]
        timings["rerank"] = timings.get("rerank", 0.0) + time.perf_counter() - start

    def validate(self, sparql: str, trace: list[dict], timings: dict[str, float]) -> tuple[bool, Result | None]:
        """Final validation: the query must execute and return something (an ASK answer counts). As in
        the reference, a timeout or server error is accepted: the KG was busy, not the query wrong."""
        start = time.perf_counter()
        try:
            result = self.client.query(sparql)
            ok, event = not result.is_empty, {"rows": len(result.rows), "boolean": result.boolean}
        except EndpointUnreachable:
            raise
        except (QueryTimeout, ServerError) as e:
            result, ok, event = None, True, {"accepted_error": f"{type(e).__name__}: {e}"}
        except SparqlError as e:
            result, ok, event = None, False, {"error": f"{type(e).__name__}: {e}"}
        timings["validate"] = timings.get("validate", 0.0) + time.perf_counter() - start
        trace.append({"event": "validate", "query": sparql, "ok": ok} | event)
        return ok, result

    # --- the depth-first search
    def resolve(self, question: str, skeleton: str, deadline: float = float("inf")) -> Resolution:
        """Resolve every placeholder of `skeleton`; Resolution.sparql is None if the skeleton failed."""
        trace, timings, backtracks = [], {}, 0
        if not find_placeholders(skeleton):  # nothing to resolve: only validate
            ok, result = self.validate(skeleton, trace, timings) if self.switches.kg_guidance else (True, None)
            return Resolution(skeleton if ok else None, result, 0, None if ok else "dead_end", trace, timings)
        stack = [self.expand(question, skeleton, trace, timings)]
        while stack:
            if time.monotonic() > deadline:
                trace.append({"event": "timeout"})
                return Resolution(None, None, backtracks, "timeout", trace, timings)
            frame = stack[-1]
            if not frame.alternatives:  # dead end: no candidates, None on top, or all tried
                stack.pop()
                if not stack or not self.switches.backtracking:
                    break
                backtracks += 1
                parent = stack[-1]
                event = {"event": "backtrack", "to": parent.placeholder.text, "left": len(parent.alternatives)}
                trace.append(event)
                self.rank(question, parent, event, timings)  # re-rank what remains, not the old order
                continue
            choice = frame.alternatives.pop(0)
            text = substitute(frame.text, frame.placeholder, choice.id)
            trace.append({"event": "choose", "placeholder": frame.placeholder.text, "iri": choice.id,
                          "label": choice.label})
            if find_placeholders(text):
                stack.append(self.expand(question, text, trace, timings))
                continue
            if not self.switches.kg_guidance:
                return Resolution(text, None, backtracks, None, trace, timings)
            ok, result = self.validate(text, trace, timings)
            if ok:
                return Resolution(text, result, backtracks, None, trace, timings)
            if not self.switches.backtracking:
                break
            backtracks += 1  # an invalid query: back one step, re-rank the last placeholder's rest
            event = {"event": "backtrack", "to": frame.placeholder.text, "left": len(frame.alternatives)}
            trace.append(event)
            self.rank(question, frame, event, timings)
        trace.append({"event": "exhausted"})
        return Resolution(None, None, backtracks, "dead_end", trace, timings)
