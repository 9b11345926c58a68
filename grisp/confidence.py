"""How sure GRISP is of an answer, and declining the unsure ones (docs/method.md section 6.10).

An answer's confidence is a number in [0, 1] made of the re-ranker's probabilities of the IRIs chosen
for its query (each a softmax over the shown hits and None, resolve.py):

  - their mean, as a rule. A first-pass answer took every IRI above None, most with a probability near
    1. An answer of the second pass (options.retry) took at least one IRI below None, and what the next
    placeholders' re-ranking made of it tells a rewording from a wrong item: after the right entity
    (the question named it in other words) its property is chosen with near certainty, after a wrong
    one the fitting property is missing from the constraint and None wins again. The mean keeps that,
    where the least probability would not.
  - their least, if an entity was taken below None although none of its names holds the words the
    model wrote for it (the choice's "named", search.Item.named_by): "Jimmy Hoffa" taken as Jimmy
    Wales is a namesake the re-ranker rightly put below None, not a rewording, however sure the
    property after it is.

Both rules were chosen on the tune half (docs/method.md 6.10). Without re-ranking there are no
probabilities, and the confidence is 1 (nothing tells answers apart).

`judge` applies options.min_confidence: an answer below it is declined ("no confident answer"); its
query stays in `Answer.guess`, marked as declined in the trace and the JSON. evaluate.py --score-only
applies the same rule to recorded answers (`decide`).

    confidence([{"p": 0.99}, {"p": 0.87}])                                            # -> 0.93
    confidence([{"p": 0.001, "p_none": 0.99, "named": False}, {"p": 0.99}])          # -> 0.001
    decide(0.42, min_confidence=0.5)                                                  # -> True: declined
"""


def confidence(choices: list[dict]) -> float:
    """The confidence of a query from its choices (resolve.Resolution.choices: {"p", "p_none", "named"}
    per placeholder; p None without re-ranking): the mean probability of the chosen IRIs, their least if
    an unnamed one was taken below None, 1.0 if none was re-ranked."""
    probabilities = [choice["p"] for choice in choices if choice.get("p") is not None]
    if not probabilities:
        return 1.0
    if any(unnamed_below_none(choice) for choice in choices):
        return min(probabilities)
    return sum(probabilities) / len(probabilities)


def unnamed_below_none(choice: dict) -> bool:
    """Whether the choice took an entity the re-ranker put below None and no wording of its placeholder
    names (choices recorded before "named" existed count as named: their confidence is the mean)."""
    return choice.get("named") is False and choice["p"] is not None and choice["p"] < choice["p_none"]


def decide(confidence_value: float | None, min_confidence: float) -> bool:
    """Whether an answer of this confidence is declined (None: there is no answer to decline)."""
    return confidence_value is not None and confidence_value < min_confidence
