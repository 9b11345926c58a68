"""Training samples for GRISP's two tasks from question-query pairs (paper section 3, "Training Data";
docs/method.md section 3). The library behind gen_data.py (offline samples) and train.py (online samples).

For every record of the epoch (mixture.py picks them, with the sources' weights) it makes one sample
of each task:
- skeleton: the question (or a random paraphrase) -> the gold query with every KG IRI replaced by a
  placeholder holding the item's label, or with probability `alias` a random alias;
- rerank: a random placeholder i of that skeleton; placeholders before i are resolved to the gold IRIs
  (`wd:Q42`, `wdt:P19`), i is marked `<rep>...</rep>`, later ones stay placeholders; prompt format v2
  also lists the resolved items with their labels. The index of i's kind (entity or property) is
  searched with i's placeholder text (with probability `constrain`, and an endpoint, only among the
  answers of i's constraint query, as at inference); the top k hits plus "None of the above" get
  single-token identifiers (prompts.py); the target is the gold item's identifier, or None's when the
  search missed it (as the reference; `gold_missing="insert"` puts it in instead, the first adapter's).
  Augmentations, each with its own probability (defaults: the reference's): k uniform in 2..10, drop
  the infos, drop the gold item (target = None; the next hit takes its place, so the list length tells
  nothing), shuffle the alternatives (else they keep the index's order), and (ours, `mention`, off by
  default) name an entity to re-rank by the question's words for it, as the model names it at inference.
Each epoch also adds, for each shape of `compose_shapes` (by default only two-hop chains, which WWQ has
few of), compose x weight x (number of records) records composed from one-hop ones (compose.py; ours).

A sample is a pure function of (seed, epoch, record, copy) (and the endpoint's answers for constrained
ones), so online generation (train.py) is reproducible and resumable, and gen_data.py can precompute N
epochs offline. Records whose query has an IRI the index does not know are skipped and counted. A sample:

    {"id": record id, "source": "wwq", "epoch": 0, "task": "skeleton", "messages": [system, user],
     "target": "SELECT ..."}
    {"id": ..., "epoch": 0, "task": "rerank", "messages": [...], "target": "C", "prompt_format": "v2",
     "identifiers": ["A", ..., "K"], "iri": gold item IRI or null when dropped or missed}

    records = load_records("wwq")
    generator = SampleGenerator(records, build_index.open_index(None, "wwq"), Augment(), seed=0)
    samples, stats = generator.epoch(0)
"""

import argparse
import difflib
import hashlib
import random
import re
import statistics
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from common.jsonl import iter_jsonl
from grisp import compose, mixture
from grisp.constraints import allowed_items, constraint_query
from grisp.loss import TASKS
from grisp.mixture import epoch_records
from grisp.prompts import (
    IDENTIFIERS,
    LATEST_PROMPT_FORMAT,
    PROMPT_FORMATS,
    mark_current,
    rerank_messages,
    skeleton_messages,
    to_alternative,
)
from grisp.skeleton import find_placeholders, placeholder_text, skeletonize, split_variant, substitute
from grisp.sparql import SparqlError
from search import Indices


