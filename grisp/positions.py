"""Position inference: is a placeholder the subject, the property or the object of a triple
pattern, or somewhere else (paper Section 3; docs/method.md section 6.2)? The position picks the index the
resolver searches (entities for subject / object, properties for property).

    from grisp.positions import infer_position
    infer_position("SELECT ?x WHERE { wd:Q104123 <iri>director (wdt)</iri> ?x }", ph)  # "property"

Pure function over the text; validity is decided by pyoxigraph's parser (skeleton.parses).
"""

from grisp.skeleton import DUMMY_IRI, Placeholder, parses
from grisp.sparql_syntax import Unsupported, closers, tokenize, where_start


def infer_position(text: str, ph: Placeholder) -> str:
    """The position of `ph`: "subject", "property", "object" or "unknown" (FILTER, BIND, VALUES ...).

    docs/method.md section 6.2: take the prefix up to the placeholder, append terms, close the open brackets
    and parse: 3 terms parse -> subject, 2 -> property, 1 -> object. The placeholder becomes an IRI
    (so it may sit inside a property path) followed by fresh variables, and the triple ends with
    `;`, which only a triple pattern accepts (so `FILTER(?x = <ph>)` is unknown, not an object).
    """
    prefix, tokens = text[: ph.start], tokenize(text[: ph.start])
    try:  # test the WHERE pattern as ASK: a cut-off SELECT may not parse for its aggregates alone
        q, where = where_start(tokens)
        prefix = prefix[: tokens[q].start] + "ASK " + prefix[tokens[where].start :]
    except Unsupported:
        pass
    to_close = closers(tokenize(prefix))  # (earlier placeholders are read as IRIs by parses)
    if to_close is None:
        return "unknown"
    if parses(f"{prefix} {DUMMY_IRI} ?grisp_p ?grisp_o ; {to_close}"):
        return "subject"
    # inside `(a|<ph>)`: close the path's own parentheses before the object
    for k in range(len(to_close) - len(to_close.lstrip(")")) + 1):
        if parses(f"{prefix} {DUMMY_IRI}{to_close[:k]} ?grisp_o ; {to_close[k:]}"):
            return "property"
    return "object" if parses(f"{prefix} {DUMMY_IRI} ; {to_close}") else "unknown"
