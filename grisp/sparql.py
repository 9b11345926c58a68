"""SPARQL 1.1 protocol client: typed errors, the JSON results parser and SparqlClient.

GRISP talks to its knowledge graph only through SPARQL over HTTP (paper, Section 3): the
KG-constrained candidate queries, the final validation of a resolved query, and the evaluation of
gold and predicted queries. This client works unchanged against the local oxigraph server
(`endpoint.py`), QLever, Virtuoso or the public Wikidata endpoint: it speaks the standard protocol
(form POST or GET, `Accept: application/sparql-results+json`) and prepends the PREFIX declarations a
query uses but does not declare, because most engines predefine none. Query text (tokenizer, the
PREFIXES table, compact / expand, the read-only check) lives in sparql_syntax.py.

    from grisp.sparql import SparqlClient
    client = SparqlClient("http://127.0.0.1:7878/query")  # defaults.ENDPOINT_URL
    result = client.query("SELECT ?d WHERE { wd:Q104123 wdt:P57 ?d }")
    result.variables, result.rows  # ['d'], [{'d': {'type': 'uri', 'value': '...Q3772'}}]

Every failure is a `SparqlError`: `EndpointUnreachable` (also an endpoint that refuses requests: 401,
403, 404, 405 ...), `QueryTimeout`, `BadQuery` (400 or 422: the query's fault), `ServerError` (5xx, 408
or 429 after retries; 413, 414 or 431: a request too large for it), `InvalidResponse` (invalid or
truncated JSON, or a connection lost mid-answer; oxigraph reports a query cancelled by its timeout as
HTTP 200 with truncated JSON), `ForbiddenQuery` (SERVICE, a SPARQL Update or a skeleton placeholder,
refused before anything is sent; defined with the check in sparql_syntax.py). `ENDPOINT_FAULTS` are the
endpoint's failures rather than the query's.

A `deadline` (time.monotonic() seconds) makes the time budget a hard limit: every request's connect
and read timeouts are cut to the time left, and no retry waits past it. The read timeout bounds the
whole answer body, not each socket read (`read_body`), so a server that trickles its answer cannot
stretch it (the headers, read by requests, are bounded per read only).
`client.tally` counts the queries sent, those answered and the endpoint faults by type (grisp/pipeline.py
starts a new one per question):

    result = client.query(query, deadline=time.monotonic() + 20)
    client.tally  # Tally(sent=3, answered=2, faults={'ServerError': 1}, first_fault='ServerError: ...')
"""

import json
import re
import time
from dataclasses import dataclass, field

import requests
import urllib3

from common import defaults
from grisp.sparql_syntax import PREFIXES, ForbiddenQuery, SparqlError, check_read_only, with_prefixes  # noqa: F401

# ---------------------------------------------------------------------------- errors


class EndpointUnreachable(SparqlError):
    """No connection to the endpoint (refused, DNS, connect timeout), also after retries; or an endpoint
    that refuses requests whatever the query (HTTP 401, 403, 404, 405 ...: access, a ban, a wrong URL)."""


class QueryTimeout(SparqlError):
    """The query ran out of time, on the client (read timeout) or on the server."""


class BadQuery(SparqlError):
    """The endpoint rejected the query (HTTP 400 or 422); the message carries the server's text."""


class ServerError(SparqlError):
    """The endpoint kept answering 5xx (or 408, 429) after all retries, or found the request too large
    (HTTP 413, 414, 431: its limits, not the query's meaning)."""


class InvalidResponse(SparqlError):
    """The answer is not a valid (or is a truncated) SPARQL JSON results document."""


# the endpoint's failures, not the query's (BadQuery, ForbiddenQuery): they say nothing about the query
ENDPOINT_FAULTS = (EndpointUnreachable, QueryTimeout, ServerError, InvalidResponse)


@dataclass
class Tally:
    """What a client's queries came to: sent, answered with a result, endpoint faults by error type."""

    sent: int = 0
    answered: int = 0
    faults: dict[str, int] = field(default_factory=dict)  # error class name -> queries
    first_fault: str | None = None  # "ServerError: HTTP 500 from ..." of the first fault


# ---------------------------------------------------------------------------- results


