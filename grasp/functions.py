"""The GRASP agent's functions: how the model explores a knowledge graph (GRASP paper, Section 3.1;
docs/agent.md). Each is a JSON-schema definition for function calling plus its implementation over
our SPARQL client (sparql.py) and search indices (search.py):

    EXE execute(kg, sparql)                        run a query; a compact table capped in rows and columns
    LST list(kg, subject?, property?, object?)     triples matching a pattern, popular and diverse first
    SEN search_entity(kg, query)                   the entity index (prefix keywords)
    SPR search_property(kg, query)                 the property index (embeddings if built)
    SPE search_property_of_entity(kg, entity, query)   properties the entity has (constraint query + subset search)
    SOP search_object_of_property(kg, property, query)  entities the property points to (same)
    FSE find_similar_examples(kg, question) / FEX find_examples(kg)   question-SPARQL pairs (kept by grasp/examples.py)
    ANS answer(...) / CAN cancel(...)              stop (their definitions depend on the task, agent.py)

`known` is the set of IRIs (canonical: Wikidata property variants folded to wd:P..) that earlier
results showed the model; results add to it, and with know_before_use an EXE (or ANS) whose query
uses an IRI outside it, other than common vocabularies (rdf, rdfs, xsd, ...), gets an error instead.

    functions = Functions({"wikidata": kg}, config.agent)
    text = functions.call("search_entity", {"kg": "wikidata", "query": "pulp fiction"}, known, deadline)
A call the model must fix raises FunctionError; the agent sends its message back as the result.
"""

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import defaults
from grisp.constraints import CONSTRAINT_LIMIT, allowed_items
from grisp.skeleton import split_variant
from grisp.sparql import Result, SparqlClient, SparqlError
from grisp.sparql_syntax import PREFIXES, compact, declared_prefixes, expand, is_keyword, tokenize

COMMON = ("rdf", "rdfs", "xsd", "owl", "skos", "schema", "prov", "wikibase", "bd")  # no need to be known
LIST_LIMIT = 10000  # triples LST fetches to rank (more are counted as "more than")
_NUMERIC = {PREFIXES["xsd"] + t for t in ("integer", "decimal", "double", "float", "int", "long")}


class FunctionError(Exception):
    """A call the model has to correct (bad IRI, unknown KG, unknown items); the text goes back to it."""


@dataclass
class KnowledgeGraph:
    """One knowledge graph as the functions see it: endpoint, indices (or None) and namespaces."""

    name: str
    client: SparqlClient
    indices: object | None = None  # search.Indices
    description: str = ""
    prefixes: dict = field(default_factory=lambda: dict(PREFIXES))
    examples: object | None = None  # grasp.examples.ExampleIndex

    @classmethod
    def from_config(cls, k) -> "KnowledgeGraph":
        """The knowledge graph a config.KgConfig describes: client, indices, examples (built if missing)."""
        from grasp.examples import ExampleIndex
        from search import load_indices

        try:
            indices = load_indices(Path(k.index)) if k.index else None
        except FileNotFoundError as e:
            raise FunctionError(f"knowledge graph {k.name}: {e} (or set its index to none)") from None
        where = Path(k.example_index or defaults.GRISP_HOME / "examples" / Path(k.examples or "").stem)
        examples = ExampleIndex.open(k.examples, where) if k.examples else None
        prefixes = {**PREFIXES, **k.prefixes}
        client = SparqlClient(k.endpoint, retries=1, prefixes=prefixes)
        return cls(k.name, client, indices, k.description, prefixes, examples)

    def query(self, sparql: str, deadline: float | None = None, timeout_s: float = 30.0) -> Result:
        """Run a query; the read timeout never passes the agent's deadline."""
        left = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
        if left <= 0:
            raise FunctionError("not run: the time limit is reached")
        self.client.timeout = (min(5.0, left), left)
        try:
            return self.client.query(sparql, deadline=deadline)
        except UnicodeEncodeError as e:  # e.g. a lone surrogate escape (\ud83d) the model wrote
            raise FunctionError(
                f"the query cannot be sent as UTF-8 ({e.reason} at character {e.start})"
            ) from None

    def item(self, iri: str):
        """The index's item for an IRI (any Wikidata property variant), or None."""
        if self.indices is None:
            return None
        canonical = split_variant(iri)[0]
        return self.indices.get(canonical)

    def show(self, iri: str) -> str:
        """`Label (prefix:local)` for an indexed item, else the compact IRI."""
        item = self.item(iri)
        return f"{item.label} ({compact(iri, self.prefixes)})" if item else compact(iri, self.prefixes)

    def term(self, text: str, position: str) -> str:
        """SPARQL text of an IRI the model gave (wd:Q1, <http://...>, http://...) or, as an object,
        of a literal (quoted if it is not already SPARQL); FunctionError otherwise."""
        text = text.strip()
        tokens = tokenize(text)
        if text.startswith(("http://", "https://")) and " " not in text:
            return f"<{text}>"
        if len(tokens) == 1 and tokens[0].kind == "iri":
            return text
        if len(tokens) == 1 and tokens[0].kind == "pname" and text.split(":")[0] in self.prefixes:
            return text
        if position == "object":
            if tokens and tokens[0].kind in ("string", "number") and len(text) == tokens[-1].end:
                return text
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        raise FunctionError(
            f"{text!r} is not an IRI for the {position}: write IRIs as prefixed names "
            f"(wd:Q937), in full (<http://www.wikidata.org/entity/Q937>) or as a URL"
        )


