"""positions.py: the position of a placeholder (subject / property / object / unknown) over many
skeleton shapes."""

import pytest

from grisp.positions import infer_position
from grisp.skeleton import find_placeholders

PH = "<iri>X</iri>"  # the placeholder under test in the shape table (`$PH` in its text)

POSITIONS = [
    # the paper's example, placeholder by placeholder
    (
        "SELECT ?place WHERE { $PH <iri>director (wdt)</iri> ?d . ?d <iri>place of birth (wdt)</iri> ?place . }",
        "subject",
    ),
    ("SELECT ?place WHERE { wd:Q104123 $PH ?d . ?d <iri>place of birth (wdt)</iri> ?place . }", "property"),
    ("SELECT ?place WHERE { wd:Q104123 wdt:P57 ?d . ?d $PH ?place . }", "property"),
    ("SELECT ?x WHERE { wd:Q104123 wdt:P57 $PH }", "object"),
    # `;` and `,` continuations, statements with p/ps/pq
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 ; $PH ?y }", "property"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 , $PH }", "object"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . $PH wdt:P31 ?x }", "subject"),
    ("SELECT ?x WHERE { wd:Q1 p:P161 ?s . ?s ps:P161 wd:Q2 ; pq:P453 $PH . }", "object"),
    ("SELECT ?x WHERE { wd:Q1 p:P161 ?s . ?s ps:P161 wd:Q2 ; $PH ?x . }", "property"),
    ("SELECT ?x WHERE { ?x a $PH }", "object"),
    # property paths
    ("SELECT ?x WHERE { ?x wdt:P31 / wdt:P279 * $PH }", "object"),
    ("SELECT ?x WHERE { ?x wdt:P31 / $PH * wd:Q5 }", "property"),
    ("SELECT ?x WHERE { ?x (wdt:P31|$PH) wd:Q5 }", "property"),
    ("SELECT ?x WHERE { ?x ^$PH wd:Q5 }", "property"),
    ("SELECT ?x WHERE { ?x !($PH) ?o }", "property"),
    ("SELECT ?x WHERE { ?p wdt:P361 + $PH ; wdt:P527 ?x . }", "object"),
    # OPTIONAL, FILTER, BIND, VALUES, UNION, MINUS, nested groups, subqueries
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . OPTIONAL { ?x $PH ?y } }", "property"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . OPTIONAL { $PH ?p ?y } }", "subject"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . FILTER(?x != $PH) }", "unknown"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . FILTER($PH) }", "unknown"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 FILTER(?x IN ($PH, wd:Q2)) }", "unknown"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . FILTER NOT EXISTS { ?x $PH ?z } }", "property"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . BIND($PH AS ?y) }", "unknown"),
    ("SELECT ?x WHERE { VALUES ?x { wd:Q1 $PH } ?x wdt:P31 ?y }", "unknown"),
    ("SELECT ?x WHERE { { ?x wdt:P31 $PH } UNION { ?x wdt:P279 wd:Q5 } }", "object"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 MINUS { ?x $PH wd:Q6 } }", "property"),
    ("SELECT ?x WHERE { { { $PH wdt:P31 ?x } } }", "subject"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 . { SELECT ?x WHERE { ?x $PH ?y } } }", "property"),
    ("SELECT ?x WHERE { ?x wdt:P31 [ $PH ?o ] }", "property"),
    ("SELECT ?x WHERE { ?x wdt:P31 ( $PH ) }", "unknown"),  # a collection member
    # ASK, COUNT, GROUP BY, ORDER BY
    ("ASK { wd:Q1 wdt:P31 $PH }", "object"),
    ("SELECT (COUNT(?x) AS ?n) WHERE { ?x $PH wd:Q5 }", "property"),
    (
        "SELECT ?x (COUNT(*) AS ?y) WHERE { wd:Q1 wdt:P527 ?p . ?p $PH ?x } GROUP BY ?x HAVING (?y = 2)",
        "property",
    ),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 } ORDER BY $PH", "unknown"),
    ("SELECT $PH WHERE { ?x ?p ?o }", "unknown"),
    ("SELECT ?x WHERE { ?x wdt:P31 wd:Q5 ) $PH", "unknown"),  # unbalanced
]


@pytest.mark.parametrize("text, expected", POSITIONS)
def test_infer_position(text, expected):
    text = text.replace("$PH", PH)
    ph = next(p for p in find_placeholders(text) if p.text == PH)
    assert infer_position(text, ph) == expected
