"""How sure GRISP is of an answer, and declining the unsure ones (docs/method.md section 6.10).

An answer's confidence is a number in [0, 1]: the mean of the re-ranker's probabilities of the IRIs
chosen for its query (each a softmax over the shown hits and None, resolve.py). A first-pass answer
took every IRI above None, most with a probability near 1. An answer of the second pass (options.retry)
took at least one IRI below None, and what the next placeholders' re-ranking made of it tells a
rewording from a wrong item: after the right entity (the question named it in other words) its
property is chosen with near certainty, after a wrong namesake the fitting property is missing from
the constraint and None wins again. The mean keeps that, where the least probability would not; the
choice among the mean, the geometric mean, the least and the last probability was made on the tune
half (docs/method.md 6.10). Without re-ranking there are no probabilities, and the confidence is 1
(nothing tells answers apart).

`judge` applies options.min_confidence: an answer below it is declined ("no confident answer"); its
query stays in `Answer.guess`, marked as declined in the trace and the JSON. evaluate.py --score-only
applies the same rule to recorded answers (`decide`).

    confidence([{"p": 0.99}, {"p": 0.87}])   # -> 0.93
    decide(0.42, min_confidence=0.5)         # -> True: declined
"""


def confidence(choices: list[dict]) -> float:
    """The confidence of a query from its choices (resolve.Resolution.choices: {"p", ...} per placeholder;
    p None without re-ranking): the mean probability of the chosen IRIs, 1.0 if none was re-ranked."""
    probabilities = [choice["p"] for choice in choices if choice.get("p") is not None]
    return sum(probabilities) / len(probabilities) if probabilities else 1.0


def decide(confidence_value: float | None, min_confidence: float) -> bool:
    """Whether an answer of this confidence is declined (None: there is no answer to decline)."""
    return confidence_value is not None and confidence_value < min_confidence