def canonical(iri: str) -> str:
    return split_variant(iri)[0]


def unknown_iris(kg: KnowledgeGraph, sparql: str, known: set[str]) -> list[str]:
    """IRIs of the query (outside PREFIX lines and common vocabularies) no earlier result showed."""
    tokens = tokenize(sparql)
    prefixes = {**kg.prefixes, **declared_prefixes(tokens)}
    common = tuple(PREFIXES[p] for p in COMMON)
    unknown, skip = [], set()
    for i, token in enumerate(tokens):  # the name and IRI of a PREFIX line, the IRI of BASE: no uses
        if is_keyword(token, "PREFIX", "BASE"):
            skip.update((i + 1, i + 2) if is_keyword(token, "PREFIX") else (i + 1,))
    for i, token in enumerate(tokens):
        if token.kind not in ("iri", "pname") or i in skip:
            continue
        try:
            iri = expand(token.text, prefixes)
        except ValueError:
            continue  # an undeclared prefix: the endpoint will say so
        if not token.text.endswith(":") and not iri.startswith(common) and canonical(iri) not in known:
            unknown.append(token.text)
    return list(dict.fromkeys(unknown))


# ---------------------------------------------------------------------------- result formatting


def cell(kg: KnowledgeGraph, term: dict | None, clip: int = 100) -> str:
    if term is None:
        return ""
    value = term["value"] if len(term["value"]) <= clip else term["value"][:clip] + "..."
    if term["type"] == "uri":
        return kg.show(term["value"])
    if term["type"] == "bnode":
        return "_:" + value
    if term.get("datatype") in _NUMERIC:
        return value
    text = '"' + value.replace('"', '\\"') + '"'
    if "xml:lang" in term:
        return f"{text}@{term['xml:lang']}"
    return f"{text}^^{compact(term['datatype'], kg.prefixes)}" if term.get("datatype") else text


def table(
    kg: KnowledgeGraph, columns: list[str], rows: list[dict], known: set[str], max_rows: int, max_columns: int
) -> str:
    """`Got N rows and M columns` and a text table of the first and last half of the rows and columns
    (GRASP shows results so); the IRIs shown become known."""
    n, m = len(rows), len(columns)
    half_r, half_c = (max_rows + 1) // 2, (max_columns + 1) // 2
    shown_rows = rows if n <= max_rows else rows[:half_r] + [None] + rows[n - half_r :]
    cols = columns if m <= max_columns else columns[:half_c] + [None] + columns[-half_c:]
    lines = ["| " + " | ".join("..." if c is None else c for c in cols) + " |"]
    for row in shown_rows:
        if row is None:
            lines.append("| " + " | ".join("..." for _ in cols) + " |")
            continue
        lines.append("| " + " | ".join("..." if c is None else cell(kg, row.get(c)) for c in cols) + " |")
        known.update(canonical(row[c]["value"]) for c in cols if c in row and row[c]["type"] == "uri")
    parts = [
        f"first and last {half_r} rows" if n > max_rows else "",
        f"first and last {half_c} columns" if m > max_columns else "",
    ]
    showing = " and ".join(p for p in parts if p)
    header = f"Got {n} row{'s' * (n != 1)} and {m} column{'s' * (m != 1)}"
    return header + (f", showing the {showing}" if showing else "") + ":\n" + "\n".join(lines)


