"""SPARQL skeletons: placeholders, Wikidata property variants, parsing, position inference and
KG-constraint queries (paper Section 3; METHOD.md sections 1 and 3). Pure functions, no model.

A skeleton is a SPARQL query without PREFIX lines whose KG IRIs are natural-language placeholders
`<iri>label</iri>`; property placeholders end with their Wikidata variant hint,
`<iri>place of birth (wdt)</iri>`. Resolution goes left to right; for the current placeholder:

    ph = find_placeholders(text)[0]
    infer_position(text, ph)    # "subject" | "property" | "object" | "unknown": which index to search
    constraint_query(text, ph)  # "SELECT DISTINCT ?candidate WHERE { ... } LIMIT 131073" or None
    text = substitute(text, ph, "http://www.wikidata.org/entity/P19")  # writes wdt:P19

For training data, `skeletonize(gold_sparql, name_for)` turns a gold query into its skeleton.
Text is always read with the SPARQL tokenizer of sparql.py, and validity with pyoxigraph's parser.
"""
import re
from dataclasses import dataclass
from typing import Callable

import pyoxigraph

from sparql import PREFIXES, Token, compact, declared_prefixes, expand, is_keyword, tokenize

# property variants a placeholder hint may name (`(wdt)`); each is a PREFIXES namespace
VARIANTS = ("wdt", "p", "ps", "pq", "psv", "pqv", "pr", "prv", "wdtn", "psn", "pqn", "prn", "wdno")
# IRIs of these vocabularies stay verbatim in skeletons; all other IRIs are KG items
COMMON_NAMESPACES = tuple(PREFIXES[name] for name in ("rdf", "rdfs", "xsd", "owl", "skos", "schema", "wikibase"))
CONSTRAINT_LIMIT = 131073  # 2**17 + 1: one row more than the resolver accepts as a candidate set
DUMMY_IRI = "<urn:grisp:placeholder>"  # stands in for placeholders when parsing
_HINT_RE = re.compile(r"(.*?)\s*\((" + "|".join(VARIANTS) + r")\)")
_WD_PROPERTY_RE = re.compile(re.escape(PREFIXES["wd"]) + r"P\d+")


@dataclass(frozen=True)
class Placeholder:
    text: str  # `<iri>place of birth (wdt)</iri>`
    label: str  # `place of birth`: what the index is searched with
    variant: str | None  # `wdt` (property variant hint) or None (entities, no hint)
    start: int  # character span of `text` in the skeleton
    end: int


def find_placeholders(text: str) -> list[Placeholder]:
    """All placeholders of a skeleton, left to right (never inside strings or comments)."""
    found = []
    for token in tokenize(text):
        if token.kind == "ph":
            inner = token.text[len("<iri>"):-len("</iri>")].strip()
            hint = _HINT_RE.fullmatch(inner)
            label, variant = (hint.group(1), hint.group(2)) if hint else (inner, None)
            found.append(Placeholder(token.text, label, variant, token.start, token.end))
    return found


def placeholder_text(label: str, variant: str | None = None) -> str:
    """`<iri>label (variant)</iri>`; whitespace in the label is collapsed to single spaces."""
    label = " ".join(label.split())
    return f"<iri>{label} ({variant})</iri>" if variant else f"<iri>{label}</iri>"


def split_variant(iri: str) -> tuple[str, str | None]:
    """`.../prop/direct/P19` -> (`.../entity/P19`, "wdt"); entities and other IRIs -> (iri, None)."""
    for variant in VARIANTS:
        local = iri[len(PREFIXES[variant]):]
        if iri.startswith(PREFIXES[variant]) and re.fullmatch(r"P\d+", local):
            return PREFIXES["wd"] + local, variant
    return iri, None


def with_variant(canonical_iri: str, variant: str | None) -> str:
    """Inverse of split_variant: (`.../entity/P19`, "wdt") -> `.../prop/direct/P19`."""
    if variant is None:
        return canonical_iri
    if variant not in VARIANTS or not _WD_PROPERTY_RE.fullmatch(canonical_iri):
        raise ValueError(f"cannot write {canonical_iri!r} as variant {variant!r}: needs a Wikidata "
                         f"property IRI ({PREFIXES['wd']}P...) and one of {VARIANTS}")
    return PREFIXES[variant] + canonical_iri[len(PREFIXES["wd"]):]