@dataclass
class Result:
    """A SPARQL result: `variables` and `rows` for SELECT, `boolean` for ASK.

    Each row maps a bound variable to its term `{"type": "uri"|"literal"|"bnode", "value": str,
    "datatype"?: str, "xml:lang"?: str}` (unbound variables are absent), as in the JSON format.
    """

    variables: list[str] = field(default_factory=list)
    rows: list[dict[str, dict[str, str]]] = field(default_factory=list)
    boolean: bool | None = None

    @property
    def is_empty(self) -> bool:
        """No row binds a value (`MAX` over no match gives one row with nothing bound); an ASK answer,
        true or false, counts as non-empty (GRISP's final validation)."""
        return self.boolean is None and not any(self.rows)

    def iris(self, variable: str | None = None) -> list[str]:
        """The distinct IRIs bound to `variable` (default: the first column), in row order."""
        variable = variable or (self.variables[0] if self.variables else "")
        values = [row[variable]["value"] for row in self.rows if row.get(variable, {}).get("type") == "uri"]
        return list(dict.fromkeys(values))

    def to_json(self) -> dict:
        """The result as a SPARQL 1.1 JSON results document (what parse_results reads back)."""
        if self.boolean is not None:
            return {"head": {}, "boolean": self.boolean}
        return {"head": {"vars": self.variables}, "results": {"bindings": self.rows}}


_TERM_KEYS = {"type", "value", "datatype", "xml:lang"}


