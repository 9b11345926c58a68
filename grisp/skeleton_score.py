"""The KG-free skeleton score: a generated skeleton against the gold query's skeleton, by question shape
(docs/method.md section 7.6). No endpoint, no search: only the index's item store for labels and aliases.

The gold skeleton is the training target (grisp/skeleton.py with the index's labels). Two verdicts:
- structure match: the same token sequence after normalisation (`structure`): every placeholder
  reduced to its kind, `<ph wdt>` for a property placeholder with hint `(wdt)`, `<ph entity>` for one
  without; variables renamed by first use (?v0, ?v1, ...); keywords and function names upper-cased;
  prefixed names and IRIs expanded to full IRIs (PREFIX/BASE lines dropped), `a` as rdf:type; string
  quotes unified, language tags lower-cased; optional syntax dropped (the word WHERE, a `.` before `}`,
  `{` or a keyword); the triples of each run of triple blocks read out (`;`, `,`) and put in a
  canonical order (`_triple_orders`), so their written order and style do not count.
- label match: structure match, and every generated placeholder names the gold item in its place by
  the item's label or one of its aliases (case-insensitive, whitespace collapsed; a merged placeholder
  by any of its wordings).
Each question gets one shape from its gold query (`shape`, first rule that applies, in `SHAPES` order
of precedence). evaluate.py --skeleton-only runs it over a benchmark:

    gold = gold_skeleton(sample["sparql"], indices.get)  # skeleton, names per placeholder, unknown IRIs
    structure_match(gold.skeleton, generated), label_match(gold.skeleton, gold.names, generated)
    shape("ASK { wd:Q1 wdt:P19 wd:Q2 }")  # "ask"
"""

from collections import Counter
from dataclasses import dataclass
from itertools import groupby, permutations, product
from math import factorial, prod
from typing import Callable

from grisp.skeleton import find_placeholders, label_key, skeletonize, split_variant, split_wordings
from grisp.sparql_syntax import (
    PREFIXES,
    Token,
    Unsupported,
    declared_prefixes,
    expand,
    is_keyword,
    skip_group,
    tokenize,
    top_level_triples,
    triple_blocks,
    values_data_start,
    where_start,
)
from search import Item

# shapes in order of precedence: the query form and solution modifiers first (syntax the model writes on
# top of the triples), then the graph pattern's structure (docs/method.md section 7.6)
SHAPES = ("ask", "aggregate", "filter/order", "qualifier", "other", "two-hop", "intersection", "one triple")
AGGREGATE_WORDS = {"COUNT", "SUM", "AVG", "MIN", "MAX", "GROUP_CONCAT", "SAMPLE", "GROUP", "HAVING"}
FILTER_ORDER_WORDS = {"FILTER", "ORDER"}
NESTED_WORDS = {"UNION", "OPTIONAL", "MINUS", "GRAPH", "SERVICE"}  # patterns the triple count does not see
# property variants that go through a statement node: p: to it, ps:/pq:/pr: ... out of it
STATEMENT_VARIANTS = {"p", "ps", "pq", "psv", "pqv", "psn", "pqn", "pr", "prv", "prn"}


# ---------------------------------------------------------------------------- normalisation and matching


RDF_TYPE = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"  # the verb `a`
MAX_ORDERINGS = 720  # orderings of look-alike triples tried for the canonical form; past it, one order
DOT = Token("punct", ".", -1, -1)  # between the triples a block is read out into


@dataclass(frozen=True)
class Structure:
    tokens: tuple[str, ...]  # the normalised token sequence (structure match compares these)
    readings: tuple[tuple[int, ...], ...]  # per triple order that gives `tokens`: its placeholders by
    # their index in the written text, in order (a subject written once before `;` comes once per triple)


def structure(text: str) -> Structure:
    """The normalised form of a skeleton or query (see the module docstring): each run of triple blocks
    read out into single triples (`;`, `,`) and put in a canonical order, the least normalised sequence
    over the orders of triples that look alike up to variable names."""
    tokens = tokenize(text)
    prefixes = {**PREFIXES, **declared_prefixes(tokens)}
    placeholders = {p.start: (n, p) for n, p in enumerate(find_placeholders(text))}
    readings = [
        _normalised(order, prefixes, placeholders) for order in _triple_orders(tokens, prefixes, placeholders)
    ]
    least = min(normal for normal, _ in readings)
    return Structure(least, tuple(dict.fromkeys(seen for normal, seen in readings if normal == least)))