def substitute(text: str, ph: Placeholder, iri: str) -> str:
    """Replace placeholder `ph` by the chosen item IRI, written with the placeholder's variant
    hint (for a Wikidata property) and as a prefixed name where one applies (`wdt:P19`)."""
    if text[ph.start:ph.end] != ph.text:
        raise ValueError(f"{ph.text!r} is not at {ph.start}:{ph.end} of the text; use find_placeholders on it")
    canonical, _ = split_variant(iri)
    if ph.variant is not None and _WD_PROPERTY_RE.fullmatch(canonical):
        iri = with_variant(canonical, ph.variant)
    # keep the written IRI a token of its own (`?x<iri>a</iri>` must not become `?xwd:Q1`)
    before = " " if re.fullmatch(r"[\w?$]", text[ph.start - 1:ph.start]) else ""
    after = " " if re.fullmatch(r"[\w:]", text[ph.end:ph.end + 1]) else ""
    return text[:ph.start] + before + compact(iri) + after + text[ph.end:]


# ---------------------------------------------------------------------------- token helpers


class _Unsupported(Exception):
    """A construct the constraint extraction does not handle (the resolver searches unconstrained)."""


Span = tuple[int, int]  # token index range [start, end) of one term
_PAIRS = {"{": "}", "(": ")", "[": "]"}


def _at(tokens: list[Token], i: int, *texts: str) -> bool:
    return i < len(tokens) and tokens[i].kind == "punct" and tokens[i].text in texts


def _skip_group(tokens: list[Token], i: int) -> int:
    """Index just past the bracket group that opens at tokens[i]."""
    if not _at(tokens, i, *_PAIRS):
        raise _Unsupported(f"expected a bracket at token {i}")
    opener, depth = tokens[i].text, 0
    for j in range(i, len(tokens)):
        if _at(tokens, j, opener):
            depth += 1
        elif _at(tokens, j, _PAIRS[opener]):
            depth -= 1
            if depth == 0:
                return j + 1
    raise _Unsupported("unbalanced brackets")


