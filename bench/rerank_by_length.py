"""Does a re-ranker read the alternatives, or does the length of the list decide? For two demo
placeholders with the right answer first (wdt:P57 "director" for Pulp Fiction), the list grows from 2
to 11 property alternatives; a sound re-ranker keeps the right answer on top at every length.

The first WWQ adapter failed this: with exactly 9 alternatives "None of the above" jumped above
wdt:P57 (its training lists were one alternative short, 9 of 10, whenever the gold was dropped).

    python bench/rerank_by_length.py adapters/grisp-wwq-0.5b ~/.cache/grisp/runs/<run>/best
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import defaults  # noqa: E402
from grisp import (
    peft_format,  # noqa: E402
)
from grisp.prompts import to_alternative  # noqa: E402
from grisp.rerank import ModelReranker  # noqa: E402
from grisp.sparql_syntax import PREFIXES  # noqa: E402
from llm.cpu_speed import cpu_name  # noqa: E402
from llm.tokenizer import Tokenizer  # noqa: E402
from model import Transformer  # noqa: E402
from search import load_indices  # noqa: E402

# the right answer first, then other properties of the film (as a constrained search would list them)
PROPERTIES = ["P57", "P58", "P161", "P136", "P495", "P31", "P364", "P2047", "P577", "P19", "P20"]
CASES = [
    ("who directed pulp fiction?", "SELECT DISTINCT ?x WHERE { wd:Q104123 <rep>director (wdt)</rep> ?x . }"),
    (
        "Where was the Pulp Fiction director born?",
        "SELECT DISTINCT ?x WHERE { wd:Q104123 <rep>director (wdt)</rep> ?y . "
        "?y <iri>place of birth (wdt)</iri> ?x . }",
    ),
]


def scores_by_length(adapter: str, model_dir: Path, index_dir: Path) -> list[list[tuple[float, float]]]:
    """Per case, per list length 2..11: (score of the right answer, score of None)."""
    tokenizer = Tokenizer(model_dir)
    model = Transformer.from_pretrained(model_dir)
    peft_format.load_merged(model, adapter)
    indices = load_indices(index_dir)
    alternatives = [to_alternative(indices.item(PREFIXES["wd"] + p), "wdt") for p in PROPERTIES]
    rerank = ModelReranker(
        model, tokenizer, prompt_format=peft_format.read_prompt_format(adapter)
    )  # as trained
    return [
        [(s[0], s[-1]) for n in range(2, len(PROPERTIES) + 1) for s in [rerank(q, query, alternatives[:n])]]
        for q, query in CASES
    ]


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(f"CPU {cpu_name()}, {args.threads} threads, float32")
    results = {
        adapter: scores_by_length(adapter, Path(args.model_dir), Path(args.index))
        for adapter in args.adapters
    }
    for number, (question, _) in enumerate(CASES):
        print(f"\n{question}\nright answer (wdt:P57) minus None, by list length; > 0: the re-ranker keeps it")
        print("length | " + " | ".join(args.adapters))
        for i, length in enumerate(range(2, len(PROPERTIES) + 1)):
            print(
                f"{length:6d} | "
                + " | ".join(
                    f"{results[a][number][i][0] - results[a][number][i][1]:+.2f}" for a in args.adapters
                )
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("adapters", nargs="+", help="adapter directories (PEFT layout) to compare")
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory")
    parser.add_argument(
        "--index", default=str(defaults.DEMO_INDEX_DIR), help="demo search index (build_index.py)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    main(parser.parse_args())
