"""SPARQL as text: the tokenizer, the project's one namespace table (PREFIXES), IRI compaction and
expansion, the read-only check, and bracket / triple-pattern helpers over token lists.

Everything GRISP does to a query before it is sent works on its text (paper, Section 3): finding
placeholders, inferring a placeholder's position, cutting the constraint query out of the resolved
prefix, turning a gold query into a skeleton. Those steps live in skeleton.py, positions.py,
constraints.py and grisp/skeleton.py; the SPARQL grammar they share lives here. No network, no model.

    from grisp.sparql_syntax import tokenize, compact, expand, with_prefixes
    tokenize("?x wdt:P19 <http://e/a>")  # [Token('var', '?x', 0, 2), Token('pname', ...), Token('iri', ...)]
    compact("http://www.wikidata.org/prop/direct/P19")  # 'wdt:P19'
    with_prefixes("ASK { wd:Q1 ?p ?o }")  # 'PREFIX wd: <http://www.wikidata.org/entity/>\\nASK { ... }'
"""

import re
from typing import NamedTuple

_WD = "http://www.wikidata.org/"
PREFIXES: dict[str, str] = {
    # Wikidata entities, statements and the property variants (wdt, p, ps, pq, ...)
    "wd": _WD + "entity/",
    "wds": _WD + "entity/statement/",
    "wdv": _WD + "value/",
    "wdref": _WD + "reference/",
    "wdt": _WD + "prop/direct/",
    "wdtn": _WD + "prop/direct-normalized/",
    "wdno": _WD + "prop/novalue/",
    "p": _WD + "prop/",
    "ps": _WD + "prop/statement/",
    "psv": _WD + "prop/statement/value/",
    "psn": _WD + "prop/statement/value-normalized/",
    "pq": _WD + "prop/qualifier/",
    "pqv": _WD + "prop/qualifier/value/",
    "pqn": _WD + "prop/qualifier/value-normalized/",
    "pr": _WD + "prop/reference/",
    "prv": _WD + "prop/reference/value/",
    "prn": _WD + "prop/reference/value-normalized/",
    # common vocabularies
    "wikibase": "http://wikiba.se/ontology#",
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "rdfs": "http://www.w3.org/2000/01/rdf-schema#",
    "xsd": "http://www.w3.org/2001/XMLSchema#",
    "owl": "http://www.w3.org/2002/07/owl#",
    "skos": "http://www.w3.org/2004/02/skos/core#",
    "schema": "http://schema.org/",
    "prov": "http://www.w3.org/ns/prov#",
    "bd": "http://www.bigdata.com/rdf#",
}


class SparqlError(Exception):
    """Base class of every SPARQL error: the refused query below and the client's errors (sparql.py)."""


class ForbiddenQuery(SparqlError):
    """The query contains SERVICE or a SPARQL Update; refused before sending."""


class Unsupported(Exception):
    """A construct the bracket / triple helpers do not handle (callers fall back, e.g. the resolver
    then searches without a constraint query)."""


# ---------------------------------------------------------------------------- tokenizer


class Token(NamedTuple):
    kind: str  # ph, iri, pname, var, string, number, bnode, lang, word, punct, other
    text: str
    start: int  # character span in the tokenized text
    end: int


_PN_LOCAL = r"(?:(?:[\w:%]|\\[^\s])(?:[\w.:%\-]|\\[^\s])*(?<!\.))?"
_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>\#[^\r\n]*)
    |(?P<ph><iri>(?:(?!</iri>)[^\n])*</iri>)
    |(?P<iri><[^<>"{}|^`\\\x00-\x20]*>)
    |(?P<string>\"\"\"(?:[^"\\]|\\.|"(?!""))*\"\"\"|'''(?:[^'\\]|\\.|'(?!''))*'''
        |"(?:[^"\\\n\r]|\\.)*"|'(?:[^'\\\n\r]|\\.)*')
    |(?P<var>[?$]\w+)
    |(?P<bnode>_:\w(?:[\w.\-]*\w)?)
    |(?P<pname>(?:[A-Za-z](?:[\w.\-]*[\w\-])?)?:"""
    + _PN_LOCAL
    + r""")
    |(?P<lang>@[A-Za-z]+(?:-[A-Za-z0-9]+)*)
    |(?P<number>\d+\.\d*[eE][+-]?\d+|\d*\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?)
    |(?P<word>[A-Za-z_]\w*)
    |(?P<punct>\^\^|&&|\|\||!=|<=|>=|[{}()\[\].,;*/|^!+\-=<>?])
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


