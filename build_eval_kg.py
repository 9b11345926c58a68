"""Build a closed, offline Wikidata subset on which WWQ dev can be scored here (issue 7, item 2).

WWQ dev keeps the gold answers of every question in `info.results`. For the questions whose gold
query is a single triple pattern (`wd:Q wdt:P ?x` or `?x wdt:P wd:Q`), those answers *are* the
triples: `wd:Q wdt:P answer` (or `answer wdt:P wd:Q`). This script collects those triples, adds
labels, aliases and descriptions from the item cache (`wikidata/items.jsonl`) for every item and
property it mentions, keeps the questions whose gold query returns exactly its gold answers on the
result (checked in-process, then again over HTTP on a real oxigraph server), and writes to `--out`:

    kg.nt            the knowledge graph (N-Triples): answer triples + labels + property links
    questions.jsonl  the covered dev questions (benchmark JSONL, records unchanged)
    items.jsonl      the label records of every item in the KG (same format as the item cache)
    stats.json       counts and the configuration that produced them

This KG is much easier than full Wikidata: it holds only the triples that answer its questions,
so there are far fewer distractors for search, constrained search and query validation.

    python build_eval_kg.py                      # WWQ dev -> ~/.cache/grisp/eval_kg/wwq-dev/
    python endpoint.py start --data ~/.cache/grisp/eval_kg/wwq-dev/kg.nt \
        --store ~/.cache/grisp/stores/wwq-dev --port 7879   # serve it for evaluate.py
"""
import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pyoxigraph as ox

import benchmarks
import defaults
import endpoint
import metrics
import sparql

WD = "http://www.wikidata.org/entity/"
WDT = "http://www.wikidata.org/prop/direct/"
RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"
SKOS_ALT_LABEL = "http://www.w3.org/2004/02/skos/core#altLabel"
SCHEMA_DESCRIPTION = "http://schema.org/description"
RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
WIKIBASE_PROPERTY = "http://wikiba.se/ontology#Property"
WIKIBASE_DIRECT_CLAIM = "http://wikiba.se/ontology#directClaim"

PREFIX_LINE = re.compile(r"PREFIX\s+([\w-]*):\s*<([^>]*)>", re.IGNORECASE)
TERM = r"(\?\w+|<[^>\s]*>|[\w-]*:\w+)"
# the whole query after its PREFIX lines: one triple pattern selecting its one variable
SINGLE_PATTERN = re.compile(
    rf"SELECT\s+(?:DISTINCT\s+)?(\?\w+)\s+WHERE\s*\{{\s*{TERM}\s+{TERM}\s+{TERM}\s*\.?\s*\}}"
    rf"\s*(?:LIMIT\s+\d+\s*)?", re.IGNORECASE)


def expand(term: str, prefixes: dict[str, str]) -> str:
    """A variable stays `?x`; `<iri>` and `prefix:local` become the full IRI."""
    if term.startswith("?"):
        return term
    if term.startswith("<"):
        return term[1:-1]
    prefix, local = term.split(":", 1)
    assert prefix in prefixes, f"undeclared prefix {prefix!r} in {term}"
    return prefixes[prefix] + local


def single_pattern(sparql: str) -> tuple[str, str, str, str] | None:
    """(variable, subject, property, object) if the query is `SELECT ?x { s wdt:P o }` with ?x at
    one end and a Wikidata entity at the other; None for any other query."""
    prefixes = dict(PREFIX_LINE.findall(sparql))
    body = PREFIX_LINE.sub("", sparql).strip()
    match = SINGLE_PATTERN.fullmatch(body)
    if match is None:
        return None
    variable, *terms = match.groups()
    if any(t.split(":", 1)[0] not in prefixes for t in terms if t[0] not in "?<"):
        return None  # an undeclared prefix: not a query this script understands
    subject, prop, obj = (expand(t, prefixes) for t in terms)
    if not prop.startswith(WDT) or sorted([subject == variable, obj == variable]) != [False, True]:
        return None
    if not (subject if obj == variable else obj).startswith(WD):
        return None
    return variable, subject, prop, obj


def rdf_term(term: dict) -> ox.NamedNode | ox.Literal:
    """A SPARQL JSON results term (uri or literal) as a pyoxigraph term."""
    kind, value, datatype, language = metrics.term(term)
    assert kind != "bnode", f"blank node answers cannot be rebuilt as triples: {term}"
    if kind == "uri":
        return ox.NamedNode(value)
    if language:
        return ox.Literal(value, language=language)
    return ox.Literal(value, datatype=ox.NamedNode(datatype))


