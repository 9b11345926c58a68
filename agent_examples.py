"""Few-shot examples for the GRASP agent: FSE (find similar examples) and FEX (find random examples).

GRASP can be given question-SPARQL pairs of a knowledge graph (e.g. WWQ train for Wikidata); the agent
then has one more function, FSE (the pairs whose questions are most similar to a given one, by
embedding cosine) or FEX (random pairs), and `force_examples` starts every question with such a call
(docs/agent.md). The example index is our embedding index (indices.EmbeddingIndex over the MiniLM
encoder of encoder.py), one item per pair, its question and paraphrases as the item's names:

    index = ExampleIndex.open("wwq-train", Path("~/.cache/grisp/examples/wwq-train"))   # built once
    index.similar("who directed pulp fiction?", 3)     # [{"question": ..., "sparql": ...}, ...]
    text = find_examples(kg, "who directed pulp fiction?", 3, random.Random(0), known)
"""
import json
import random
from pathlib import Path

import numpy as np

import benchmarks
from jsonl import read_jsonl
from indices import EmbeddingIndex

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
            from encoder import load_encoder
            encoder = load_encoder(ENCODER)
        directory = Path(directory).expanduser()
        names = [[s["question"], *s.get("paraphrases", [])] for s in samples]
        index = EmbeddingIndex.build(names, np.zeros(len(samples), np.float32), encoder, ENCODER)
        index.save(directory / "embedding")
        lines = [json.dumps({"question": s["question"], "sparql": s["sparql"]}, ensure_ascii=False) for s in samples]
        (directory / "examples.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    @classmethod
    def open(cls, source: str, directory: Path, encoder=None) -> "ExampleIndex":
        """The index at `directory`, built first from `source` (a benchmark name or JSONL file) if missing."""
        directory = Path(directory).expanduser()
        if not (directory / "embedding" / "config.json").exists():
            samples = benchmarks.load_benchmark(source)
            print(f"building the example index of {source} ({len(samples)} pairs) in {directory}")
            cls.build(samples, directory, encoder)
        return cls(directory, encoder)

    def similar(self, question: str, k: int) -> list[dict]:
        return [self.examples[row] for row, _ in self.index.search(question, k)]

    def random(self, k: int, rng: random.Random) -> list[dict]:
        return rng.sample(self.examples, min(k, len(self.examples)))


def example_definitions(kgs: list[str], k: int, random_examples: bool) -> list[dict]:
    """FEX or FSE over the knowledge graphs that have examples (OpenAI tools format)."""
    from agent_functions import string_arg, tool_def
    kg = {"kg": string_arg("the knowledge graph", kgs)}
    if random_examples:
        return [tool_def("find_examples", f"Get {k} random example questions with their SPARQL queries over the "
                    "knowledge graph; they show how its queries are written. "
                    "Example: find_examples(kg=\"wikidata\")", kg)]
    return [tool_def("find_similar_examples", f"Get the {k} example questions most similar to a given question, with "
                "their SPARQL queries over the knowledge graph. Example: find_similar_examples(kg=\"wikidata\", "
                "question=\"Where was Angela Merkel born?\")", kg | {"question": string_arg("the question")})]


def find_examples(kg, question: str | None, k: int, rng: random.Random, known: set[str]) -> str:
    """FSE (a question given) or FEX (None): the examples as text; their IRIs become known."""
    from agent_functions import FunctionError, canonical
    from sparql_syntax import expand, tokenize
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
    return "\n\n".join(f"Example {i}:\nQuestion: {e['question']}\nSPARQL:\n{e['sparql']}"
                       for i, e in enumerate(examples, start=1))
