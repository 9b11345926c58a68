"""Synthetic entity names for the search benchmark (bench/bench_search.py), streamed: any number of items
from any row on, in memory a block at a time (100M names fit as well as 1M).

Item i of a set of `n_names` names (labels of n_names / 1.1 items plus aliases of the first 10%, as Wikidata
items have): a label of 1-4 pseudo-words drawn Zipf-like from a vocabulary of n_names / 8 words (at least
1000; some with accents; connector words "of", "de", "la", "van", "st.", "the" among them), capitalised.
Popularity falls with the row (a Zipf-like 10^6 / (1 + i)^0.7, ties at the tail), so that GRASP's Rust index,
which breaks ties by row, orders ties as ours does (popularity, then row). Everything about item i depends
only on (seed, its block), so a resumed build reads the same items again.

    for names, popularity in synthetic_items(n_names=1_000_000, seed=0, start=0): ...
    write_tsv(path, 1_000_000, seed=0)   # the search-index data file of the same items
"""

from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

BLOCK = 100_000  # items generated at once
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ["a", "e", "i", "o", "u", "ai", "ou", "é"]]
CONNECTORS = ["of", "de", "la", "van", "st.", "the"]
ALIAS_SHARE = 0.1  # items with an alias: the first 10%


def vocabulary_size(n_names: int) -> int:
    return max(1000, n_names // 8)


@lru_cache(maxsize=1 << 18)
def word(word_id: int, vocabulary: int) -> str:
    """The pseudo-word of a word id: its digits in base len(SYLLABLES), 2 syllables at least (distinct ids give
    distinct words); the last ids are the connector words."""
    if word_id >= vocabulary - len(CONNECTORS):
        return CONNECTORS[word_id - (vocabulary - len(CONNECTORS))]
    digits, value = [], word_id + len(SYLLABLES)  # at least two digits
    while value:
        value, digit = divmod(value, len(SYLLABLES))
        digits.append(SYLLABLES[digit])
    return "".join(digits)


def draw_words(rng: np.random.Generator, count: int, vocabulary: int) -> np.ndarray:
    """Word ids with Zipf-like frequencies p(rank) ~ 1 / (rank + 20) (inverse CDF), ranks spread over the ids."""
    ranks = np.floor(20 * ((vocabulary + 20) / 20) ** rng.random(count) - 20).astype(np.int64)
    return (np.minimum(ranks, vocabulary - 1) * 7919) % vocabulary  # 7919 is prime: a permutation of ids


def items_count(n_names: int) -> int:
    return round(n_names / 1.1)


def synthetic_items(n_names: int, seed: int = 0, start: int = 0) -> Iterator[tuple[list[str], float]]:
    """(names, popularity) of items start, start + 1, ... of the set of `n_names` names."""
    n_items, vocabulary = items_count(n_names), vocabulary_size(n_names)
    n_aliased = n_names - n_items
    for block_start in range(start - start % BLOCK, n_items, BLOCK):
        rng = np.random.default_rng([seed, block_start])
        size = min(BLOCK, n_items - block_start)
        lengths = rng.integers(1, 5, size=(2, size))  # label and alias word counts
        ids = draw_words(rng, int(lengths.sum()), vocabulary)
        bounds = np.concatenate([[0], np.cumsum(lengths.ravel())])
        for j in range(max(0, start - block_start), size):
            i = block_start + j
            label = " ".join(word(int(w), vocabulary) for w in ids[bounds[j] : bounds[j + 1]]).capitalize()
            names = [label]
            if i < n_aliased:
                alias = ids[bounds[size + j] : bounds[size + j + 1]]
                names.append(" ".join(word(int(w), vocabulary) for w in alias).capitalize())
            yield names, float(int(1e6 / (1 + i) ** 0.7))


def write_tsv(path: Path, n_names: int, seed: int = 0) -> None:
    """The items as a search-index data file (name, score, synonyms, info), rows in item order."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("name\tscore\tsynonyms\tinfo\n")
        for names, popularity in synthetic_items(n_names, seed):
            f.write(f"{names[0]}\t{popularity:g}\t{';;;'.join(names[1:])}\t\n")


def labels_of(n_names: int, seed: int, rows: np.ndarray) -> list[str]:
    """The labels of item `rows` (sorted, distinct), each block generated once."""
    labels, stream, position = [], None, -1
    for row in sorted(set(int(row) for row in rows)):
        if stream is None or row // BLOCK != position // BLOCK:  # another block: start there
            stream, position = synthetic_items(n_names, seed, row), row
        for _ in range(row - position):  # within the block: step over the rows between
            next(stream)
        labels.append(next(stream)[0][0])
        position = row + 1
    return labels


def sample_queries(n_names: int, count: int, seed: int) -> list[str]:
    """Queries from the names of random items (read from their blocks, not from all items): full names, the
    last word cut to a prefix, some words reordered, a short refining word, misses; each with a keyword of
    >= 3 characters (Rust returns nothing otherwise)."""
    rng = np.random.default_rng(seed + 1)
    labels = labels_of(n_names, seed, rng.integers(0, items_count(n_names), count * 2))
    queries = []
    for label in rng.permutation(labels):
        words, kind = label.lower().split(), rng.random()
        if kind < 0.35:  # a full name
            query = words
        elif kind < 0.7:  # the last word cut to a prefix, as while typing
            query = words[:-1] + [words[-1][: max(3, len(words[-1]) // 2)]]
        elif kind < 0.85:  # some of the words, reordered
            query = list(rng.permutation(words)[: max(1, len(words) - 1)])
        elif kind < 0.95:  # a short refining word
            query = words + [words[0][:2]]
        else:  # a miss
            query = [w[::-1] for w in words]
        if any(len(w) >= 3 for w in query) and len(queries) < count:
            queries.append(" ".join(query))
    return queries