def tokenize(text: str) -> list[Token]:
    """Split SPARQL (or skeleton) text into tokens, dropping whitespace and comments.

    Placeholders `<iri>label</iri>` are single `ph` tokens; strings, IRIs (which may contain `#`)
    and comments are recognised before punctuation, so nothing inside them is mistaken for syntax.
    Never raises: a character that starts no token becomes an `other` token.
    """
    tokens = []
    for m in _TOKEN_RE.finditer(text):
        if m.lastgroup not in ("ws", "comment"):
            tokens.append(Token(m.lastgroup, m.group(), m.start(), m.end()))
    return tokens


def is_keyword(token: Token, *words: str) -> bool:
    """True if the token is one of the (case-insensitive) SPARQL keywords `words`."""
    return token.kind == "word" and token.text.upper() in words


def declared_prefixes(tokens: list[Token]) -> dict[str, str]:
    """The `PREFIX name: <iri>` declarations of a query, as {name: namespace IRI}."""
    declared = {}
    for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
        if is_keyword(a, "PREFIX") and b.kind == "pname" and b.text.endswith(":") and c.kind == "iri":
            declared[b.text[:-1]] = c.text[1:-1]
    return declared


# ---------------------------------------------------------------------------- IRIs and queries


def compact(iri: str, prefixes: dict[str, str] = PREFIXES) -> str:
    """SPARQL text of a full IRI: `wd:Q42` where a known prefix applies, else `<iri>`.

    The longest matching namespace wins (`wdt:P19`, not `p:direct/P19`).
    """
    best = None
    for name, namespace in prefixes.items():
        local = iri[len(namespace) :]
        if iri.startswith(namespace) and re.fullmatch(r"\w(?:[\w.\-]*[\w\-])?", local):
            if best is None or len(namespace) > len(prefixes[best]):
                best = name
    return f"{best}:{iri[len(prefixes[best]) :]}" if best is not None else f"<{iri}>"


def expand(term: str, prefixes: dict[str, str] = PREFIXES) -> str:
    """Full IRI of a prefixed name (`wd:Q42`) or of an `<iri>`; ValueError for an unknown prefix."""
    if term.startswith("<") and term.endswith(">"):
        return term[1:-1]
    name, sep, local = term.partition(":")
    if not sep or name not in prefixes:
        raise ValueError(f"cannot expand {term!r}: unknown prefix {name!r} (known: {sorted(prefixes)})")
    return prefixes[name] + local.replace("\\", "")


def query_key(query: str) -> str:
    """The query with its writing undone, for telling whether two queries are the same: PREFIX/BASE
    lines dropped, IRIs and prefixed names as full `<iri>`s, variables renamed in order of first use
    (`?v0`, `?v1`, ...), keywords upper-cased, a `.` right before `}` dropped, one space between tokens."""
    tokens = tokenize(query)
    prefixes = {**PREFIXES, **declared_prefixes(tokens)}
    variables: dict[str, str] = {}
    words, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        if is_keyword(token, "PREFIX", "BASE"):  # PREFIX wd: <iri> / BASE <iri>
            i += 3 if is_keyword(token, "PREFIX") else 2
            continue
        if token.kind == "pname":
            try:
                words.append(f"<{expand(token.text, prefixes)}>")
            except ValueError:
                words.append(token.text)
        elif token.kind == "var":
            words.append(variables.setdefault(token.text[1:], f"?v{len(variables)}"))
        elif token.kind == "word":
            words.append(token.text.upper())
        elif token.text == "}" and words and words[-1] == ".":
            words[-1] = "}"
        else:
            words.append(token.text)
        i += 1
    return " ".join(words)


_UPDATE_WORDS = ("INSERT", "DELETE", "LOAD", "CLEAR", "CREATE", "DROP", "COPY", "MOVE", "ADD", "WITH")


# SPARQL 1.1 section 19.2: `\uXXXX` and `\UXXXXXXXX` spell any character anywhere in a query, decoded
# before parsing (so `\u0053ERVICE` is SERVICE to an engine that follows the letter of the spec)
_CODEPOINT_ESCAPE = re.compile(r"\\u([0-9A-Fa-f]{4})|\\U([0-9A-Fa-f]{8})")


