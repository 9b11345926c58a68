"""The KG-guided depth-first resolver (resolve.py) on a real oxigraph server over the demo KG, with a
scripted re-ranker standing in for the model: each test asserts the exact final query and the trace."""

import math
import subprocess
import sys
import time

import pytest

from common import defaults
from grisp.options import GrispError, Options
from grisp.prompts import mark_current
from grisp.resolve import Resolver
from grisp.skeleton import find_placeholders
from grisp.sparql import BadQuery, QueryTimeout, Result, ServerError, SparqlClient
from search import load_indices

WD = "http://www.wikidata.org/entity/"
FILM, GENRE, TARANTINO, KNOXVILLE = WD + "Q104123", WD + "Q351718", WD + "Q3772", WD + "Q185582"
DIRECTOR, BIRTHPLACE, DEATHPLACE = WD + "P57", WD + "P19", WD + "P20"
SKELETON = (
    "SELECT ?place WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?d . "
    "?d <iri>place of birth (wdt)</iri> ?place . }"
)
RESOLVED = "SELECT ?place WHERE { wd:Q104123 wdt:P57 ?d . ?d wdt:P19 ?place . }"


@pytest.fixture(scope="module")
def client(demo_endpoint):
    return SparqlClient(demo_endpoint)


@pytest.fixture(scope="module")
def indices(demo_endpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-index")
    subprocess.run(
        [
            sys.executable,
            str(defaults.REPO_DIR / "build_index.py"),
            "--endpoint",
            demo_endpoint,
            "--out",
            str(out),
            "--embed",
            "none",
        ],
        check=True,
        capture_output=True,
    )
    return load_indices(out)


class ScriptedReranker:
    """Scores alternatives by a preference table; None gets `none_score` (or a rule's verdict).

    `none_first(marked_query)` -> True makes None win for that prompt (the model saying "no fit")."""

    def __init__(self, preference: dict[str, float], none_score: float = 0.0, none_first=lambda q: False):
        self.preference, self.none_score, self.none_first = preference, none_score, none_first
        self.calls, self.resolved = [], []

    def __call__(self, question, marked_query, alternatives, resolved):
        self.calls.append((marked_query, [a.iri for a in alternatives]))
        self.resolved.append([(a.iri, a.shown_id, a.kind, a.label) for a in resolved])
        scores = [self.preference.get(a.iri, 1.0) for a in alternatives]
        return scores + [100.0 if self.none_first(marked_query) else self.none_score]


def events(resolution, name):
    return [e for e in resolution.trace if e["event"] == name]


def test_picks_the_film_over_the_genre(indices, client):
    reranker = ScriptedReranker({FILM: 9.0, GENRE: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", SKELETON)
    assert resolution.sparql == RESOLVED and resolution.verified is True
    assert [e["iri"] for e in events(resolution, "choose")] == [FILM, DIRECTOR, BIRTHPLACE]
    assert resolution.backtracks == 0 and resolution.failure is None
    assert {row["place"]["value"] for row in resolution.result.rows} == {KNOXVILLE}
    first = events(resolution, "placeholder")[0]
    assert first["kind"] == "entity" and {FILM, GENRE} <= {h[0] for h in first["hits"]}
    # the director search was constrained by the film's outgoing properties
    second = events(resolution, "placeholder")[1]
    assert second["kind"] == "property" and "wd:Q104123" in second["constraint"]
    assert second["constraint_size"] > 0
    # the current placeholder is marked for the re-ranker; earlier ones are resolved
    assert reranker.calls[1][0] == (
        "SELECT ?place WHERE { wd:Q104123 <rep>director (wdt)</rep> ?d . "
        "?d <iri>place of birth (wdt)</iri> ?place . }"
    )
    # and the items resolved so far reach it with their labels and kinds (prompt format v2 shows them)
    film, director = (
        (FILM, "wd:Q104123", "entity", "Pulp Fiction"),
        (DIRECTOR, "wdt:P57", "property", "director"),
    )
    assert reranker.resolved == [[], [film], [film, director]]


def test_the_resolution_records_each_choice_with_its_probabilities(indices, client):
    """Resolution.choices: per placeholder of the final query the chosen IRI, and the re-ranker's probability
    (softmax over the shown hits and None) of it and of None; without re-ranking none."""
    reranker = ScriptedReranker({FILM: 9.0, GENRE: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", SKELETON)
    assert [c["iri"] for c in resolution.choices] == [FILM, DIRECTOR, BIRTHPLACE]
    ranked = dict(events(resolution, "placeholder")[0]["reranked"])  # the first placeholder's scores
    weights = {iri: math.exp(score) for iri, score in ranked.items()}
    first = resolution.choices[0]
    assert first["p"] == pytest.approx(weights[FILM] / sum(weights.values()), rel=1e-3)
    assert first["p_none"] == pytest.approx(weights[None] / sum(weights.values()), rel=1e-3)
    # the entity placeholder's wording names the film; property placeholders' wordings name nothing
    assert [c["named"] for c in resolution.choices] == [True, None, None]
    plain = Resolver(indices, client, None, Options(rerank=False)).resolve("q", SKELETON)
    assert plain.sparql is not None and all(c["p"] is None and c["p_none"] is None for c in plain.choices)
    failed = Resolver(indices, client, ScriptedReranker({}, none_first=lambda q: True), Options()).resolve(
        "q", SKELETON
    )
    assert failed.sparql is None and failed.choices == []


def test_an_ask_question_is_not_constrained_so_a_no_resolves(indices, client):
    """As in the reference, only SELECT queries get constraint queries: the ASK below is false in the KG,
    and a constraint on the birthplace would only admit Tarantino's real one (a dead end)."""
    skeleton = "ASK { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> <iri>Paris</iri> . }"
    reranker = ScriptedReranker({TARANTINO: 9.0, BIRTHPLACE: 9.0, WD + "Q90": 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve(
        "was quentin tarantino born in paris?", skeleton
    )
    assert resolution.sparql == "ASK { wd:Q3772 wdt:P19 wd:Q90 . }" and resolution.result.boolean is False
    assert not any("constraint" in e for e in events(resolution, "placeholder"))


def test_backtracks_when_the_constrained_candidate_set_is_empty(indices, client):
    # the re-ranker prefers the genre; the genre has no director, so the constrained search finds nothing
    reranker = ScriptedReranker({GENRE: 9.0, FILM: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", SKELETON)
    assert resolution.sparql == RESOLVED
    assert [e["iri"] for e in events(resolution, "choose")] == [GENRE, FILM, DIRECTOR, BIRTHPLACE]
    dead = events(resolution, "placeholder")[1]
    assert dead["placeholder"] == "<iri>director (wdt)</iri>" and dead["hits"] == [] and dead["kept"] == []
    assert "wd:Q351718" in dead["constraint"]
    assert resolution.backtracks == 1
    assert events(resolution, "backtrack")[0]["to"] == "<iri>Pulp Fiction</iri>"


def test_backtracks_when_none_ranks_first(indices, client):
    # without constraints the genre gets director candidates, but the model puts None on top there
    reranker = ScriptedReranker(
        {GENRE: 9.0, FILM: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0},
        none_first=lambda q: "wd:Q351718 <rep>director" in q,
    )
    options = Options(constrained=False)
    resolution = Resolver(indices, client, reranker, options).resolve("q", SKELETON)
    assert resolution.sparql == RESOLVED
    assert [e["iri"] for e in events(resolution, "choose")] == [GENRE, FILM, DIRECTOR, BIRTHPLACE]
    rejected = events(resolution, "placeholder")[1]
    assert rejected["hits"] and rejected["kept"] == [] and rejected["reranked"][0][0] is None
    assert "constraint" not in rejected
    assert resolution.backtracks == 1
    # after backtracking the remaining alternatives were re-ranked (a new re-ranker call without the genre)
    backtrack_call = reranker.calls[2]
    assert backtrack_call[0].startswith("SELECT ?place WHERE { <rep>Pulp Fiction</rep>")
    assert GENRE not in backtrack_call[1] and FILM in backtrack_call[1]


def test_none_margin_keeps_alternatives_just_below_none_for_backtracking(indices, client):
    # the genre is chosen first and is a dead end (it has no director); the film scores below None
    reranker = ScriptedReranker({GENRE: 9.0, FILM: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0}, none_score=7.0)
    strict = Resolver(indices, client, reranker, Options()).resolve("q", SKELETON)
    assert strict.failure == "dead_end" and events(strict, "placeholder")[0]["kept"] == [GENRE]
    resolution = Resolver(indices, client, reranker, Options(none_margin=3.0)).resolve("q", SKELETON)
    assert events(resolution, "placeholder")[0]["kept"] == [GENRE, FILM]  # 5.0 > 7.0 - 3.0
    assert resolution.sparql == RESOLVED and resolution.backtracks == 1
    assert (
        Resolver(indices, client, reranker, Options(none_margin=1.9)).resolve("q", SKELETON).failure
        == "dead_end"
    )
    with pytest.raises(GrispError, match="none_margin = -1.0 must be >= 0"):
        Options(none_margin=-1.0)


def test_a_merged_placeholder_searches_its_next_wording_when_the_first_finds_nothing(indices, client):
    skeleton = (
        "SELECT ?x WHERE { <iri>zzqx<sep>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }"
    )
    reranker = ScriptedReranker({TARANTINO: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", skeleton)
    assert resolution.sparql == "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . }" and resolution.backtracks == 0
    assert events(resolution, "placeholder")[0]["hits"] == []
    [wording] = events(resolution, "wording")
    assert wording["wording"] == "Quentin Tarantino" and wording["kept"][0] == TARANTINO
    # the re-ranking prompt shows the first wording, as the best beam wrote it
    assert reranker.calls[0][0] == "SELECT ?x WHERE { <rep>zzqx</rep> <iri>place of birth (wdt)</iri> ?x . }"


def test_a_next_wording_offers_only_items_not_tried_and_comes_before_a_dead_end(indices, client):
    # "place of death" resolves, but Tarantino is alive: empty. "death place" finds P20 again, which was
    # tried; "place of birth" finds P19.
    skeleton = (
        "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> "
        "<iri>place of death<sep>death place<sep>place of birth (wdt)</iri> ?x . }"
    )
    reranker = ScriptedReranker({TARANTINO: 9.0, DEATHPLACE: 9.0, BIRTHPLACE: 8.0})
    resolution = Resolver(indices, client, reranker, Options(constrained=False, top_k=1)).resolve(
        "q", skeleton
    )
    assert resolution.sparql == "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . }"
    assert [e["iri"] for e in events(resolution, "choose")] == [TARANTINO, DEATHPLACE, BIRTHPLACE]
    again, birth = events(resolution, "wording")
    assert again["wording"] == "death place" and again["hits"][0][0] == DEATHPLACE and again["kept"] == []
    assert birth["wording"] == "place of birth" and birth["kept"] == [BIRTHPLACE]
    assert resolution.backtracks == 1  # only the rejected final query; a next wording is no backtrack


def test_a_next_wording_is_searched_within_the_same_constraint(indices, client):
    # the constraint admits only directors: "Pulp Fiction" finds no director, "Quentin Tarantino" does
    skeleton = "SELECT ?film WHERE { ?film <iri>director (wdt)</iri> <iri>zzqx<sep>Pulp Fiction<sep>Quentin Tarantino</iri> . }"
    reranker = ScriptedReranker({FILM: 9.0, TARANTINO: 9.0, DIRECTOR: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", skeleton)
    assert resolution.sparql == "SELECT ?film WHERE { ?film wdt:P57 wd:Q3772 . }"
    assert [e["iri"] for e in events(resolution, "choose")] == [DIRECTOR, TARANTINO]
    film, director = events(resolution, "wording")
    assert film["wording"] == "Pulp Fiction" and FILM not in [iri for iri, _, _ in film["hits"]]
    assert director["wording"] == "Quentin Tarantino" and director["kept"][0] == TARANTINO
    assert "wdt:P57" in events(resolution, "placeholder")[1]["constraint"]


def test_backtracking_into_a_merged_placeholder_moves_on_to_its_next_wording(indices, client):
    # the genre has no director (constraint empty: a dead end); back at the first placeholder its first
    # wording is used up, so its second is searched
    skeleton = (
        "SELECT ?place WHERE { <iri>science fiction film<sep>Pulp Fiction</iri> <iri>director (wdt)</iri> ?d . "
        "?d <iri>place of birth (wdt)</iri> ?place . }"
    )
    scifi = WD + "Q471839"
    reranker = ScriptedReranker({scifi: 9.0, FILM: 9.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options(top_k=1)).resolve("q", skeleton)
    assert resolution.sparql == RESOLVED and resolution.backtracks == 1
    assert [e["iri"] for e in events(resolution, "choose")] == [scifi, FILM, DIRECTOR, BIRTHPLACE]
    [wording] = events(resolution, "wording")
    assert wording["wording"] == "Pulp Fiction" and wording["kept"] == [FILM]


def test_a_placeholder_whose_wordings_all_fail_is_a_dead_end(indices, client):
    skeleton = "SELECT ?x WHERE { <iri>zzqx<sep>qqzz</iri> <iri>place of birth (wdt)</iri> ?x . }"
    resolution = Resolver(indices, client, ScriptedReranker({}), Options()).resolve("q", skeleton)
    assert resolution.sparql is None and resolution.failure == "dead_end"
    assert [e["wording"] for e in events(resolution, "wording")] == ["qqzz"]


def test_final_validation_rejects_an_empty_result(indices, client):
    # Tarantino is alive: "place of death" resolves but returns nothing; validation backtracks to P19
    skeleton = "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }"
    reranker = ScriptedReranker({TARANTINO: 9.0, DEATHPLACE: 9.0, BIRTHPLACE: 8.0})
    resolution = Resolver(indices, client, reranker, Options(constrained=False)).resolve("q", skeleton)
    assert resolution.sparql == "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . }"
    validations = events(resolution, "validate")
    assert [v["ok"] for v in validations] == [False, True]
    assert (
        validations[0]["query"] == "SELECT ?x WHERE { wd:Q3772 wdt:P20 ?x . }" and validations[0]["rows"] == 0
    )
    assert resolution.backtracks == 1


def test_final_validation_rejects_a_row_with_nothing_bound(indices, client):
    # MAX over no match answers one row that binds nothing: empty, as metrics.py scores it
    class UnboundOnDeathplace:
        def query(self, sparql, deadline=None):
            if "wdt:P20" in sparql and "<" not in sparql:  # the resolved query; constraints pass through
                return Result(variables=["x"], rows=[{}])
            return client.query(sparql, deadline)

    skeleton = "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }"
    reranker = ScriptedReranker({TARANTINO: 9.0, DEATHPLACE: 9.0, BIRTHPLACE: 8.0})
    resolution = Resolver(indices, UnboundOnDeathplace(), reranker, Options(constrained=False)).resolve(
        "q", skeleton
    )
    assert resolution.sparql == "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . }"
    assert [v["ok"] for v in events(resolution, "validate")] == [False, True]


@pytest.mark.parametrize("error", [QueryTimeout("read timed out"), ServerError("HTTP 503")])
def test_final_validation_accepts_a_busy_endpoint(indices, client, error):
    # as in the reference: a timeout or 5xx on the final query means the KG was busy, not the query wrong
    class BusyOnFullQueries:
        def query(self, sparql, deadline=None):
            if "wdt:P19" in sparql and "<" not in sparql:  # the resolved query; constraints pass through
                raise error
            return client.query(sparql, deadline)

    skeleton = "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }"
    reranker = ScriptedReranker({TARANTINO: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, BusyOnFullQueries(), reranker, Options(constrained=False)).resolve(
        "q", skeleton
    )
    assert resolution.sparql == "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x . }" and resolution.result is None
    assert resolution.verified is False  # accepted without a result: unverified
    [validation] = events(resolution, "validate")
    assert validation["ok"] and type(error).__name__ in validation["accepted_error"]


def test_final_query_at_the_end_of_the_budget_gets_a_fair_wait(indices, client):
    # the final query comes back empty 0.3 s after the time budget's end. Cut at the budget's end, its
    # timeout would pass as a busy KG's; with its least wait it is seen to be empty: the skeleton times out
    budget_end = time.monotonic() + 1.0

    class EmptyJustAfterTheBudget:
        def query(self, sparql, deadline=None):
            if "wdt:P19" in sparql and "<" not in sparql:  # the resolved query; constraints pass through
                answer_at = budget_end + 0.3
                time.sleep(max(min(answer_at, deadline) - time.monotonic(), 0))
                if deadline < answer_at:
                    raise QueryTimeout("no answer within the rest of the time budget")
                return Result(variables=["x"], rows=[])
            return client.query(sparql, deadline)

    skeleton = "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }"
    reranker = ScriptedReranker({TARANTINO: 9.0, BIRTHPLACE: 9.0})
    resolver = Resolver(indices, EmptyJustAfterTheBudget(), reranker, Options(constrained=False))
    resolution = resolver.resolve("q", skeleton, deadline=budget_end)
    assert resolution.sparql is None and resolution.failure == "timeout"
    [validation] = events(resolution, "validate")
    assert not validation["ok"] and validation["rows"] == 0
    assert resolution.trace[-1] == {"event": "timeout"}


def test_final_validation_rejects_a_bad_query(indices, client):
    class Rejecting:
        def query(self, sparql, deadline=None):
            raise BadQuery("parse error")

    skeleton = "SELECT ?x WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . }"
    reranker = ScriptedReranker({TARANTINO: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, Rejecting(), reranker, Options(constrained=False)).resolve("q", skeleton)
    assert resolution.sparql is None and not any(v["ok"] for v in events(resolution, "validate"))


def test_exhausted_skeleton_fails_without_backtracking_past_the_first_placeholder(indices, client):
    skeleton = "SELECT ?x WHERE { <iri>pulp fiction</iri> <iri>director (wdt)</iri> ?x . }"
    reranker = ScriptedReranker({}, none_first=lambda q: "<rep>director" in q)
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", skeleton)
    assert resolution.sparql is None and resolution.failure == "dead_end"
    assert resolution.trace[-1] == {"event": "exhausted"}
    first = events(resolution, "placeholder")[0]
    assert len(events(resolution, "choose")) == len(first["kept"])  # every kept alternative was tried


def test_no_backtracking_gives_up_at_the_first_dead_end(indices, client):
    reranker = ScriptedReranker({GENRE: 9.0, FILM: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options(backtracking=False)).resolve("q", SKELETON)
    assert resolution.sparql is None and resolution.backtracks == 0
    assert [e["iri"] for e in events(resolution, "choose")] == [GENRE]


def test_without_reranking_the_index_order_is_taken(indices, client):
    resolution = Resolver(indices, client, None, Options(rerank=False)).resolve("q", SKELETON)
    first = events(resolution, "placeholder")[0]
    assert events(resolution, "choose")[0]["iri"] == first["hits"][0][0]
    assert "reranked" not in first


def test_without_kg_guidance_nothing_is_executed(indices, client):
    class NoClient:
        def query(self, sparql, deadline=None):
            raise AssertionError(f"no query may run without KG guidance: {sparql}")

    reranker = ScriptedReranker({FILM: 9.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, NoClient(), reranker, Options(kg_guidance=False)).resolve("q", SKELETON)
    assert resolution.sparql == RESOLVED and resolution.result is None and resolution.verified is None


def test_timeout_stops_the_search(indices, client):
    reranker = ScriptedReranker({FILM: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", SKELETON, deadline=0.0)
    assert resolution.sparql is None and resolution.failure == "timeout"


def test_a_skeleton_with_service_is_refused_before_any_search(indices, client):
    """Before: every filling of its placeholders was searched, re-ranked and refused by the client in turn
    (a whole budget of model calls for a skeleton no filling of which could be sent)."""

    class NoClient:
        def query(self, sparql, deadline=None):
            raise AssertionError(f"nothing may be sent: {sparql}")

    skeleton = (
        "SELECT ?x ?xLabel WHERE { <iri>Quentin Tarantino</iri> <iri>place of birth (wdt)</iri> ?x . "
        'SERVICE wikibase:label { bd:serviceParam wikibase:language "en" . } }'
    )
    reranker = ScriptedReranker({})
    resolution = Resolver(indices, NoClient(), reranker, Options()).resolve("q", skeleton)
    assert resolution.sparql is None and resolution.failure == "dead_end" and reranker.calls == []
    assert [e["event"] for e in resolution.trace] == ["refused"]


def test_no_search_or_reranking_starts_after_the_budget_ran_out_in_a_constraint_query(indices, client):
    """Before: the budget's end during a constraint query was swallowed as a constraint error, and an
    unconstrained search and a re-ranking call (seconds of model time on a CPU) still followed."""
    budget_end = time.monotonic() + 1.0

    class SlowConstraints:
        def query(self, sparql, deadline=None):
            if "?candidate" in sparql:  # a constraint query: runs until the budget ends
                time.sleep(max(deadline - time.monotonic(), 0))
                raise QueryTimeout("no answer within the rest of the time budget")
            return client.query(sparql, deadline)

    reranker = ScriptedReranker({FILM: 9.0})
    resolution = Resolver(indices, SlowConstraints(), reranker, Options()).resolve(
        "q", SKELETON, deadline=budget_end
    )
    assert resolution.failure == "timeout" and resolution.trace[-1] == {"event": "timeout"}
    assert len(reranker.calls) == 1  # the film's; not the director's after the budget
    director = events(resolution, "placeholder")[1]
    assert "QueryTimeout" in director["constraint_error"] and "hits" not in director


def test_mark_current_writes_the_current_placeholder():
    ph = find_placeholders(SKELETON)[1]
    assert mark_current(SKELETON, ph) == SKELETON.replace(
        "<iri>director (wdt)</iri>", "<rep>director (wdt)</rep>"
    )


def test_a_choice_no_wording_names_is_recorded_as_unnamed(indices, client):
    """The search finds Pulp Fiction for "Pulp Nonsense" (one keyword matches), but none of the film's
    names holds "nonsense": the choice is recorded as not named (confidence.py caps such an answer)."""
    skeleton = SKELETON.replace("<iri>Pulp Fiction</iri>", "<iri>Pulp Nonsense</iri>")
    reranker = ScriptedReranker({FILM: 9.0, GENRE: 5.0, DIRECTOR: 9.0, BIRTHPLACE: 9.0})
    resolution = Resolver(indices, client, reranker, Options()).resolve("q", skeleton)
    assert resolution.choices[0]["iri"] == FILM and resolution.choices[0]["named"] is False
