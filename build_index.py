"""Build the search indices of a knowledge graph (docs/method.md sections 5.1-5.3; GRASP's `data` + `index`).

Reads every item's id, main label, aliases, description and popularity, either (a) from a SPARQL
endpoint with paged queries or (b) from an items JSONL file ({"id", "label", "aliases",
"description", "count"} per line, Wikidata Q/P ids or full IRIs), and writes into one directory:

    manifest.json                   source, counts, build settings, versions
    entities/   items + prefix/     prefix-keyword index (+ embedding/ with --embed all)
    properties/ items + prefix/ + embedding/

Finished parts are reused when the command is run again with the same settings (--force rebuilds).
The building itself (item extraction, popularity, parts, manifest) is the library index_build.py;
this script is its command line.

    python build_index.py --items ~/.cache/grisp/data/wikidata/items.jsonl \
        --out ~/.cache/grisp/indices/wikidata-items
    python endpoint.py start && python build_index.py --endpoint http://127.0.0.1:7878/query
    python build_index.py --endpoint URL --schema generic --lang de --out DIR   # any RDF graph
"""

import argparse
from pathlib import Path

import defaults
import index_build
from sparql import SparqlError


def main(args: argparse.Namespace) -> None:
    if args.items is not None and not Path(args.items).is_file():
        raise SystemExit(
            f"error: items file {args.items} does not exist; pass an items JSONL (see --help)"
        )
    index_build.build(Path(args.out), items=args.items and Path(args.items), endpoint=args.endpoint,
                      schema=args.schema, lang=args.lang, page_size=args.page_size, embed=args.embed,
                      encoder=args.encoder, force=args.force)


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
        choices=index_build.SCHEMAS,
        default=index_build.SCHEMAS[0],
        help="endpoint vocabulary: Wikidata RDF, or generic RDF (rdfs:label, skos:altLabel, "
        "schema:description, IRI local names)",
    )
    parser.add_argument(
        "--lang",
        default="en",
        help="language of labels, aliases and descriptions (untagged literals are always used)",
    )
    parser.add_argument("--page-size", type=int, default=index_build.PAGE_SIZE, help="rows per paged SPARQL query")
    # output
    parser.add_argument(
        "--out", default=str(defaults.DEMO_INDEX_DIR), help="index directory to write"
    )
    parser.add_argument("--force", action="store_true", help="rebuild parts that already exist")
    # embedding
    parser.add_argument(
        "--embed",
        choices=index_build.EMBED,
        default=index_build.EMBED[0],
        help="which kinds get an embedding index",
    )
    parser.add_argument(
        "--encoder",
        default=index_build.ENCODERS[0],
        choices=index_build.ENCODERS,
        help="text encoder of the embedding index",
    )
    args = parser.parse_args()
    try:
        main(args)
    except (ValueError, SparqlError) as e:
        raise SystemExit(f"error: {e}")
