"""constraints.py: constraint queries over many skeleton shapes, and on real oxigraph endpoints
(the paper's example step by step; every demo gold query)."""

import json

import pytest

from common import defaults
from grisp.constraints import constraint_query
from grisp.skeleton import Placeholder, find_placeholders, parses, skeletonize, substitute
from grisp.sparql import SparqlClient
from grisp.sparql_syntax import PREFIXES

WD, WDT = PREFIXES["wd"], PREFIXES["wdt"]
PH = "<iri>X</iri>"  # the placeholder under test in the shape table (`$PH` in its text)


def first(text: str) -> Placeholder:
    return find_placeholders(text)[0]


C, LIMIT = "SELECT DISTINCT ?candidate WHERE", "LIMIT 131073"
CONSTRAINTS = [
    # the paper's examples
    (
        "SELECT ?place WHERE { wd:Q104123 $PH ?d . ?d <iri>place of birth (wdt)</iri> ?place . }",
        f"{C} {{ wd:Q104123 ?candidate ?d . }} {LIMIT}",
    ),
    (
        "SELECT ?place WHERE { wd:Q104123 wdt:P57 ?d . ?d $PH ?place . }",
        f"{C} {{ wd:Q104123 wdt:P57 ?d . ?d ?candidate ?place . }} {LIMIT}",
    ),
    # the first placeholder of a skeleton has nothing to be constrained by
    ("SELECT ?place WHERE { $PH <iri>director (wdt)</iri> ?d . }", None),
    # only connected triples are kept; continuations are expanded; literals kept verbatim
    (
        'SELECT ?x WHERE { ?x wdt:P31 wd:Q5 ; rdfs:label "a . b"@en . ?y wdt:P1 ?z . ?x $PH ?w }',
        f'{C} {{ ?x wdt:P31 wd:Q5 . ?x rdfs:label "a . b"@en . ?x ?candidate ?w . }} {LIMIT}',
    ),
    (
        "SELECT ?x WHERE { ?x wdt:P31 wd:Q5 , $PH }",
        f"{C} {{ ?x wdt:P31 wd:Q5 . ?x wdt:P31 ?candidate . }} {LIMIT}",
    ),
    (
        "SELECT ?x WHERE { wd:Q1 p:P161 ?s . ?s ps:P161 wd:Q2 ; pq:P453 $PH . }",
        f"{C} {{ wd:Q1 p:P161 ?s . ?s ps:P161 wd:Q2 . ?s pq:P453 ?candidate . }} {LIMIT}",
    ),
    (
        "SELECT ?x WHERE { ?x wdt:P31 wd:Q5 ; wdt:P27 ?c . ?c $PH wd:Q1 }",
        f"{C} {{ ?x wdt:P31 wd:Q5 . ?x wdt:P27 ?c . ?c ?candidate wd:Q1 . }} {LIMIT}",
    ),
    # later placeholders in the same triple become fresh variables
    (
        "SELECT ?x WHERE { ?x wdt:P31 ?t ; $PH <iri>Y</iri> }",
        f"{C} {{ ?x wdt:P31 ?t . ?x ?candidate ?free . }} {LIMIT}",
    ),
    # FILTER / OPTIONAL / BIND / VALUES / MINUS / UNION in the prefix are left out
    (
        "SELECT ?x WHERE { ?x wdt:P569 ?d . FILTER(YEAR(?d) > 1900) OPTIONAL { ?x wdt:P1 wd:Q1 } "
        "BIND(1 AS ?one) VALUES ?x { wd:Q3 } MINUS { ?x wdt:P2 ?z } { ?x wdt:P3 ?q } UNION { ?x wdt:P4 ?q } ?x $PH wd:Q5 }",
        f"{C} {{ ?x wdt:P569 ?d . ?x ?candidate wd:Q5 . }} {LIMIT}",
    ),
    # property paths in the prefix are kept; COUNT queries; PREFIX lines carried over
    (
        "SELECT * WHERE { ?x wdt:P31 / wdt:P279 * wd:Q5 . ?x $PH ?y }",
        f"{C} {{ ?x wdt:P31 / wdt:P279 * wd:Q5 . ?x ?candidate ?y . }} {LIMIT}",
    ),
    # only SELECT queries are constrained (as in the reference): an ASK for a false fact must stay resolvable
    ("ASK { ?x wdt:P31 / wdt:P279 * wd:Q5 . ?x $PH ?y }", None),
    ("PREFIX ex: <http://ex.org/> ASK { wd:Q1 wdt:P19 $PH }", None),
    ("DESCRIBE ?x WHERE { wd:Q1 wdt:P19 ?x . ?x $PH ?y }", None),
    (
        "SELECT (COUNT(?x) AS ?n) WHERE { ?x wdt:P31 $PH } ORDER BY ?n",
        f"{C} {{ ?x wdt:P31 ?candidate . }} {LIMIT}",
    ),
    (
        "PREFIX ex: <http://ex.org/> SELECT ?x WHERE { ?x ex:p ?y . ?y $PH ?z }",
        f"PREFIX ex: <http://ex.org/> {C} {{ ?x ex:p ?y . ?y ?candidate ?z . }} {LIMIT}",
    ),
    (
        "SELECT ?candidate WHERE { ?candidate wdt:P31 ?y . ?y $PH ?z }",
        f"SELECT DISTINCT ?candidate2 WHERE {{ ?candidate wdt:P31 ?y . ?y ?candidate2 ?z . }} {LIMIT}",
    ),
    # unsupported -> None: inside paths, OPTIONAL, UNION, FILTER, VALUES, nested groups, subqueries, [ ]
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . ?x wdt:P31 / $PH * wd:Q5 }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . ?x (wdt:P31|$PH) wd:Q5 }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . OPTIONAL { ?x $PH ?y } }", None),
    ("SELECT ?x WHERE { { ?x wdt:P31 $PH } UNION { ?x wdt:P279 wd:Q5 } }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . FILTER(?x != $PH) }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . FILTER NOT EXISTS { ?x $PH ?z } }", None),
    ("SELECT ?x WHERE { VALUES ?x { $PH } ?x wdt:P31 ?y }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 { ?x $PH ?y } }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . { SELECT ?x WHERE { ?x $PH ?y } } }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 [ $PH ?o ] }", None),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 } ORDER BY $PH", None),
    ("CONSTRUCT { ?x ?p ?o } WHERE { ?x wdt:P31 $PH }", None),
]


