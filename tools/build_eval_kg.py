"""Build a closed, offline Wikidata subset on which WWQ dev can be scored here (issues 7 and 14).

WWQ dev keeps the gold answers of every question in `info.results`. For the questions whose gold
query is a single triple pattern (`wd:Q wdt:P ?x` or `?x wdt:P wd:Q`), those answers *are* the
triples: `wd:Q wdt:P answer` (or `answer wdt:P wd:Q`). This script collects those triples, adds
labels, aliases and descriptions from the item cache (`wikidata/items.jsonl`), keeps the questions
whose gold query returns exactly its gold answers on the result (checked in-process, then again over
HTTP on a real oxigraph server), and writes to `--out`. Three settings (`--setting`):

  closed  (default, benchmark `wwq-dev-kg`) the answer triples + labels of the items and properties
          they mention. Very easy: search sees almost no distractors.
  full    (benchmark `wwq-dev-full`) the answer triples + the demo KG (`--extra-kg`) + labels of ALL
          items of the item cache; searched with the index over all items, so "paris" finds six
          Parises. Still easier than Wikidata: the distractors have names but (outside the demo KG)
          no facts, so constraint queries and validation rarely see them.
  real    (benchmark `wwq-dev-real`, docs/evaluation.md) the full setting + 246,902 real Wikidata facts
          (CoDEx, `extra/codex/`) as neighbours and competing facts, and it keeps the questions whose
          entity or property has no label record too: the index cannot name them, so declining is
          their right outcome (`info.index_lacks` lists the ids). Halves: `wwq-dev-real-tune` chooses
          defaults, `wwq-dev-real-report` is reported (benchmarks.half).

    kg.nt            the knowledge graph (N-Triples)
    questions.jsonl  the covered dev questions (benchmark JSONL, records unchanged)
    items.jsonl      the label records of every labelled item (format of the item cache), for its search
                     index; their `count` (the index's popularity) is counted in the training material
    stats.json       counts (what was covered and dropped, and `difficulty`: memory, distractors), the configuration

Popularity (`--popularity`): the item cache's own `count` was counted over training *and validation*
data, so every WWQ dev answer and topic entity has one while most other items have none; an index
built on it ranks the gold item first among its namesakes, and search alone looks right. `training`
(the default) counts each id's occurrences in the gold queries and answers of the training material
(benchmarks.TRAINING_MATERIAL) instead; `items` keeps the cache's count (evaluations before 2026-12-06).

    python tools/build_eval_kg.py                      # WWQ dev -> ~/.cache/grisp/eval_kg/wwq-dev/
    python endpoint.py start --data ~/.cache/grisp/eval_kg/wwq-dev/kg.nt \
        --store ~/.cache/grisp/stores/wwq-dev --port 7879   # serve it for evaluate.py
    python tools/build_eval_kg.py --setting full       # -> ~/.cache/grisp/eval_kg/wwq-dev-full/ (port 7880)
    python tools/build_eval_kg.py --setting real       # -> ~/.cache/grisp/eval_kg/wwq-dev-real/ (port 7881)
    python build_index.py --items ~/.cache/grisp/eval_kg/wwq-dev-full/items.jsonl \
        --out ~/.cache/grisp/indices/wwq-dev-full          # its search index
"""

import argparse
import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pyoxigraph as ox

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: its modules
import endpoint  # noqa: E402
from build_index import WIKIDATA_ID  # noqa: E402
from common import defaults  # noqa: E402
from common.jsonl import read_jsonl, write_jsonl  # noqa: E402
from grisp import (  # noqa: E402
    benchmarks,
    metrics,
    sparql,
)
from grisp.skeleton import query_iris  # noqa: E402
from grisp.sparql_syntax import PREFIXES, declared_prefixes, expand, query_key, tokenize  # noqa: E402
from search import normalize  # noqa: E402

WD, WDT = PREFIXES["wd"], PREFIXES["wdt"]
RDFS_LABEL, SKOS_ALT_LABEL = expand("rdfs:label"), expand("skos:altLabel")
SCHEMA_DESCRIPTION, RDF_TYPE = expand("schema:description"), expand("rdf:type")
WIKIBASE_PROPERTY, WIKIBASE_DIRECT_CLAIM = expand("wikibase:Property"), expand("wikibase:directClaim")


CODEX_FILE = (
    "extra/codex/codex_triples.nt.gz"  # in the data cache (benchmarks.cached_file): real Wikidata facts
)