# ---------------------------------------------------------------------------- definitions


def tool_def(name: str, description: str, required: dict, optional: dict | None = None) -> dict:
    properties = {**required, **(optional or {})}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
        },
    }


def string_arg(description: str, enum: list[str] | None = None) -> dict:
    return {"type": "string", "description": description} | ({"enum": enum} if enum else {})


def kg_definitions(kgs: list[str], k: int, list_k: int, indexed: bool) -> list[dict]:
    """EXE, LST and (if there are indices) SEN, SPR, SPE, SOP, in the OpenAI tools format."""
    kg = {"kg": string_arg("the knowledge graph", kgs)}
    fns = [
        tool_def(
            "execute",
            "Execute a SPARQL query on a knowledge graph. Returns the result as a table, or an "
            'error message. Example: execute(kg="wikidata", sparql="SELECT ?job WHERE { wd:Q937 wdt:P106 ?job }")',
            kg | {"sparql": string_arg("the SPARQL query")},
        ),
        tool_def(
            "list",
            f"List up to {list_k} triples matching the given subject, property and/or object "
            '(leave out a position to leave it open). Example: list(kg="wikidata", subject="wd:Q937") '
            'shows facts about Albert Einstein; list(kg="wikidata", property="wdt:P19") shows how '
            "place of birth is used.",
            kg,
            {
                "subject": string_arg("an IRI"),
                "property": string_arg("an IRI"),
                "object": string_arg("an IRI or a literal"),
            },
        ),
    ]
    if indexed:
        fns += [
            tool_def(
                "search_entity",
                f"Search the entities of a knowledge graph by name; returns the top {k} with "
                'their IRIs. Example: search_entity(kg="wikidata", query="albert einstein")',
                kg | {"query": string_arg("the search text")},
            ),
            tool_def(
                "search_property",
                f"Search the properties of a knowledge graph by meaning; returns the top {k}. "
                'Example: search_property(kg="wikidata", query="place of birth")',
                kg | {"query": string_arg("the search text")},
            ),
            tool_def(
                "search_property_of_entity",
                "Search only the properties the given entity has; returns the top "
                f"{k}. "
                'Example: search_property_of_entity(kg="wikidata", entity="wd:Q937", query="birth")',
                kg | {"entity": string_arg("the entity's IRI"), "query": string_arg("the search text")},
            ),
            tool_def(
                "search_object_of_property",
                f"Search only the entities that are objects of the given property; "
                f'returns the top {k}. Example: search_object_of_property(kg="wikidata", property="wdt:P106", '
                'query="football")',
                kg | {"property": string_arg("the property's IRI"), "query": string_arg("the search text")},
            ),
        ]
    return fns


def example_definitions(kgs: list[str], k: int, random_examples: bool) -> list[dict]:
    """FEX or FSE over the knowledge graphs that have examples (OpenAI tools format)."""
    kg = {"kg": string_arg("the knowledge graph", kgs)}
    if random_examples:
        return [
            tool_def(
                "find_examples",
                f"Get {k} random example questions with their SPARQL queries over the "
                "knowledge graph; they show how its queries are written. "
                'Example: find_examples(kg="wikidata")',
                kg,
            )
        ]
    return [
        tool_def(
            "find_similar_examples",
            f"Get the {k} example questions most similar to a given question, with "
            'their SPARQL queries over the knowledge graph. Example: find_similar_examples(kg="wikidata", '
            'question="Where was Angela Merkel born?")',
            kg | {"question": string_arg("the question")},
        )
    ]


# ---------------------------------------------------------------------------- implementations


