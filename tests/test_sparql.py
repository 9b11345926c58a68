"""sparql.py: the client against a real oxigraph server, and every fault against a fake one
(query text itself: test_sparql_syntax.py)."""

import json
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

import pytest
from conftest import free_port, start_http_server, stop_http_server

from grisp import sparql
from grisp.sparql import (
    BadQuery,
    EndpointUnreachable,
    ForbiddenQuery,
    InvalidResponse,
    QueryTimeout,
    ServerError,
    SparqlClient,
)

KG = """@prefix wd: <http://www.wikidata.org/entity/> .
@prefix wdt: <http://www.wikidata.org/prop/direct/> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix xsd: <http://www.w3.org/2001/XMLSchema#> .
wd:Q104123 wdt:P57 wd:Q3772 ; rdfs:label "Pulp Fiction"@en ; wdt:P577 "1994-10-14"^^xsd:date .
wd:Q3772 wdt:P19 wd:Q185582 .
""" + "".join(
    f"<http://e/{i}> <http://e/next> <http://e/{i + 1}> .\n" for i in range(100)
)  # 105 triples: a 4-way cross product is 1e8 rows


@pytest.fixture(scope="module")
def kg_url(oxigraph_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("kg") / "kg.ttl"
    path.write_text(KG)
    return oxigraph_server(path, timeout_s=1)  # a tiny server-side timeout for the timeout test


# ---------------------------------------------------------------------------- real server


def test_select_ask_and_terms_against_oxigraph(kg_url):
    for method in ("post", "get"):
        client = SparqlClient(kg_url, method=method)
        # no PREFIX lines: the client adds wd/wdt/rdfs, which oxigraph does not predefine
        result = client.query("SELECT ?d ?place WHERE { wd:Q104123 wdt:P57 ?d . ?d wdt:P19 ?place }")
        assert result.variables == ["d", "place"]
        assert result.rows == [
            {
                "d": {"type": "uri", "value": "http://www.wikidata.org/entity/Q3772"},
                "place": {"type": "uri", "value": "http://www.wikidata.org/entity/Q185582"},
            }
        ]
        assert client.query("ASK { wd:Q3772 wdt:P19 wd:Q185582 }").boolean is True
        assert client.query("ASK { wd:Q3772 wdt:P19 wd:Q1 }").boolean is False
    terms = client.query("SELECT ?l ?t WHERE { wd:Q104123 rdfs:label ?l ; wdt:P577 ?t }").rows[0]
    assert terms["l"] == {"type": "literal", "value": "Pulp Fiction", "xml:lang": "en"}
    assert terms["t"] == {
        "type": "literal",
        "value": "1994-10-14",
        "datatype": "http://www.w3.org/2001/XMLSchema#date",
    }
    empty = client.query("SELECT ?x WHERE { wd:Q1 wdt:P1 ?x }")
    assert empty.is_empty and not client.query("ASK { wd:Q1 wdt:P1 ?x }").is_empty
    unbound = client.query("SELECT (MAX(?t) AS ?m) WHERE { wd:Q1 wdt:P577 ?t }")  # one row, nothing bound
    assert unbound.rows == [{}] and unbound.is_empty
    assert not client.query("SELECT (COUNT(?t) AS ?n) WHERE { wd:Q1 wdt:P577 ?t }").is_empty  # a count of 0


def test_bad_query_carries_server_message(kg_url):
    with pytest.raises(BadQuery, match=r"HTTP 400 .*error at"):
        SparqlClient(kg_url).query("SELECT ?x WHERE { ?x wdt:P31 }")


def test_server_timeout_is_query_timeout(kg_url):
    # oxigraph cancels after 1 s and reports it inside an HTTP 200 answer with truncated JSON
    heavy = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i . ?j ?k ?l }"
    with pytest.raises(QueryTimeout, match="cancelled"):
        SparqlClient(kg_url, retries=0).query(heavy)


# ---------------------------------------------------------------------------- fake server


class FakeEndpoint:
    """A local HTTP server answering from a list of (status, body, delay_s); records requests."""

    def __init__(self, answers: list[tuple[int, str, float]]):
        self.answers, self.requests = answers, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                fake.requests.append(parse_qs(body)["query"][0])
                status, text, delay = fake.answers[min(len(fake.requests), len(fake.answers)) - 1]
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/sparql-results+json")
                    self.send_header("Content-Length", str(len(text.encode())))
                    self.end_headers()
                    self.wfile.write(text.encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the read timeout test)

            def log_message(self, *args):
                pass

        self.server, self.url = start_http_server(Handler)

    def close(self):
        stop_http_server(self.server)


@pytest.fixture
def fake():
    servers = []

    def make(*answers):
        servers.append(FakeEndpoint(list(answers)))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


