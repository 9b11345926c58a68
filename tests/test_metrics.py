"""Tests for metrics.py: the GRASP scoring protocol on hand-built result sets."""

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grisp import metrics

XSD = "http://www.w3.org/2001/XMLSchema#"


def uri(name: str) -> dict:
    return {"type": "uri", "value": f"http://www.wikidata.org/entity/{name}"}


def lit(value: str, **extra) -> dict:
    return {"type": "literal", "value": value, **extra}


def select(*rows: dict) -> metrics.ResultSet:
    """A SELECT result from rows given as {variable: term} dicts."""
    return metrics.from_json(
        {"head": {"vars": sorted({v for r in rows for v in r})}, "results": {"bindings": list(rows)}}
    )


def column(*names: str, var: str = "x") -> metrics.ResultSet:
    return select(*({var: uri(name)} for name in names))


ASK_TRUE, ASK_FALSE = metrics.from_json({"boolean": True}), metrics.from_json({"boolean": False})


# --- ASK handling


def test_ask_vs_ask_compares_truth_values():
    assert metrics.f1_score(ASK_TRUE, ASK_TRUE) == 1.0
    assert metrics.f1_score(ASK_FALSE, ASK_FALSE) == 1.0
    assert metrics.f1_score(ASK_TRUE, ASK_FALSE) == 0.0
    assert metrics.f1_score(ASK_FALSE, ASK_TRUE) == 0.0


def test_select_prediction_for_ask_gold_is_read_as_a_truth_value():
    assert metrics.f1_score(column("Q1"), ASK_TRUE) == 1.0
    assert metrics.f1_score(column(), ASK_FALSE) == 1.0
    assert metrics.f1_score(column(), ASK_TRUE) == 0.0
    assert metrics.f1_score(column("Q1"), ASK_FALSE) == 0.0


def test_ask_prediction_for_select_gold_scores_zero():
    # a trivial ASK { ?s ?p ?o } must not get credit for a non-empty SELECT answer
    assert metrics.f1_score(ASK_TRUE, column("Q1")) == 0.0
    assert metrics.f1_score(ASK_FALSE, column()) == 0.0


def test_ask_result_is_never_empty():
    assert not ASK_FALSE.is_empty and column().is_empty


# --- empty results


def test_both_empty_scores_one_and_one_empty_scores_zero():
    assert metrics.f1_score(column(), column()) == 1.0
    assert metrics.f1_score(column(), column("Q1")) == 0.0
    assert metrics.f1_score(column("Q1"), column()) == 0.0


def test_rows_without_bound_values_are_dropped():
    result = select({"x": uri("Q1")}, {})
    assert result.rows == ((("uri", "http://www.wikidata.org/entity/Q1", "", ""),),)
    assert select({}).is_empty


# --- row F1 with the assignment


def test_partial_overlap_single_column():
    # matched pairs Q1-Q1 (1), Q2-Q2 (1), and Q4 or Q5 with Q3 (0); one predicted row unmatched.
    # TP = 2, FN = (1 - 0) = 1, FP = 1 (a matched zero-score pair counts as FN, not FP):
    # P = 2/3, R = 2/3, F1 = 2/3
    f1 = metrics.f1_score(column("Q1", "Q2", "Q4", "Q5"), column("Q1", "Q2", "Q3"))
    assert f1 == pytest.approx(2 / 3)
    # no overlap at all -> 0
    assert metrics.f1_score(column("Q4", "Q5"), column("Q1", "Q2", "Q3")) == 0.0
    assert not metrics.exact_match(f1)


def test_partial_overlap_within_a_row():
    # gold rows (a, 1990), (b, 1985); predicted (a, 1990), (b, 1986): pair scores 1 and 1/2
    # TP = 1.5, FN = 0.5, FP = 0: P = 1, R = 3/4, F1 = 6/7
    date = {"datatype": XSD + "gYear"}
    gold = select({"p": uri("Qa"), "y": lit("1990", **date)}, {"p": uri("Qb"), "y": lit("1985", **date)})
    pred = select({"p": uri("Qa"), "y": lit("1990", **date)}, {"p": uri("Qb"), "y": lit("1986", **date)})
    assert metrics.f1_score(pred, gold) == pytest.approx(6 / 7)


