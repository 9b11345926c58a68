"""The training data mixture: which benchmark records a run trains on, from which sources, how often per
epoch, and what was skipped and why (docs/method.md section 3.7). Used by gen_data.py and train.py;
samples.py turns the records into samples.

`--data` names one source or several, each with an optional weight:

    --data wwq                                   # WikiWebQuestions train, as the first adapter
    --data wwq,qald10,qald7,lcquad2,sq,spinach   # every source once per epoch
    --data wwq:1,lcquad2:0.3,qald7:2             # weights

A source is a short name (SOURCES), a benchmarks.py name or a JSONL path (never an evaluation set). Its weight w is how
often each of its usable records is used per epoch on average: the integer part is that many full
passes, the fraction a fresh random subset of round(fraction x records) records per epoch, drawn from
the seed (`epoch_records`). So `lcquad2:0.3` trains on a different 30% of LC-QuAD's records each
epoch, and `qald7:2` on every QALD-7 record twice, with different augmentations. Records come from
benchmarks.load_training, which never yields a held-out dev set ("qald10" is QALD-10's train part;
its 20% hold-out, qald10-dev, stays out of every run). With more than one source a record's id
becomes "source:id", since the files reuse ids such as train_0.

`prepare` keeps what can train and counts the rest per source and reason (the first that applies):
- other_service: a SERVICE call other than Wikidata's label service (our client refuses SERVICE);
- does_not_parse: the gold query is not valid SPARQL 1.1 after the rewrite below (e.g. Blazegraph's
  `hint:` and named subqueries `WITH { ... } AS %x`);
- unknown_iri: an IRI the index (items.jsonl) cannot name, so the skeleton would hold a raw IRI.
Wikidata's label service (`SERVICE wikibase:label { ... }`, 105 of SPINACH's 155 queries), which binds
?xLabel to the label of ?x, is rewritten into plain patterns our client and any endpoint run
(`without_label_service`): the model should not learn to write a SERVICE call the client refuses.

    data = read("wwq,lcquad2:0.3").prepare(indices)    # parse_data, load, prepare
    print(data.table(is_validation))            # the per-source summary
    SampleGenerator(data.usable, indices, Augment(), seed, weights=data.weights)   # samples.py
"""

import math
import random
from collections import Counter
from dataclasses import dataclass, field

from grisp import benchmarks
from grisp.skeleton import parses, skeletonize
from grisp.sparql_syntax import is_keyword, rewrite, skip_group, tokenize

# --data short names -> benchmarks.load_training names
SOURCES = {
    "wwq": "wwq-train",
    "qald10": "qald10",
    "qald7": "qald7-train",
    "lcquad2": "lcquad2-test",
    "sq": "simplequestions-val",
    "spinach": "spinach-val",
}
SKIP_REASONS = ("other_service", "does_not_parse", "unknown_iri")  # checked in this order
# a variable ?x<suffix> bound by the label service -> the property that holds it
LABEL_SERVICE_SUFFIXES = {
    "AltLabel": "skos:altLabel",
    "Description": "schema:description",
    "Label": "rdfs:label",
}
LABEL_SERVICE = ("wikibase:label", "<http://wikiba.se/ontology#label>")


@dataclass(frozen=True)
class Source:
    name: str  # as given in --data
    benchmark: str  # what benchmarks.load_training reads
    weight: float  # uses of each usable record per epoch


def parse_data(spec: str) -> list[Source]:
    """`wwq,lcquad2:0.3` -> Sources; ValueError naming the problem for a bad spec."""
    sources = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        name, _, weight = part.rpartition(":") if _has_weight(part) else (part, "", "1")
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(
                f"--data {spec}: the weight of {name!r} must be a number, got {weight!r}"
            ) from None
        if not 0 < value < math.inf:  # nan and inf too: an epoch takes int(weight) full passes
            raise ValueError(
                f"--data {spec}: the weight of {name!r} must be a finite number > 0, got {weight}"
            )
        sources.append(Source(name, SOURCES.get(name, name), value))
    names = [s.name for s in sources]
    if not sources or len(set(names)) < len(names):
        raise ValueError(
            f"--data {spec!r}: name each source once, e.g. wwq or wwq,qald10:1,lcquad2:0.3 "
            f"(short names: {', '.join(SOURCES)})"
        )
    return sources


