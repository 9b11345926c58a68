"""Precision, coverage and declining (grisp/coverage.py), and the confidence rule (grisp/confidence.py),
on hand-made records whose numbers are worked out by hand."""

import pytest

from grisp import confidence, coverage


def record(f1, confidence_value=None, declined=False, guess_f1=None, lacks=(), retried=False):
    """An evaluate.py record: answered (a query), declined (a guess, no query) or without any query."""
    has_guess = confidence_value is not None
    return {
        "f1": f1,
        "sparql": "Q" if has_guess and not declined else None,
        "guess": "Q" if has_guess else None,
        "confidence": confidence_value,
        "declined": declined,
        "guess_f1": guess_f1,
        "index_lacks": list(lacks),
        "retried": retried,
    }


RUN = [
    record(1.0, 0.99),  # right, sure
    record(0.5, 0.9),  # half right
    record(0.0, 0.3, lacks=["Q1"], retried=True),  # wrong, on a question the index cannot name
    record(0.0, 0.2, declined=True, guess_f1=1.0),  # declined, although the guess was right
    record(0.0, None),  # no query found (dead end)
    record(0.0, None, lacks=["Q2"]),  # nothing found, rightly
    record(None, 0.95),  # gold empty: not scored, left out of everything
]


def test_summary_counts_answered_precision_wrong_and_declined():
    s = coverage.summary(RUN)
    assert s["answered"] == 3 and s["coverage"] == pytest.approx(3 / 6)
    assert s["precision"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert s["wrong"] == 1 and s["partial"] == 1
    assert s["declined"] == 3 and s["declined_for_confidence"] == 1
    assert s["index_lacks"] == {"questions": 2, "declined": 1, "wrong": 1}
    assert s["f1_index_names"] == pytest.approx((1.0 + 0.5 + 0.0 + 0.0) / 4)
    # with no threshold the declined guess (right) is answered: F1 over the 6 scored, and over the 4 named
    assert s["no_threshold"]["f1"] == pytest.approx((1.0 + 0.5 + 0.0 + 1.0 + 0.0 + 0.0) / 6)
    assert s["no_threshold"]["f1_index_names"] == pytest.approx((1.0 + 0.5 + 1.0 + 0.0) / 4)


def test_risk_coverage_answers_in_order_of_confidence_with_each_guess():
    points = coverage.risk_coverage(RUN)
    assert [p["threshold"] for p in points] == [0.99, 0.9, 0.3, 0.2]
    assert [p["answered"] for p in points] == [1, 2, 3, 4]
    assert [p["coverage"] for p in points] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6])
    # the declined guess counts with the F1 it would have scored (1.0)
    assert [p["precision"] for p in points] == pytest.approx([1.0, 0.75, 0.5, 2.5 / 4])
    assert coverage.at_coverage(points, 0.5)["threshold"] == 0.3 and coverage.at_coverage(points, 0.9) is None


def test_tied_confidences_enter_together():
    points = coverage.risk_coverage([record(1.0, 0.5), record(0.0, 0.5), record(1.0, 0.9)])
    assert [(p["threshold"], p["answered"]) for p in points] == [(0.9, 1), (0.5, 3)]


def test_without_retry_takes_the_retry_answers_back():
    records = coverage.without_retry(RUN)
    assert (
        coverage.summary(records)["answered"] == 2 and records[2]["guess"] is None and records[2]["f1"] == 0.0
    )
    assert records[0] is RUN[0]


def test_the_confidence_is_the_mean_choice_probability_and_declines_below_the_threshold():
    choices = [{"p": 0.9, "p_none": 0.05}, {"p": 0.4, "p_none": 0.5}]
    assert confidence.confidence(choices) == pytest.approx(0.65)
    assert confidence.confidence([{"p": None}]) == 1.0 and confidence.confidence([]) == 1.0  # no re-ranking
    assert confidence.confidence([{"p": 0.2}, {"p": None}]) == 0.2  # only the re-ranked ones count
    assert (
        confidence.decide(0.4, 0.5) and not confidence.decide(0.5, 0.5) and not confidence.decide(None, 0.5)
    )


def test_an_unnamed_entity_taken_below_none_makes_the_least_probability_the_confidence():
    """A namesake ("Jimmy Hoffa" taken as Jimmy Wales, below None) followed by a near-certain property: the
    least probability, not the mean. Named, or taken above None, or recorded without "named": the mean."""
    property_choice = {"p": 0.999, "p_none": 0.0001, "named": None}
    namesake = {"p": 0.0004, "p_none": 0.999, "named": False}
    assert confidence.confidence([namesake, property_choice]) == pytest.approx(0.0004)
    rewording = namesake | {"named": True}  # "Van Gogh" taken as Vincent van Gogh
    assert confidence.confidence([rewording, property_choice]) == pytest.approx((0.0004 + 0.999) / 2)
    above_none = {"p": 0.9, "p_none": 0.05, "named": False}
    assert confidence.confidence([above_none, property_choice]) == pytest.approx((0.9 + 0.999) / 2)
    recorded_before = {"p": 0.0004, "p_none": 0.999}
    assert confidence.confidence([recorded_before, property_choice]) == pytest.approx((0.0004 + 0.999) / 2)