def test_pair_score_counts_only_gold_values():
    # a predicted row with extra values still fully covers its gold row: score |p & g| / |g| = 1
    gold = select({"x": uri("Qa")})
    pred = select({"x": uri("Qa"), "label": lit("A")})
    assert metrics.f1_score(pred, gold) == 1.0


def test_assignment_is_optimal_not_greedy():
    # pred0 covers both gold rows; a greedy match of pred0 -> gold0 would leave pred1 -> gold1 at 1/2
    gold = select({"a": uri("Qa"), "b": uri("Qb")}, {"a": uri("Qa"), "b": uri("Qc")})
    pred = select({"a": uri("Qa"), "b": uri("Qb"), "c": uri("Qc")}, {"a": uri("Qa"), "b": uri("Qb")})
    assert metrics.f1_score(pred, gold) == 1.0


def test_duplicate_rows_count():
    # one gold row, the prediction repeats it: TP = 1, FP = 1 -> P = 1/2, R = 1, F1 = 2/3
    assert metrics.f1_score(column("Q1", "Q1"), column("Q1")) == pytest.approx(2 / 3)
    # duplicated gold row, predicted once: TP = 1, FN = 1 -> F1 = 2/3
    assert metrics.f1_score(column("Q1"), column("Q1", "Q1")) == pytest.approx(2 / 3)
    assert metrics.f1_score(column("Q1", "Q1"), column("Q1", "Q1")) == 1.0


def test_duplicate_values_within_a_row_are_a_multiset():
    gold = select({"a": uri("Q1"), "b": uri("Q1")})  # the value twice
    pred = select({"a": uri("Q1")})  # covers one of the two -> 1/2, then F1 = 2/3
    assert metrics.f1_score(pred, gold) == pytest.approx(2 / 3)


def test_column_names_and_order_are_ignored():
    gold = metrics.from_json(
        {
            "head": {"vars": ["person", "place"]},
            "results": {"bindings": [{"person": uri("Q3772"), "place": uri("Q185582")}]},
        }
    )
    pred = metrics.from_json(
        {
            "head": {"vars": ["where", "who"]},
            "results": {"bindings": [{"where": uri("Q185582"), "who": uri("Q3772")}]},
        }
    )
    assert metrics.f1_score(pred, gold) == 1.0


def test_row_order_is_ignored():
    assert metrics.f1_score(column("Q3", "Q1", "Q2"), column("Q1", "Q2", "Q3")) == 1.0


# --- value equality: kind, value, datatype and language


def test_language_tags_must_match_case_insensitively():
    gold = select({"x": lit("Paris", **{"xml:lang": "en"})})
    assert metrics.f1_score(select({"x": lit("Paris", **{"xml:lang": "EN"})}), gold) == 1.0
    assert metrics.f1_score(select({"x": lit("Paris", **{"xml:lang": "fr"})}), gold) == 0.0
    assert metrics.f1_score(select({"x": lit("Paris")}), gold) == 0.0


def test_typed_literals_must_match_datatype():
    gold = select({"n": lit("1", datatype=XSD + "integer")})
    assert metrics.f1_score(select({"n": lit("1", datatype=XSD + "integer")}), gold) == 1.0
    assert metrics.f1_score(select({"n": lit("1", datatype=XSD + "decimal")}), gold) == 0.0
    assert metrics.f1_score(select({"n": lit("1")}), gold) == 0.0
    # the old-style JSON kind "typed-literal" is the same term
    old = {"type": "typed-literal", "value": "1", "datatype": XSD + "integer"}
    assert metrics.f1_score(select({"n": old}), gold) == 1.0


def test_simple_literal_equals_xsd_string():
    plain, typed = select({"x": lit("abc")}), select({"x": lit("abc", datatype=XSD + "string")})
    assert metrics.f1_score(plain, typed) == 1.0


def test_uri_is_not_a_literal_with_the_same_text():
    gold = select({"x": uri("Q1")})
    pred = select({"x": lit("http://www.wikidata.org/entity/Q1")})
    assert metrics.f1_score(pred, gold) == 0.0


def test_bad_terms_and_documents_are_rejected():
    with pytest.raises(ValueError, match="SPARQL JSON results term"):
        metrics.term({"type": "iri", "value": "x"})
    with pytest.raises(ValueError, match="results.bindings"):
        metrics.from_json({"head": {"vars": []}})


