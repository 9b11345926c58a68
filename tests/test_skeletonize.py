"""grisp/skeleton.py: gold query -> skeleton on real WikiWebQuestions queries (copied here), and the
round trip back through position inference, constraint queries and substitution."""

import pytest

from grisp.constraints import constraint_query
from grisp.positions import infer_position
from grisp.skeleton import (
    Placeholder,
    find_placeholders,
    parses,
    query_iris,
    skeletonize,
    split_variant,
    substitute,
)
from grisp.sparql_syntax import PREFIXES, declared_prefixes, expand, tokenize

WD, WDT = PREFIXES["wd"], PREFIXES["wdt"]


def first(text: str) -> Placeholder:
    return find_placeholders(text)[0]


WWQ = [  # from WWQ train, benchmarks.load_benchmark("wwq-train") (WebQTrn-0, -1, -144, -17, -924, -301, -103, -560, -1263, -407)
    "PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX wd: <http://www.wikidata.org/entity/> SELECT DISTINCT ?x WHERE { wd:Q34086 wdt:P3373 ?x . ?x wdt:P21 wd:Q6581097 . }",
    "PREFIX ps: <http://www.wikidata.org/prop/statement/> PREFIX pq: <http://www.wikidata.org/prop/qualifier/> PREFIX wd: <http://www.wikidata.org/entity/> PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX p: <http://www.wikidata.org/prop/> SELECT DISTINCT ?x WHERE { ?p wdt:P8345 wd:Q462 ; p:P161 ?y . ?y ps:P161 wd:Q37876 ; pq:P453 ?x . }",
    'PREFIX xsd: <http://www.w3.org/2001/XMLSchema#> PREFIX ps: <http://www.wikidata.org/prop/statement/> PREFIX pq: <http://www.wikidata.org/prop/qualifier/> PREFIX wd: <http://www.wikidata.org/entity/> PREFIX p: <http://www.wikidata.org/prop/> SELECT DISTINCT ?x WHERE { ?x p:P39 ?p . ?p ps:P39 wd:Q740126 ; pq:P580 ?y ; pq:P582 ?z . FILTER ( ( ?y < "2012-01-01T00:00:00Z" ^^ xsd:dateTime ) && ( ?z >= "2011-01-01T00:00:00Z" ^^ xsd:dateTime ) ) }',
    "PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX wd: <http://www.wikidata.org/entity/> SELECT DISTINCT ?x WHERE { ?x wdt:P53 wd:Q34821 ; wdt:P570 ?y . } ORDER BY ?y LIMIT 1",
    "PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX wd: <http://www.wikidata.org/entity/> SELECT DISTINCT ?x WHERE { { wd:Q76 wdt:P69 ?x . ?x wdt:P31 / wdt:P279 * wd:Q149566 . } UNION { wd:Q76 wdt:P69 ?x . ?x wdt:P31 / wdt:P279 * wd:Q159334 . } }",
    "PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX wd: <http://www.wikidata.org/entity/> SELECT DISTINCT ?x ( COUNT ( DISTINCT * ) AS ?y ) WHERE { wd:Q159821 wdt:P527 ?p . ?p wdt:P276 ?x . ?x wdt:P31 / wdt:P279 * wd:Q515 . } GROUP BY ?x HAVING ( ?y = 2 )",
    "PREFIX ps: <http://www.wikidata.org/prop/statement/> PREFIX pq: <http://www.wikidata.org/prop/qualifier/> PREFIX wd: <http://www.wikidata.org/entity/> PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX p: <http://www.wikidata.org/prop/> SELECT DISTINCT ?x WHERE { ?x p:P39 ?p . ?p ps:P39 wd:Q4416090 . ?p pq:P768 ?y . ?y wdt:P131 wd:Q1581 . FILTER NOT EXISTS { ?p pq:P582 ?z . } }",
    "PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX wd: <http://www.wikidata.org/entity/> SELECT ( COUNT ( * ) AS ?x ) WHERE { ?p wdt:P361 + wd:Q271805 ; wdt:P527 ?x . }",
    'PREFIX wdt: <http://www.wikidata.org/prop/direct/> PREFIX rdfs: <http://www.w3.org/2000/01/rdf-schema#> PREFIX wd: <http://www.wikidata.org/entity/> SELECT DISTINCT ?x WHERE { { wd:Q6107 wdt:P570 ?y ; rdfs:label ?x . FILTER ( LANGMATCHES ( LANG ( ?x ) , "EN" ) ) } UNION { wd:Q179157 wdt:P570 ?y ; rdfs:label ?x . FILTER ( LANGMATCHES ( LANG ( ?x ) , "EN" ) ) } } ORDER BY ?y LIMIT 1',
]
LABELS = {
    "Q34086": "Justin Bieber",
    "P3373": "sibling",
    "P21": "sex or gender",
    "Q6581097": "male",
    "P8345": "media franchise",
    "Q462": "Star Wars",
    "P161": "cast member",
    "Q37876": "Natalie Portman",
    "P453": "character role",
    "P39": "position held",
    "Q740126": "President of Brazil",
    "P580": "start time",
    "P582": "end time",
    "P53": "family",
    "Q34821": "royal house",
    "P570": "date of death",
    "Q76": "Barack Obama",
    "P69": "educated at",
    "P31": "instance of",
    "P279": "subclass of",
    "Q149566": "middle school",
    "Q159334": "secondary school",
    "Q159821": "Summer Olympic Games",
    "P527": "has part(s)",
    "P276": "location",
    "Q515": "city",
    "Q4416090": "United States representative",
    "P768": "electoral district",
    "P131": "located in the administrative territorial entity",
    "Q1581": "Colorado",
    "P361": "part of",
    "Q271805": "Catholic Church",
    "Q6107": "Henry I",
    "Q179157": "Stephen",
}


