"""The KG-free skeleton score: a generated skeleton against the gold query's skeleton, by question shape
(docs/method.md section 7.6). No endpoint, no search: only the index's item store for labels and aliases.

The gold skeleton is the training target (grisp/skeleton.py with the index's labels). Two verdicts:
- structure match: the same token sequence after normalisation (`structure`): every placeholder
  reduced to its kind, `<ph wdt>` for a property placeholder with hint `(wdt)`, `<ph entity>` for one
  without; variables renamed by first use (?v0, ?v1, ...); keywords and function names upper-cased;
  prefixed names and IRIs expanded to full IRIs (PREFIX/BASE lines dropped); string quotes unified,
  language tags lower-cased; optional syntax dropped (the word WHERE, a `.` before `}`, `{` or a keyword).
- label match: structure match, and every generated placeholder names its gold item by the item's
  label or one of its aliases (case-insensitive, whitespace collapsed; a merged placeholder by any of
  its wordings).
Each question gets one shape from its gold query (`shape`, first rule that applies, in `SHAPES` order
of precedence). evaluate.py --skeleton-only runs it over a benchmark:

    gold = gold_skeleton(sample["sparql"], indices.get)  # skeleton, names per placeholder, unknown IRIs
    structure_match(gold.skeleton, generated), label_match(gold.skeleton, gold.names, generated)
    shape("ASK { wd:Q1 wdt:P19 wd:Q2 }")  # "ask"
"""
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from grisp.skeleton import find_placeholders, label_key, skeletonize, split_variant, split_wordings
from grisp.sparql_syntax import (PREFIXES, Unsupported, declared_prefixes, expand, is_keyword, skip_group, tokenize,
                           top_level_triples, where_start)
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


@dataclass(frozen=True)
class Structure:
    tokens: tuple[str, ...]  # the normalised token sequence (structure match compares these)
    labels: tuple[str, ...]  # the placeholders' labels in order, hints split off


def structure(text: str) -> Structure:
    """The normalised form of a skeleton or query (see the module docstring)."""
    tokens = tokenize(text)
    prefixes = {**PREFIXES, **declared_prefixes(tokens)}
    placeholders = {p.start: p for p in find_placeholders(text)}
    out, labels, names, i = [], [], {}, 0
    while i < len(tokens):
        token = tokens[i]
        size = 3 if is_keyword(token, "PREFIX") else 2 if is_keyword(token, "BASE") else 0
        if size and i + size <= len(tokens) and tokens[i + size - 1].kind == "iri":
            i += size  # a declaration: prefixed names are expanded below instead
            continue
        i += 1
        following = tokens[i] if i < len(tokens) else None
        if token.kind == "ph":
            p = placeholders[token.start]
            out.append(f"<ph {p.variant or 'entity'}>")
            labels.append(p.label)
        elif token.kind == "var":
            out.append(names.setdefault(token.text[1:], f"?v{len(names)}"))
        elif token.kind in ("iri", "pname"):
            try:
                out.append(f"<{expand(token.text, prefixes)}>")
            except ValueError:  # an unknown prefix: compare as written
                out.append(token.text)
        elif token.kind == "word":
            if token.text.upper() != "WHERE":  # `WHERE` is optional before every query pattern
                out.append(token.text.upper())
        elif token.kind == "string":
            quote = 3 if token.text[:3] in ('"""', "'''") else 1
            out.append('"' + token.text[quote:-quote] + '"')
        elif token.kind == "lang":
            out.append(token.text.lower())
        elif token.text == "." and (following is None or following.text in ("}", "{") or (
                following.kind == "word" and following.text.upper() not in ("TRUE", "FALSE"))):
            continue  # a `.` that only ends a triple block before `}`, a group or FILTER/OPTIONAL/...
        else:
            out.append(token.text)
    return Structure(tuple(out), tuple(labels))


def structure_match(gold: str, generated: str | None) -> bool:
    """True if the generated skeleton has the gold skeleton's structure (no skeleton: False)."""
    return generated is not None and structure(gold).tokens == structure(generated).tokens