def answer_triples(sample: dict) -> list[ox.Triple] | None:
    """The triples that the sample's gold answers stand for, or None if it is not single-pattern."""
    pattern = single_pattern(sample["sparql"])
    results = sample.get("info", {}).get("results")
    if pattern is None or not results:
        return None
    variable, subject, prop, obj = pattern
    triples = []
    for binding in results:
        answer = binding.get(variable[1:])
        if answer is None or (subject == variable and answer.get("type") != "uri"):
            return None  # an unbound answer, or a literal in subject position
        s = rdf_term(answer) if subject == variable else ox.NamedNode(subject)
        o = rdf_term(answer) if obj == variable else ox.NamedNode(obj)
        triples.append(ox.Triple(s, ox.NamedNode(prop), o))
    return triples


def label_triples(item: dict) -> list[ox.Triple]:
    """rdfs:label, skos:altLabel and schema:description (English) of one item-cache record;
    a property also gets its Wikidata type and its `wikibase:directClaim` link to the wdt: IRI."""
    node = ox.NamedNode(WD + item["id"])
    triples = [ox.Triple(node, ox.NamedNode(RDFS_LABEL), ox.Literal(item["label"], language="en"))]
    for alias in item.get("aliases") or []:
        triples.append(ox.Triple(node, ox.NamedNode(SKOS_ALT_LABEL), ox.Literal(alias, language="en")))
    if item.get("description"):
        triples.append(ox.Triple(node, ox.NamedNode(SCHEMA_DESCRIPTION),
                                 ox.Literal(item["description"], language="en")))
    if item["id"].startswith("P"):
        triples.append(ox.Triple(node, ox.NamedNode(RDF_TYPE), ox.NamedNode(WIKIBASE_PROPERTY)))
        triples.append(ox.Triple(node, ox.NamedNode(WIKIBASE_DIRECT_CLAIM), ox.NamedNode(WDT + item["id"])))
    return triples


def mentioned_ids(triples: list[ox.Triple]) -> set[str]:
    """Wikidata ids (Q.., P..) of every entity and property the triples use."""
    ids = set()
    for triple in triples:
        for node in (triple.subject, triple.predicate, triple.object):
            if isinstance(node, ox.NamedNode):
                for namespace in (WD, WDT):
                    if node.value.startswith(namespace):
                        ids.add(node.value[len(namespace):])
    return ids


def topic_ids(sample: dict) -> set[str]:
    """Ids the resolver must find by search: the query's constant entity and its property."""
    variable, subject, prop, obj = single_pattern(sample["sparql"])
    entity = obj if subject == variable else subject
    return {entity[len(WD):], prop[len(WDT):]}


def gold_matches(result: metrics.ResultSet, sample: dict) -> bool:
    """True iff a result holds exactly the gold answers (as a multiset of rows)."""
    gold = metrics.from_bindings(sample["info"]["results"])
    return Counter(result.rows) == Counter(gold.rows)


def check_in_process(triples: list[ox.Triple], samples: list[dict]) -> list[dict]:
    """Run every gold query on an in-memory store of the KG; keep the samples answered exactly.
    A sample fails when another question's triples add answers to its pattern (data drift)."""
    store = ox.Store()
    store.bulk_extend(ox.Quad(t.subject, t.predicate, t.object) for t in triples)
    kept = []
    for sample in samples:
        document = json.loads(store.query(sample["sparql"]).serialize(format=ox.QueryResultsFormat.JSON))
        if gold_matches(metrics.from_json(document), sample):
            kept.append(sample)
    return kept


def verify_on_server(kg_file: Path, samples: list[dict], store_dir: Path, port: int) -> list[str]:
    """Serve the KG with a real oxigraph server (endpoint.py) and run every gold query over HTTP;
    returns the ids whose answers differ from the gold ones. The server is stopped again; its
    stamped store stays for `python endpoint.py start` to reuse."""
    url = endpoint.start([kg_file], store_dir, port=port)
    client = sparql.SparqlClient(url)
    try:
        return [sample["id"] for sample in samples
                if not gold_matches(metrics.from_result(client.query(sample["sparql"])), sample)]
    finally:
        client.close()
        endpoint.stop(store_dir)


