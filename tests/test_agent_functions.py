"""grasp/functions.py and grasp/examples.py: every function of the GRASP agent against the demo KG (a
real oxigraph server and a prefix index built from it), know_before_use, result tables, bad arguments."""

import json
import random
import time

import pytest

from grasp.config import AgentConfig
from grasp.examples import ExampleIndex
from grasp.functions import FunctionError, Functions, KnowledgeGraph, find_examples, table, unknown_iris
from grisp.sparql import SparqlClient
from tests.agent_helpers import bag_of_words, demo_kg

WD = "http://www.wikidata.org/entity/"


@pytest.fixture(scope="module")
def kg(demo_endpoint):
    return demo_kg(demo_endpoint)


def run(kg, name, known=None, **args):
    known = set() if known is None else known
    return Functions({kg.name: kg}, AgentConfig()).call(name, {"kg": kg.name, **args}, known)


def test_search_entity_finds_the_film_and_makes_it_known(kg):
    known = set()
    text = run(kg, "search_entity", known, query="pulp fiction")
    assert text.splitlines()[1].startswith("1. Pulp Fiction (wd:Q104123)")
    assert "pulp fiction (wd:Q351718)" in text  # the genre of the same name is listed too
    assert WD + "Q104123" in known and WD + "Q351718" in known


def test_search_property_shows_the_truthy_variant_and_knows_all_variants(kg):
    known = set()
    text = run(kg, "search_property", known, query="director")
    assert "director (wdt:P57)" in text
    assert WD + "P57" in known  # canonical: wdt:P57, p:P57, ps:P57 ... are all known now
    assert (
        unknown_iris(kg, "SELECT ?x WHERE { wd:Q104123 p:P57 ?s . ?s ps:P57 ?x }", known | {WD + "Q104123"})
        == []
    )


def test_search_property_of_entity_searches_only_the_entitys_properties(kg):
    everything = run(kg, "search_property", query="born")
    of_film = run(kg, "search_property_of_entity", entity="wd:Q104123", query="born")
    assert "place of birth (wdt:P19)" in everything
    assert "place of birth" not in of_film  # a film has no place of birth
    assert "director (wdt:P57)" in run(kg, "search_property_of_entity", entity="wd:Q104123", query="director")


def test_search_object_of_property_searches_only_its_objects(kg):
    text = run(kg, "search_object_of_property", property="wdt:P57", query="tarantino")
    assert text.splitlines()[1].startswith("1. Quentin Tarantino (wd:Q3772)")
    # the genre "pulp fiction" is no director's work... nor a director: not among wdt:P57's objects
    assert run(kg, "search_object_of_property", property="wdt:P57", query="pulp fiction") == "No results"


def test_list_shows_diverse_popular_triples_with_labels(kg):
    known = set()
    text = run(kg, "list", known, subject="wd:Q104123")
    lines = text.splitlines()
    assert (
        lines[0].startswith("24 triples match, showing 10") and lines[1] == "| subject | property | object |"
    )
    assert len(lines) == 12 and all(line.startswith("| Pulp Fiction (wd:Q104123) |") for line in lines[2:])
    properties = [line.split(" | ")[1] for line in lines[2:]]
    assert len({p.split("(")[0] for p in properties[:5]}) == 5  # the first rows show different properties
    assert WD + "Q3772" in known  # an IRI a listed triple showed
    by_property = run(kg, "list", property="wdt:P57", object="wd:Q3772")
    assert "Pulp Fiction (wd:Q104123) | director (wdt:P57) | Quentin Tarantino (wd:Q3772)" in by_property
    assert run(kg, "list", subject="wd:Q104123", property="wdt:P57", object="wd:Q2001") == "No triples match"


def test_execute_shows_a_table_capped_in_rows_and_columns(kg):
    known = set()
    options = AgentConfig(result_max_rows=4, result_max_columns=2, know_before_use=False)
    functions = Functions({kg.name: kg}, options)
    query = "SELECT ?f ?d ?x WHERE { ?f wdt:P57 ?d . BIND(1 AS ?x) } ORDER BY ?f"
    text = functions.call("execute", {"kg": kg.name, "sparql": query}, known)
    lines = text.splitlines()
    assert (
        lines[0]
        == "Got 51 rows and 3 columns, showing the first and last 2 rows and first and last 1 columns:"
    )
    assert lines[1] == "| f | ... | x |" and lines[4] == "| ... | ... | ... |" and len(lines) == 7
    assert len(known) == 4  # only the films shown (the directors' column was not shown)
    ask = functions.call("execute", {"kg": kg.name, "sparql": "ASK { wd:Q104123 wdt:P57 wd:Q3772 }"}, known)
    assert ask == "ASK result: yes"
    empty = functions.call(
        "execute", {"kg": kg.name, "sparql": "SELECT ?x WHERE { wd:Q104123 wdt:P19 ?x }"}, known
    )
    assert empty == "Got no rows (columns: x)"


