"""Items from a SPARQL endpoint, streamed page by page (docs/method.md section 5.1, docs/wikidata-scale.md):
the endpoint reader of build_index.py.

Properties first (there are few: the predicates with their usage counts, held in memory); then the
entities a page at a time: a page of `page_size` IRIs with their occurrence counts (one GROUP BY query,
read with LIMIT / OFFSET in the endpoint's own order), then that page's labels, aliases, descriptions
(and sitelinks) by queries restricted to its IRIs (VALUES), each paged too. Memory holds one page of
entities, whatever the size of the KG; the entities come in the endpoint's order of their IRIs.

Wikidata schema: entities are the wd:Q IRIs; properties the wd:P IRIs, their usage counted over every
variant (wdt:, p:, ps:, pq: ...), labelled but unused ones included, external ids after all others;
entity popularity is the sitelinks count, else the number of triples the entity occurs in. Generic
schema: properties are the predicates, entities every other IRI, popularity their triple counts.
Labels: exactly `lang` first, then its regional variants (en-gb), untagged literals last.

    for kind, item in items_from_endpoint("http://127.0.0.1:7878/query", "wikidata", "en", 10000): ...
"""

import re
from collections import defaultdict
from typing import Iterator
from urllib.parse import unquote

from tqdm import tqdm

from grisp.skeleton import split_variant
from grisp.sparql import SparqlClient
from grisp.sparql_syntax import PREFIXES

WD_ENTITY = PREFIXES["wd"]  # Wikidata items and properties: wd:Q42, wd:P19
LANG_FILTER = 'FILTER(LANG(?value) = "" || LANGMATCHES(LANG(?value), "{lang}"))'
# (name, WHERE clause binding ?item and ?value); counts are GROUP BY queries
QUERIES = {
    "usage": "SELECT ?item (COUNT(*) AS ?value) WHERE { ?s ?item ?o } GROUP BY ?item",
    "occurrences": "SELECT ?item (COUNT(*) AS ?value) WHERE { { ?item ?p ?o } UNION { ?s ?p ?item } "
    "FILTER(isIRI(?item)) } GROUP BY ?item",
    "labels": "SELECT ?item ?value WHERE { ?item rdfs:label ?value " + LANG_FILTER + " }",
    "aliases": "SELECT ?item ?value WHERE { ?item skos:altLabel ?value " + LANG_FILTER + " }",
    "descriptions": "SELECT ?item ?value WHERE { ?item schema:description ?value " + LANG_FILTER + " }",
    "sitelinks": "SELECT ?item ?value WHERE { ?item wikibase:sitelinks ?value }",
    "external_ids": "SELECT ?item ?value WHERE { ?item wikibase:propertyType ?value "
    "FILTER(?value = wikibase:ExternalId) }",
}
TEXTS = ("labels", "aliases", "descriptions")


def count_triples(url: str) -> int:
    """The number of triples a SPARQL endpoint serves."""
    client = SparqlClient(url, read_timeout_s=600)
    try:
        return int(client.query("SELECT ( COUNT ( * ) AS ?n ) WHERE { ?s ?p ?o }").rows[0]["n"]["value"])
    finally:
        client.close()


def pages(client, name: str, query: str, page_size: int) -> Iterator[list[tuple[str, dict]]]:
    """The (item IRI, value term) rows of `query`, a page of up to `page_size` rows at a time. A server may
    cap its results below that (Virtuoso's ResultSetMaxRows): each page starts after the rows received,
    and only an empty page ends the fetch."""
    offset = 0
    while True:
        page = client.query(f"{query} ORDER BY ?item ?value LIMIT {page_size} OFFSET {offset}")
        if not page.rows:
            return
        yield [
            (r["item"]["value"], r["value"])
            for r in page.rows
            if r.get("item", {}).get("type") == "uri" and "value" in r
        ]
        offset += len(page.rows)


def fetch_pairs(client, name: str, query: str, page_size: int) -> list[tuple[str, dict]]:
    """All (item IRI, value term) rows of `query`, fetched in pages (`pages`)."""
    return [pair for page in pages(client, name, query, page_size) for pair in page]


def restricted(query: str, iris: list[str]) -> str:
    """`query` restricted to the items `iris` (a VALUES clause at the start of its WHERE)."""
    values = " ".join(f"<{iri}>" for iri in iris)
    return query.replace("WHERE { ", f"WHERE {{ VALUES ?item {{ {values} }} ", 1)


def language_rank(term: dict, lang: str) -> int:
    """0 for a literal tagged exactly `lang`, 1 for one of its regional variants (en-gb for en: LANGMATCHES
    lets them through), 2 for an untagged literal. Tags compare without case, as in RDF."""
    tag = term.get("xml:lang")
    return 2 if not tag else 0 if tag.lower() == lang.lower() else 1


