"""Constraint queries: the SPARQL query whose answers are the knowledge-graph items a placeholder
may become, cut from the already resolved prefix of the skeleton (paper Section 3; docs/method.md
section 6.3). The resolver runs it on the endpoint and searches the index only among its answers.

    from grisp.constraints import constraint_query
    text = "SELECT ?place WHERE { wd:Q104123 wdt:P57 ?d . ?d <iri>place of birth (wdt)</iri> ?place . }"
    constraint_query(text, find_placeholders(text)[0])
    # "SELECT DISTINCT ?candidate WHERE { wd:Q104123 wdt:P57 ?d . ?d ?candidate ?place . } LIMIT 131073"

Pure functions over the text (the triple patterns come from sparql_syntax.top_level_triples).
"""

from grisp.skeleton import Placeholder, parses, split_variant
from grisp.sparql_syntax import (
    Span,
    Unsupported,
    is_keyword,
    skip_group,
    tokenize,
    top_level_triples,
    where_start,
)

CONSTRAINT_LIMIT = 131073  # 2**17 + 1: one row more than the resolver accepts as a candidate set


def constraint_query(text: str, ph: Placeholder, limit: int = CONSTRAINT_LIMIT) -> str | None:
    """The single-column query whose answers are the allowed IRIs for placeholder `ph`, or None.

    Paper, Section 3: the top-level triple patterns of the resolved prefix that connect (through
    shared variables) to the placeholder's own triple, which is completed from the text after it
    with later placeholders as fresh variables; the placeholder becomes the variable ?candidate:
    `SELECT DISTINCT ?candidate WHERE { wd:Q104123 wdt:P57 ?d . ?d ?candidate ?place . } LIMIT 131073`.
    None when the placeholder is not in a top-level triple pattern (inside OPTIONAL, UNION, FILTER,
    VALUES, a subquery, a property path ...), for unsupported syntax, when the patterns hold
    no IRI or literal at all (they would not constrain anything), or when the text is not valid
    SPARQL (skeleton.parses; a malformed token such as an undeclared prefix or `[ SELECT ]` would be
    copied into the query). A returned query always parses.
    Only a SELECT query is constrained, as in the reference implementation: an ASK query asks whether
    facts hold, and admitting only the items that make them hold would leave a "no" nothing to resolve
    to (docs/method.md section 6.3).
    """
    tokens = tokenize(text)
    at = next((i for i, t in enumerate(tokens) if t.kind == "ph" and t.start == ph.start), None)
    if at is None or tokens[at].text != ph.text:
        raise ValueError(
            f"{ph.text!r} is not at {ph.start}:{ph.end} of the text; use find_placeholders on it"
        )
    try:
        q, lo = where_start(tokens)
        if not is_keyword(tokens[q], "SELECT"):
            return None
        hi = skip_group(tokens, lo) - 1  # the WHERE group is tokens[lo:hi + 1]
        triples = top_level_triples(tokens, lo + 1, hi) if lo < at < hi else []
    except Unsupported:
        return None
    current = next((t for t in triples if any(a <= at < b for a, b in t)), None)
    if current is None or any(a <= at < b and b - a > 1 for a, b in current):
        return None
    used = {t.text[1:] for t in tokens if t.kind == "var"}
    candidate = _fresh(used, "candidate")

    def render(span: Span) -> str | None:
        a, b = span
        if a == at:
            return candidate
        if any(tokens[k].kind == "ph" for k in range(a, b)):  # a later placeholder: any value
            return _fresh(used, "free") if b - a == 1 else None  # (no variable inside a path)
        return text[tokens[a].start : tokens[b - 1].end]

    def variables(triple: tuple[Span, Span, Span]) -> set[str]:
        return {
            tokens[k].text.lstrip("?$")
            for a, b in triple
            for k in range(a, b)
            if tokens[k].kind in ("var", "bnode")
        }

    # --- grow the set of prefix triples connected to the current one through shared variables
    before = [
        t
        for t in triples
        if t[2][1] <= at and not any(tokens[k].kind == "ph" for a, b in t for k in range(a, b))
    ]
    chosen, reached = [], variables(current)
    while grown := [t for t in before if t not in chosen and variables(t) & reached]:
        chosen += grown
        reached |= set().union(*map(variables, grown))
    chosen = sorted(chosen) + [current]
    if not any(
        tokens[k].kind not in ("var", "bnode", "ph", "punct")
        for t in chosen
        for a, b in t
        for k in range(a, b)
    ):
        return None
    terms = [render(span) for t in chosen for span in t]
    if None in terms:
        return None
    if not parses(text):  # checked last: parsing costs more than all of the above
        return None
    patterns = [" ".join(terms[k : k + 3]) + " ." for k in range(0, len(terms), 3)]
    prologue = text[: tokens[q].start]
    return f"{prologue}SELECT DISTINCT {candidate} WHERE {{ {' '.join(patterns)} }} LIMIT {limit}"


def allowed_items(result) -> set[str] | None:
    """What a constraint query's result (sparql.Result) allows: None (any item) when it reached the limit,
    too many to be a constraint; else the IRIs of its column, a property variant (wdt:P57) mapped to the
    item the index knows (wd:P57). Used by the resolver, constrained training samples (samples.py) and
    the agent's SPE/SOP (grasp/functions.py)."""
    if len(result.rows) >= CONSTRAINT_LIMIT:
        return None
    return {split_variant(iri)[0] for iri in result.iris()}


def _fresh(used: set[str], base: str) -> str:
    """A variable `?base`, `?base2`, ... whose name is not in `used` (and is added to it)."""
    name = next(n for n in [base] + [f"{base}{k}" for k in range(2, len(used) + 3)] if n not in used)
    used.add(name)
    return f"?{name}"