class Setting(NamedTuple):
    """Defaults of one --setting: where it writes, which store and port check it, what RDF it adds."""

    out: Path
    store: Path
    port: int
    extra_kg: tuple[Path | str, ...]  # a str names a file of the data cache
    all_items: bool  # label every item of the item cache, not only those the KG mentions
    keep_unlabelled: bool = False  # keep questions whose entity or property has no label record


SETTINGS = {
    "closed": Setting(benchmarks.EVAL_KG_DIR, defaults.GRISP_HOME / "stores" / "wwq-dev", 7879, (), False),
    "full": Setting(
        benchmarks.EVAL_KG_FULL_DIR,
        defaults.GRISP_HOME / "stores" / "wwq-dev-full",
        7880,
        (defaults.DEMO_DIR / "kg.ttl",),
        True,
    ),
    "real": Setting(
        benchmarks.EVAL_KG_REAL_DIR,
        defaults.GRISP_HOME / "stores" / "wwq-dev-real",
        7881,
        (defaults.DEMO_DIR / "kg.ttl", CODEX_FILE),
        True,
        keep_unlabelled=True,
    ),
}

PREFIX_LINE = re.compile(r"PREFIX\s+[\w-]*:\s*<[^>]*>", re.IGNORECASE)
TERM = r"(\?\w+|<[^>\s]*>|[\w-]*:\w+)"
# the whole query after its PREFIX lines: one triple pattern selecting its one variable
SINGLE_PATTERN = re.compile(
    rf"SELECT\s+(?:DISTINCT\s+)?(\?\w+)\s+WHERE\s*\{{\s*{TERM}\s+{TERM}\s+{TERM}\s*\.?\s*\}}"
    rf"\s*(?:LIMIT\s+\d+\s*)?",
    re.IGNORECASE,
)


def single_pattern(sparql: str) -> tuple[str, str, str, str] | None:
    """(variable, subject, property, object) if the query is `SELECT ?x { s wdt:P o }` with ?x at
    one end and a Wikidata entity at the other; None for any other query. Prefixed names expand
    only with the query's own PREFIX declarations (an undeclared prefix: None)."""
    prefixes = declared_prefixes(tokenize(sparql))
    body = PREFIX_LINE.sub("", sparql).strip()
    match = SINGLE_PATTERN.fullmatch(body)
    if match is None:
        return None
    variable, *terms = match.groups()
    if any(t.split(":", 1)[0] not in prefixes for t in terms if t[0] not in "?<"):
        return None  # an undeclared prefix: not a query this script understands
    subject, prop, obj = (t if t.startswith("?") else expand(t, prefixes) for t in terms)
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
        triples.append(
            ox.Triple(node, ox.NamedNode(SCHEMA_DESCRIPTION), ox.Literal(item["description"], language="en"))
        )
    if item["id"].startswith("P"):
        triples.append(ox.Triple(node, ox.NamedNode(RDF_TYPE), ox.NamedNode(WIKIBASE_PROPERTY)))
        triples.append(ox.Triple(node, ox.NamedNode(WIKIBASE_DIRECT_CLAIM), ox.NamedNode(WDT + item["id"])))
    return triples


def mentioned_ids(triples: list[ox.Triple]) -> set[str]:
    """Wikidata ids (Q.., P..) of every entity and property the triples use (not statement nodes)."""
    ids = set()
    for triple in triples:
        for node in (triple.subject, triple.predicate, triple.object):
            if isinstance(node, ox.NamedNode):
                for namespace in (WD, WDT):
                    local = node.value[len(namespace) :]
                    if node.value.startswith(namespace) and WIKIDATA_ID.fullmatch(local):
                        ids.add(local)
    return ids


LOCAL_ID = re.compile(r"/([QP]\d+)$")  # the Wikidata id at the end of an entity or property IRI


def training_records() -> list[dict]:
    """Every record of the training material (benchmarks.TRAINING_MATERIAL), held-out parts left out."""
    return [record for name in benchmarks.TRAINING_MATERIAL for record in benchmarks.load_benchmark(name)]


def training_popularity(records: list[dict]) -> Counter:
    """How often each Wikidata id (Q.., P..) occurs in the records' gold queries (any property variant)
    and gold answers (where a record keeps them): a popularity no evaluation question has shaped."""
    counts = Counter()
    for record in records:
        iris = query_iris(record["sparql"])
        iris += [
            term["value"]
            for row in record.get("info", {}).get("results") or []
            for term in row.values()
            if isinstance(term, dict) and term.get("type") == "uri"
        ]
        counts.update(match[1] for iri in iris if (match := LOCAL_ID.search(iri)))
    return counts


def topic_entity(sample: dict) -> str:
    """The id of the single-pattern query's constant entity (`Q..`)."""
    variable, subject, _, obj = single_pattern(sample["sparql"])
    return (obj if subject == variable else subject)[len(WD) :]