def parse_results(body: bytes | str) -> Result:
    """Validate and parse a SPARQL 1.1 JSON results document; InvalidResponse if it is not one."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        raise InvalidResponse(
            f"invalid or truncated JSON ({e}); the answer ends with {text[-200:]!r}"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("head"), dict):
        raise InvalidResponse(f"not a SPARQL JSON results document (no 'head' object): {str(doc)[:200]!r}")
    if "boolean" in doc:
        if not isinstance(doc["boolean"], bool):
            raise InvalidResponse(f"ASK result 'boolean' is not true/false: {doc['boolean']!r}")
        return Result(boolean=doc["boolean"])
    results = doc.get("results") or {}
    if not isinstance(results, dict):
        raise InvalidResponse(f"'results' is not an object: {str(results)[:200]!r}")
    variables, bindings = doc["head"].get("vars", []), results.get("bindings")
    if not isinstance(variables, list) or not all(isinstance(v, str) for v in variables):
        raise InvalidResponse(f"'head.vars' is not a list of names: {variables!r}")
    if not isinstance(bindings, list):
        raise InvalidResponse("a SELECT result needs 'results.bindings' (a list); it is missing")
    rows = []
    for row in bindings:
        if not isinstance(row, dict):
            raise InvalidResponse(f"a binding row is not an object: {row!r}")
        for name, term in row.items():
            if not (
                isinstance(term, dict)
                and isinstance(term.get("value"), str)
                and term.get("type") in ("uri", "literal", "typed-literal", "bnode")
            ):
                raise InvalidResponse(f"invalid RDF term for ?{name}: {term!r}")
        # SPARQL 1.0 servers say "typed-literal"; normalise so values compare equal across engines
        rows.append(
            {
                name: {k: v for k, v in term.items() if k in _TERM_KEYS}
                | ({"type": "literal"} if term["type"] == "typed-literal" else {})
                for name, term in row.items()
            }
        )
    return Result(variables=variables, rows=rows)


# ---------------------------------------------------------------------------- client

_TIMEOUT_TEXT = re.compile(r"time ?out|timed out|cancell?ed", re.IGNORECASE)


class SparqlClient:
    """SPARQL 1.1 protocol client with timeouts, retries and typed errors (see module docstring).

    `method`: "post" sends an HTML form (no URL length limit), "get" puts the query in the URL.
    Connection errors, 5xx and 429 are retried `retries` times, waiting backoff_s * 2**attempt.
    Client read timeouts and server-reported timeouts are not retried (the query is too heavy).
    `tally` counts every query sent (see Tally); replace it with a new Tally to count afresh.
    """

    def __init__(
        self,
        url: str = defaults.ENDPOINT_URL,
        *,
        method: str = "post",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        prefixes: dict[str, str] = PREFIXES,
    ):
        if method not in ("post", "get"):
            raise ValueError(f"method must be 'post' or 'get', not {method!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint URL must start with http:// or https://, got {url!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries}")
        self.url, self.method, self.prefixes = url, method, prefixes
        self.timeout = (connect_timeout_s, read_timeout_s)
        self.retries, self.backoff_s = retries, backoff_s
        self.tally = Tally()
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Accept": "application/sparql-results+json",
                # the public Wikidata endpoint refuses requests without a descriptive User-Agent
                "User-Agent": "grisp-reference/0.1 (SPARQL client; python-requests)",
            }
        )

    def query(self, sparql: str, deadline: float | None = None) -> Result:
        """Run a read-only query; returns a Result or raises a SparqlError subclass. With a `deadline`
        (time.monotonic() seconds) no request or retry outlasts it. Counted in `self.tally`."""
        check_read_only(sparql)
        if deadline is not None and time.monotonic() >= deadline:  # not sent, so not counted
            raise QueryTimeout(f"the time budget ran out before the query was sent to {self.url}")
        self.tally.sent += 1
        try:
            result = self._send(with_prefixes(sparql, self.prefixes), deadline)
        except ENDPOINT_FAULTS as e:
            name = type(e).__name__
            self.tally.faults[name] = self.tally.faults.get(name, 0) + 1
            self.tally.first_fault = self.tally.first_fault or f"{name}: {e}"
            raise
        self.tally.answered += 1
        return result

    def _send(self, sparql: str, deadline: float | None) -> Result:
        """The HTTP exchange with retries; timeouts and waits cut to the time left before `deadline`."""
        deadline = float("inf") if deadline is None else deadline
        error, attempts = None, 0
        for attempt in range(self.retries + 1):
            if attempt:
                pause = self.backoff_s * 2 ** (attempt - 1)
                if deadline - time.monotonic() <= pause:
                    break  # no time left for another attempt: report the last error
                time.sleep(pause)
            attempts, left = attempt + 1, max(deadline - time.monotonic(), 1e-3)
            timeout = (min(self.timeout[0], left), min(self.timeout[1], left))
            answer_by = min(
                deadline, time.monotonic() + timeout[0] + timeout[1]
            )  # the whole answer, not each read
            try:
                if self.method == "post":
                    response = self.session.post(
                        self.url, data={"query": sparql}, timeout=timeout, stream=True
                    )
                else:
                    response = self.session.get(
                        self.url, params={"query": sparql}, timeout=timeout, stream=True
                    )
                body = read_body(response, answer_by)
            except (requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError):
                hint = (
                    "the rest of the time budget"
                    if timeout[1] < self.timeout[1]
                    else "raise read_timeout_s or simplify the query"
                )
                raise QueryTimeout(f"no answer from {self.url} within {timeout[1]:.3g} s ({hint})") from None
            except requests.ConnectTimeout:
                error = EndpointUnreachable(f"connecting to {self.url} timed out after {timeout[0]:.3g} s")
                continue
            except requests.ConnectionError as e:
                if isinstance(e.args[0] if e.args else None, urllib3.exceptions.ProtocolError):
                    # connected, then reset or closed before the answer: retried like a refused connection
                    error = EndpointUnreachable(f"{self.url} dropped the connection without an answer ({e})")
                else:
                    error = EndpointUnreachable(
                        f"cannot connect to {self.url} ({type(e).__name__}); is the "
                        "endpoint running? (local: python endpoint.py start)"
                    )
                continue
            except (
                requests.RequestException,
                urllib3.exceptions.HTTPError,
            ) as e:  # e.g. an answer cut off mid-stream
                raise InvalidResponse(f"broken answer from {self.url}: {e}") from None
            message = body[:500].decode("utf-8", "replace").strip()
            status = response.status_code
            if status >= 500 or status in (408, 429):  # busy or failing: worth another attempt
                if _TIMEOUT_TEXT.search(message):
                    raise QueryTimeout(f"the endpoint {self.url} timed out: {message}")
                error = ServerError(f"HTTP {status} from {self.url}: {message}")
                continue
            if status in (400, 422):  # the query's fault: syntax, an unknown prefix or function
                raise BadQuery(f"HTTP {status} from {self.url}: {message}")
            if status in (413, 414, 431):  # the same again on a retry
                hint = "; method='post' sends the query in the body" if self.method == "get" else ""
                raise ServerError(
                    f"HTTP {status} from {self.url}: the request is too large for it{hint}: {message}"
                )
            if status >= 400:  # 401, 403, 404, 405 ...: refused whatever the query, so not the query's fault
                raise EndpointUnreachable(
                    f"HTTP {status} from {self.url}: it refuses the request (check the URL's "
                    f"path and access to it): {message}"
                )
            try:
                return parse_results(body)
            except InvalidResponse as e:
                if _TIMEOUT_TEXT.search(body[-300:].decode("utf-8", "replace")):
                    raise QueryTimeout(
                        f"the endpoint {self.url} cancelled the query (timeout): {e}"
                    ) from None
                raise
        assert error is not None, f"no attempt was made (retries={self.retries})"
        raise type(error)(f"{error} (after {attempts} attempt{'s' if attempts > 1 else ''})")

    def close(self) -> None:
        self.session.close()


def read_body(response: requests.Response, answer_by: float) -> bytes:
    """The response body, read as it arrives until `answer_by` (time.monotonic() seconds). requests'
    read timeout bounds each socket read, so a server that trickles bytes could stretch one answer
    without limit; here every read waits at most the time left. Read to its end, the connection goes
    back to the session's pool (keep-alive); cut off, it is closed."""
    sock = getattr(response.raw.connection, "sock", None)
    chunks = []
    try:
        while True:
            left = answer_by - time.monotonic()
            if left <= 0:
                raise urllib3.exceptions.ReadTimeoutError(None, response.url, "the answer took too long")
            if sock is not None:
                sock.settimeout(left)
            chunk = response.raw.read1(64 * 1024, decode_content=True)  # what has arrived; b"" at the end
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        response.close()