def test_execute_reports_failing_queries_as_text(kg):
    functions = Functions({kg.name: kg}, AgentConfig(know_before_use=False))
    bad = functions.call("execute", {"kg": kg.name, "sparql": "SELECT ?x WHERE { ?x ?p "}, set())
    assert bad.startswith("The SPARQL query failed (BadQuery)")
    update = functions.call("execute", {"kg": kg.name, "sparql": "DELETE WHERE { ?s ?p ?o }"}, set())
    assert update.startswith("The SPARQL query failed (ForbiddenQuery)")


def test_know_before_use_refuses_iris_no_result_showed(kg):
    functions = Functions({kg.name: kg}, AgentConfig(know_before_use=True))
    query = "SELECT ?d WHERE { wd:Q104123 wdt:P57 ?d . ?d rdfs:label ?l }"
    with pytest.raises(FunctionError, match="wd:Q104123, wdt:P57"):
        functions.call("execute", {"kg": kg.name, "sparql": query}, set())
    known = set()
    functions.call("search_entity", {"kg": kg.name, "query": "pulp fiction"}, known)
    with pytest.raises(FunctionError, match="IRIs that no earlier function result showed: wdt:P57"):
        functions.call("execute", {"kg": kg.name, "sparql": query}, known)  # rdfs:label is common vocabulary
    functions.call("search_property", {"kg": kg.name, "query": "director"}, known)
    assert "Quentin Tarantino (wd:Q3772)" in functions.call(
        "execute", {"kg": kg.name, "sparql": query}, known
    )
    # full IRIs and declared prefixes count the same; PREFIX lines themselves are not uses
    declared = (
        "PREFIX e: <http://www.wikidata.org/entity/>\n"
        "ASK { e:Q104123 <http://www.wikidata.org/prop/direct/P57> ?d }"
    )
    assert unknown_iris(kg, declared, known) == []
    assert unknown_iris(kg, "ASK { wd:Q1 wdt:P57 ?d }", known) == ["wd:Q1"]


def test_bad_arguments_are_function_errors_with_a_fix(kg):
    with pytest.raises(FunctionError, match="not an IRI for the subject"):
        run(kg, "list", subject="Pulp Fiction")
    with pytest.raises(FunctionError, match="unknown knowledge graph 'dblp'; use one of wikidata"):
        Functions({kg.name: kg}, AgentConfig()).call("list", {"kg": "dblp"}, set())
    with pytest.raises(FunctionError, match="search query is empty"):
        run(kg, "search_entity", query="  ")
    # a literal object is quoted for the user; a full URL becomes an IRI
    assert kg.term("Pulp Fiction", "object") == '"Pulp Fiction"'
    assert kg.term("http://www.wikidata.org/entity/Q1", "subject") == "<http://www.wikidata.org/entity/Q1>"
    no_index = KnowledgeGraph("bare", kg.client)
    with pytest.raises(FunctionError, match="no search index"):
        Functions({"bare": no_index}, AgentConfig()).call(
            "search_entity", {"kg": "bare", "query": "x"}, set()
        )
    definitions = Functions({"bare": no_index}, AgentConfig()).definitions()
    assert [d["function"]["name"] for d in definitions] == ["execute", "list"]


def test_unreachable_endpoint_and_constraint_failure_are_text_not_crashes(kg):
    dead = KnowledgeGraph("dead", SparqlClient("http://127.0.0.1:9/query", retries=0), kg.indices)
    functions = Functions({"dead": dead}, AgentConfig(know_before_use=False))
    assert "EndpointUnreachable" in functions.call("execute", {"kg": "dead", "sparql": "ASK {}"}, set())
    args = {"kg": "dead", "entity": "wd:Q104123", "query": "director"}
    text = functions.call("search_property_of_entity", args, set())
    assert text.startswith("Searching without the constraint") and "director (wdt:P57)" in text


