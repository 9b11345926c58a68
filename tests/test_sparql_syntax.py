"""sparql_syntax.py: tokenizer, compact / expand, the read-only check and the bracket / triple
helpers, on query text alone (sending queries: test_sparql.py)."""

import pytest

from grisp import sparql_syntax
from grisp.sparql_syntax import (
    ForbiddenQuery,
    SparqlError,
    Unsupported,
    check_read_only,
    closers,
    skip_group,
    tokenize,
    top_level_triples,
    where_start,
)


def test_compact_expand_and_tokenizer():
    assert sparql_syntax.compact("http://www.wikidata.org/prop/direct/P19") == "wdt:P19"
    assert sparql_syntax.compact("http://www.wikidata.org/prop/statement/P161") == "ps:P161"
    assert sparql_syntax.compact("http://www.wikidata.org/entity/Q42") == "wd:Q42"
    assert sparql_syntax.compact("http://example.org/a/b") == "<http://example.org/a/b>"
    for iri in ("http://www.wikidata.org/prop/qualifier/P453", "http://www.w3.org/2000/01/rdf-schema#label"):
        assert sparql_syntax.expand(sparql_syntax.compact(iri)) == iri
    with pytest.raises(ValueError, match="unknown prefix 'foo'"):
        sparql_syntax.expand("foo:bar")
    tokens = sparql_syntax.tokenize('?x <http://e/a#b> "a { # }"@en . # comment }\nwd:Q1. 5.')
    assert [(t.kind, t.text) for t in tokens] == [
        ("var", "?x"),
        ("iri", "<http://e/a#b>"),
        ("string", '"a { # }"'),
        ("lang", "@en"),
        ("punct", "."),
        ("pname", "wd:Q1"),
        ("punct", "."),
        ("number", "5"),
        ("punct", "."),
    ]
    assert [t.kind for t in sparql_syntax.tokenize("?a<?b && ?c<=3")] == [
        "var",
        "punct",
        "var",
        "punct",
        "var",
        "punct",
        "number",
    ]


def test_check_read_only_on_text():
    check_read_only('SELECT ?service WHERE { ?service <http://e/SERVICE> "DELETE" } # INSERT')
    for query in (
        "SELECT * WHERE { SERVICE <http://e/sparql> { ?s ?p ?o } }",
        "drop all",
        # a comment ends at a carriage return as at a newline (SPARQL 1.1, section 19.4)
        "SELECT * WHERE { ?s ?p ?o # c\rSERVICE <http://e/sparql> { ?a ?b ?c } }",
        # a placeholder token would swallow what lies before a `</iri>` in a comment
        "BASE <http://e/> SELECT * WHERE { ?s <iri> ?o . SERVICE <http://e/sparql> { ?a ?b ?c } } #</iri>",
        "SELECT ?x WHERE { ?x <iri>director</iri> ?y }",
        # codepoint escapes spell characters anywhere in a query (SPARQL 1.1, section 19.2)
        r"SELECT * WHERE { \u0053ERVICE <http://e/sparql> { ?s ?p ?o } }",
        r"\U00000049NSERT DATA { <http://e/a> <http://e/b> <http://e/c> }",
        # an escape in an IRI would end the IRI token early and start a "comment" at its `#`
        r"SELECT * WHERE { <http://e/\u0041#> SERVICE <http://e/sparql> { ?s ?p ?o } }",
    ):
        with pytest.raises(ForbiddenQuery, match="refusing") as error:
            check_read_only(query)
        assert isinstance(error.value, SparqlError)
    assert [t.text for t in tokenize("?a # note\r?b")] == ["?a", "?b"]
    check_read_only(r'SELECT ?x WHERE { ?x <http://e/name> "caf\u00e9 \uZZZZ" }')  # harmless escapes pass


def test_brackets_and_top_level_triples():
    tokens = tokenize(
        "PREFIX e: <http://e/> SELECT (COUNT(?x) AS ?n) WHERE { ?x e:p ?y ; e:q 1 , ?z . "
        "OPTIONAL { ?x e:r ?w } FILTER(?y > 2) ?y e:s / e:t* [ e:u ?v ] }"
    )
    q, lo = where_start(tokens)
    assert tokens[q].text == "SELECT" and tokens[lo].text == "{"
    hi = skip_group(tokens, lo) - 1
    assert hi == len(tokens) - 1
    triples = [
        " ".join(" ".join(t.text for t in tokens[a:b]) for a, b in triple)
        for triple in top_level_triples(tokens, lo + 1, hi)
    ]
    assert triples == ["?x e:p ?y", "?x e:q 1", "?x e:q ?z", "?y e:s / e:t * [ e:u ?v ]"]
    assert closers(tokenize("ASK { ?x e:p [ e:q (")) == ")]}" and closers(tokenize("ASK { ) }")) is None
    with pytest.raises(Unsupported):
        where_start(tokenize("CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o }"))
    with pytest.raises(Unsupported):
        skip_group(tokenize("{ ?s ?p ?o"), 0)


def test_query_key_tells_the_same_query_written_otherwise():
    from grisp.sparql_syntax import query_key

    one = "PREFIX e: <http://www.wikidata.org/entity/>\nselect ?person where { e:Q1 wdt:P19 ?person . } # a comment"
    same = (
        "SELECT $x WHERE{<http://www.wikidata.org/entity/Q1> <http://www.wikidata.org/prop/direct/P19> ?x.}"
    )
    assert query_key(one) == query_key(same)
    assert query_key(one) != query_key(same.replace("Q1>", "Q2>"))  # another item
    assert query_key("ASK { ?a ?b ?c . }") == query_key("ASK { ?a ?b ?c }") != query_key("ASK { ?a ?b '.' }")
    assert query_key("SELECT ?a ?b WHERE { ?a wdt:P1 ?b }") != query_key(
        "SELECT ?a ?b WHERE { ?b wdt:P1 ?a }"
    )
    assert query_key("SELECT ?a WHERE { ?a wdt:P1 'x' }") != query_key("SELECT ?a WHERE { ?a wdt:P1 'X' }")