def _rewrite(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply non-overlapping (start, end, replacement) edits to text."""
    out, last = [], 0
    for start, end, new in sorted(edits):
        out += [text[last:start], new]
        last = end
    return "".join(out) + text[last:]


def _closers(tokens: list[Token]) -> str | None:
    """The brackets that close what `tokens` left open, innermost first; None if unbalanced."""
    stack = []
    for i, token in enumerate(tokens):
        if _at(tokens, i, *_PAIRS):
            stack.append(_PAIRS[token.text])
        elif _at(tokens, i, *_PAIRS.values()) and (not stack or stack.pop() != token.text):
            return None
    return "".join(reversed(stack))


def _where_start(tokens: list[Token]) -> tuple[int, int]:
    """(index of the query form keyword, index of the WHERE group's `{`) of a SELECT/ASK/DESCRIBE."""
    q = 0
    while q < len(tokens) and is_keyword(tokens[q], "PREFIX", "BASE"):
        q += 3 if is_keyword(tokens[q], "PREFIX") else 2
    if q >= len(tokens) or not is_keyword(tokens[q], "SELECT", "ASK", "DESCRIBE"):
        raise _Unsupported("only SELECT, ASK and DESCRIBE queries are supported")
    depth = 0
    for i in range(q + 1, len(tokens)):
        depth += _at(tokens, i, "(") - _at(tokens, i, ")")
        if depth == 0 and _at(tokens, i, "{"):
            return q, i
    raise _Unsupported("no WHERE group")


def parses(query: str) -> bool:
    """True if the query (placeholders read as IRIs, PREFIXES predefined) is valid SPARQL 1.1."""
    tokens = tokenize(query)
    edits = [(t.start, t.end, DUMMY_IRI) for t in tokens if t.kind == "ph"]
    # pyoxigraph evaluates ASK eagerly: point SERVICE at an IRI it cannot call, so no network
    for i, token in enumerate(tokens[:-1]):
        if is_keyword(token, "SERVICE"):
            target = tokens[i + 2] if is_keyword(tokens[i + 1], "SILENT") and i + 2 < len(tokens) else tokens[i + 1]
            if target.kind in ("iri", "pname", "var"):
                edits.append((target.start, target.end, "<urn:grisp:no-service>"))
    try:
        pyoxigraph.Store().query(_rewrite(query, edits), prefixes=PREFIXES)
    except SyntaxError:
        return False
    except (OSError, RuntimeError):  # raised by evaluation, which only starts after a successful parse
        pass
    return True


# ---------------------------------------------------------------------------- position


def infer_position(text: str, ph: Placeholder) -> str:
    """The position of `ph`: "subject", "property", "object" or "unknown" (FILTER, BIND, VALUES ...).

    METHOD.md 3: take the prefix up to the placeholder, append terms, close the open brackets
    and parse: 3 terms parse -> subject, 2 -> property, 1 -> object. The placeholder becomes an IRI
    (so it may sit inside a property path) followed by fresh variables, and the triple ends with
    `;`, which only a triple pattern accepts (so `FILTER(?x = <ph>)` is unknown, not an object).
    """
    prefix, tokens = text[:ph.start], tokenize(text[:ph.start])
    try:  # test the WHERE pattern as ASK: a cut-off SELECT may not parse for its aggregates alone
        q, where = _where_start(tokens)
        prefix = prefix[:tokens[q].start] + "ASK " + prefix[tokens[where].start:]
    except _Unsupported:
        pass
    closers = _closers(tokenize(prefix))  # (earlier placeholders are read as IRIs by parses)
    if closers is None:
        return "unknown"
    if parses(f"{prefix} {DUMMY_IRI} ?grisp_p ?grisp_o ; {closers}"):
        return "subject"
    # inside `(a|<ph>)`: close the path's own parentheses before the object
    for k in range(len(closers) - len(closers.lstrip(")")) + 1):
        if parses(f"{prefix} {DUMMY_IRI}{closers[:k]} ?grisp_o ; {closers[k:]}"):
            return "property"
    return "object" if parses(f"{prefix} {DUMMY_IRI} ; {closers}") else "unknown"


# ---------------------------------------------------------------------------- constraint query


def _term(tokens: list[Token], i: int) -> int:
    """End of the subject/object term at i: a single token, a literal, `[ ... ]` or `( ... )`."""
    if _at(tokens, i, "[", "("):
        return _skip_group(tokens, i)
    if i < len(tokens) and tokens[i].kind == "string":
        if i + 1 < len(tokens) and tokens[i + 1].kind == "lang":
            return i + 2
        return i + 3 if _at(tokens, i + 1, "^^") and i + 2 < len(tokens) else i + 1
    if i < len(tokens) and (tokens[i].kind in ("var", "iri", "pname", "ph", "bnode", "number")
                            or is_keyword(tokens[i], "TRUE", "FALSE")):
        return i + 1
    raise _Unsupported(f"no RDF term at token {i}")


def _verb(tokens: list[Token], i: int) -> int:
    """End of the verb at i: a variable or a property path (`wdt:P31/wdt:P279*`, `^p`, `(a|b)`)."""
    if i < len(tokens) and tokens[i].kind == "var":
        return i + 1
    while True:
        i += 1 if _at(tokens, i, "^") else 0
        i += 1 if _at(tokens, i, "!") else 0
        if _at(tokens, i, "("):
            i = _skip_group(tokens, i)
        elif i < len(tokens) and (tokens[i].kind in ("iri", "pname", "ph") or tokens[i].text == "a"):
            i += 1
        else:
            raise _Unsupported(f"no property at token {i}")
        i += 1 if _at(tokens, i, "*", "+", "?") else 0
        if not _at(tokens, i, "/", "|"):
            return i
        i += 1


def _top_level_triples(tokens: list[Token], lo: int, hi: int) -> list[tuple[Span, Span, Span]]:
    """The triple patterns directly inside the group tokens[lo:hi]; nested groups (OPTIONAL, UNION,
    MINUS, GRAPH, subqueries), FILTER, BIND and VALUES are skipped."""
    triples, i = [], lo
    while i < hi:
        if _at(tokens, i, "."):
            i += 1
        elif _at(tokens, i, "{"):
            i = _skip_group(tokens, i)
        elif is_keyword(tokens[i], "UNION"):
            i += 1
        elif is_keyword(tokens[i], "OPTIONAL", "MINUS", "BIND"):
            i = _skip_group(tokens, i + 1)
        elif is_keyword(tokens[i], "GRAPH", "SERVICE"):
            i = _skip_group(tokens, i + (3 if is_keyword(tokens[min(i + 1, hi)], "SILENT") else 2))
        elif is_keyword(tokens[i], "VALUES"):
            i = _skip_group(tokens, _skip_group(tokens, i + 1) if _at(tokens, i + 1, "(") else i + 2)
        elif is_keyword(tokens[i], "FILTER"):
            j = i + 1 + is_keyword(tokens[min(i + 1, hi)], "NOT")
            j += 1 if is_keyword(tokens[min(j, hi)], "EXISTS") or not _at(tokens, j, "(") else 0
            i = _skip_group(tokens, j)  # FILTER (...), FILTER fn(...), FILTER [NOT] EXISTS {...}
        else:  # subject, then `verb object (, object)* (; verb object ...)*`
            subject, j = (i, _term(tokens, i)), _term(tokens, i)
            while True:
                verb = (j, _verb(tokens, j))
                j = verb[1]
                while True:
                    triples.append((subject, verb, (j, _term(tokens, j))))
                    j = triples[-1][2][1]
                    if not _at(tokens, j, ","):
                        break
                    j += 1
                if not _at(tokens, j, ";"):
                    break
                while _at(tokens, j, ";"):
                    j += 1
                if j >= hi or _at(tokens, j, ".", "{", "}") or tokens[j].kind == "word" and tokens[j].text != "a":
                    break
            i = j
    return triples


def _fresh(used: set[str], base: str) -> str:
    name = next(n for n in [base] + [f"{base}{k}" for k in range(2, len(used) + 3)] if n not in used)
    used.add(name)
    return f"?{name}"


def constraint_query(text: str, ph: Placeholder, limit: int = CONSTRAINT_LIMIT) -> str | None:
    """The single-column query whose answers are the allowed IRIs for placeholder `ph`, or None.

    Paper, Section 3: the top-level triple patterns of the resolved prefix that connect (through
    shared variables) to the placeholder's own triple, which is completed from the text after it
    with later placeholders as fresh variables; the placeholder becomes the variable ?candidate:
    `SELECT DISTINCT ?candidate WHERE { wd:Q104123 wdt:P57 ?d . ?d ?candidate ?place . } LIMIT 131073`.
    None when the placeholder is not in a top-level triple pattern (inside OPTIONAL, UNION, FILTER,
    VALUES, a subquery, a property path ...), for unsupported syntax, or when the patterns hold
    no IRI or literal at all (they would not constrain anything).
    """
    tokens = tokenize(text)
    at = next((i for i, t in enumerate(tokens) if t.kind == "ph" and t.start == ph.start), None)
    if at is None or tokens[at].text != ph.text:
        raise ValueError(f"{ph.text!r} is not at {ph.start}:{ph.end} of the text; use find_placeholders on it")
    try:
        q, lo = _where_start(tokens)
        hi = _skip_group(tokens, lo) - 1  # the WHERE group is tokens[lo:hi + 1]
        triples = _top_level_triples(tokens, lo + 1, hi) if lo < at < hi else []
    except _Unsupported:
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
        return text[tokens[a].start:tokens[b - 1].end]

    def variables(triple: tuple[Span, Span, Span]) -> set[str]:
        return {tokens[k].text.lstrip("?$") for a, b in triple for k in range(a, b) if tokens[k].kind in ("var", "bnode")}

    # --- grow the set of prefix triples connected to the current one through shared variables
    before = [t for t in triples if t[2][1] <= at and not any(tokens[k].kind == "ph" for a, b in t for k in range(a, b))]
    chosen, reached = [], variables(current)
    while grown := [t for t in before if t not in chosen and variables(t) & reached]:
        chosen += grown
        reached |= set().union(*map(variables, grown))
    chosen = sorted(chosen) + [current]
    if not any(tokens[k].kind not in ("var", "bnode", "ph", "punct") for t in chosen for a, b in t for k in range(a, b)):
        return None
    terms = [render(span) for t in chosen for span in t]
    if None in terms:
        return None
    patterns = [" ".join(terms[k:k + 3]) + " ." for k in range(0, len(terms), 3)]
    prologue = text[:tokens[q].start]
    return f"{prologue}SELECT DISTINCT {candidate} WHERE {{ {' '.join(patterns)} }} LIMIT {limit}"


# ---------------------------------------------------------------------------- gold query -> skeleton


def _iri_tokens(tokens: list[Token]) -> tuple[list[tuple[Token, str | None]], list[Span]]:
    """Every IRI token outside the PREFIX/BASE declarations with its full IRI (None if its prefix is
    unknown), and the token spans of those declarations."""
    prefixes = {**PREFIXES, **declared_prefixes(tokens)}
    found, declarations, i = [], [], 0
    while i < len(tokens):
        size = 3 if is_keyword(tokens[i], "PREFIX") else 2 if is_keyword(tokens[i], "BASE") else 0
        if size and i + size <= len(tokens) and tokens[i + size - 1].kind == "iri":
            declarations.append((i, i + size))
            i += size
            continue
        if tokens[i].kind == "iri":
            found.append((tokens[i], tokens[i].text[1:-1]))
        elif tokens[i].kind == "pname":
            try:
                found.append((tokens[i], expand(tokens[i].text, prefixes)))
            except ValueError:
                found.append((tokens[i], None))
        i += 1
    return found, declarations


def query_iris(sparql: str) -> list[str]:
    """The knowledge-graph IRIs of a query, in order, as full IRIs (common vocabularies excluded)."""
    found, _ = _iri_tokens(tokenize(sparql))
    return [iri for _, iri in found if iri is not None and not iri.startswith(COMMON_NAMESPACES)]


@dataclass
class Skeletonized:
    skeleton: str  # the query without PREFIX lines, known KG IRIs replaced by placeholders
    iris: list[str]  # the replaced IRIs in order, as full IRIs as written (property variants kept)
    unknown: list[str]  # KG IRIs the index has no name for (kept as IRIs), or unexpandable prefixed names


def skeletonize(sparql: str, name_for: Callable[[str], str | None]) -> Skeletonized:
    """Skeleton of a gold query (METHOD.md 1-2). `name_for(canonical_iri)` returns the text for an
    item's placeholder (its label or an alias) or None if the index does not know it; Wikidata
    properties are looked up by their entity IRI and get their variant hint (`(wdt)`)."""
    tokens = tokenize(sparql)
    found, declarations = _iri_tokens(tokens)
    edits = [(tokens[a].start, tokens[b].start if b < len(tokens) else len(sparql), "") for a, b in declarations]
    iris, unknown = [], []
    for token, iri in found:
        if iri is None:
            unknown.append(token.text)
            continue
        canonical, variant = split_variant(iri)
        name = None if iri.startswith(COMMON_NAMESPACES) else name_for(canonical)
        if name:
            edits.append((token.start, token.end, placeholder_text(name, variant)))
            iris.append(iri)
            continue
        if not iri.startswith(COMMON_NAMESPACES):
            unknown.append(iri)
        if token.kind == "pname" and compact(iri) != token.text:  # its PREFIX line is dropped
            edits.append((token.start, token.end, compact(iri)))
    return Skeletonized(_rewrite(sparql, edits).strip(), iris, unknown)