def topic_ids(sample: dict) -> set[str]:
    """Ids the resolver must find by search: the query's constant entity and its property."""
    return {topic_entity(sample), single_pattern(sample["sparql"])[2][len(WDT) :]}


def difficulty(
    samples: list[dict],
    candidates: list[dict],
    covered: list[dict],
    triples: list[ox.Triple],
    records: dict[str, dict],
    popularity: Counter | None,
    training: list[dict],
) -> dict:
    """How much the KG tests search, re-ranking and memory (the counts docs/evaluation.md quotes):

    in_training     questions whose gold query (sparql_syntax.query_key) is also the gold query of a
                    record of the training material (`training`)
    one_property    single-pattern questions whose topic entity has exactly one wdt: property in the KG
                    (then a constrained property search has a single candidate)
    namesakes       covered questions whose topic entity shares its label (as search normalises it)
                    with another labelled entity; gold_first_*: of those, how often the gold entity
                    comes first among its namesakes by popularity (ties: the lower Q number), by the
                    count written to items.jsonl and by the item cache's own count
    """
    train_keys = {query_key(record["sparql"]) for record in training}
    properties = {}  # entity id -> the wdt: properties of the facts it takes part in
    for triple in triples:
        if triple.predicate.value.startswith(WDT):
            for node in (triple.subject, triple.object):
                if isinstance(node, ox.NamedNode) and node.value.startswith(WD):
                    properties.setdefault(node.value[len(WD) :], set()).add(triple.predicate.value)
    namesakes = {}  # normalised label -> labelled entity ids
    for item_id, record in records.items():
        if item_id.startswith("Q"):
            namesakes.setdefault(" ".join(normalize(record["label"])), []).append(item_id)
    own_count = {item_id: record.get("count") or 0 for item_id, record in records.items()}
    counts = {"written": own_count if popularity is None else popularity, "item_cache": own_count}
    shared = [
        (topic, ids)
        for topic in map(topic_entity, covered)
        if topic in records and len(ids := namesakes[" ".join(normalize(records[topic]["label"]))]) > 1
    ]
    first = {
        name: sum(min(ids, key=lambda i: (-count[i], int(i[1:]))) == topic for topic, ids in shared)
        for name, count in counts.items()
    }
    return {
        "in_training": sum(query_key(sample["sparql"]) in train_keys for sample in samples),
        "one_property": sum(len(properties.get(topic_entity(sample), ())) == 1 for sample in candidates),
        "namesakes": len(shared),
        "gold_first_by_written_count": first["written"],
        "gold_first_by_item_cache_count": first["item_cache"],
    }


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
    returns the ids whose answers differ from the gold ones. A server started here is stopped again
    (one already running over this store is left running); the stamped store stays for
    `python endpoint.py start` to reuse."""
    running = endpoint.status(store_dir)
    url = endpoint.start([kg_file], store_dir, port=port)
    started_here = running is None or endpoint.status(store_dir)["pid"] != running["pid"]
    client = sparql.SparqlClient(url)
    try:
        return [
            sample["id"]
            for sample in samples
            if not gold_matches(metrics.from_result(client.query(sample["sparql"])), sample)
        ]
    finally:
        client.close()
        if started_here:
            endpoint.stop(store_dir)


def read_rdf(path: Path) -> list[ox.Triple]:
    """The triples of an RDF file, its format told by the extension (.ttl, .nt ..., gzipped as .nt.gz)."""
    zipped = path.suffix == ".gz"
    rdf_format = ox.RdfFormat.from_extension((path.with_suffix("") if zipped else path).suffix[1:])
    if not path.is_file() or rdf_format is None:
        raise FileNotFoundError(
            f"extra KG file {path} does not exist or has no RDF extension "
            f"(.ttl, .nt, ... or .nt.gz); pass another one with --extra-kg"
        )
    try:
        with (gzip.open if zipped else open)(path, "rb") as file:
            return [quad.triple for quad in ox.parse(file, format=rdf_format)]
    except SyntaxError as error:
        raise ValueError(f"extra KG file {path} is not valid RDF: {error}") from None


def single_pattern_answers(samples: list[dict]) -> tuple[list[dict], list[ox.Triple]]:
    """The single-pattern questions and their answer triples (de-duplicated, in order)."""
    candidates, answers = [], []
    for sample in samples:
        sample_triples = answer_triples(sample)
        if sample_triples is not None:
            candidates.append(sample)
            answers.extend(sample_triples)
    return candidates, list(dict.fromkeys(answers))  # questions may share answers


def verify(kg_file: Path, covered: list[dict], store_dir: Path, port: int) -> int:
    """verify_on_server, a ValueError naming the questions whose gold answers differ; how many were checked."""
    mismatched = verify_on_server(kg_file, covered, store_dir, port)
    if mismatched:
        raise ValueError(
            f"on the oxigraph server these gold queries do not return their gold answers: {', '.join(mismatched)}"
        )
    print(
        f"verified on an oxigraph server: all {len(covered)} covered gold queries return exactly their gold answers"
    )
    return len(covered)


def resolve_setting(args: argparse.Namespace) -> Setting:
    """The --setting's defaults filled into the flags left unset (in `args`); the setting."""
    setting = SETTINGS[args.setting]
    args.out = str(Path(args.out or setting.out).expanduser())
    args.store = str(Path(args.store or setting.store).expanduser())
    args.port = setting.port if args.port is None else args.port
    endpoint.check_port(args.port)  # here, not after the whole build at the check on the server
    extra_files = setting.extra_kg if args.extra_kg is None else args.extra_kg
    extra_files = [
        benchmarks.cached_file(f) if isinstance(f, str) and args.extra_kg is None else f for f in extra_files
    ]
    args.extra_kg = [str(Path(f).expanduser()) for f in extra_files]
    return setting


