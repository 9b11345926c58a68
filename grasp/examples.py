"""Few-shot examples for the GRASP agent: FSE (find similar examples) and FEX (find random examples).

GRASP can be given question-SPARQL pairs of a knowledge graph (e.g. WWQ train for Wikidata); the agent
then has one more function, FSE (the pairs whose questions are most similar to a given one, by
embedding cosine) or FEX (random pairs), and `force_examples` starts every question with such a call
(docs/agent.md). The example index is our embedding index (search.EmbeddingIndex over the MiniLM
encoder of encoder.py), one item per pair, its question and paraphrases as the item's names:

    index = ExampleIndex.open("wwq-train", Path("~/.cache/grisp/examples/wwq-train"))   # built once
    index.similar("who directed pulp fiction?", 3)     # [{"question": ..., "sparql": ...}, ...]

The functions FSE and FEX themselves (definitions, the text of their results) are in grasp/functions.py.
"""

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np

from common.jsonl import read_jsonl
from grisp import benchmarks
from search import EmbeddingIndex

ENCODER = "all-minilm-l6-v2"  # encoder.MINILM (not imported here: torch only when embedding)


class ExampleIndex:
    """Question-SPARQL pairs (examples.jsonl) and an embedding index of their questions (embedding/)."""

    def __init__(self, directory: Path, encoder=None):
        directory = Path(directory).expanduser()
        self.examples = read_jsonl(directory / "examples.jsonl")
        self.index = EmbeddingIndex.load(directory / "embedding", encoder)

    @staticmethod
    def build(samples: list[dict], directory: Path, encoder=None) -> None:
        """Embed the questions (and paraphrases) of `samples` ({question, sparql, paraphrases?})."""
        if encoder is None:
            from llm.encoder import load_encoder

            encoder = load_encoder(ENCODER)
        directory = Path(directory).expanduser()
        names = [[s["question"], *s.get("paraphrases", [])] for s in samples]
        index = EmbeddingIndex.build(names, np.zeros(len(samples), np.float32), encoder, ENCODER)
        tmp = directory.with_name(directory.name + ".tmp")  # becomes `directory` only when complete
        shutil.rmtree(tmp, ignore_errors=True)
        index.save(tmp / "embedding")
        lines = [
            json.dumps({"question": s["question"], "sparql": s["sparql"]}, ensure_ascii=False)
            for s in samples
        ]
        (tmp / "examples.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        (tmp / "source.json").write_text(json.dumps({"sha256": examples_digest(samples)}))
        if directory.exists():
            if others := sorted(
                {p.name for p in directory.iterdir()} - {"embedding", "examples.jsonl", "source.json"}
            ):
                shutil.rmtree(tmp)
                raise FileExistsError(
                    f"{directory} holds more than an example index ({', '.join(others)}); "
                    "give the example index a directory of its own"
                )
            shutil.rmtree(directory)
        tmp.rename(directory)

    @classmethod
    def open(cls, source: str, directory: Path, encoder=None) -> "ExampleIndex":
        """The index at `directory`, built first from `source` (a benchmark name or JSONL file) if missing,
        built from other examples (an edited file, another file of the same name) or made of float32
        encoder vectors."""
        directory = Path(directory).expanduser()
        try:
            samples = benchmarks.load_training(
                source
            )  # never an evaluation set: FSE would hand out the gold queries
        except FileNotFoundError:
            if not (directory / "examples.jsonl").exists():
                raise
            print(f"warning: {source} is not here; using the example index at {directory} as it is")
            return cls(directory, encoder)
        stamp = directory / "source.json"
        same = stamp.exists() and json.loads(stamp.read_text()) == {"sha256": examples_digest(samples)}
        if not (same and EmbeddingIndex.is_current(directory / "embedding")):
            print(f"building the example index of {source} ({len(samples)} pairs) in {directory}")
            cls.build(samples, directory, encoder)
        return cls(directory, encoder)

    def similar(self, question: str, k: int) -> list[dict]:
        return [self.examples[row] for row, _ in self.index.search(question, k)]

    def random(self, k: int, rng: random.Random) -> list[dict]:
        return rng.sample(self.examples, min(k, len(self.examples)))


def examples_digest(samples: list[dict]) -> str:
    """SHA-256 of what the index holds of the examples: questions, paraphrases and queries, in order."""
    held = [[s["question"], s.get("paraphrases", []), s["sparql"]] for s in samples]
    return hashlib.sha256(json.dumps(held, ensure_ascii=False).encode()).hexdigest()