def _decode_codepoint_escapes(query: str) -> str:
    def decode(match: re.Match) -> str:
        code = int(match.group(1) or match.group(2), 16)
        return chr(code) if code <= 0x10FFFF else match.group()

    return _CODEPOINT_ESCAPE.sub(decode, query)


def check_read_only(query: str) -> None:
    """Raise ForbiddenQuery if the query federates (SERVICE), is a SPARQL Update, or holds a skeleton
    placeholder (`<iri>...</iri>` is read as one token, which could hide a SERVICE clause before a
    `</iri>` in a comment; a query to send has none). Checked on the query with its codepoint escapes
    decoded, as an engine reads it (character positions in the messages are of that text)."""
    for token in tokenize(_decode_codepoint_escapes(query)):
        if token.kind == "ph":
            raise ForbiddenQuery(
                f"refusing to send a query with a skeleton placeholder {token.text[:40]!r} (at character "
                f"{token.start}): replace every placeholder by an IRI first"
            )
        if is_keyword(token, "SERVICE"):
            raise ForbiddenQuery(
                f"refusing to send a query with SERVICE (at character {token.start}): federated "
                "calls to other endpoints are not allowed; remove the SERVICE clause"
            )
        if is_keyword(token, *_UPDATE_WORDS):
            raise ForbiddenQuery(
                f"refusing to send a SPARQL Update ({token.text.upper()} at character {token.start}): "
                "this client only runs read-only queries (SELECT, ASK, CONSTRUCT, DESCRIBE)"
            )


def with_prefixes(query: str, prefixes: dict[str, str] = PREFIXES) -> str:
    """Prepend a PREFIX line for each known prefix the query uses but does not declare."""
    tokens = tokenize(query)
    declared = declared_prefixes(tokens)
    missing = []
    for prev, token in zip([None, *tokens], tokens):
        if token.kind != "pname" or (prev is not None and is_keyword(prev, "PREFIX")):
            continue
        name = token.text.split(":", 1)[0]
        if name in prefixes and name not in declared and name not in missing:
            missing.append(name)
    return "".join(f"PREFIX {name}: <{prefixes[name]}>\n" for name in missing) + query