class Functions:
    """The knowledge-graph functions of one configuration (config.AgentConfig holds the limits)."""

    def __init__(self, kgs: dict[str, KnowledgeGraph], options):
        self.kgs, self.o = kgs, options
        self.rng = random.Random(options.seed)  # FEX's choice

    def definitions(self) -> list[dict]:
        indexed = any(kg.indices is not None for kg in self.kgs.values())
        fns = kg_definitions(list(self.kgs), self.o.search_top_k, self.o.list_k, indexed)
        with_examples = [name for name, kg in self.kgs.items() if kg.examples is not None]
        return fns + (
            example_definitions(with_examples, self.o.num_examples, self.o.random_examples)
            if with_examples
            else []
        )

    def kg(self, name) -> KnowledgeGraph:
        if name not in self.kgs:
            raise FunctionError(f"unknown knowledge graph {name!r}; use one of {', '.join(self.kgs)}")
        return self.kgs[name]

    def call(self, name: str, args: dict, known: set[str], deadline: float | None = None) -> str:
        kg = self.kg(args.get("kg"))
        if name == "execute":
            return self.execute(kg, args["sparql"], known, deadline)
        if name == "list":
            return self.list(
                kg, args.get("subject"), args.get("property"), args.get("object"), known, deadline
            )
        if name in ("find_examples", "find_similar_examples"):
            return find_examples(kg, args.get("question"), self.o.num_examples, self.rng, known)
        if kg.indices is None and name.startswith("search_"):
            raise FunctionError(f"the knowledge graph {kg.name} has no search index; use execute or list")
        if name == "search_entity":
            return self.search(kg, "entity", args["query"], None, known)
        if name == "search_property":
            return self.search(kg, "property", args["query"], None, known)
        if name == "search_property_of_entity":
            constraint = f"SELECT DISTINCT ?p WHERE {{ {kg.term(args['entity'], 'subject')} ?p ?o }}"
            return self.constrained(kg, "property", args["query"], constraint, known, deadline)
        if name == "search_object_of_property":
            constraint = f"SELECT DISTINCT ?o WHERE {{ ?s {kg.term(args['property'], 'property')} ?o }}"
            return self.constrained(kg, "entity", args["query"], constraint, known, deadline)
        raise FunctionError(f"there is no function {name!r}")

    def execute(self, kg: KnowledgeGraph, sparql: str, known: set[str], deadline) -> str:
        if self.o.know_before_use:
            check_known(kg, sparql, known)
        try:
            result = kg.query(sparql, deadline, self.o.sparql_timeout_s)
        except SparqlError as e:
            return f"The SPARQL query failed ({type(e).__name__}): {e}"
        if result.boolean is not None:
            return f"ASK result: {'yes' if result.boolean else 'no'}"
        if not result.rows:
            return f"Got no rows (columns: {', '.join(result.variables) or 'none'})"
        return table(
            kg, result.variables, result.rows, known, self.o.result_max_rows, self.o.result_max_columns
        )

    def list(self, kg: KnowledgeGraph, s, p, o, known: set[str], deadline) -> str:
        fixed = {
            "s": s and kg.term(s, "subject"),
            "p": p and kg.term(p, "property"),
            "o": o and kg.term(o, "object"),
        }
        pattern = " ".join(fixed[v] or f"?{v}" for v in "spo")
        try:
            result = kg.query(
                f"SELECT * WHERE {{ {pattern} }} LIMIT {LIST_LIMIT + 1}", deadline, self.o.sparql_timeout_s
            )
        except SparqlError as e:
            raise FunctionError(f"listing the triples failed ({type(e).__name__}): {e}") from None
        more, rows = len(result.rows) > LIST_LIMIT, result.rows[:LIST_LIMIT]
        for row in rows:  # fill the fixed positions in, as terms of the table
            for v, text in fixed.items():
                if text and v not in row:
                    row[v] = _term_of(kg, text)

        def popularity(term):
            item = kg.item(term["value"]) if term["type"] == "uri" else None
            return item.popularity if item else -1.0

        # popular properties first, then popular entities; then triples with an unseen property or entity first
        rows.sort(key=lambda r: (-popularity(r["p"]), -max(popularity(r["s"]), popularity(r["o"]))))
        seen_p, seen_e, keyed = set(), set(), []
        for i, r in enumerate(rows):
            p, s, o = canonical(r["p"]["value"]), r["s"]["value"], r["o"]["value"]
            keyed.append(((p in seen_p, s in seen_e or o in seen_e), i))
            seen_p.add(p), seen_e.update((s, o))
        rows = [rows[i] for _, i in sorted(keyed, key=lambda x: x[0])]
        if not rows:
            return "No triples match"
        renamed = [{"subject": r["s"], "property": r["p"], "object": r["o"]} for r in rows[: self.o.list_k]]
        text = table(kg, ["subject", "property", "object"], renamed, known, self.o.list_k, 3)
        total = f"more than {LIST_LIMIT}" if more else str(len(rows))
        return f"{total} triples match, showing {len(renamed)}:" + text.split(":", 1)[1]

    def search(
        self, kg: KnowledgeGraph, kind: str, query: str, allowed, known: set[str], note: str = ""
    ) -> str:
        if not query.strip():
            raise FunctionError("the search query is empty")
        hits = kg.indices.search(kind, query, self.o.search_top_k, allowed_ids=allowed)
        if not hits:
            return note + "No results"
        lines = []
        for i, hit in enumerate(hits, start=1):
            iri = hit.id
            if kind == "property" and iri.startswith(
                PREFIXES["wd"] + "P"
            ):  # Wikidata: show the truthy variant
                iri = PREFIXES["wdt"] + iri[len(PREFIXES["wd"]) :]
            extra = (f": {hit.description}" if hit.description else "") + (
                f" (also: {', '.join(hit.aliases[:3])})" if hit.aliases else ""
            )
            lines.append(f"{i}. {hit.label} ({compact(iri, kg.prefixes)}){extra}")
            known.add(canonical(hit.id))
        return (
            note + f"Top {len(hits)} {'entities' if kind == 'entity' else 'properties'}:\n" + "\n".join(lines)
        )

    def constrained(
        self, kg: KnowledgeGraph, kind: str, query: str, constraint: str, known: set[str], deadline
    ) -> str:
        """Search only among the IRIs the constraint query returns (GRASP's SPE and SOP)."""
        try:
            result = kg.query(f"{constraint} LIMIT {CONSTRAINT_LIMIT}", deadline, self.o.sparql_timeout_s)
        except SparqlError as e:
            return self.search(
                kg,
                kind,
                query,
                None,
                known,
                f"Searching without the constraint, its query failed ({type(e).__name__}: {e}).\n",
            )
        allowed = allowed_items(result)  # the resolver's rule: None when the limit was reached
        if allowed is None:
            note = "Searching without the constraint (too many candidates).\n"
            return self.search(kg, kind, query, None, known, note)
        return self.search(kg, kind, query, allowed, known)