def label_match(gold: str, gold_names: list[list[str]], generated: str | None) -> bool:
    """Structure match, and placeholder i of the generated skeleton is one of `gold_names[i]` (the
    label and aliases of gold placeholder i's item), case-insensitive; a merged placeholder (several
    wordings) matches if one of its wordings does, as the resolver searches them all."""
    if not structure_match(gold, generated):
        return False
    labels = structure(generated).labels
    assert len(labels) == len(gold_names), f"{len(labels)} placeholders, {len(gold_names)} gold items"
    return all(any(label_key(wording) in {label_key(n) for n in names} for wording in split_wordings(label))
               for label, names in zip(labels, gold_names))


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
    return GoldSkeleton(skeletonized.skeleton, [[item.label, *item.aliases] for item in items],
                        skeletonized.unknown)


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
    selected variables (a typed one-hop question is one). one triple: exactly one triple pattern."""
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
    if _intermediate_variable(tokens, brace, triples) or any(_full_steps(tokens, verb) > 1 for _, verb, _ in triples):
        return "two-hop"
    return "intersection" if len(triples) > 1 else "one triple"


def _intermediate_variable(tokens, brace: int, triples) -> bool:
    """Does a variable that the query does not select link two triple patterns (as subject or object)?"""
    def variable(span):
        return tokens[span[0]].text if span[1] - span[0] == 1 and tokens[span[0]].kind == "var" else None
    head = tokens[:brace]  # SELECT ... up to the WHERE group
    if any(t.text == "*" for t in head):  # everything is selected: a chain is an object that is a subject
        subjects = {variable(s) for s, _, _ in triples} - {None}
        return any(variable(o) in subjects and variable(o) != variable(s) for s, _, o in triples)
    selected = {t.text for t in head if t.kind == "var"}
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


def score_sample(sample: dict, lookup: Callable[[str], Item | None],
                 generate: Callable[[str], list[tuple[str, float]]]) -> dict:
    """One benchmark record -> its skeleton-score record: id, question, shape, gold_skeleton, gold_names,
    unknown, status ("scored" or "unskeletonisable"), skeletons (kept, with scores), generated (the top-1
    or None), structure_match, label_match. `generate(question)` returns the kept skeletons, best first,
    with scores; it is not called when the gold query cannot be skeletonised."""
    gold = gold_skeleton(sample["sparql"], lookup)
    record = {"id": sample["id"], "question": sample["question"], "shape": shape(sample["sparql"]),
              "gold_skeleton": gold.skeleton, "gold_names": gold.names, "unknown": gold.unknown}
    if gold.unknown:  # an IRI without a label: there is no gold skeleton to compare with
        return record | {"status": "unskeletonisable", "skeletons": None, "generated": None,
                         "structure_match": None, "label_match": None}
    skeletons = generate(sample["question"])
    generated = skeletons[0][0] if skeletons else None
    return record | {"status": "scored", "skeletons": [list(s) for s in skeletons], "generated": generated,
                     "structure_match": structure_match(gold.skeleton, generated),
                     "label_match": label_match(gold.skeleton, gold.names, generated)}


def summarize(records: list[dict]) -> dict:
    """Structure and label match rates overall and per shape, over the scored records."""
    scored = [r for r in records if r["status"] == "scored"]

    def rates(group: list[dict]) -> dict:
        n = len(group)
        return {"questions": n, "structure": sum(r["structure_match"] for r in group) / n if n else None,
                "label": sum(r["label_match"] for r in group) / n if n else None}
    return {"questions": len(records), "scored": len(scored),
            "unskeletonisable": len(records) - len(scored),
            "no_skeleton": sum(r["generated"] is None for r in scored),
            "by_shape": {s: rates([r for r in scored if r["shape"] == s])
                         for s in SHAPES if any(r["shape"] == s for r in scored)},
            "all": rates(scored)}


def format_table(summary: dict) -> str:
    """The summary as a Markdown table (one row per shape present, then all), with the counts below."""
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}"
    rows = ["| shape | questions | structure match % | label match % |", "|---|---|---|---|"]
    by_shape = {**summary["by_shape"], "all": summary["all"]}
    rows += [f"| {name} | {r['questions']} | {pct(r['structure'])} | {pct(r['label'])} |" for name, r in by_shape.items()]
    rows.append(f"\n{summary['questions']} questions: {summary['scored']} scored, {summary['unskeletonisable']} "
                f"not skeletonisable (an IRI without a label in the index), {summary['no_skeleton']} without "
                f"a generated skeleton that parses (counted as misses)")
    return "\n".join(rows)