@dataclass
class Augment:
    """Probabilities of the sample variations; the defaults are the reference implementation's
    (docs/method.md section 3.4), `compose` is ours."""

    alias: float = 0.2  # a placeholder shows a random alias instead of the main label
    vary_k: float = 1.0  # re-rank k uniform in [min_k, max_k] alternatives instead of max_k
    drop_infos: float = (
        0.05  # show the alternatives without infos (v2: the description; v1: also the aliases)
    )
    drop_gold: float = 0.1  # remove the gold item, the next hit takes its place: the target becomes None
    shuffle: float = 0.1  # shuffle the alternatives (else they keep the search order)
    constrain: float = 0.1  # search within the constraint query's answers (needs an endpoint)
    compose: float = (
        0.1  # extra records of each composed shape per record, made from one-hop ones (ours, not the paper's)
    )
    compose_shapes: str = (
        "chain"  # the composed shapes (compose.SHAPES), comma-separated, each with an optional :weight
    )
    mention: float = (
        0.0  # an entity to re-rank is named by the question's words for it, as at inference (ours)
    )
    min_k: int = 2
    max_k: int = 10
    gold_missing: str = (
        "none"  # the search missed the gold item: target None ("none") or insert it ("insert")
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Augment":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


GOLD_MISSING = ("none", "insert")


def add_generation_args(group: argparse._ArgumentGroup) -> None:
    """The augmentation flags, shared by gen_data.py and train.py (online generation)."""
    helps = {
        "alias": "probability that a placeholder shows a random alias instead of the label",
        "vary_k": "probability that a re-ranking sample has k uniform in [min-k, max-k] alternatives (else max-k)",
        "drop_infos": "probability of showing the alternatives without infos (prompt v2: without the "
        "description, aliases kept, as the reference; v1: without description and aliases)",
        "drop_gold": "probability of dropping the gold alternative (target: None of the above); the next search "
        "hit takes its place, so the list length tells nothing",
        "shuffle": "probability of shuffling the alternatives (else: search order)",
        "constrain": "probability that a re-ranking sample searches within its constraint query's answers, as at "
        "inference (needs --endpoint; without one no sample is constrained)",
        "compose": "records of each --compose-shapes shape composed from one-hop records, per record (0 = off; "
        "ours, not the paper's)",
        "compose_shapes": "composed shapes, comma-separated: chain (two-hop: 'where was the director of x born?'), "
        "ask ('was x born in y?'), intersection ('which films directed by x and starring y?'), "
        "superlative ('what was the first film directed by x?'), count ('how many films "
        "directed by x?'), filter ('which films directed by x came out after 2005?'); "
        "shape:w makes w x --compose of that shape per record (e.g. chain,ask:0.5)",
        "mention": "probability that the entity to re-rank is named by the question's words for it (the question span "
        "most like its label or an alias, e.g. 'Shawn Johnson' for 'Shawn Johnson East') instead of its "
        "label, and searched with them, as the model names it at inference (ours, not the paper's)",
        "min_k": "fewest search results in a re-ranking sample",
        "max_k": "most search results (inference uses 10)",
        "gold_missing": "when the search misses the gold item: none = the target is None of the above (the "
        "reference), insert = put the gold item at a random rank (the first adapter's)",
    }
    for f in fields(Augment):
        flag = "--rerank-gold-missing" if f.name == "gold_missing" else "--" + f.name.replace("_", "-")
        group.add_argument(
            flag,
            dest=f.name,
            type=type(f.default),
            default=f.default,
            help=helps[f.name],
            choices=GOLD_MISSING if f.name == "gold_missing" else None,
        )


MENTION_SIMILARITY = (
    0.6  # least difflib ratio (lower case) between a question span and a name to call it a mention
)
# words a mention neither starts nor ends with (unless the name does): question words, articles, prepositions
MENTION_EDGE_STOPWORDS = set(
    "a an the of in on at to for from by with and or is are was were be been do does did "
    "what who whom whose which where when why how many much that this there their his her "
    "its it they he she you".split()
)


def question_mention(question: str, names: list[str]) -> str | None:
    """How `question` names the item with these `names` (label first, then aliases): among its spans of
    at most one word more than a name, not starting or ending with a stopword that name does not start
    or end with, and at least MENTION_SIMILARITY like a name (difflib's ratio, lower case), the
    one sharing the largest share of words with a name (Jaccard), then the most similar, then the
    shortest; its words cased as in that name, others capitalized if the name is. None if there is none.

        question_mention("where is shawn johnson gymnast from?", ["Shawn Johnson East"])  # "Shawn Johnson"
    """
    words = re.findall(r"\w+(?:[-.]\w+)*", question.replace("'s", ""))
    edge_ok = lambda word, edge: word not in MENTION_EDGE_STOPWORDS or word == edge
    best, best_key = None, None
    lower = [word.lower() for word in words]
    for name in filter(str.strip, names):
        name_words = name.lower().split()
        name_text, name_set = " ".join(name_words), set(name_words)
        for n in range(1, min(len(name_words) + 1, len(words)) + 1):
            for start in range(len(words) - n + 1):
                span = lower[start : start + n]
                if not (edge_ok(span[0], name_words[0]) and edge_ok(span[-1], name_words[-1])):
                    continue
                ratio = difflib.SequenceMatcher(None, " ".join(span), name_text).ratio()
                if ratio < MENTION_SIMILARITY:
                    continue
                jaccard = len(set(span) & name_set) / len(set(span) | name_set)
                key = (jaccard, ratio, -n)
                if best_key is None or key > best_key:
                    best, best_key = (span, name), key
    if best is None:
        return None
    span, name = best
    cased = {word.lower(): word for word in name.split()}
    capitalize = name[:1].isupper()
    return " ".join(cased.get(word, word.capitalize() if capitalize else word) for word in span)


class SampleGenerator:
    """Samples of both tasks for a list of benchmark records: `epoch(e)` -> (samples, statistics).

    `weights` (source -> uses per record and epoch, mixture.py) picks each epoch's records;
    `prompt_format` is the re-ranking prompt's (prompts.PROMPT_FORMATS); `client` (a sparql.SparqlClient)
    lets `augment.constrain` of the re-ranking samples search within their constraint query's answers."""

    def __init__(
        self,
        records: list[dict],
        indices: Indices,
        augment: Augment,
        seed: int,
        weights: dict[str, float] | None = None,
        prompt_format: str = LATEST_PROMPT_FORMAT,
        client=None,
    ):
        if not 1 <= augment.min_k <= augment.max_k < len(IDENTIFIERS):
            raise ValueError(
                f"need 1 <= min-k <= max-k < {len(IDENTIFIERS)}, got {augment.min_k}..{augment.max_k}"
            )
        if augment.gold_missing not in GOLD_MISSING:
            raise ValueError(
                f"--rerank-gold-missing must be one of {', '.join(GOLD_MISSING)}, got {augment.gold_missing!r}"
            )
        self.compose_shapes = compose.parse_shapes(augment.compose_shapes) if augment.compose else {}
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}"
            )
        self.records, self.indices, self.augment, self.seed = records, indices, augment, seed
        self.weights, self.prompt_format, self.client = weights or {}, prompt_format, client
        self.hits = {}  # (kind, query, k, constraint) -> search results: the same placeholders recur every epoch
        self.allowed = {}  # constraint query -> the items it allows (None: any), from the endpoint

    def epoch(self, epoch: int) -> tuple[list[dict], Counter]:
        samples, stats = [], Counter()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the query encoder runs one short text at a time: threads only cost here
        try:
            composed = []
            for shape, weight in self.compose_shapes.items():
                stream = (
                    "compose" if shape == "chain" else f"compose:{shape}"
                )  # chains keep their earlier stream
                shaped = compose.compose_records(
                    self.records,
                    self.indices,
                    self.augment.compose * weight,
                    random.Random(f"{self.seed}:{epoch}:{stream}"),
                    shape,
                )
                stats[f"composed_{shape}"] += len(shaped)
                composed += shaped
            stats["composed"] += len(composed)
            chosen = epoch_records(self.records, self.weights, self.seed, epoch) + [(r, 0) for r in composed]
            for (
                record,
                copy,
            ) in chosen:  # a record used twice in an epoch gets other variations the second time
                rng = random.Random(f"{self.seed}:{epoch}:{record['id']}" + (f":{copy}" if copy else ""))
                samples += self.record_samples(record, rng, stats)
        finally:
            torch.set_num_threads(threads)
        for sample in samples:
            sample["epoch"] = epoch
        return samples, stats

    def name_for(self, rng: random.Random, names: dict[str, str]):
        """skeletonize's callback: label or (probability `alias`) a random alias; None if not indexed."""

        def name(iri: str) -> str | None:
            try:
                item = self.indices.item(iri)
            except KeyError:
                return None
            text = (
                rng.choice(item.aliases) if item.aliases and rng.random() < self.augment.alias else item.label
            )
            names[iri] = text
            return text

        return name

    def record_samples(self, record: dict, rng: random.Random, stats: Counter) -> list[dict]:
        """The skeleton and the re-ranking sample of one record (none if its query has unknown IRIs)."""
        question = rng.choice([record["question"], *record.get("paraphrases", [])])
        skeletonized = skeletonize(record["sparql"], self.name_for(rng, {}))
        if skeletonized.unknown:
            stats["skipped_unknown_iri"] += 1
            return []
        base = {"id": record["id"]} | ({"source": record["source"]} if "source" in record else {})
        if "composed_from" in record.get(
            "info", {}
        ):  # a validation split must know the records it was made of
            base["composed_from"] = record["info"]["composed_from"]
        samples = [
            base
            | {"task": "skeleton", "messages": skeleton_messages(question), "target": skeletonized.skeleton}
        ]
        stats["skeleton"] += 1
        if not skeletonized.iris:
            stats["no_rerank_no_placeholder"] += 1
            return samples
        rerank = self.rerank_sample(question, skeletonized.skeleton, skeletonized.iris, rng, stats)
        return samples + ([base | rerank] if rerank else [])

    def kind(self, iri: str) -> str:
        """ "property" or "entity": which index holds the item (by its entity IRI)."""
        return "property" if self.indices.stores["property"].get(iri) is not None else "entity"

    def rerank_sample(
        self, question: str, skeleton: str, iris: list[str], rng: random.Random, stats: Counter
    ) -> dict | None:
        aug = self.augment
        placeholders = find_placeholders(skeleton)
        assert len(placeholders) == len(iris), (
            f"{len(placeholders)} placeholders for {len(iris)} IRIs in {skeleton!r}"
        )
        i = rng.randrange(len(iris))
        # the query as the resolver sees it at step i: earlier placeholders resolved (later edits first,
        # so earlier offsets stay valid), i the first placeholder left
        text = skeleton
        for j in reversed(range(i)):
            text = substitute(text, placeholders[j], iris[j])
        ph = find_placeholders(text)[0]
        gold, variant = split_variant(iris[i])
        kind = self.kind(gold)
        if (
            aug.mention and kind == "entity" and rng.random() < aug.mention
        ):  # no draw at 0: older runs' samples stay
            item = self.indices.item(gold)
            words = question_mention(question, [item.label, *item.aliases])
            if (
                words is not None and words != ph.label
            ):  # the model's wording at inference, not the index's label
                text = text[: ph.start] + placeholder_text(words, ph.variant) + text[ph.end :]
                ph = find_placeholders(text)[0]
                stats["mention"] += 1
        k = rng.randint(aug.min_k, aug.max_k) if rng.random() < aug.vary_k else aug.max_k
        constrained = (
            rng.random() < aug.constrain
        )  # drawn with or without an endpoint: same samples otherwise
        query = constraint_query(text, ph) if constrained and self.client is not None else None
        allowed = self.constraint(query, stats) if query else None
        # one hit more than k, so that a list without the gold item still has k alternatives: a list one
        # shorter than usual would tell the model "None of the above" without reading it
        key = (kind, ph.label, k + 1, query if allowed is not None else None)
        if key not in self.hits:
            self.hits[key] = self.indices.search(kind, ph.label, k + 1, allowed) if allowed != set() else []
        items = {hit.id: hit for hit in self.hits[key]}
        ids = list(items)
        others = [iri for iri in ids if iri != gold]
        if rng.random() < aug.drop_gold:
            ids = others[:k]
            stats["gold_dropped"] += 1
        elif gold in ids[:k]:
            ids = ids[:k]
        elif aug.gold_missing == "insert":  # the search missed it: put it at a random rank within the top k
            stats["gold_inserted"] += 1
            ids = others[: k - 1]
            ids.insert(rng.randint(0, len(ids)), gold)
            items[gold] = self.indices.item(gold)
        else:  # the search missed it: as in the reference, the right answer is None of the above
            stats["gold_missed"] += 1
            ids = others[:k]
        if rng.random() < aug.shuffle:
            rng.shuffle(ids)
            stats["shuffled"] += 1
        show_infos = rng.random() >= aug.drop_infos
        stats["infos_dropped"] += not show_infos
        if not ids:  # only "None of the above" left: the restricted loss would be 0, nothing to learn
            stats["rerank_skipped_no_alternative"] += 1
            return None
        alternatives = [to_alternative(items[iri], variant, kind) for iri in ids]
        resolved = []  # the items resolved before i, as the re-ranker is shown them (prompt v2)
        for j in range(i):
            iri, j_variant = split_variant(iris[j])
            resolved.append(to_alternative(self.indices.item(iri), j_variant, self.kind(iri)))
        messages, identifiers = rerank_messages(
            question, mark_current(text, ph), alternatives, show_infos, resolved, self.prompt_format
        )
        target = identifiers[ids.index(gold)] if gold in ids else identifiers[-1]
        stats["rerank"] += 1
        stats[f"rerank_alternatives_{len(ids):02d}"] += 1
        return {
            "task": "rerank",
            "messages": messages,
            "target": target,
            "identifiers": identifiers,
            "iri": gold if gold in ids else None,
            "prompt_format": self.prompt_format,
        }

    def constraint(self, query: str, stats: Counter) -> set[str] | None:
        """The items the constraint query allows (cached per query; None: any, when it has too many
        answers or the endpoint fails it, as the resolver falls back to searching without it)."""
        if query not in self.allowed:
            try:
                self.allowed[query] = allowed_items(self.client.query(query))
                stats["constrained"] += 1
            except SparqlError as error:
                stats[f"constraint_error_{type(error).__name__}"] += 1
                return None
        else:
            stats["constrained"] += 1
        return self.allowed[query]