def name_for(iri: str) -> str | None:
    return LABELS.get(iri[len(WD) :]) if iri.startswith(WD) else None


def full_iri_tokens(query: str) -> list[str]:
    """A query's tokens without PREFIX lines, prefixed names expanded: equal for equal queries."""
    tokens, out, prefixes = tokenize(query), [], {**PREFIXES, **declared_prefixes(tokenize(query))}
    skip = {i + k for i, t in enumerate(tokens) if t.text.upper() == "PREFIX" for k in range(3)}
    for i, t in enumerate(tokens):
        if i not in skip:
            out.append(f"<{expand(t.text, prefixes)}>" if t.kind == "pname" else t.text)
    return out


def test_skeletonize_examples():
    s = skeletonize(WWQ[1], name_for)
    assert s.skeleton == (
        "SELECT DISTINCT ?x WHERE { ?p <iri>media franchise (wdt)</iri> <iri>Star Wars</iri> ; "
        "<iri>cast member (p)</iri> ?y . ?y <iri>cast member (ps)</iri> <iri>Natalie Portman</iri> ; "
        "<iri>character role (pq)</iri> ?x . }"
    )
    assert (
        s.iris
        == [
            WDT + "P8345",
            WD + "Q462",
            PREFIXES["p"] + "P161",
            PREFIXES["ps"] + "P161",
            WD + "Q37876",
            PREFIXES["pq"] + "P453",
        ]
        and s.unknown == []
    )
    s = skeletonize(WWQ[2], name_for)  # xsd stays verbatim (its PREFIX line is dropped: PREFIXES has it)
    assert s.skeleton.startswith("SELECT DISTINCT ?x WHERE { ?x <iri>position held (p)</iri> ?p .")
    assert '"2012-01-01T00:00:00Z" ^^ xsd:dateTime' in s.skeleton and "PREFIX" not in s.skeleton
    assert query_iris(WWQ[0]) == [WD + "Q34086", WDT + "P3373", WDT + "P21", WD + "Q6581097"]


@pytest.mark.parametrize("gold", WWQ)
def test_wwq_round_trip_positions_and_constraints(gold):
    s = skeletonize(gold, name_for)
    assert s.unknown == [] and parses(s.skeleton) and "PREFIX" not in s.skeleton
    assert len(find_placeholders(s.skeleton)) == len(s.iris) == len(query_iris(gold))
    text = s.skeleton
    for iri in s.iris:  # resolve with the gold items, left to right, as the resolver would
        ph = first(text)
        canonical, variant = split_variant(iri)
        assert ph.variant == variant and ph.label == LABELS[canonical[len(WD) :]]
        position = infer_position(text, ph)
        assert position == "property" if variant else position in ("subject", "object"), (text, position)
        query = constraint_query(text, ph)
        assert query is None or (parses(query) and query.endswith("LIMIT 131073"))
        text = substitute(text, ph, canonical)
    assert full_iri_tokens(text) == full_iri_tokens(gold)


def test_skeletonize_reports_unknown_iris_and_keeps_vocabularies():
    gold = WWQ[-1].replace("wd:Q179157", "wd:Q999999999") + "  # <http://example.org/in-a-comment>"
    s = skeletonize(gold, name_for)
    assert s.unknown == [WD + "Q999999999"] and "wd:Q999999999" in s.skeleton and "rdfs:label" in s.skeleton
    service = (
        "PREFIX wd: <http://www.wikidata.org/entity/> PREFIX wikibase: <http://wikiba.se/ontology#> "
        "PREFIX bd: <http://www.bigdata.com/rdf#> PREFIX schema: <http://schema.org/> SELECT DISTINCT ?x WHERE "
        '{ SERVICE wikibase:label { bd:serviceParam wikibase:language "en" . wd:Q4675 schema:description ?x . } }'
    )
    s = skeletonize(service, lambda iri: "Gambia" if iri == WD + "Q4675" else None)
    assert s.unknown == ["http://www.bigdata.com/rdf#serviceParam"] and s.iris == [WD + "Q4675"]
    # a custom prefix name for a common vocabulary is rewritten, since PREFIX lines are dropped
    s = skeletonize(
        "PREFIX r: <http://www.w3.org/2000/01/rdf-schema#> SELECT ?l WHERE { wd:Q76 r:label ?l . ex:a ?p ?l }",
        name_for,
    )
    assert s.skeleton == "SELECT ?l WHERE { <iri>Barack Obama</iri> rdfs:label ?l . ex:a ?p ?l }"
    assert s.unknown == ["ex:a"]
