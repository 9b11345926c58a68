"""SPARQL skeletons: placeholders, Wikidata property variants and parsing (paper Section 3;
docs/method.md sections 2.1, 2.2 and 2.4). Pure functions, no model.

A skeleton is a SPARQL query without PREFIX lines whose KG IRIs are natural-language placeholders
`<iri>label</iri>`; property placeholders end with their Wikidata variant hint,
`<iri>place of birth (wdt)</iri>`. Resolution goes left to right; for the current placeholder:

    ph = find_placeholders(text)[0]
    infer_position(text, ph)    # positions.py: "subject" | "property" | "object" | "unknown"
    constraint_query(text, ph)  # constraints.py: "SELECT DISTINCT ?candidate WHERE { ... } LIMIT 131073" or None
    text = substitute(text, ph, "http://www.wikidata.org/entity/P19")  # writes wdt:P19

For training data and oracle skeletons, `skeletonize` turns a gold query into its skeleton (paper
Section 3; docs/method.md section 2.3): drop the PREFIX lines and replace every knowledge-graph IRI the
index can name by its placeholder (`wdt:P19` -> `<iri>place of birth (wdt)</iri>`); vocabularies such as
rdfs:label stay verbatim.

    s = skeletonize("SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x }", name_for)  # name_for(iri) -> label or None
    s.skeleton  # "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x }"
    s.iris      # the replaced IRIs in order: what resolution must find again

Text is always read with the SPARQL tokenizer of sparql_syntax.py, and validity with pyoxigraph's
parser (`parses`).
"""

import re
from dataclasses import dataclass
from typing import Callable

import pyoxigraph

from grisp.sparql_syntax import (
    PREFIXES,
    ForbiddenQuery,
    Span,
    Token,
    check_read_only,
    compact,
    declared_prefixes,
    expand,
    is_keyword,
    rewrite,
    tokenize,
)

# property variants a placeholder hint may name (`(wdt)`); each is a PREFIXES namespace
VARIANTS = ("wdt", "p", "ps", "pq", "psv", "pqv", "pr", "prv", "wdtn", "psn", "pqn", "prn", "wdno")
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
            inner = token.text[len("<iri>") : -len("</iri>")].strip()
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
        local = iri[len(PREFIXES[variant]) :]
        if iri.startswith(PREFIXES[variant]) and re.fullmatch(r"P\d+", local):
            return PREFIXES["wd"] + local, variant
    return iri, None


def with_variant(canonical_iri: str, variant: str | None) -> str:
    """Inverse of split_variant: (`.../entity/P19`, "wdt") -> `.../prop/direct/P19`."""
    if variant is None:
        return canonical_iri
    if variant not in VARIANTS or not _WD_PROPERTY_RE.fullmatch(canonical_iri):
        raise ValueError(
            f"cannot write {canonical_iri!r} as variant {variant!r}: needs a Wikidata "
            f"property IRI ({PREFIXES['wd']}P...) and one of {VARIANTS}"
        )
    return PREFIXES[variant] + canonical_iri[len(PREFIXES["wd"]) :]


def substitute(text: str, ph: Placeholder, iri: str) -> str:
    """Replace placeholder `ph` by the chosen item IRI, written with the placeholder's variant
    hint (for a Wikidata property) and as a prefixed name where one applies (`wdt:P19`)."""
    if text[ph.start : ph.end] != ph.text:
        raise ValueError(
            f"{ph.text!r} is not at {ph.start}:{ph.end} of the text; use find_placeholders on it"
        )
    canonical, _ = split_variant(iri)
    if ph.variant is not None and _WD_PROPERTY_RE.fullmatch(canonical):
        iri = with_variant(canonical, ph.variant)
    # keep the written IRI a token of its own: `?x<iri>a</iri>` must not become `?xwd:Q1`, nor
    # `wd:Q5.<iri>a</iri>` the name `wd:Q5.wd:Q1`, nor `<iri>a</iri>.FILTER` the name `wd:Q1.FILTER`
    # (a prefixed name may hold `.` and `-` inside)
    before = " " if re.fullmatch(r"[\w?$.\-]", text[ph.start - 1 : ph.start]) else ""
    after = " " if re.match(r"[\w:%\-]|\.+[\w:%\-]", text[ph.end :]) else ""
    return text[: ph.start] + before + compact(iri) + after + text[ph.end :]