@pytest.mark.parametrize("text, expected", CONSTRAINTS)
def test_constraint_query(text, expected):
    text = text.replace("$PH", PH)
    ph = next(p for p in find_placeholders(text) if p.text == PH)
    query = constraint_query(text, ph)
    assert query == expected
    assert query is None or parses(query)


# Texts that are not valid SPARQL have no constraint query: each malformed token below would be copied
# into the query, which would not parse either (the first was found by the hypothesis test of
# test_skeleton.py). The second column is the same text made valid, which does get a constraint.
MALFORMED = [  # (found as ASK queries; written as SELECT since only a SELECT is constrained)
    (
        "SELECT * { ?x SELECTwdt:P31 ?x . ?x wdt:P31 ?x . FILTER(?x != <iri>film</iri>) . ?x wdt:P31 ?x ; wdt:P1 $PH . }",
        "SELECT * { ?x wdt:P31 ?x . ?x wdt:P31 ?x . FILTER(?x != <iri>film</iri>) . ?x wdt:P31 ?x ; wdt:P1 $PH . }",
    ),
    (
        "SELECT * { ?x foo:p ?y . ?x wdt:P1 $PH }",
        "PREFIX foo: <http://foo.org/> SELECT * { ?x foo:p ?y . ?x wdt:P1 $PH }",
    ),
    (
        "SELECT * { ?x wdt:P31 [ SELECT ] . ?x wdt:P1 $PH }",
        "SELECT * { ?x wdt:P31 [ wdt:P2 ?o ] . ?x wdt:P1 $PH }",
    ),
    (
        'SELECT * { ?x wdt:P31 "a" ^^ SELECT . ?x wdt:P1 $PH }',
        'SELECT * { ?x wdt:P31 "a" ^^ xsd:string . ?x wdt:P1 $PH }',
    ),
]


@pytest.mark.parametrize("malformed, valid", MALFORMED)
def test_a_text_that_does_not_parse_has_no_constraint_query(malformed, valid):
    malformed, valid = malformed.replace("$PH", PH), valid.replace("$PH", PH)
    assert not parses(malformed) and parses(valid)
    assert constraint_query(malformed, find_placeholders(malformed)[-1]) is None
    query = constraint_query(valid, find_placeholders(valid)[-1])
    assert query is not None and parses(query) and "?candidate" in query, query


TINY_KG = """@prefix wd: <http://www.wikidata.org/entity/> .
@prefix wdt: <http://www.wikidata.org/prop/direct/> .
wd:Q104123 wdt:P57 wd:Q3772 ; wdt:P136 wd:Q351718 .
wd:Q3772 wdt:P19 wd:Q185582 ; wdt:P27 wd:Q30 .
wd:Q351718 wdt:P279 wd:Q1 .
"""


def test_constraint_queries_against_oxigraph(oxigraph_server, tmp_path_factory):
    # resolving the paper's example step by step on a real endpoint
    kg = tmp_path_factory.mktemp("kg") / "kg.ttl"
    kg.write_text(TINY_KG)
    client = SparqlClient(oxigraph_server(kg))
    text = (
        "SELECT ?place WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?d . "
        "?d <iri>place of birth (wdt)</iri> ?place . }"
    )
    text = substitute(text, first(text), WD + "Q104123")
    allowed = client.query(constraint_query(text, first(text))).iris()
    assert sorted(allowed) == [WDT + "P136", WDT + "P57"]
    text = substitute(text, first(text), WD + "P57")
    allowed = client.query(constraint_query(text, first(text))).iris()
    assert sorted(allowed) == [WDT + "P19", WDT + "P27"]
    text = substitute(text, first(text), WD + "P19")
    assert client.query(text).iris() == [WD + "Q185582"]


def test_constraints_admit_the_gold_items_on_the_demo_kg(demo_endpoint):
    """Resolving each demo gold query with its own IRIs, every constraint query admits the gold IRI."""
    questions = defaults.DEMO_DIR / "questions.jsonl"  # committed
    client, checked = SparqlClient(demo_endpoint), 0
    for line in questions.read_text().splitlines():
        gold = json.loads(line)["sparql"]
        if client.query(gold).boolean is False:
            continue  # a false ASK: its facts are not in the KG, so no constraint can admit them
        s = skeletonize(gold, lambda iri: "label")
        text = s.skeleton
        for iri in s.iris:
            query = constraint_query(text, first(text))
            if query is not None:
                assert iri in client.query(query).iris(), (text, query)
                checked += 1
            text = substitute(text, first(text), iri)
        assert not client.query(text).is_empty, text
    assert checked >= 30, f"only {checked} constraint queries were checked"