def find_examples(
    kg: KnowledgeGraph, question: str | None, k: int, rng: random.Random, known: set[str]
) -> str:
    """FSE (a question given) or FEX (None): the examples as text; their IRIs become known."""
    if kg.examples is None:
        raise FunctionError(f"the knowledge graph {kg.name} has no examples")
    examples = kg.examples.similar(question, k) if question is not None else kg.examples.random(k, rng)
    if not examples:
        return "No examples found"
    for example in examples:
        for token in tokenize(example["sparql"]):
            if token.kind in ("iri", "pname") and not token.text.endswith(":"):
                try:
                    known.add(canonical(expand(token.text, kg.prefixes)))
                except ValueError:
                    pass
    return "\n\n".join(
        f"Example {i}:\nQuestion: {e['question']}\nSPARQL:\n{e['sparql']}"
        for i, e in enumerate(examples, start=1)
    )


def check_known(kg: KnowledgeGraph, sparql: str, known: set[str]) -> None:
    """know_before_use: FunctionError naming the IRIs of the query that no earlier result showed."""
    unknown = unknown_iris(kg, sparql, known)
    if unknown:
        raise FunctionError(
            "The query uses IRIs that no earlier function result showed: "
            + ", ".join(unknown)
            + ". They may exist, but verify them first (search for them, or list triples "
            "with them), then run the query again."
        )


def _term_of(kg: KnowledgeGraph, text: str) -> dict:
    """A result term for a fixed position of LST: an IRI, else the literal's text."""
    token = tokenize(text)[0]
    if token.kind in ("iri", "pname"):
        return {"type": "uri", "value": expand(token.text, kg.prefixes)}
    return {"type": "literal", "value": token.text.strip("\"'") if token.kind == "string" else token.text}