def covered_questions(exact: list[dict], labelled: set[str], keep_unlabelled: bool) -> list[dict]:
    """The questions kept: those whose entity and property have a label record, and with `keep_unlabelled`
    the others too, their unlabelled ids in `info.index_lacks` (search cannot find them: to decline)."""
    covered = []
    for sample in exact:
        lacks = sorted(topic_ids(sample) - labelled)
        if not lacks or keep_unlabelled:
            covered.append({**sample, "info": {**sample["info"], "index_lacks": lacks}} if lacks else sample)
    return covered


def print_counts(stats: dict, extra_triples: int) -> None:
    """What was covered and dropped, the KG's size and its difficulty, from `stats` (main's)."""
    hard, changed = stats["difficulty"], stats["changed_by_extra_kg"]
    print(
        f"{stats['covered']} of {stats['questions']} questions covered: {stats['single_pattern']} single-pattern, "
        f"{stats['conflicting']} of them dropped because other questions' triples add answers, "
        f"{len(changed)} because the extra KG adds answers{': ' + ', '.join(changed) if changed else ''}, "
        f"{stats['unlabelled_topic']} {'kept (to decline)' if stats['kept_unlabelled'] else 'dropped'} because "
        f"their entity or property has no label record"
    )
    print(
        f"{stats['triples']} triples ({stats['answer_triples']} answer triples, {extra_triples} from "
        f"{len(stats['extra_kg_triples'])} extra KG files, {stats['label_triples']} label triples of "
        f"{stats['label_records']} label records), {stats['items']} items, {stats['properties']} properties, "
        f"{len(stats['unlabelled'])} without a label record"
    )
    print(
        f"difficulty: {hard['in_training']} of {stats['questions']} gold queries are also gold queries of the "
        f"training material; {hard['one_property']} of {stats['single_pattern']} single-pattern topics have "
        f"one wdt: property in the KG; {hard['namesakes']} of {stats['covered']} covered topics have a "
        f"namesake, the gold one first by popularity in {hard['gold_first_by_written_count']} (item cache's "
        f"count: {hard['gold_first_by_item_cache_count']})"
    )


