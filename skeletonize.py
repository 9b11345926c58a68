"""Gold query -> skeleton, for training data (paper Section 3; docs/method.md section 2.3): drop the
PREFIX lines and replace every knowledge-graph IRI the index can name by its placeholder
(`wdt:P19` -> `<iri>place of birth (wdt)</iri>`); vocabularies such as rdfs:label stay verbatim.

    from skeletonize import skeletonize
    s = skeletonize("SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x }", name_for)  # name_for(iri) -> label or None
    s.skeleton  # "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x }"
    s.iris      # the replaced IRIs in order: what resolution must find again

Pure functions over the text; samples.py (training targets) and evaluate.py (oracle skeletons) use it.
"""
from dataclasses import dataclass
from typing import Callable

from skeleton import placeholder_text, split_variant
from sparql_syntax import PREFIXES, Span, Token, compact, declared_prefixes, expand, is_keyword, rewrite, tokenize

# IRIs of these vocabularies stay verbatim in skeletons; all other IRIs are KG items
COMMON_NAMESPACES = tuple(PREFIXES[name] for name in ("rdf", "rdfs", "xsd", "owl", "skos", "schema", "wikibase"))


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
    return Skeletonized(rewrite(sparql, edits).strip(), iris, unknown)
