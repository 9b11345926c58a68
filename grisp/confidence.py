"""How sure GRISP is of an answer, and declining the unsure ones (docs/method.md section 6.10).

An answer's confidence is a number in [0, 1] made of what the search itself saw:
  - the re-ranker's probability of each chosen IRI (softmax over the shown hits and None, resolve.py),
    of which the least sure choice counts: one wrong placeholder makes the whole query wrong;
  - nothing else is added for the retry: a second-pass answer took at least one IRI ranked below None,
    so its least sure choice is below None's probability there, which the minimum already shows.
Without re-ranking there are no probabilities, and the confidence is 1 (nothing tells answers apart).

`judge` applies options.min_confidence: an answer below it is declined ("no confident answer"); its
query stays in `Answer.guess`, marked as declined in the trace and the JSON. evaluate.py --score-only
applies the same rule to recorded answers (`decide`).

    confidence(choices)                      # -> 0.93
    decide(0.42, min_confidence=0.5)         # -> True: declined
"""


def confidence(choices: list[dict]) -> float:
    """The confidence of a query from its choices (resolve.Resolution.choices: {"p", ...} per placeholder;
    p None without re-ranking): the least probability of a chosen IRI, 1.0 if none was re-ranked."""
    probabilities = [choice["p"] for choice in choices if choice.get("p") is not None]
    return min(probabilities, default=1.0)


def decide(confidence_value: float | None, min_confidence: float) -> bool:
    """Whether an answer of this confidence is declined (None: there is no answer to decline)."""
    return confidence_value is not None and confidence_value < min_confidence