def main(args: argparse.Namespace) -> None:
    setting = resolve_setting(args)  # its defaults fill the flags left unset
    print(f"config: {json.dumps(vars(args), default=str)}")
    # --- data
    samples = benchmarks.load_benchmark(args.benchmark)
    items_path = Path(args.items) if args.items else benchmarks.cached_file(benchmarks.ITEMS_FILE)
    items = {record["id"]: record for record in read_jsonl(items_path)}
    extra = {path: read_rdf(Path(path)) for path in args.extra_kg}

    # --- answer triples of the single-pattern questions
    candidates, answers = single_pattern_answers(samples)
    extra_triples = [triple for triples in extra.values() for triple in triples]

    # --- labels of every item and property mentioned (closed) or of every item (full, real)
    ids = mentioned_ids(answers + extra_triples)
    labelled = sorted(
        items if setting.all_items else (i for i in ids if i in items), key=lambda i: (i[0], i[1:].zfill(12))
    )
    labels = [triple for item_id in labelled for triple in label_triples(items[item_id])]
    triples = list(dict.fromkeys(answers + extra_triples + labels))  # the extra KG repeats labels

    # --- keep the questions whose gold query returns exactly its gold answers: on the answer triples
    # alone (other questions' triples may add answers), then on the whole KG (the extra KG's facts
    # may add answers); and whose entity and property have a label record (else search cannot find them)
    alone = check_in_process(answers, candidates)
    exact = check_in_process(triples, alone)
    changed = sorted({sample["id"] for sample in alone} - {sample["id"] for sample in exact})
    covered = covered_questions(exact, set(labelled), setting.keep_unlabelled)

    # --- write
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ox.serialize(triples, out / "kg.nt", format=ox.RdfFormat.N_TRIPLES)
    write_jsonl(out / "questions.jsonl", covered)
    training = training_records()
    popularity = training_popularity(training) if args.popularity == "training" else None
    write_jsonl(
        out / "items.jsonl",
        (items[i] if popularity is None else {**items[i], "count": popularity[i]} for i in labelled),
    )
    kg_ids = mentioned_ids(triples)
    stats = {
        "setting": args.setting,
        "questions": len(samples),
        "single_pattern": len(candidates),
        "covered": len(covered),
        "conflicting": len(candidates) - len(alone),
        "changed_by_extra_kg": changed,
        "unlabelled_topic": sum(not topic_ids(s) <= set(labelled) for s in exact),
        "kept_unlabelled": setting.keep_unlabelled,
        "answer_triples": len(answers),
        "extra_kg_triples": {path: len(t) for path, t in extra.items()},
        "label_records": len(labelled),
        "label_triples": len(labels),
        "triples": len(triples),
        "items": len([i for i in kg_ids if i.startswith("Q")]),
        "properties": len([i for i in kg_ids if i.startswith("P")]),
        "unlabelled": sorted(kg_ids - set(labelled)),
        "items_file": str(items_path),
        "popularity": args.popularity,
        "difficulty": difficulty(
            samples, candidates, covered, triples, {i: items[i] for i in labelled}, popularity, training
        ),
        "config": vars(args),
    }
    print_counts(stats, len(extra_triples))
    if args.verify:
        stats["server_verified"] = verify(out / "kg.nt", covered, Path(args.store), args.port)
    (out / "stats.json").write_text(json.dumps(stats, indent=2, default=str) + "\n")
    print(
        f"wrote {out}/kg.nt, questions.jsonl, items.jsonl (popularity: {args.popularity}), stats.json; "
        f"its search index: python build_index.py --items {out / 'items.jsonl'} --out DIR"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Build a closed WWQ-dev evaluation knowledge graph from the gold answers of "
        "single-triple-pattern questions (easier than full Wikidata: few distractors).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # data
    parser.add_argument(
        "--setting",
        choices=list(SETTINGS),
        default="closed",
        help="closed: answer triples + labels of what they mention (benchmark "
        "wwq-dev-kg); full: + the demo KG + labels of all items (wwq-dev-full); real: "
        "full + CoDEx's real Wikidata facts, questions the index cannot name kept "
        "(wwq-dev-real)",
    )
    parser.add_argument(
        "--benchmark", default="wwq-dev", help="benchmark name or JSONL path whose records carry info.results"
    )
    parser.add_argument(
        "--items",
        default=None,
        help="item label file (JSONL id/label/aliases/description/count); "
        "default: wikidata/items.jsonl from the data cache",
    )
    parser.add_argument(
        "--popularity",
        choices=["training", "items"],
        default="training",
        help="the items.jsonl count its search index ranks by: training = occurrences in the "
        "training material's gold queries and answers; items = the item file's own "
        "count, which counts validation data too (evaluations before 2026-12-06)",
    )
    parser.add_argument(
        "--extra-kg",
        nargs="*",
        default=None,
        help="RDF files added to the KG; default: none (closed), data/demo/kg.ttl (full), "
        "that and extra/codex/codex_triples.nt.gz of the data cache (real)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"output directory; default: {benchmarks.EVAL_KG_DIR} (closed), "
        f"{benchmarks.EVAL_KG_FULL_DIR} (full), {benchmarks.EVAL_KG_REAL_DIR} (real)",
    )
    # verification on a real endpoint
    parser.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the check that runs every covered gold query on an oxigraph server "
        "(verify=%(default)s: the check runs unless this flag is given)",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="oxigraph store directory for the check (reused by endpoint.py start); "
        "default: ~/.cache/grisp/stores/wwq-dev (closed), .../wwq-dev-full (full), .../wwq-dev-real (real)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="port of the checking server; default: 7879 (closed), 7880 (full), 7881 (real)",
    )
    args = parser.parse_args()
    try:
        main(args)
    except (FileNotFoundError, ValueError, endpoint.EndpointError, sparql.SparqlError) as error:
        sys.exit(f"error: {error}")
