"""The GRASP scoring protocol: how a predicted SPARQL answer is compared with the gold one.

GRISP (paper section 4, "evaluation protocol") scores a question by executing the gold and the
predicted query and comparing their results row by row (docs/method.md section 7.2):

- If the gold query is an ASK query, compare truth values (a SELECT prediction counts as true when
  it returns a row). An ASK prediction for a SELECT gold query scores 0: a trivial
  `ASK { ?s ?p ?o }` must not get credit for every non-empty gold answer.
- Both results empty -> 1, exactly one empty -> 0.
- Otherwise row F1 with a one-to-one row assignment. A row is the multiset of its bound values
  (column names and column order are ignored). A (predicted, gold) pair scores
  |pred_row & gold_row| / |gold_row|; the best matching maximises the summed score (Hungarian
  algorithm); TP = sum of matched scores, FN = sum(1 - score) over matched gold rows + unmatched
  gold rows, FP = unmatched predicted rows. Above 1024 rows (either side) plain multiset F1 over
  whole rows is used instead.
- Values are equal only if kind (uri/literal/bnode), lexical value, datatype and language match.
- The benchmark score is the mean F1 over samples whose gold query executes and returns something;
  exact match (EM) is 1 iff F1 is 1.

Results come in as SPARQL 1.1 JSON results (`from_json`), as a `sparql.Result` (`from_result`) or
as the bare binding list that benchmark files keep in `info.results` (`from_bindings`). Usage:

    gold, pred = metrics.from_json(gold_doc), metrics.from_json(pred_doc)
    f1 = metrics.f1_score(pred, gold); em = metrics.exact_match(f1)
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from grisp.sparql_syntax import PREFIXES

XSD_STRING = PREFIXES["xsd"] + "string"
RDF_LANG_STRING = PREFIXES["rdf"] + "langString"
EXACT_ABOVE = 1024  # more rows than this on either side -> multiset F1 (the assignment is O(n^3))

# One RDF term, hashable: (kind, value, datatype, language) with kind in {"uri", "literal", "bnode"}
Term = tuple[str, str, str, str]
# One result row as a multiset: its bound terms, sorted, so column names and order do not matter
Row = tuple[Term, ...]


def term(binding: dict) -> Term:
    """Normalise one SPARQL JSON results term so that equal RDF terms compare equal.

    Handles the old-style `"typed-literal"` kind, the `xml:lang` key, a missing datatype on a plain
    literal (RDF 1.1: a simple literal *is* an xsd:string) and case in language tags (BCP 47 tags
    are case-insensitive).
    """
    kind, value = binding.get("type"), binding.get("value")
    if not isinstance(value, str) or kind not in ("uri", "literal", "typed-literal", "bnode"):
        raise ValueError(f"not a SPARQL JSON results term: {binding!r}")
    if kind in ("uri", "bnode"):
        return (kind, value, "", "")
    language = binding.get("xml:lang", binding.get("lang", "")).lower()
    datatype = binding.get("datatype", "")
    if language:
        datatype = RDF_LANG_STRING
    elif not datatype:
        datatype = XSD_STRING
    return ("literal", value, datatype, language)


@dataclass(frozen=True)
class ResultSet:
    """A query result ready for scoring: an ASK truth value, or SELECT rows as term multisets."""

    ask: bool | None = None  # truth value of an ASK query; None for a SELECT result
    rows: tuple[Row, ...] = ()  # SELECT rows (rows without any bound value are dropped)

    @property
    def is_empty(self) -> bool:
        # an ASK answer is never empty, even when false
        return self.ask is None and not self.rows

    @property
    def truth(self) -> bool:
        """The result read as a truth value: the ASK answer, or "the SELECT returned something"."""
        return self.ask if self.ask is not None else bool(self.rows)


def from_bindings(bindings: list[dict]) -> ResultSet:
    """Build a SELECT result from a list of `{variable: term}` dicts (JSON results `bindings`)."""
    rows = []
    for binding in bindings:
        row = tuple(sorted(term(value) for value in binding.values()))
        if row:  # a row of unbound variables carries no answer
            rows.append(row)
    return ResultSet(rows=tuple(rows))


def from_json(document: dict) -> ResultSet:
    """Build a result from a SPARQL 1.1 JSON results document (ASK or SELECT)."""
    if "boolean" in document:
        return ResultSet(ask=bool(document["boolean"]))
    bindings = document.get("results", {}).get("bindings")
    if not isinstance(bindings, list):
        raise ValueError(f"not a SPARQL JSON results document (no results.bindings): {str(document)[:200]}")
    return from_bindings(bindings)


def from_result(result) -> ResultSet:
    """Build a result from a `sparql.Result` (`boolean` for ASK, else `rows` of JSON terms)."""
    if result.boolean is not None:
        return ResultSet(ask=bool(result.boolean))
    return from_bindings(result.rows)


def multiset_f1(pred: list[Row], gold: list[Row]) -> float:
    """F1 over whole rows as multisets (duplicates count): the fallback for large results."""
    pred_counts, gold_counts = Counter(pred), Counter(gold)
    tp = sum((pred_counts & gold_counts).values())
    if tp == 0:
        return 0.0
    precision, recall = tp / len(pred), tp / len(gold)
    return 2 * precision * recall / (precision + recall)


def pair_scores(pred: list[Row], gold: list[Row]) -> np.ndarray:
    """Score matrix S[i, j] = |pred[i] & gold[j]| / |gold[j]| (multiset intersection).

    Shape (len(pred), len(gold)), float64. Built sparsely through an inverted index term -> gold
    rows, so only pairs that share a term are ever compared.
    """
    gold_counts = [Counter(row) for row in gold]
    postings: dict[Term, list[tuple[int, int]]] = {}  # term -> [(gold row, count in that row)]
    for j, counts in enumerate(gold_counts):
        for value, count in counts.items():
            postings.setdefault(value, []).append((j, count))
    overlap = np.zeros((len(pred), len(gold)))
    for i, row in enumerate(pred):
        for value, count in Counter(row).items():
            for j, gold_count in postings.get(value, ()):
                overlap[i, j] += min(count, gold_count)
    gold_sizes = np.array([len(row) for row in gold], dtype=np.float64)  # rows are never empty
    return overlap / gold_sizes[None, :]


def assignment_f1(pred: list[Row], gold: list[Row]) -> float:
    """Row F1 under the best one-to-one assignment of predicted to gold rows."""
    scores = pair_scores(pred, gold)
    matched_pred, matched_gold = linear_sum_assignment(scores, maximize=True)
    matched = scores[matched_pred, matched_gold]  # one score per matched pair
    assert len(matched) == min(len(pred), len(gold)), f"assignment left {len(matched)} pairs"
    tp = float(matched.sum())
    if tp <= 0.0:
        return 0.0
    fn = float((1.0 - matched).sum()) + (len(gold) - len(matched))
    fp = len(pred) - len(matched)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: ResultSet, gold: ResultSet, exact_above: int = EXACT_ABOVE) -> float:
    """The GRASP F1 of one prediction against its gold result (see the module docstring)."""
    if gold.ask is not None:
        return float(pred.truth == gold.ask)
    if pred.ask is not None:
        return 0.0  # an ASK answer cannot answer a SELECT question
    if pred.is_empty and gold.is_empty:
        return 1.0
    if pred.is_empty or gold.is_empty:
        return 0.0
    pred_rows, gold_rows = list(pred.rows), list(gold.rows)
    if len(pred_rows) > exact_above or len(gold_rows) > exact_above:
        return multiset_f1(pred_rows, gold_rows)
    return assignment_f1(pred_rows, gold_rows)


def exact_match(f1: float) -> bool:
    """EM is 1 iff F1 is 1 (a perfect prediction scores exactly 1.0 in floating point too)."""
    return f1 >= 1.0 - 1e-9


def sample_score(pred: ResultSet | None, gold: ResultSet | None) -> float | None:
    """F1 of one benchmark sample: None (left out of the mean) when the gold query failed or
    returned nothing; 0 when the prediction is missing or failed to execute."""
    if gold is None or gold.is_empty:
        return None
    if pred is None:
        return 0.0
    return f1_score(pred, gold)
