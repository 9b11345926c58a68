"""What an evaluation answered, how precisely, and what it declined (docs/evaluation.md, "Precision and
declining").

F1 over all questions scores a wrong answer and no answer alike; a person asking is better served by
"no confident answer" than by a confident wrong one. So every evaluation also reports, over its scored
records (evaluate.py's predictions: "sparql" the answer given, None when there is none; "f1"):

    answered    questions with an answer (coverage: answered / scored)
    precision   mean F1 of the answered questions
    wrong       answered with F1 0 (no gold row), partial: 0 < F1 < 1
    declined    questions without an answer: no query found, or declined for low confidence
    index_lacks questions whose entity or property the index cannot name (wwq-dev-real's
                info.index_lacks): there declining is the right outcome

and, as the confidence threshold moves (`risk_coverage`), the precision at each coverage level: the
questions are answered in order of confidence, each with the query found ("guess", declined or not).

    summary(records)["precision"]
    for point in risk_coverage(records): point["coverage"], point["precision"], point["threshold"]
"""

import statistics


def answered(record: dict) -> bool:
    """Whether the record gave an answer (a query, not declined)."""
    return record.get("sparql") is not None


def summary(records: list[dict]) -> dict:
    """The counts of the module docstring over the records with an F1 (scored)."""
    scored = [r for r in records if r.get("f1") is not None]
    given = [r for r in scored if answered(r)]
    lacking = [r for r in scored if r.get("index_lacks")]
    named = [r for r in scored if not r.get("index_lacks")]
    return {
        "answered": len(given),
        "coverage": len(given) / len(scored) if scored else None,
        "precision": statistics.fmean(r["f1"] for r in given) if given else None,
        "wrong": sum(r["f1"] == 0 for r in given),
        "partial": sum(0 < r["f1"] < 1 for r in given),
        "declined": len(scored) - len(given),
        "declined_for_confidence": sum(bool(r.get("declined")) for r in scored),
        "index_lacks": {
            "questions": len(lacking),
            "declined": sum(not answered(r) for r in lacking),
            "wrong": sum(answered(r) and r["f1"] == 0 for r in lacking),
        },
        # F1 over the questions whose entities the index can name (all, if no record says otherwise)
        "f1_index_names": statistics.fmean(r["f1"] for r in named) if named else None,
        # the same with nothing declined for confidence (every guess answered): the system with no threshold
        "no_threshold": {
            "f1": statistics.fmean(undeclined_f1(r) for r in scored) if scored else None,
            "f1_index_names": statistics.fmean(undeclined_f1(r) for r in named) if named else None,
        },
    }


def undeclined_f1(record: dict) -> float:
    """The record's F1 had its answer not been declined for confidence."""
    return record["guess_f1"] if record.get("declined") else record["f1"]


def guess_f1(record: dict) -> float | None:
    """The F1 the record's guess scores (its answer's F1 unless it was declined); None without a guess."""
    if record.get("guess") is None:
        return None
    return undeclined_f1(record)


def risk_coverage(records: list[dict]) -> list[dict]:
    """Precision against coverage as the threshold moves: for each distinct confidence of a guess, from the
    highest down, {"threshold", "answered", "coverage", "precision"} when every guess of at least that
    confidence is answered (coverage over the scored records; a record without a guess never is)."""
    scored = [r for r in records if r.get("f1") is not None]
    guesses = sorted(
        ((r["confidence"], guess_f1(r)) for r in scored if guess_f1(r) is not None), key=lambda g: -g[0]
    )
    points, total = [], 0.0
    for i, (threshold, f1) in enumerate(guesses):
        total += f1
        if i + 1 == len(guesses) or guesses[i + 1][0] < threshold:  # all ties of this confidence are in
            points.append(
                {
                    "threshold": threshold,
                    "answered": i + 1,
                    "coverage": (i + 1) / len(scored),
                    "precision": total / (i + 1),
                }
            )
    return points


def without_retry(records: list[dict]) -> list[dict]:
    """The records as the paper's search (options.retry off) would have left them: the retry runs only
    after every skeleton failed, so its answers become questions without a query (F1 0, no guess)."""
    return [
        r
        | {
            "sparql": None,
            "guess": None,
            "confidence": None,
            "declined": False,
            "retried": False,
            "f1": 0.0 if r.get("f1") is not None else None,
        }
        if r.get("retried")
        else r
        for r in records
    ]


def at_coverage(points: list[dict], coverage: float) -> dict | None:
    """The point of `risk_coverage` with the least coverage that reaches `coverage` (None if none does)."""
    return next((p for p in points if p["coverage"] >= coverage - 1e-12), None)  # points: coverage ascending