def _has_weight(part: str) -> bool:
    """`lcquad2:0.3` (and `wwq:x`, a bad weight) has a weight; a path such as `/a/b:c.jsonl` does not."""
    head, sep, tail = part.rpartition(":")
    return bool(sep and head) and (head in SOURCES or tail.replace(".", "", 1).lstrip("-").isdigit())


def load(sources: list[Source]) -> list[dict]:
    """The records of every source, each with its "source"; ids prefixed "source:" with several sources."""
    records = []
    for source in sources:
        try:
            material = benchmarks.load_training(source.benchmark)
        except FileNotFoundError as error:
            if source.name in SOURCES:  # a known source whose file is missing: the error says how to get it
                raise
            raise FileNotFoundError(
                f"{error}; --data also takes the short names {', '.join(SOURCES)}"
            ) from None
        for record in material:
            record = dict(record, source=source.name)
            if len(sources) > 1:
                record["id"] = f"{source.name}:{record['id']}"
            records.append(record)
    return records


def without_label_service(sparql: str) -> str | None:
    """The query with Wikidata's label service replaced by plain patterns, or None if it calls another
    SERVICE (not rewritable). `SERVICE wikibase:label { bd:serviceParam wikibase:language "en" . }`
    binds ?xLabel, ?xDescription and ?xAltLabel for every variable ?x of the query; explicit bindings
    inside it (`?x rdfs:label ?name .`, `wd:Q42 schema:description ?d .`) bind those variables. Each
    binding used becomes `OPTIONAL { ?x rdfs:label ?xLabel . FILTER(LANG(?xLabel) = "en") }` (schema:description,
    skos:altLabel) in the place of the SERVICE group. Differences from the service, which do not matter
    for a training target: no fallback to the id when an item has no English label, and one row per
    alias instead of a comma-joined list. A query without SERVICE is returned unchanged."""
    tokens = tokenize(sparql)
    variables = list(dict.fromkeys(t.text[1:] for t in tokens if t.kind == "var"))  # in order of appearance
    edits = []
    for i, token in enumerate(tokens):
        if not is_keyword(token, "SERVICE"):
            continue
        target = i + 2 if i + 2 < len(tokens) and is_keyword(tokens[i + 1], "SILENT") else i + 1
        if target >= len(tokens) or tokens[target].text not in LABEL_SERVICE:
            return None
        brace = next((j for j in range(target + 1, len(tokens)) if tokens[j].text == "{"), None)
        if brace is None:
            return None
        end = skip_group(tokens, brace)  # the token after the group's "}"
        inner = tokens[brace + 1 : end - 1]
        bindings = [
            (s.text, p.text, o.text)
            for s, p, o in zip(inner, inner[1:], inner[2:])
            if s.kind in ("var", "pname", "iri")
            and o.kind == "var"
            and p.text in LABEL_SERVICE_SUFFIXES.values()
        ]
        bound = {o[1:] for _, _, o in bindings}
        for name in [v for v in variables if v not in bound]:
            suffix = next(
                (s for s in LABEL_SERVICE_SUFFIXES if name.endswith(s) and name[: -len(s)] in variables), None
            )
            if suffix:  # an automatic binding: ?xLabel for ?x
                bindings.append((f"?{name[: -len(suffix)]}", LABEL_SERVICE_SUFFIXES[suffix], f"?{name}"))
        patterns = [f'OPTIONAL {{ {s} {p} {o} . FILTER(LANG({o}) = "en") }}' for s, p, o in bindings]
        edits.append((token.start, tokens[end - 1].end, " ".join(patterns)))
    return rewrite(sparql, edits) if edits else sparql


def prepare(records: list[dict], indices) -> tuple[list[dict], Counter]:
    """(usable records, skipped): the label service rewritten, records that cannot train dropped and
    counted by (source, reason) (SKIP_REASONS), rewrites counted as (source, "label_service_rewritten")."""

    def named(iri: str) -> str | None:
        item = indices.get(iri)
        return item.label if item is not None else None

    usable, counts = [], Counter()
    for record in records:
        source, sparql = record.get("source", ""), without_label_service(record["sparql"])
        if sparql is None:
            counts[source, "other_service"] += 1
        elif not parses(sparql):
            counts[source, "does_not_parse"] += 1
        elif skeletonize(sparql, named).unknown:
            counts[source, "unknown_iri"] += 1
        else:
            if sparql != record["sparql"]:
                counts[source, "label_service_rewritten"] += 1
                record = dict(record, sparql=sparql)
            usable.append(record)
    return usable, counts