ROW = json.dumps(
    {"head": {"vars": ["x"]}, "results": {"bindings": [{"x": {"type": "uri", "value": "http://e/1"}}]}}
)


def test_endpoint_down_is_unreachable():
    client = SparqlClient(f"http://127.0.0.1:{free_port()}/query", retries=1, backoff_s=0.01)
    with pytest.raises(EndpointUnreachable, match="after 2 attempts"):
        client.query("SELECT * WHERE { ?s ?p ?o }")


def test_500_is_retried_then_raised(fake):
    server = fake((500, "internal error", 0.0))
    with pytest.raises(ServerError, match="HTTP 500.*internal error.*after 3 attempts"):
        SparqlClient(server.url, retries=2, backoff_s=0.01).query("SELECT * WHERE { ?s ?p ?o }")
    assert len(server.requests) == 3
    # a transient 503 then a good answer: the retry succeeds
    server = fake((503, "busy", 0.0), (200, ROW, 0.0))
    result = SparqlClient(server.url, retries=2, backoff_s=0.01).query("SELECT * WHERE { ?s ?p ?o }")
    assert result.iris() == ["http://e/1"] and len(server.requests) == 2


@pytest.mark.parametrize(
    "status, error, attempts",
    [
        (400, BadQuery, 1),
        (422, BadQuery, 1),  # the query's fault
        (401, EndpointUnreachable, 1),
        (403, EndpointUnreachable, 1),  # refused whatever the query: no access, a ban,
        (404, EndpointUnreachable, 1),
        (405, EndpointUnreachable, 1),  # a wrong path or method
        (414, ServerError, 1),
        (408, ServerError, 3),  # too large for this endpoint; busy (retried)
    ],
)
def test_only_400_and_422_blame_the_query(fake, status, error, attempts):
    server = fake((status, "refused", 0.0))
    client = SparqlClient(server.url, retries=2, backoff_s=0.01)
    with pytest.raises(error, match=f"HTTP {status} from"):
        client.query("SELECT * WHERE { ?s ?p ?o }")
    assert len(server.requests) == attempts
    assert client.tally.faults == ({} if error is BadQuery else {error.__name__: 1})


def test_client_read_timeout(fake):
    server = fake((200, ROW, 1.0))
    with pytest.raises(QueryTimeout, match="within 0.2 s"):
        SparqlClient(server.url, read_timeout_s=0.2).query("SELECT * WHERE { ?s ?p ?o }")
    assert len(server.requests) == 1, "a timed-out query must not be retried"


def test_server_side_timeout_message(fake):
    server = fake((500, "java.util.concurrent.TimeoutException", 0.0))
    with pytest.raises(QueryTimeout):
        SparqlClient(server.url, backoff_s=0.01).query("SELECT * WHERE { ?s ?p ?o }")
    assert len(server.requests) == 1


def test_truncated_or_invalid_json(fake):
    for body in (
        ROW[:40],
        "<html>not json</html>",
        '{"head": {"vars": ["x"]}}',
        '{"head": {}, "boolean": "yes"}',
        '{"head": {"vars": ["x"]}, "results": {"bindings": [{"x": {"type": "uri"}}]}}',
        '{"head": {"vars": ["x"]}, "results": [1]}',
        '{"head": {"vars": ["x"]}, "results": "none"}',
    ):
        with pytest.raises(InvalidResponse):
            SparqlClient(fake((200, body, 0.0)).url).query("SELECT * WHERE { ?s ?p ?o }")


def test_forbidden_queries_are_never_sent(fake):
    server = fake((200, ROW, 0.0))
    client = SparqlClient(server.url)
    for query in (
        "SELECT * WHERE { SERVICE <http://example.org/sparql> { ?s ?p ?o } }",
        "SELECT * WHERE { ?s ?p ?o . service wikibase:label { bd:serviceParam wikibase:language 'en' } }",
        "INSERT DATA { <http://e/a> <http://e/b> <http://e/c> }",
        "DELETE WHERE { ?s ?p ?o }",
        "DROP ALL",
    ):
        with pytest.raises(ForbiddenQuery, match="refusing"):
            client.query(query)
    assert server.requests == [], "a forbidden query must be refused before anything is sent"
    # the words inside strings, IRIs, comments or variable names are not keywords
    client.query('SELECT ?service WHERE { ?service <http://e/SERVICE> "DELETE" } # INSERT')
    assert len(server.requests) == 1