def _word(token: Token, prefixes: dict[str, str], placeholders: dict) -> str | None:
    """One token's normal form, None to leave it out (`WHERE`); a variable stays as written."""
    if token.kind == "ph":
        return f"<ph {placeholders[token.start][1].variant or 'entity'}>"
    if token.kind in ("iri", "pname"):
        try:
            return f"<{expand(token.text, prefixes)}>"
        except ValueError:  # an unknown prefix: compare as written
            return token.text
    if token.kind == "word":
        word = token.text.upper()
        return None if word == "WHERE" else RDF_TYPE if token.text == "a" else word  # WHERE is optional
    if token.kind == "string":
        quote = 3 if token.text[:3] in ('"""', "'''") else 1
        return '"' + token.text[quote:-quote] + '"'
    if token.kind == "lang":
        return token.text.lower()
    return token.text


def _normalised(
    tokens: list[Token], prefixes: dict[str, str], placeholders: dict
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The normalised sequence of `tokens` (variables renamed by first use) and its placeholders' indices."""
    out, seen, names, i = [], [], {}, 0
    while i < len(tokens):
        token = tokens[i]
        size = 3 if is_keyword(token, "PREFIX") else 2 if is_keyword(token, "BASE") else 0
        if size and i + size <= len(tokens) and tokens[i + size - 1].kind == "iri":
            i += size  # a declaration: prefixed names are expanded instead
            continue
        i += 1
        following = tokens[i] if i < len(tokens) else None
        if token.kind == "var":
            out.append(names.setdefault(token.text[1:], f"?v{len(names)}"))
        elif (
            token.text == "."
            and token.kind == "punct"
            and (
                following is None
                or following.text in ("}", "{")
                or (following.kind == "word" and following.text.upper() not in ("TRUE", "FALSE"))
            )
        ):
            continue  # a `.` that only ends a triple block before `}`, a group or FILTER/OPTIONAL/...
        elif (word := _word(token, prefixes, placeholders)) is not None:
            out.append(word)
            if token.kind == "ph":
                seen.append(placeholders[token.start][0])
    return tuple(out), tuple(seen)


def _triple_orders(tokens: list[Token], prefixes: dict[str, str], placeholders: dict) -> list[list[Token]]:
    """`tokens` with every run of triple blocks (blocks separated by `.` only) read out into single
    triples sorted by their look (variables as `?`): one token list per order of the look-alike triples
    (just the first if there are more than MAX_ORDERINGS). A text the triple reader cannot follow is
    left as written."""
    try:
        runs = _triple_runs(tokens)
    except Unsupported:
        return [tokens]

    def look(triple):
        return tuple(
            "?" if tokens[k].kind == "var" else _word(tokens[k], prefixes, placeholders) or ""
            for a, b in triple
            for k in range(a, b)
        )

    tied = [
        [list(group) for _, group in groupby(sorted(triples, key=look), key=look)] for _, _, triples in runs
    ]
    count = prod(factorial(len(group)) for groups in tied for group in groups)
    orders = (
        product(*[permutations(group) for groups in tied for group in groups])
        if count <= MAX_ORDERINGS
        else [tuple(tuple(group) for groups in tied for group in groups)]
    )
    out = []
    for order in orders:
        sequence, at, groups = [], 0, iter(order)
        for (start, end, _), run_groups in zip(runs, tied):
            triples = [triple for _ in run_groups for triple in next(groups)]
            sequence += tokens[at:start]
            for k, triple in enumerate(triples):
                sequence += [tokens[j] for a, b in triple for j in range(a, b)] + (
                    [DOT] if k < len(triples) - 1 else []
                )
            at = end
        out.append(sequence + tokens[at:])
    return out


def _triple_runs(tokens: list[Token]) -> list[tuple[int, int, list]]:
    """The runs of triple blocks in every group of the query (not VALUES data, not a subquery's outer
    braces), in text order, as (start, end, triples)."""
    values_data = {
        values_data_start(tokens, i) for i, token in enumerate(tokens) if is_keyword(token, "VALUES")
    }
    runs = []
    for i, token in enumerate(tokens):
        if (
            token.kind != "punct"
            or token.text != "{"
            or i in values_data
            or (i + 1 < len(tokens) and is_keyword(tokens[i + 1], "SELECT"))
        ):
            continue
        run = None
        for start, end, triples in triple_blocks(tokens, i + 1, skip_group(tokens, i) - 1):
            if run and all(tokens[k].text == "." for k in range(run[1], start)):
                run = (run[0], end, run[2] + triples)
            else:
                runs += [run] if run else []
                run = (start, end, triples)
        runs += [run] if run else []
    return sorted(runs)


def structure_match(gold: str, generated: str | None) -> bool:
    """True if the generated skeleton has the gold skeleton's structure (no skeleton: False)."""
    return generated is not None and structure(gold).tokens == structure(generated).tokens


def label_match(gold: str, gold_names: list[list[str]], generated: str | None) -> bool:
    """Structure match, and each generated placeholder is one of the names (label and aliases) of the
    gold item in its place, case-insensitive, for some order of look-alike triples (`gold_names[i]`: of
    gold placeholder i in written order); a merged placeholder (several wordings) matches if one of its
    wordings does, as the resolver searches them all."""
    if generated is None:
        return False
    gold_structure, generated_structure = structure(gold), structure(generated)  # each once: orders are tried
    if gold_structure.tokens != generated_structure.tokens:
        return False
    gold_order = gold_structure.readings[0]
    names = [{label_key(n) for n in gold_names[i]} for i in gold_order]
    labels = [p.label for p in find_placeholders(generated)]
    assert max(gold_order, default=-1) < len(gold_names), (
        f"{len(gold_names)} gold items, more gold placeholders"
    )
    return any(
        all(
            any(label_key(wording) in wanted for wording in split_wordings(labels[i]))
            for i, wanted in zip(reading, names)
        )
        for reading in generated_structure.readings
    )


# ---------------------------------------------------------------------------- gold skeleton


@dataclass
class GoldSkeleton:
    skeleton: str  # grisp/skeleton.py's output with the index's labels (the training target)
    names: list[list[str]]  # per placeholder, left to right: its gold item's label and aliases
    unknown: list[str]  # IRIs without a label in the index: such a question cannot be scored


def gold_skeleton(sparql: str, lookup: Callable[[str], Item | None]) -> GoldSkeleton:
    """The gold query's skeleton with label placeholders, and the names each placeholder may carry."""

    def label(iri: str) -> str | None:
        item = lookup(iri)
        return item.label if item is not None else None

    skeletonized = skeletonize(sparql, label)
    items = [lookup(split_variant(iri)[0]) for iri in skeletonized.iris]
    return GoldSkeleton(
        skeletonized.skeleton, [[item.label, *item.aliases] for item in items], skeletonized.unknown
    )


# ---------------------------------------------------------------------------- question shape


def shape(sparql: str) -> str:
    """The question's shape from its gold query (or a skeleton); the first of these that applies:
    ask: an ASK query. aggregate: COUNT, SUM, AVG, MIN, MAX, GROUP_CONCAT, SAMPLE, GROUP BY or HAVING.
    filter/order: FILTER (also FILTER [NOT] EXISTS) or ORDER BY. qualifier: a property through a
    statement node (p:, ps:, pq:, pr: ... variants). other: UNION, OPTIONAL, MINUS, GRAPH, SERVICE, a
    subquery, no triple pattern, or a WHERE group the triple reader does not handle. two-hop: an
    intermediate variable, one that is not selected and links two or more triple patterns ("where was
    the director of X born?"), or a sequence path of two full steps (`p1/p2`; `wdt:P31/wdt:P279*`, a
    step and a closure, is one hop: a type); under SELECT *, a variable that is the object of one
    pattern and the subject of another. intersection: two or more triple patterns that meet only in
    selected variables (a typed one-hop question is one). one triple: exactly one triple pattern.
    VALUES and BIND are not read: `?s ?p ?o . VALUES ?p {...}` is one triple."""
    tokens = tokenize(sparql)
    words = Counter(t.text.upper() for t in tokens if t.kind == "word")
    prefixes = {**PREFIXES, **declared_prefixes(tokens)}
    if words["ASK"]:
        return "ask"
    if AGGREGATE_WORDS & set(words):
        return "aggregate"
    if FILTER_ORDER_WORDS & set(words):
        return "filter/order"
    if any(_variant(t, prefixes) in STATEMENT_VARIANTS for t in tokens):
        return "qualifier"
    if NESTED_WORDS & set(words) or words["SELECT"] > 1:
        return "other"
    try:
        _, brace = where_start(tokens)
        triples = top_level_triples(tokens, brace + 1, skip_group(tokens, brace) - 1)
    except Unsupported:
        return "other"
    if not triples:
        return "other"
    if _intermediate_variable(tokens, brace, triples) or any(
        _full_steps(tokens, verb) > 1 for _, verb, _ in triples
    ):
        return "two-hop"
    return "intersection" if len(triples) > 1 else "one triple"


def _intermediate_variable(tokens, brace: int, triples) -> bool:
    """Does a variable that the query does not select link two triple patterns (as subject or object)?"""

    def variable(span):  # its name without the sigil: $x is ?x
        return tokens[span[0]].text[1:] if span[1] - span[0] == 1 and tokens[span[0]].kind == "var" else None

    head = tokens[:brace]  # SELECT ... up to the WHERE group
    if any(t.text == "*" for t in head):  # everything is selected: a chain is an object that is a subject
        subjects = {variable(s) for s, _, _ in triples} - {None}
        return any(variable(o) in subjects and variable(o) != variable(s) for s, _, o in triples)
    selected = {t.text[1:] for t in head if t.kind == "var"}
    uses = Counter(v for s, _, o in triples for v in {variable(s), variable(o)} - {None})
    return any(n > 1 and v not in selected for v, n in uses.items())


def _full_steps(tokens, verb) -> int:
    """The steps of a property path `p1/p2*/...` that are not closures (`*`, `+`, `?`): one for a plain
    property. Parentheses are read through: `(wdt:P31/wdt:P279*)` is one step and a closure."""
    a, b = verb
    steps = [[]]
    for j in range(a, b):
        if tokens[j].text == "/":
            steps.append([])
        elif tokens[j].text not in ("(", ")"):
            steps[-1].append(tokens[j].text)
    return sum(1 for step in steps if step and step[-1] not in ("*", "+", "?"))


def _variant(token, prefixes: dict[str, str]) -> str | None:
    """The Wikidata property variant of an IRI token or placeholder hint ("wdt", "pq", ...), else None."""
    if token.kind == "ph":
        return find_placeholders(token.text)[0].variant
    if token.kind not in ("iri", "pname"):
        return None
    try:
        return split_variant(expand(token.text, prefixes))[1]
    except ValueError:
        return None


# ---------------------------------------------------------------------------- one question, a benchmark


def score_sample(
    sample: dict, lookup: Callable[[str], Item | None], generate: Callable[[str], list[tuple[str, float]]]
) -> dict:
    """One benchmark record -> its skeleton-score record: id, question, shape, gold_skeleton, gold_names,
    unknown, status ("scored" or "unskeletonisable"), skeletons (kept, with scores), generated (the top-1
    or None), structure_match, label_match. `generate(question)` returns the kept skeletons, best first,
    with scores; it is not called when the gold query cannot be skeletonised."""
    gold = gold_skeleton(sample["sparql"], lookup)
    record = {
        "id": sample["id"],
        "question": sample["question"],
        "shape": shape(sample["sparql"]),
        "gold_skeleton": gold.skeleton,
        "gold_names": gold.names,
        "unknown": gold.unknown,
    }
    if gold.unknown:  # an IRI without a label: there is no gold skeleton to compare with
        return record | {
            "status": "unskeletonisable",
            "skeletons": None,
            "generated": None,
            "structure_match": None,
            "label_match": None,
        }
    skeletons = generate(sample["question"])
    generated = skeletons[0][0] if skeletons else None
    return record | {
        "status": "scored",
        "skeletons": [list(s) for s in skeletons],
        "generated": generated,
        "structure_match": structure_match(gold.skeleton, generated),
        "label_match": label_match(gold.skeleton, gold.names, generated),
    }


def summarize(records: list[dict]) -> dict:
    """Structure and label match rates overall and per shape, over the scored records."""
    scored = [r for r in records if r["status"] == "scored"]

    def rates(group: list[dict]) -> dict:
        n = len(group)
        return {
            "questions": n,
            "structure": sum(r["structure_match"] for r in group) / n if n else None,
            "label": sum(r["label_match"] for r in group) / n if n else None,
        }

    return {
        "questions": len(records),
        "scored": len(scored),
        "unskeletonisable": len(records) - len(scored),
        "no_skeleton": sum(r["generated"] is None for r in scored),
        "by_shape": {
            s: rates([r for r in scored if r["shape"] == s])
            for s in SHAPES
            if any(r["shape"] == s for r in scored)
        },
        "all": rates(scored),
    }


def format_table(summary: dict) -> str:
    """The summary as a Markdown table (one row per shape present, then all), with the counts below."""

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}"

    rows = ["| shape | questions | structure match % | label match % |", "|---|---|---|---|"]
    by_shape = {**summary["by_shape"], "all": summary["all"]}
    rows += [
        f"| {name} | {r['questions']} | {pct(r['structure'])} | {pct(r['label'])} |"
        for name, r in by_shape.items()
    ]
    rows.append(
        f"\n{summary['questions']} questions: {summary['scored']} scored, {summary['unskeletonisable']} "
        f"not skeletonisable (an IRI without a label in the index), {summary['no_skeleton']} without "
        f"a generated skeleton that parses (counted as misses)"
    )
    return "\n".join(rows)