def test_table_shows_literals_as_sparql_terms(kg):
    xsd = "http://www.w3.org/2001/XMLSchema#"
    rows = [
        {"x": {"type": "literal", "value": "1994-10-14T00:00:00Z", "datatype": xsd + "dateTime"}},
        {"x": {"type": "literal", "value": "Paris", "xml:lang": "en"}},
        {"x": {"type": "literal", "value": "42", "datatype": xsd + "integer"}},
    ]
    text = table(kg, ["x"], rows, set(), 10, 10)
    assert text.splitlines()[2:] == ['| "1994-10-14T00:00:00Z"^^xsd:dateTime |', '| "Paris"@en |', "| 42 |"]


def test_examples_similar_and_random_and_their_iris_become_known(kg, tmp_path):
    samples = [
        {"question": "who directed pulp fiction?", "sparql": "SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x }"},
        {"question": "where was tarantino born?", "sparql": "SELECT ?x WHERE { wd:Q3772 wdt:P19 ?x }"},
        {"question": "what genre is titanic?", "sparql": "SELECT ?x WHERE { wd:Q44578 wdt:P136 ?x }"},
    ]
    ExampleIndex.build(samples, tmp_path / "ex", bag_of_words)
    kg_ex = KnowledgeGraph(
        kg.name, kg.client, kg.indices, examples=ExampleIndex(tmp_path / "ex", bag_of_words)
    )
    known = set()
    text = find_examples(kg_ex, "where was quentin tarantino born?", 1, random.Random(0), known)
    assert (
        text
        == "Example 1:\nQuestion: where was tarantino born?\nSPARQL:\nSELECT ?x WHERE { wd:Q3772 wdt:P19 ?x }"
    )
    assert known == {WD + "Q3772", WD + "P19"}
    two = find_examples(kg_ex, None, 2, random.Random(0), set())
    assert two.count("Question:") == 2
    functions = Functions({kg.name: kg_ex}, AgentConfig(num_examples=1))
    assert "find_similar_examples" in [d["function"]["name"] for d in functions.definitions()]
    args = {"kg": kg.name, "question": "who directed pulp fiction"}
    assert "wd:Q104123" in functions.call("find_similar_examples", args, set())
    with pytest.raises(FunctionError, match="has no examples"):
        find_examples(kg, "q", 1, random.Random(0), set())


def test_the_example_index_follows_its_source_file(tmp_path, capsys):
    source = tmp_path / "pairs.jsonl"
    pair = {
        "id": "1",
        "question": "who directed pulp fiction?",
        "sparql": "SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x }",
    }
    source.write_text(json.dumps(pair) + "\n")
    assert [
        e["question"] for e in ExampleIndex.open(str(source), tmp_path / "ex", bag_of_words).examples
    ] == [pair["question"]]
    assert "building" in capsys.readouterr().out
    ExampleIndex.open(str(source), tmp_path / "ex", bag_of_words)
    assert "building" not in capsys.readouterr().out  # unchanged: reused
    source.write_text(json.dumps(pair | {"question": "who made pulp fiction?"}) + "\n")  # edited
    assert (
        ExampleIndex.open(str(source), tmp_path / "ex", bag_of_words).examples[0]["question"]
        == "who made pulp fiction?"
    )
    assert not (tmp_path / "ex.tmp").exists()
    source.unlink()  # the source gone: the index as it is
    assert (
        ExampleIndex.open(str(source), tmp_path / "ex", bag_of_words).examples[0]["question"]
        == "who made pulp fiction?"
    )
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "notes.txt").write_text(
        "mine"
    )  # a directory with other things in it is not replaced
    with pytest.raises(FileExistsError, match="holds more than an example index"):
        ExampleIndex.build([pair], tmp_path / "shared", bag_of_words)
    assert (tmp_path / "shared" / "notes.txt").exists()


def test_a_query_that_cannot_be_encoded_is_a_function_error_and_the_deadline_reaches_the_client(kg):
    from grasp.functions import FunctionError

    with pytest.raises(FunctionError, match="cannot be sent as UTF-8"):
        kg.query('SELECT * WHERE { ?s ?p "\ud83d" }')
    seen = {}

    class Recording:
        timeout = None

        def query(self, sparql, deadline=None):
            seen["deadline"] = deadline

    KnowledgeGraph(kg.name, Recording(), kg.indices).query("ASK {}", deadline=time.monotonic() + 5)
    assert seen["deadline"] is not None  # retries stop at the agent's time limit
