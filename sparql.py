"""SPARQL 1.1 protocol client: typed errors, the JSON results parser and SparqlClient.

GRISP talks to its knowledge graph only through SPARQL over HTTP (paper, Section 3): the
KG-constrained candidate queries, the final validation of a resolved query, and the evaluation of
gold and predicted queries. This client works unchanged against the local oxigraph server
(`endpoint.py`), QLever, Virtuoso or the public Wikidata endpoint: it speaks the standard protocol
(form POST or GET, `Accept: application/sparql-results+json`) and prepends the PREFIX declarations a
query uses but does not declare, because most engines predefine none. Query text (tokenizer, the
PREFIXES table, compact / expand, the read-only check) lives in sparql_syntax.py.

    from sparql import SparqlClient
    client = SparqlClient("http://127.0.0.1:7878/query")  # defaults.ENDPOINT_URL
    result = client.query("SELECT ?d WHERE { wd:Q104123 wdt:P57 ?d }")
    result.variables, result.rows  # ['d'], [{'d': {'type': 'uri', 'value': '...Q3772'}}]

Every failure is a `SparqlError`: `EndpointUnreachable`, `QueryTimeout`, `BadQuery` (4xx),
`ServerError` (5xx after retries), `InvalidResponse` (invalid or truncated JSON; oxigraph reports a
query cancelled by its timeout as HTTP 200 with truncated JSON), `ForbiddenQuery` (SERVICE or a SPARQL
Update, refused before anything is sent; defined with the check in sparql_syntax.py).
"""
import json
import re
import time
from dataclasses import dataclass, field

import requests

import defaults
# SparqlError and ForbiddenQuery (refused for its text) are defined with the read-only check; imported
# here so that every error the client raises can be imported from this module
from sparql_syntax import PREFIXES, ForbiddenQuery, SparqlError, check_read_only, with_prefixes  # noqa: F401

# ---------------------------------------------------------------------------- errors


class EndpointUnreachable(SparqlError):
    """No connection to the endpoint (refused, DNS, connect timeout), also after retries."""


class QueryTimeout(SparqlError):
    """The query ran out of time, on the client (read timeout) or on the server."""


class BadQuery(SparqlError):
    """The endpoint rejected the query with a 4xx status; the message carries the server's text."""


class ServerError(SparqlError):
    """The endpoint kept answering 5xx (or 429) after all retries."""