# ---------------------------------------------------------------------------- data, index, files
def load_records(data: str) -> list[dict]:
    """Benchmark records of `--data` (mixture.py: one or several sources, e.g. wwq or wwq,qald10): never a
    held-out dev set (benchmarks.load_training: "qald10" gives "qald10-train")."""
    return mixture.load(mixture.parse_data(data))


def validation_split(fraction: float, seed: int):
    """A predicate on record ids: True for the held-out `fraction` (a hash, so stable for any record set)."""

    def is_validation(record_id: str) -> bool:
        digest = hashlib.sha1(f"{seed}:{record_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < fraction

    return is_validation


def read_samples(path: str | Path) -> dict[int, list[dict]]:
    """Precomputed samples by epoch; a line that is not a sample raises ValueError naming it."""
    by_epoch = {}
    for number, sample in iter_jsonl(path):
        task = sample.get("task") if isinstance(sample, dict) else None
        if (
            task not in TASKS
            or not {"id", "epoch", "messages", "tools" if task == "agent" else "target"} <= sample.keys()
        ):
            raise ValueError(
                f"{path}: line {number} is not a gen_data.py or tools/gen_agent_data.py sample (needs id, "
                f"epoch, task, messages, and target or, for an agent trace, tools)"
            )
        by_epoch.setdefault(sample["epoch"], []).append(sample)
    if not by_epoch:
        raise ValueError(f"{path} holds no samples; write some with gen_data.py --out")
    return by_epoch


def length_stats(samples: list[dict], model_dir: Path) -> dict:
    """Token lengths (prompt + answer) per task, with the base model's tokenizer."""
    from llm.tokenizer import Tokenizer, chat_prompt

    tokenizer = Tokenizer(model_dir)
    lengths = {}
    for s in samples:
        n = len(tokenizer.encode(chat_prompt(s["messages"]) + s["target"])) + 1  # + <|im_end|>
        lengths.setdefault(s["task"], []).append(n)
    return {
        task: {
            "mean": round(statistics.mean(v), 1),
            "p95": sorted(v)[int(0.95 * (len(v) - 1))],
            "max": max(v),
        }
        for task, v in lengths.items()
    }


def is_sample_file(path: str | Path) -> bool:
    """True if `path` is a JSONL file of gen_data.py samples (not benchmark records)."""
    path = Path(path).expanduser()
    if not path.is_file():
        return False
    try:
        _, first = next(iter_jsonl(path), (0, {}))
    except ValueError:  # not JSON: not a sample file either
        return False
    return isinstance(first, dict) and "task" in first