def main(args: argparse.Namespace) -> None:
    print(f"config: {json.dumps(vars(args), default=str)}")
    # --- data
    samples = benchmarks.load_benchmark(args.benchmark)
    items_path = Path(args.items) if args.items else benchmarks.cached_file(benchmarks.ITEMS_FILE)
    items = {record["id"]: record for record in benchmarks.read_jsonl(items_path)}

    # --- answer triples of the single-pattern questions
    candidates, triples = [], []
    for sample in samples:
        sample_triples = answer_triples(sample)
        if sample_triples is not None:
            candidates.append(sample)
            triples.extend(sample_triples)
    triples = list(dict.fromkeys(triples))  # de-duplicate, keep order (shared answers)
    answer_count = len(triples)

    # --- labels of every item and property mentioned
    ids = mentioned_ids(triples)
    labelled = sorted((i for i in ids if i in items), key=lambda i: (i[0], i[1:].zfill(12)))
    for item_id in labelled:
        triples.extend(label_triples(items[item_id]))

    # --- keep the questions whose gold query returns exactly its gold answers on this KG and
    # whose entity and property have a label record (without one, no search can find them)
    exact = check_in_process(triples, candidates)
    covered = [sample for sample in exact if topic_ids(sample) <= set(labelled)]

    # --- write
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    ox.serialize(triples, out / "kg.nt", format=ox.RdfFormat.N_TRIPLES)
    with open(out / "questions.jsonl", "w", encoding="utf-8") as file:
        file.writelines(json.dumps(sample, ensure_ascii=False) + "\n" for sample in covered)
    with open(out / "items.jsonl", "w", encoding="utf-8") as file:
        file.writelines(json.dumps(items[i], ensure_ascii=False) + "\n" for i in labelled)
    stats = {
        "questions": len(samples), "single_pattern": len(candidates), "covered": len(covered),
        "conflicting": len(candidates) - len(exact), "unlabelled_topic": len(exact) - len(covered),
        "answer_triples": answer_count,
        "triples": len(triples), "items": len([i for i in ids if i.startswith("Q")]),
        "properties": len([i for i in ids if i.startswith("P")]),
        "unlabelled": sorted(ids - set(labelled)), "config": vars(args),
    }
    print(f"{len(covered)} of {len(samples)} questions covered: {len(candidates)} single-pattern, "
          f"{stats['conflicting']} of them dropped because other questions' triples add answers, "
          f"{stats['unlabelled_topic']} because their entity or property has no label record")
    print(f"{len(triples)} triples ({answer_count} answer triples), {stats['items']} items, "
          f"{stats['properties']} properties, {len(stats['unlabelled'])} without a label record")
    if args.verify:
        mismatched = verify_on_server(out / "kg.nt", covered, Path(args.store).expanduser(), args.port)
        if mismatched:
            raise ValueError(f"on the oxigraph server these gold queries do not return their gold "
                             f"answers: {', '.join(mismatched)}")
        stats["server_verified"] = len(covered)
        print(f"verified on an oxigraph server: all {len(covered)} covered gold queries return "
              f"exactly their gold answers")
    (out / "stats.json").write_text(json.dumps(stats, indent=2, default=str) + "\n")
    print(f"wrote {out}/kg.nt, questions.jsonl, items.jsonl, stats.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Build the closed WWQ-dev evaluation knowledge graph from the gold answers of "
                    "single-triple-pattern questions (easier than full Wikidata: few distractors).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # data
    parser.add_argument("--benchmark", default="wwq-dev",
                        help="benchmark name or JSONL path whose records carry info.results")
    parser.add_argument("--items", default=None,
                        help="item label file (JSONL id/label/aliases/description/count); "
                             "default: wikidata/items.jsonl from the data cache")
    parser.add_argument("--out", default=str(benchmarks.EVAL_KG_DIR),
                        help="output directory for kg.nt, questions.jsonl, items.jsonl, stats.json")
    # verification on a real endpoint
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip running every covered gold query on an oxigraph server")
    parser.add_argument("--store", default=str(defaults.GRISP_HOME / "stores" / "wwq-dev"),
                        help="oxigraph store directory for the check (reused by endpoint.py start)")
    parser.add_argument("--port", type=int, default=7879, help="port of the checking server")
    args = parser.parse_args()
    try:
        main(args)
    except (FileNotFoundError, ValueError, endpoint.EndpointError, sparql.SparqlError) as error:
        sys.exit(f"error: {error}")
