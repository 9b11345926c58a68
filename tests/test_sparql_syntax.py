"""sparql_syntax.py: tokenizer, compact / expand on query text alone (sending queries: test_sparql.py)."""
import pytest

import sparql_syntax


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
        ("var", "?x"), ("iri", "<http://e/a#b>"), ("string", '"a { # }"'), ("lang", "@en"),
        ("punct", "."), ("pname", "wd:Q1"), ("punct", "."), ("number", "5"), ("punct", ".")]
    assert [t.kind for t in sparql_syntax.tokenize("?a<?b && ?c<=3")] == ["var", "punct", "var", "punct", "var", "punct", "number"]