class InvalidResponse(SparqlError):
    """The answer is not a valid (or is a truncated) SPARQL JSON results document."""


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
        """No rows; an ASK answer (true or false) counts as non-empty (GRISP's final validation)."""
        return self.boolean is None and not self.rows

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
        raise InvalidResponse(f"invalid or truncated JSON ({e}); the answer ends with {text[-200:]!r}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("head"), dict):
        raise InvalidResponse(f"not a SPARQL JSON results document (no 'head' object): {str(doc)[:200]!r}")
    if "boolean" in doc:
        if not isinstance(doc["boolean"], bool):
            raise InvalidResponse(f"ASK result 'boolean' is not true/false: {doc['boolean']!r}")
        return Result(boolean=doc["boolean"])
    variables, bindings = doc["head"].get("vars", []), (doc.get("results") or {}).get("bindings")
    if not isinstance(variables, list) or not all(isinstance(v, str) for v in variables):
        raise InvalidResponse(f"'head.vars' is not a list of names: {variables!r}")
    if not isinstance(bindings, list):
        raise InvalidResponse("a SELECT result needs 'results.bindings' (a list); it is missing")
    rows = []
    for row in bindings:
        if not isinstance(row, dict):
            raise InvalidResponse(f"a binding row is not an object: {row!r}")
        for name, term in row.items():
            if not (isinstance(term, dict) and isinstance(term.get("value"), str)
                    and term.get("type") in ("uri", "literal", "typed-literal", "bnode")):
                raise InvalidResponse(f"invalid RDF term for ?{name}: {term!r}")
        # SPARQL 1.0 servers say "typed-literal"; normalise so values compare equal across engines
        rows.append({name: {k: v for k, v in term.items() if k in _TERM_KEYS}
                     | ({"type": "literal"} if term["type"] == "typed-literal" else {})
                     for name, term in row.items()})
    return Result(variables=variables, rows=rows)


# ---------------------------------------------------------------------------- client

_TIMEOUT_TEXT = re.compile(r"time ?out|timed out|cancell?ed", re.IGNORECASE)


class SparqlClient:
    """SPARQL 1.1 protocol client with timeouts, retries and typed errors (see module docstring).

    `method`: "post" sends an HTML form (no URL length limit), "get" puts the query in the URL.
    Connection errors, 5xx and 429 are retried `retries` times, waiting backoff_s * 2**attempt.
    Client read timeouts and server-reported timeouts are not retried (the query is too heavy).
    """

    def __init__(self, url: str = defaults.ENDPOINT_URL, *, method: str = "post",
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0, retries: int = 2,
                 backoff_s: float = 0.5, prefixes: dict[str, str] = PREFIXES):
        if method not in ("post", "get"):
            raise ValueError(f"method must be 'post' or 'get', not {method!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint URL must start with http:// or https://, got {url!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries}")
        self.url, self.method, self.prefixes = url, method, prefixes
        self.timeout = (connect_timeout_s, read_timeout_s)
        self.retries, self.backoff_s = retries, backoff_s
        self.session = requests.Session()
        self.session.headers.update({
            "Accept": "application/sparql-results+json",
            # the public Wikidata endpoint refuses requests without a descriptive User-Agent
            "User-Agent": "grisp-reference/0.1 (SPARQL client; python-requests)",
        })

    def query(self, sparql: str) -> Result:
        """Run a read-only query; returns a Result or raises a SparqlError subclass."""
        check_read_only(sparql)
        sparql = with_prefixes(sparql, self.prefixes)
        error: SparqlError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                if self.method == "post":
                    response = self.session.post(self.url, data={"query": sparql}, timeout=self.timeout)
                else:
                    response = self.session.get(self.url, params={"query": sparql}, timeout=self.timeout)
            except requests.ConnectTimeout:
                error = EndpointUnreachable(f"connecting to {self.url} timed out after {self.timeout[0]} s")
                continue
            except requests.ReadTimeout:
                raise QueryTimeout(f"no answer from {self.url} within {self.timeout[1]} s "
                                   "(raise read_timeout_s or simplify the query)") from None
            except requests.ConnectionError as e:
                error = EndpointUnreachable(f"cannot connect to {self.url} ({type(e).__name__}); is the "
                                            "endpoint running? (local: python endpoint.py start)")
                continue
            except requests.RequestException as e:  # e.g. a chunked body cut off mid-stream
                raise InvalidResponse(f"broken answer from {self.url}: {e}") from None
            message = response.text[:500].strip()
            if response.status_code >= 500 or response.status_code == 429:
                if _TIMEOUT_TEXT.search(message):
                    raise QueryTimeout(f"the endpoint {self.url} timed out: {message}")
                error = ServerError(f"HTTP {response.status_code} from {self.url}: {message}")
                continue
            if response.status_code >= 400:
                raise BadQuery(f"HTTP {response.status_code} from {self.url}: {message}")
            try:
                return parse_results(response.content)
            except InvalidResponse as e:
                if _TIMEOUT_TEXT.search(response.content[-300:].decode("utf-8", "replace")):
                    raise QueryTimeout(f"the endpoint {self.url} cancelled the query (timeout): {e}") from None
                raise
        assert error is not None, f"no attempt was made (retries={self.retries})"
        raise type(error)(f"{error} (after {self.retries + 1} attempts)")

    def close(self) -> None:
        self.session.close()