def parses(query: str) -> bool:
    """True if the query (placeholders read as IRIs, PREFIXES predefined) is valid SPARQL 1.1."""
    tokens = tokenize(query)
    edits = _placeholders_as_iris(tokens)
    # pyoxigraph evaluates ASK eagerly: point SERVICE at an IRI it cannot call, so no network
    for i, token in enumerate(tokens[:-1]):
        if is_keyword(token, "SERVICE"):
            target = (
                tokens[i + 2]
                if is_keyword(tokens[i + 1], "SILENT") and i + 2 < len(tokens)
                else tokens[i + 1]
            )
            if target.kind in ("iri", "pname", "var"):
                edits.append((target.start, target.end, "<urn:grisp:no-service>"))
    try:
        pyoxigraph.Store().query(rewrite(query, edits), prefixes=PREFIXES)
    except SyntaxError:
        return False
    except (OSError, RuntimeError):  # raised by evaluation, which only starts after a successful parse
        pass
    return True


def sendable(query: str) -> bool:
    """True if the query, placeholders read as IRIs, passes the client's read-only check (no SERVICE,
    no update): a skeleton that fails it could never be sent, however its placeholders resolve."""
    try:
        check_read_only(rewrite(query, _placeholders_as_iris(tokenize(query))))
    except ForbiddenQuery:
        return False
    return True


def _placeholders_as_iris(tokens: list[Token]) -> list[tuple[int, int, str]]:
    """The rewrite edits that put DUMMY_IRI in place of every placeholder (parses and sendable)."""
    return [(t.start, t.end, DUMMY_IRI) for t in tokens if t.kind == "ph"]


# ---------------------------------------------------------------------------- merged wordings
# Beams that differ only in how they word their placeholders are one skeleton: merged, a placeholder
# holds up to MAX_WORDINGS labels, `<iri>birthplace<sep>place of birth (wdt)</iri>` (all with the same
# variant hint), the first the best beam's. The resolver searches the next wording only once the
# previous one's alternatives are used up (docs/method.md section 2.6). An idea of the reference
# implementation, not the paper.
SEP = "<sep>"
MAX_WORDINGS = 3  # as the reference: merging a wide beam stays cheap


def wordings(ph: Placeholder) -> list[str]:
    """The labels a placeholder holds, best first: one, unless merged (at most MAX_WORDINGS, distinct)."""
    return split_wordings(ph.label)


def split_wordings(label: str) -> list[str]:
    """A placeholder's label text (hint split off) as its wordings, best first (see `wordings`)."""
    labels = []
    for part in label.split(SEP):
        if part.strip() and label_key(part) not in map(label_key, labels):
            labels.append(part.strip())
    return labels[:MAX_WORDINGS] or [label]


def label_key(label: str) -> str:
    """What two labels share if they name the same thing: case and spacing do not count."""
    return " ".join(label.split()).casefold()


def wording_key(text: str) -> str:
    """The skeleton with each placeholder's labels left out (its variant hint kept): equal keys, one
    skeleton in different wordings."""
    return rewrite(
        text, [(ph.start, ph.end, placeholder_text("", ph.variant)) for ph in find_placeholders(text)]
    )


def merge_wordings(text: str, other: str) -> str:
    """`text` with the labels of `other` (same wording_key) added to its placeholders, each at most
    MAX_WORDINGS distinct labels (ignoring case and spacing); `text` itself if nothing is new."""
    if wording_key(text) != wording_key(other):
        raise ValueError(f"{other!r} is not {text!r} in other words: their structures differ")
    edits = []
    for ph, other_ph in zip(find_placeholders(text), find_placeholders(other)):
        labels = wordings(ph)
        for label in wordings(other_ph):
            if len(labels) < MAX_WORDINGS and label_key(label) not in map(label_key, labels):
                labels.append(label)
        if labels != wordings(ph):
            edits.append((ph.start, ph.end, placeholder_text(SEP.join(labels), ph.variant)))
    return rewrite(text, edits)


def first_wordings(text: str) -> str:
    """The skeleton as its best beam wrote it: merged placeholders cut to their first label (others
    unchanged), what a prompt shows."""
    return rewrite(
        text,
        [
            (ph.start, ph.end, placeholder_text(wordings(ph)[0], ph.variant))
            for ph in find_placeholders(text)
            if SEP in ph.label
        ],
    )


# ---------------------------------------------------------------------------- gold query -> skeleton
# IRIs of these vocabularies stay verbatim in skeletons; all other IRIs are KG items
COMMON_NAMESPACES = tuple(
    PREFIXES[name] for name in ("rdf", "rdfs", "xsd", "owl", "skos", "schema", "wikibase")
)


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
    """Skeleton of a gold query (docs/method.md section 2.3). `name_for(canonical_iri)` returns the text for an
    item's placeholder (its label or an alias) or None if the index does not know it; Wikidata
    properties are looked up by their entity IRI and get their variant hint (`(wdt)`)."""
    tokens = tokenize(sparql)
    found, declarations = _iri_tokens(tokens)
    edits = [
        (tokens[a].start, tokens[b].start if b < len(tokens) else len(sparql), "") for a, b in declarations
    ]
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
    return Skeletonized(rewrite(sparql, edits).strip(), iris, unknown)