def rewrite(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply non-overlapping (start, end, replacement) character edits to text."""
    out, last = [], 0
    for start, end, new in sorted(edits):
        out += [text[last:start], new]
        last = end
    return "".join(out) + text[last:]


# ---------------------------------------------------------------------------- brackets and groups

Span = tuple[int, int]  # token index range [start, end) of one term
_PAIRS = {"{": "}", "(": ")", "[": "]"}


def _at(tokens: list[Token], i: int, *texts: str) -> bool:
    return i < len(tokens) and tokens[i].kind == "punct" and tokens[i].text in texts


def skip_group(tokens: list[Token], i: int) -> int:
    """Index just past the bracket group that opens at tokens[i]."""
    if not _at(tokens, i, *_PAIRS):
        raise Unsupported(f"expected a bracket at token {i}")
    opener, depth = tokens[i].text, 0
    for j in range(i, len(tokens)):
        if _at(tokens, j, opener):
            depth += 1
        elif _at(tokens, j, _PAIRS[opener]):
            depth -= 1
            if depth == 0:
                return j + 1
    raise Unsupported("unbalanced brackets")


def closers(tokens: list[Token]) -> str | None:
    """The brackets that close what `tokens` left open, innermost first; None if unbalanced."""
    stack = []
    for i, token in enumerate(tokens):
        if _at(tokens, i, *_PAIRS):
            stack.append(_PAIRS[token.text])
        elif _at(tokens, i, *_PAIRS.values()) and (not stack or stack.pop() != token.text):
            return None
    return "".join(reversed(stack))


def where_start(tokens: list[Token]) -> tuple[int, int]:
    """(index of the query form keyword, index of the WHERE group's `{`) of a SELECT/ASK/DESCRIBE."""
    q = 0
    while q < len(tokens) and is_keyword(tokens[q], "PREFIX", "BASE"):
        q += 3 if is_keyword(tokens[q], "PREFIX") else 2
    if q >= len(tokens) or not is_keyword(tokens[q], "SELECT", "ASK", "DESCRIBE"):
        raise Unsupported("only SELECT, ASK and DESCRIBE queries are supported")
    depth = 0
    for i in range(q + 1, len(tokens)):
        depth += _at(tokens, i, "(") - _at(tokens, i, ")")
        if depth == 0 and _at(tokens, i, "{"):
            return q, i
    raise Unsupported("no WHERE group")


# ---------------------------------------------------------------------------- triple patterns


def _term(tokens: list[Token], i: int) -> int:
    """End of the subject/object term at i: a single token, a literal, `[ ... ]` or `( ... )`."""
    if _at(tokens, i, "[", "("):
        return skip_group(tokens, i)
    if i < len(tokens) and tokens[i].kind == "string":
        if i + 1 < len(tokens) and tokens[i + 1].kind == "lang":
            return i + 2
        return i + 3 if _at(tokens, i + 1, "^^") and i + 2 < len(tokens) else i + 1
    if i < len(tokens) and (
        tokens[i].kind in ("var", "iri", "pname", "ph", "bnode", "number")
        or is_keyword(tokens[i], "TRUE", "FALSE")
    ):
        return i + 1
    raise Unsupported(f"no RDF term at token {i}")


def _verb(tokens: list[Token], i: int) -> int:
    """End of the verb at i: a variable or a property path (`wdt:P31/wdt:P279*`, `^p`, `(a|b)`)."""
    if i < len(tokens) and tokens[i].kind == "var":
        return i + 1
    while True:
        i += 1 if _at(tokens, i, "^") else 0
        i += 1 if _at(tokens, i, "!") else 0
        if _at(tokens, i, "("):
            i = skip_group(tokens, i)
        elif i < len(tokens) and (tokens[i].kind in ("iri", "pname", "ph") or tokens[i].text == "a"):
            i += 1
        else:
            raise Unsupported(f"no property at token {i}")
        i += 1 if _at(tokens, i, "*", "+", "?") else 0
        if not _at(tokens, i, "/", "|"):
            return i
        i += 1


def values_data_start(tokens: list[Token], i: int) -> int:
    """Where the data block `{ ... }` of the VALUES at token i starts: after `VALUES ?x` or
    `VALUES (?x ?y)`."""
    return skip_group(tokens, i + 1) if _at(tokens, i + 1, "(") else i + 2


def top_level_triples(tokens: list[Token], lo: int, hi: int) -> list[tuple[Span, Span, Span]]:
    """The triple patterns directly inside the group tokens[lo:hi]; nested groups (OPTIONAL, UNION,
    MINUS, GRAPH, subqueries), FILTER, BIND and VALUES are skipped."""
    return [triple for _, _, triples in triple_blocks(tokens, lo, hi) for triple in triples]


def triple_blocks(
    tokens: list[Token], lo: int, hi: int
) -> list[tuple[int, int, list[tuple[Span, Span, Span]]]]:
    """The blocks of triple patterns directly inside the group tokens[lo:hi], as (start, end, triples):
    one block per subject, `s p o , o ; p o` (its `;` and `,` read out into one triple each), ending
    before its `.`; what top_level_triples skips is in no block."""
    blocks, i = [], lo
    while i < hi:
        if _at(tokens, i, "."):
            i += 1
        elif _at(tokens, i, "{"):
            i = skip_group(tokens, i)
        elif is_keyword(tokens[i], "UNION"):
            i += 1
        elif is_keyword(tokens[i], "OPTIONAL", "MINUS", "BIND"):
            i = skip_group(tokens, i + 1)
        elif is_keyword(tokens[i], "GRAPH", "SERVICE"):
            i = skip_group(tokens, i + (3 if is_keyword(tokens[min(i + 1, hi)], "SILENT") else 2))
        elif is_keyword(tokens[i], "VALUES"):
            i = skip_group(tokens, values_data_start(tokens, i))
        elif is_keyword(tokens[i], "FILTER"):
            j = i + 1 + is_keyword(tokens[min(i + 1, hi)], "NOT")
            j += 1 if is_keyword(tokens[min(j, hi)], "EXISTS") or not _at(tokens, j, "(") else 0
            i = skip_group(tokens, j)  # FILTER (...), FILTER fn(...), FILTER [NOT] EXISTS {...}
        else:  # subject, then `verb object (, object)* (; verb object ...)*`
            triples = []
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
                if (
                    j >= hi
                    or _at(tokens, j, ".", "{", "}")
                    or tokens[j].kind == "word"
                    and tokens[j].text != "a"
                ):
                    break
            blocks.append((i, j, triples))
            i = j
    return blocks