def test_prefixes_added_only_when_used_and_undeclared(fake):
    server = fake((200, ROW, 0.0))
    query = (
        "PREFIX wd: <http://example.org/my-wd/>\nSELECT ?x WHERE { wd:Q1 wdt:P31 ?x ; "
        'rdfs:label "wd:Q2 p:P1" . ?x <http://e/#schema:x> ?y }'
    )
    SparqlClient(server.url).query(query)
    sent = server.requests[0]
    assert sent.startswith(
        "PREFIX wdt: <http://www.wikidata.org/prop/direct/>\n"
        "PREFIX rdfs: <http://www.w3.org/2000/01/rdf-schema#>\nPREFIX wd: <http://example.org/my-wd/>"
    )
    assert sent.endswith(query) and "PREFIX p:" not in sent and "PREFIX schema:" not in sent


def test_parse_results_normalises_typed_literal():
    doc = {
        "head": {"vars": ["n"]},
        "results": {
            "bindings": [
                {
                    "n": {
                        "type": "typed-literal",
                        "value": "3",
                        "datatype": "http://www.w3.org/2001/XMLSchema#integer",
                    }
                }
            ]
        },
    }
    assert sparql.parse_results(json.dumps(doc)).rows == [
        {"n": {"type": "literal", "value": "3", "datatype": "http://www.w3.org/2001/XMLSchema#integer"}}
    ]
    assert sparql.parse_results('{"head": {}, "boolean": false}').boolean is False


def test_bad_client_arguments():
    with pytest.raises(ValueError, match="http"):
        SparqlClient("localhost:7878/query")
    with pytest.raises(ValueError, match="method"):
        SparqlClient("http://localhost:7878/query", method="put")


# ---------------------------------------------------------------------------- deadline and tally


def test_deadline_cuts_the_read_timeout_and_the_retries(fake):
    slow = fake((200, ROW, 2.0))
    start = time.monotonic()
    with pytest.raises(QueryTimeout, match="within 0.3 s \\(the rest of the time budget\\)"):
        SparqlClient(slow.url).query("SELECT * WHERE { ?s ?p ?o }", deadline=time.monotonic() + 0.3)
    assert time.monotonic() - start < 0.8
    # a 500 would be retried after 0.5 s and 1 s; with 0.3 s left there is no second attempt
    broken = fake((500, "internal error", 0.0))
    start = time.monotonic()
    with pytest.raises(ServerError, match="after 1 attempt\\)"):
        SparqlClient(broken.url, retries=2).query(
            "SELECT * WHERE { ?s ?p ?o }", deadline=time.monotonic() + 0.3
        )
    assert time.monotonic() - start < 0.3 and len(broken.requests) == 1
    # a deadline already passed: nothing is sent
    client = SparqlClient(broken.url)
    with pytest.raises(QueryTimeout, match="ran out before the query was sent"):
        client.query("SELECT * WHERE { ?s ?p ?o }", deadline=time.monotonic() - 1)
    assert len(broken.requests) == 1 and client.tally == sparql.Tally()


def test_a_trickling_answer_is_cut_at_the_read_timeout_and_the_deadline():
    # headers at once, then one byte every 0.05 s: each socket read is quick, the whole answer is not
    # (1,000 bytes would take 50 s); the limit holds for the whole answer, not per read
    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/sparql-results+json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up

        def log_message(self, *args):
            pass

    server, url = start_http_server(Trickle)
    try:
        start = time.monotonic()
        with pytest.raises(QueryTimeout, match="within 0.4 s"):
            SparqlClient(url, read_timeout_s=0.4, connect_timeout_s=0.1).query("SELECT * WHERE { ?s ?p ?o }")
        assert time.monotonic() - start < 1.0
        start = time.monotonic()
        with pytest.raises(QueryTimeout, match="the rest of the time budget"):
            SparqlClient(url).query("SELECT * WHERE { ?s ?p ?o }", deadline=time.monotonic() + 0.3)
        assert time.monotonic() - start < 0.6
    finally:
        stop_http_server(server)


def test_the_connection_is_reused_across_queries(kg_url):
    # the body is read to its end, so the keep-alive connection goes back to the pool
    client = SparqlClient(kg_url)
    for _ in range(3):
        client.query("ASK { ?s ?p ?o }")
    pools = list(client.session.adapters["http://"].poolmanager.pools._container.values())
    assert [pool.num_connections for pool in pools] == [1]


def test_tally_counts_queries_answers_and_faults(fake):
    server = fake((200, ROW, 0.0), (500, "internal error", 0.0), (200, "<html>", 0.0), (400, "syntax", 0.0))
    client = SparqlClient(server.url, retries=0)
    client.query("SELECT * WHERE { ?s ?p ?o }")
    for error in (ServerError, InvalidResponse, BadQuery):
        with pytest.raises(error):
            client.query("SELECT * WHERE { ?s ?p ?o }")
    # a bad query (HTTP 400) is the query's failure, not the endpoint's
    assert (client.tally.sent, client.tally.answered) == (4, 1)
    assert client.tally.faults == {"ServerError": 1, "InvalidResponse": 1}
    assert client.tally.first_fault.startswith("ServerError: HTTP 500")