def local_name(iri: str) -> str:
    """Readable fallback label from an IRI: `.../dblp/authoredBy` -> "authored By"."""
    name = unquote(re.split(r"[/#]", iri.rstrip("/#"))[-1]).replace("_", " ")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name) or iri


def describe(client, iris: list[str], names: tuple, lang: str, page_size: int) -> dict:
    """{query name: {iri: [values, best language first]}} of the items `iris` (labels, aliases, ...)."""
    tables = {}
    for name in names:
        query = restricted(QUERIES[name].replace("{lang}", lang), iris)
        pairs = fetch_pairs(client, name, query, page_size) if iris else []
        table = tables[name] = defaultdict(
            list
        )  # exactly `lang` first, then regional variants, untagged last
        for iri, term in sorted(pairs, key=lambda pair: language_rank(pair[1], lang)):
            if term["value"] not in table[iri]:
                table[iri].append(term["value"])
    return tables


def item(iri: str, texts: dict, popularity: float) -> dict:
    """An item from its texts (`describe`): the best label, the other labels and aliases, a description."""
    labels = texts["labels"].get(iri) or [local_name(iri)]
    aliases = [a for a in labels[1:] + texts["aliases"].get(iri, []) if a != labels[0]]
    description = (texts["descriptions"].get(iri) or [""])[0]
    return {
        "id": iri,
        "label": labels[0],
        "aliases": list(dict.fromkeys(aliases)),
        "description": description,
        "popularity": popularity,
    }


def property_usage(client, schema: str, page_size: int) -> dict[str, float]:
    """{property IRI: number of triples using it} (Wikidata: over all variants of a property)."""
    pairs = fetch_pairs(client, "usage", QUERIES["usage"], page_size)
    if schema != "wikidata":
        return {iri: float(term["value"]) for iri, term in pairs}
    usage = defaultdict(float)
    for iri, term in pairs:  # wdt:P19, p:P19, ps:P19, pq:P19 ... all count for wd:P19
        canonical, _ = split_variant(iri)
        if canonical.startswith(WD_ENTITY + "P"):
            usage[canonical] += float(term["value"])
    return dict(usage)


def items_from_endpoint(url: str, schema: str, lang: str, page_size: int) -> Iterator[tuple[str, dict]]:
    """(kind, item) of every entity (a page at a time) and then every property of a SPARQL endpoint."""
    client = SparqlClient(url, read_timeout_s=600)
    try:
        usage = property_usage(client, schema, page_size)
        unused = set()  # Wikidata properties that occur (are described) but are never used
        texts = TEXTS + (("sitelinks",) if schema == "wikidata" else ())
        bar = tqdm(desc="entities", unit=" IRIs", leave=False)
        for page in pages(client, "occurrences", QUERIES["occurrences"], page_size):
            bar.update(len(page))
            occurrences = {iri: float(term["value"]) for iri, term in page}
            if schema == "wikidata":
                entities = [iri for iri in occurrences if iri.startswith(WD_ENTITY + "Q")]
                unused |= {iri for iri in occurrences if iri.startswith(WD_ENTITY + "P") and iri not in usage}
            else:
                entities = [iri for iri in occurrences if iri not in usage]
            tables = describe(client, entities, texts, lang, page_size)
            sitelinks = {iri: float(values[0]) for iri, values in tables.get("sitelinks", {}).items()}
            for iri in entities:
                yield "entity", item(iri, tables, sitelinks.get(iri, occurrences[iri]))
        bar.close()
        yield from properties(client, schema, lang, page_size, usage, sorted(unused))
    finally:
        client.close()


def properties(client, schema: str, lang: str, page_size: int, usage: dict, unused: list) -> Iterator:
    """(kind, item) of every property: the used ones, and the unused ones that have a label."""
    iris = sorted(usage)
    labelled = describe(client, unused, ("labels",), lang, page_size)["labels"] if unused else {}
    iris = sorted(set(iris) | {iri for iri in unused if iri in labelled})
    usage = {iri: usage.get(iri, 0.0) for iri in iris}
    external = set()
    if schema == "wikidata":
        external = {iri for iri, _ in fetch_pairs(client, "external_ids", QUERIES["external_ids"], page_size)}
    top = max(usage.values(), default=0.0) + 1.0
    for start in range(0, len(iris), page_size):
        batch = iris[start : start + page_size]
        tables = describe(client, batch, TEXTS, lang, page_size)
        for iri in batch:  # external ids rank after every other property: popularity in [-1, 0)
            popularity = usage[iri] / top - 1.0 if iri in external else usage[iri]
            yield "property", item(iri, tables, popularity)