def epoch_records(
    records: list[dict], weights: dict[str, float], seed: int, epoch: int
) -> list[tuple[dict, int]]:
    """The (record, copy) pairs of one epoch, sources in order: each source's records floor(w) times
    (copies 0, 1, ...) plus a seeded random subset of round((w - floor(w)) x n) of them (module docstring).
    A pure function of its inputs; records without a source, or a source without weight, count once."""
    by_source: dict[str, list[dict]] = {}
    for record in records:
        by_source.setdefault(record.get("source", ""), []).append(record)
    chosen = []
    for source, group in by_source.items():
        weight = weights.get(source, 1.0)
        full = int(weight)
        for copy in range(full):
            chosen += [(record, copy) for record in group]
        drawn = records_per_epoch(weight, len(group)) - full * len(group)
        if drawn > 0:
            rng = random.Random(f"{seed}:{epoch}:{source}:draw")
            picked = sorted(rng.sample(range(len(group)), drawn))
            chosen += [(group[i], full) for i in picked]
    return chosen


def records_per_epoch(weight: float, count: int) -> int:
    """How many of a source's `count` records an epoch uses at weight w:
    floor(w) x count + round((w - floor(w)) x count)."""
    return int(weight) * count + round((weight - int(weight)) * count)


def summary(
    sources: list[Source], records: list[dict], usable: list[dict], skipped: Counter, is_validation=None
) -> str:
    """A per-source table: records read, the held-out dev part kept out, skipped by reason, label-service
    rewrites, usable, validation (`is_validation(id)`; None: no split, "-"), weight, and training
    records per epoch."""
    head = [
        "source",
        "read",
        "held out (dev)",
        *SKIP_REASONS,
        "label service rewritten",
        "usable",
        "validation",
        "weight",
        "train records/epoch",
    ]
    rows, totals = [], Counter()
    for source in sources:
        read = sum(r["source"] == source.name for r in records)
        mine = [r for r in usable if r["source"] == source.name]
        val = sum(is_validation(r["id"]) for r in mine) if is_validation else 0
        held = held_out_count(source.benchmark)
        values = {
            "read": read,
            "held out (dev)": held,
            **{k: skipped[source.name, k] for k in SKIP_REASONS},
            "label service rewritten": skipped[source.name, "label_service_rewritten"],
            "usable": len(mine),
            # validation uses each held-out record once at most: min(1, weight) of them
            "validation": records_per_epoch(min(1.0, source.weight), val),
            "train records/epoch": records_per_epoch(source.weight, len(mine) - val),
        }
        totals.update(values)
        rows.append(
            [
                source.name,
                *[str(values[k]) for k in head[1:-2]],
                f"{source.weight:g}",
                str(values["train records/epoch"]),
            ]
        )
    rows.append(["total", *[str(totals[k]) for k in head[1:-2]], "", str(totals["train records/epoch"])])
    if is_validation is None:
        for row in rows:
            row[head.index("validation")] = "-"
    return "\n".join("| " + " | ".join(row) + " |" for row in [head, ["---"] * len(head), *rows])


@dataclass
class Mixture:
    """The sources of `--data` and their records as read (`read`); `prepare` adds the usable ones and
    the skipped counts."""

    sources: list[Source]
    records: list[dict]
    usable: list[dict] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)

    @property
    def weights(self) -> dict[str, float]:
        return {source.name: source.weight for source in self.sources}

    def prepare(self, indices) -> "Mixture":
        self.usable, self.skipped = prepare(self.records, indices)
        return self

    def table(self, is_validation=None) -> str:
        return summary(self.sources, self.records, self.usable, self.skipped, is_validation)


def read(data: str) -> Mixture:
    """The sources `--data` names and their records (ValueError / FileNotFoundError for a bad spec or a
    missing file), before the index is even opened."""
    sources = parse_data(data)
    return Mixture(sources, load(sources))


def held_out_count(benchmark: str) -> int:
    """How many records of the benchmark's file are held out for evaluation (benchmarks.HELD_OUT)."""
    held = benchmarks.held_out_source(benchmark)
    return benchmarks.held_out_count(held) if held is not None else 0