# --- large results


def test_more_than_1024_rows_uses_multiset_f1_over_whole_rows():
    # two-column rows that share one of two values: the assignment scores 1/2 per pair
    # (TP = n/2, FN = n/2, FP = 0 -> P = 1, R = 1/2, F1 = 2/3); multiset F1 over whole rows gives 0
    def rows(n, second):
        return select(*({"a": uri(f"Q{i}"), "b": uri(f"{second}{i}")} for i in range(n)))

    small_gold, small_pred = rows(metrics.EXACT_ABOVE, "G"), rows(metrics.EXACT_ABOVE, "P")
    assert metrics.f1_score(small_pred, small_gold) == pytest.approx(2 / 3)
    big_gold, big_pred = rows(metrics.EXACT_ABOVE + 1, "G"), rows(metrics.EXACT_ABOVE + 1, "P")
    assert metrics.f1_score(big_pred, big_gold) == 0.0


def test_large_multiset_f1_value():
    # 1100 gold rows, prediction has the first 550 plus 550 wrong ones: P = R = F1 = 1/2
    gold = column(*(f"Q{i}" for i in range(1100)))
    pred = column(*(f"Q{i}" for i in range(550)), *(f"X{i}" for i in range(550)))
    assert metrics.f1_score(pred, gold) == pytest.approx(0.5)
    assert metrics.f1_score(gold, gold) == 1.0


# --- the assignment agrees with brute force


def brute_force_f1(pred: list[tuple], gold: list[tuple]) -> float:
    """Try every one-to-one matching of the smaller side into the larger one."""

    def pair(p, g):
        return sum((Counter(p) & Counter(g)).values()) / len(g)

    best_tp = 0.0
    if len(pred) <= len(gold):
        for perm in itertools.permutations(range(len(gold)), len(pred)):
            best_tp = max(best_tp, sum(pair(pred[i], gold[j]) for i, j in enumerate(perm)))
    else:
        for perm in itertools.permutations(range(len(pred)), len(gold)):
            best_tp = max(best_tp, sum(pair(pred[i], gold[j]) for j, i in enumerate(perm)))
    if best_tp == 0:
        return 0.0
    matched = min(len(pred), len(gold))
    fn = matched - best_tp + (len(gold) - matched)  # sum(1 - score) over matched + unmatched gold
    fp = len(pred) - matched
    precision, recall = best_tp / (best_tp + fp), best_tp / (best_tp + fn)
    return 2 * precision * recall / (precision + recall)


value = st.sampled_from("abcd").map(lambda c: ("uri", c, "", ""))
row = st.lists(value, min_size=1, max_size=3).map(lambda r: tuple(sorted(r)))


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=1, max_size=4), st.lists(row, min_size=1, max_size=4))
def test_assignment_f1_matches_brute_force(pred, gold):
    assert metrics.assignment_f1(pred, gold) == pytest.approx(brute_force_f1(pred, gold))


@settings(max_examples=50, deadline=None)
@given(st.lists(row, min_size=1, max_size=6))
def test_identical_results_are_an_exact_match(rows):
    result = metrics.ResultSet(rows=tuple(rows))
    assert metrics.exact_match(metrics.f1_score(result, result))


def test_from_result_reads_a_sparql_client_result():
    class Result:  # the shape of sparql.Result: variables, rows of JSON terms, boolean for ASK
        def __init__(self, rows=(), boolean=None):
            self.variables, self.rows, self.boolean = ["x"], list(rows), boolean

    assert metrics.from_result(Result(boolean=False)) == ASK_FALSE
    assert metrics.from_result(Result([{"x": uri("Q1")}, {"x": uri("Q2")}])) == column("Q1", "Q2")


# --- per-sample score


def test_sample_score_skips_failed_or_empty_gold():
    assert metrics.sample_score(column("Q1"), None) is None
    assert metrics.sample_score(column("Q1"), column()) is None
    assert metrics.sample_score(None, column("Q1")) == 0.0
    assert metrics.sample_score(column("Q1"), column("Q1")) == 1.0
    assert metrics.sample_score(ASK_FALSE, ASK_FALSE) == 1.0  # a false ASK gold is still scored
