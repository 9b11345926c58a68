"""The search indices of a knowledge graph, as the rest of GRISP uses them (docs/method.md section 5).

GRISP resolves every placeholder by a search followed by SLM re-ranking (paper section 3): entities
by keywords, properties by embedding similarity (keywords miss "born in" -> "place of birth"), both
optionally restricted to the IRIs a constraint query returned (KG-constrained search). Two parts:

The indices, as NumPy arrays (docs/method.md sections 5.2-5.3; GRASP's PFX and SIM):
- `normalize`: transliterate to ASCII, lowercase, split on whitespace, strip punctuation at word ends.
- `PrefixIndex`: sorted vocabulary + CSR posting lists; keyword prefix ranges by `searchsorted`.
- `EmbeddingIndex`: L2-normalised float32 vectors of labels and aliases, cosine top-k by a matrix
  product (all-MiniLM-L6-v2, llm/encoder.py), de-duplicated by item.
Both work on item rows 0..I-1, have `build`, `search(query, k, allowed_ids=None) -> [(row, score)]`,
`save(dir)` and `load(dir)`, and store `.npy` arrays that load memory-mapped (no pickle):

    index = PrefixIndex.build([["Albert Einstein", "Einstein"], ["Albert Camus"]], popularity=[2, 1])
    index.search("albert ein", k=5)  # [(0, 1.75), (1, 0.25)]

The index directory API (`Indices`, below them): full IRIs to rows and rows back to item metadata, the
only search API other modules need:

    from search import load_indices
    indices = load_indices(defaults.DEMO_INDEX_DIR)
    hits = indices.search("entity", "pulp fiction", k=10)         # list[Hit], best first
    hits = indices.search("property", "director", k=10, allowed_ids=["http://www.wikidata.org/entity/P57"])
    hits[0].id, hits[0].label, hits[0].aliases, hits[0].description, hits[0].popularity, hits[0].score
    indices.item("http://www.wikidata.org/entity/Q42")           # Item; KeyError if not indexed

Index directory (written by build_index.py): `manifest.json`, and per kind (`entities/`,
`properties/`) an item store (below), `prefix/` and optionally `embedding/`; `.npy` + JSON only.

    python search.py                                                      # the demo index, interactive
    python search.py --index DIR --kind property --query "born in" --k 5  # one shot

About 790 lines, over a library's ~350: the card keeps the indices and their API in this one file; the
two index classes share the array helpers and the subset (allowed ids) logic above them. The build of an
index too large for memory lives apart (grisp/prefix_build.py, common/external_sort.py).
"""

import argparse
import hashlib
import itertools
import json
import mmap
import re
import string
import sys
import unicodedata
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from common import defaults, jsonl
from common.external_sort import NpyWriter, merge

# ---------------------------------------------------------------------------- the indices
MIN_KEYWORD_LEN = 3  # shorter query keywords only refine candidates found by longer ones
MAX_WORD_BYTES = 64  # vocabulary words are compared on their first 64 UTF-8 bytes
TIERED_POSTINGS = 50_000  # a query of more postings scores its names best bound first (`PrefixIndex.search`)
# a word's postings are grouped by how many words of the name no single keyword can match, 0 .. NAME_GROUPS - 1
# (the last group: that many or more), so that a long list is read best group first (`name_groups`)
NAME_GROUPS = 4
# the version of `normalize` a prefix index is built with (its config's "normalization"; none: 1): queries
# are normalised by today's, so an index of another is rebuilt by build_index.py and warned of when loaded
NORMALIZATION = 2
# embedding indices: vectors from the float64 encoder (an index's config says so; older ones are float32's)
VECTORS_FROM = "float64 encoder"
FLOAT32_MARGIN = 1e-4  # above any float32 rounding of a 384-dim unit-vector dot product (<= 384 x 6e-8)
EXACT, PREFIX, UNMATCHED_KEYWORD, UNMATCHED_WORD = 1.0, 0.75, -0.5, -0.25  # docs/method.md section 5.2

# Letters that Unicode decomposition (NFKD) does not reduce to ASCII, plus typographic punctuation.
_TRANSLIT = {
    "ß": "ss", "æ": "ae", "ø": "o", "œ": "oe", "đ": "d", "ð": "d", "þ": "th", "ł": "l", "ı": "i",
    "ħ": "h", "ŧ": "t", "ŀ": "l", "‘": "'", "’": "'", "“": '"', "”": '"', "„": '"', "«": '"',
    "»": '"', "–": "-", "—": "-", "‐": "-", "−": "-", "¿": "?", "¡": "!",
}  # fmt: skip
_SPECIAL = re.compile("[" + "".join(_TRANSLIT) + "]")  # a regex scan is faster than str.translate
_PUNCT = string.punctuation
# combining marks (accents) of the Latin, Greek and Cyrillic decompositions, and the invisible format
# characters a name may carry (soft hyphen, zero-width space and joiners, direction marks, word joiner, BOM)
_DROPPED = re.compile(
    "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
    "\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]"
)


def normalize(text: str) -> list[str]:
    """Words of `text`: lowercased, NFKD-decomposed without combining accents or invisible format characters,
    punctuation stripped at both ends.

    "Café Müller-Straße, Ltd." -> ["cafe", "muller-strasse", "ltd"]. Accents go in every script ("Йорк" ->
    "иорк"); other scripts are not spelled in ASCII (CJK stays, Hangul becomes jamo), so such names still
    match themselves (docs/method.md 5.2).
    """
    text = text.lower()
    if text.isascii():
        words = (word.strip(_PUNCT) for word in text.split())
    else:  # é -> e + combining accent (NFKD) -> e; NFKD can make capitals ("™" -> "TM"), hence lower() again
        text = _SPECIAL.sub(lambda m: _TRANSLIT[m.group()], text)
        text = _DROPPED.sub("", unicodedata.normalize("NFKD", text)).lower()
        words = (_strip_punctuation(word) for word in text.split())
    return [word for word in words if word]


def _strip_punctuation(word: str) -> str:
    """`word` without punctuation at its ends: ASCII's, and Unicode's (categories P*), not symbols ("°c")."""
    start, end = 0, len(word)
    while start < end and _is_punctuation(word[start]):
        start += 1
    while end > start and _is_punctuation(word[end - 1]):
        end -= 1
    return word[start:end]


def _is_punctuation(char: str) -> bool:
    return char in _PUNCT or unicodedata.category(char)[0] == "P"


def _concat_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of `arange(s, e)` for every pair, without a Python loop. int64 [sum(e - s)]."""
    lengths = ends - starts
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(lengths.sum(), dtype=np.int64)


def _top_k(items: np.ndarray, scores: np.ndarray, popularity: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best (item, score) pairs of distinct `items`: score, then popularity, then item order."""
    if len(items) > k:  # cheap cut before the full sort; keeps every item tied with the k-th score
        keep = scores >= np.partition(scores, -k)[-k]
        items, scores = items[keep], scores[keep]
    order = np.lexsort((items, -popularity[items], -scores))[:k]
    return [(int(items[i]), float(scores[i])) for i in order]


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for int arrays by sort + neighbour test (np.unique hashes first: slower here)."""
    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if len(values) else values


def _allowed_array(allowed_ids: Iterable[int], n_items: int) -> np.ndarray:
    """Sorted unique item rows from `allowed_ids`, dropping rows outside the index. int64 [a]."""
    allowed = np.asarray(
        allowed_ids if isinstance(allowed_ids, np.ndarray) else list(allowed_ids), dtype=np.int64
    )
    if not (allowed[1:] > allowed[:-1]).all():  # a caller's sorted set (reused across queries) skips the sort
        allowed = _sorted_unique(allowed)
    return allowed[(allowed >= 0) & (allowed < n_items)]


def _is_in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Membership mask of `values` in the sorted unique array `sorted_set` (binary search, no sort)."""
    if len(sorted_set) == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[pos] == values


def save_arrays(directory: Path, arrays: dict[str, np.ndarray], config: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        np.save(directory / f"{name}.npy", array, allow_pickle=False)
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def load_arrays(directory: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Memory-mapped arrays, as plain ndarray views (np.memmap's per-slice overhead is ~50 us)."""
    arrays = {}
    for name in names:
        arrays[name] = np.asarray(np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False))
    return arrays


class PrefixIndex:
    """Prefix-keyword index over item names (label and aliases), scored as in docs/method.md section 5.2.

    Arrays (memory-mapped after `load`):
      vocab      S<=64 [V]      sorted distinct normalised words
      word_ptr   int64 [V+1]    CSR: postings[word_ptr[w]:word_ptr[w+1]] are the names holding word w
      postings   int32 [P]      name row per word occurrence (words sorted, so a prefix range is one slice)
      name_ptr   int64 [N+1]    CSR: name_words[name_ptr[n]:name_ptr[n+1]] are the words of name n
      name_words int32 [P]      word ids in name order
      name_item  int32 [N]      item row of each name (names of one item are contiguous)
      item_ptr   int64 [I+1]    CSR: names item_ptr[i]:item_ptr[i+1] belong to item i
      popularity float32 [I]    tie-breaker
      group_ptr  int64 [V*G+1]  postings[group_ptr[w*G+g]:group_ptr[w*G+g+1]] are word w's names of group g
                                (`name_groups`; G = NAME_GROUPS); within a word, names by group, then ascending.
                                Indices built before 2026-12-08 lack it (names ascending; searched without it)
    """

    ARRAYS = ["vocab", "word_ptr", "postings", "name_ptr", "name_words", "name_item", "item_ptr"]
    ARRAYS += ["popularity", "group_ptr"]
    OPTIONAL = {"group_ptr"}

    def __init__(self, arrays: dict[str, np.ndarray]):
        for name in self.ARRAYS:
            setattr(self, name, arrays.get(name) if name in self.OPTIONAL else arrays[name])
        self.width = self.vocab.dtype.itemsize
        assert len(self.item_ptr) == len(self.popularity) + 1, (
            f"{len(self.item_ptr)=} {len(self.popularity)=}"
        )

    @classmethod
    def build(cls, names: Iterable[list[str]], popularity: np.ndarray) -> "PrefixIndex":
        """`names[i]` are the names of item i (label first); `popularity` is float [I]."""
        words, name_lengths, name_item = [], [], []
        for item, item_names in enumerate(names):
            seen = set()
            for name in item_names:
                tokens = tuple(normalize(name))
                if tokens and tokens not in seen:  # identical names would only repeat scores
                    seen.add(tokens)
                    words.extend(token.encode()[:MAX_WORD_BYTES] for token in tokens)
                    name_lengths.append(len(tokens))
                    name_item.append(item)
        popularity = np.asarray(popularity, dtype=np.float32)
        assert not name_item or name_item[-1] < len(popularity), f"{len(popularity)=} too short"
        # np.array picks the width of the longest word: vocab is S<width> [V], name_words int [P]
        vocab, name_words = np.unique(np.array(words) if words else np.zeros(0, "S1"), return_inverse=True)
        name_ptr = np.concatenate([[0], np.cumsum(name_lengths, dtype=np.int64)])
        token_name = np.repeat(np.arange(len(name_lengths), dtype=np.int32), name_lengths)  # [P]
        token_group = name_groups(vocab, name_words, np.asarray(name_lengths, dtype=np.int64))[token_name]
        order = np.lexsort((token_name, token_group, name_words))  # by word, then group, then name
        name_item = np.asarray(name_item, dtype=np.int32)
        word_counts = np.bincount(name_words, minlength=len(vocab))
        group_counts = np.bincount(name_words * NAME_GROUPS + token_group, minlength=len(vocab) * NAME_GROUPS)
        arrays = {
            "vocab": vocab,
            "word_ptr": np.concatenate([[0], np.cumsum(word_counts)]).astype(np.int64),
            "postings": token_name[order],
            "name_ptr": name_ptr,
            "name_words": name_words.astype(np.int32),
            "name_item": name_item,
            "item_ptr": np.searchsorted(name_item, np.arange(len(popularity) + 1)).astype(np.int64),
            "popularity": popularity,
            "group_ptr": np.concatenate([[0], np.cumsum(group_counts)]).astype(np.int64),
        }
        return cls(arrays)

    def save(self, directory: Path) -> None:
        save_arrays(
            Path(directory),
            {n: getattr(self, n) for n in self.ARRAYS if getattr(self, n) is not None},
            self.config(len(self.name_item)),
        )

    @staticmethod
    def config(names: int) -> dict:
        """config.json of an index of `names` names (grisp/prefix_build.py writes it too)."""
        return {"type": "prefix", "names": names, "normalization": NORMALIZATION}

    @staticmethod
    def is_current(directory: Path) -> bool:
        """Whether the index at `directory` was built with today's `normalize` (NORMALIZATION)."""
        config = Path(directory) / "config.json"
        return config.exists() and json.loads(config.read_text()).get("normalization", 1) == NORMALIZATION

    @classmethod
    def load(cls, directory: Path) -> "PrefixIndex":
        present = [n for n in cls.ARRAYS if n not in cls.OPTIONAL or (Path(directory) / f"{n}.npy").exists()]
        return cls(load_arrays(Path(directory), present))

    def _word_range(self, keyword: str) -> tuple[int, int, int]:
        """(lo, hi, exact): words [lo, hi) start with `keyword`; exact is its own word id or -1."""
        key = keyword.encode()[:MAX_WORD_BYTES]  # as the vocabulary was cut
        if len(key) > self.width:  # longer than every vocabulary word
            return 0, 0, -1
        # search with the vocabulary's own dtype: a wider key would make numpy cast all of `vocab`
        lo = int(np.searchsorted(self.vocab, np.array(key, self.vocab.dtype), "left"))
        if len(key) < self.width:  # 0xff never occurs in UTF-8, so key + 0xff bounds all extensions
            hi = int(np.searchsorted(self.vocab, np.array(key + b"\xff", self.vocab.dtype), "left"))
        else:  # no word is longer than the key: only the key itself can start with it
            hi = int(np.searchsorted(self.vocab, np.array(key, self.vocab.dtype), "right"))
        return lo, hi, (lo if lo < hi and self.vocab[lo] == key else -1)

    def search(
        self, query: str, k: int = 10, allowed_ids: Iterable[int] | None = None
    ) -> list[tuple[int, float]]:
        """Top-k `(item row, score)` for `query`, optionally only among item rows `allowed_ids`.

        Keywords of >= 3 characters find names holding a word equal to or starting with them; shorter
        keywords only add to the score of those names. If the query has no long keyword, its short
        keywords find names by exact word match instead (so "US" can find an item aliased "US").
        """
        keywords = normalize(query)
        if not keywords or k <= 0:
            return []
        ranges = [self._word_range(kw) for kw in keywords]  # (lo, hi, exact) per keyword
        finders = [len(kw) >= MIN_KEYWORD_LEN for kw in keywords]
        exact_only = not any(finders)  # only short keywords: they find names by exact words
        if exact_only:
            finders = [True] * len(keywords)
            spans = [(exact, exact + 1) for _, _, exact in ranges if exact >= 0]
        else:
            spans = [(lo, hi) for (lo, hi, _), finder in zip(ranges, finders) if finder]
        spans = np.array(spans, dtype=np.int64).reshape(-1, 2)  # word-id ranges [S, 2]
        starts, ends = self.word_ptr[spans[:, 0]], self.word_ptr[spans[:, 1]]  # posting slices
        score = partial(self._score, ranges=ranges, finders=finders, exact_only=exact_only)

        # --- candidate names: all names of the allowed items if fewer than the postings
        allowed = None
        if allowed_ids is not None:
            allowed = _allowed_array(allowed_ids, len(self.popularity))
            first, last = self.item_ptr[allowed], self.item_ptr[allowed + 1]
            if (last - first).sum() < (ends - starts).sum():
                return _top_k(*score(_concat_ranges(first, last)), self.popularity, k)
        # --- else from the posting lists; few: all scored at once
        if (ends - starts).sum() <= TIERED_POSTINGS:
            names = _sorted_unique(self.postings[_concat_ranges(starts, ends)].astype(np.int64))
            return _top_k(*self._scored(names, score, allowed), self.popularity, k)
        # --- one long list, the others short (every keyword a finder): the long one read best group first
        if self.group_ptr is not None and not exact_only and all(finders):
            lengths = ends - starts
            longest = int(np.argmax(lengths))
            if lengths.sum() - lengths[longest] <= TIERED_POSTINGS:
                return self._long_list_by_groups(ranges, spans, longest, score, k, allowed)
        # --- many: a common word's long list only if the short lists do not settle the top k
        settled = self._short_lists_first(starts, ends, score, len(keywords), exact_only, k, allowed)
        if settled is not None:
            return settled
        short_keywords = exact_only or not all(finders)  # keywords that may match words beyond the postings
        names, bound = self._bounds(starts, ends, len(keywords), exact_only, short_keywords)
        if allowed is not None:
            inside = _is_in_sorted(self.name_item[names], allowed)
            names, bound = names[inside], bound[inside]
        return _top_k(*_by_tiers(names, bound, score, k), self.popularity, k)

    def _long_list_by_groups(
        self, ranges, spans, longest: int, score, k: int, allowed
    ) -> list[tuple[int, float]]:
        """The top k of a query of finder keywords whose postings are short but for keyword `longest`'s: the short
        lists' names scored whole, the long list's a tier at a time, best first. A name only the long keyword
        finds misses every other keyword, and at least its group's count of its words stays unmatched
        (`name_groups`): it scores at most EXACT (PREFIX unless it holds the keyword itself as a word), plus a
        miss per other keyword, plus UNMATCHED_WORD per group step. Tier t holds the keyword's own word's
        group t and its longer words' group t - 1, which share that bound; reading stops once the k-th best
        item beats the bound of the next tier (a tie still reads it: popularity breaks ties)."""
        others = np.delete(spans, longest, axis=0)
        names = self.postings[_concat_ranges(self.word_ptr[others[:, 0]], self.word_ptr[others[:, 1]])]
        parts = [self._scored(_sorted_unique(names.astype(np.int64)), score, allowed)]
        lo, hi, exact = ranges[longest]
        longer_words = np.arange(lo, hi, dtype=np.int64)
        longer_words = longer_words[longer_words != exact]
        misses = (len(spans) - 1) * UNMATCHED_KEYWORD
        for tier in range(NAME_GROUPS + 1):
            items, scores = (np.concatenate(part) for part in zip(*parts))
            if _kth_best(items, scores, k) > misses + EXACT + UNMATCHED_WORD * tier:
                break
            groups = [longer_words * NAME_GROUPS + tier - 1] if tier >= 1 else []  # (word, group) slots
            if exact >= 0 and tier < NAME_GROUPS:
                groups.append(np.array([exact * NAME_GROUPS + tier], dtype=np.int64))
            if groups:
                slots = np.concatenate(groups)
                tier_names = self.postings[_concat_ranges(self.group_ptr[slots], self.group_ptr[slots + 1])]
                parts.append(self._scored(tier_names.astype(np.int64), score, allowed))
        items, scores = _best_per_item(*(np.concatenate(part) for part in zip(*parts)))
        return _top_k(items, scores, self.popularity, k)

    def _scored(
        self, names: np.ndarray, score: Callable, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`score` of the names whose item is allowed (sorted allowed item rows; all if `allowed` is None)."""
        if allowed is not None:
            names = names[_is_in_sorted(self.name_item[names], allowed)]
        return score(names)

    def _short_lists_first(self, starts, ends, score, n_keywords: int, exact_only: bool, k: int, allowed):
        """The top k from the names of the short posting slices alone (the shortest, and any of <= TIERED_POSTINGS),
        if they settle it: when the k-th best of their items beats the most a name in none of them can score
        (EXACT for each long slice, a miss for each short one, EXACT for each keyword without a slice), no name
        found only by the long slices (a common word's) can enter the top k. None if they do not settle it."""
        long = (ends - starts) > TIERED_POSTINGS
        long[np.argmin(ends - starts)] = False  # "john smith": "smith" settles it when "john" is longer
        if not long.any():
            return None
        names = _sorted_unique(self.postings[_concat_ranges(starts[~long], ends[~long])].astype(np.int64))
        items, scores = self._scored(names, score, allowed)
        miss = PREFIX if exact_only else UNMATCHED_KEYWORD
        bound = long.sum() * EXACT + (~long).sum() * miss + (n_keywords - len(starts)) * EXACT
        return _top_k(items, scores, self.popularity, k) if _kth_best(items, scores, k) > bound else None

    def _bounds(
        self, starts: np.ndarray, ends: np.ndarray, n_keywords: int, exact_only: bool, short_keywords: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """The names in the posting slices [starts, ends) of the S spans (sorted, int64 [C]) and the most each can
        score (float64 [C]): EXACT for each span it is in and each keyword without a span, a miss for each span it
        is not in (UNMATCHED_KEYWORD; PREFIX for exact-word spans), and, when every keyword has a span of its
        prefix, UNMATCHED_WORD for each of its words beyond its postings in the spans (the words any keyword
        can match)."""
        n_spans = len(starts)
        # (name, span) keys sorted: runs of one name; a name twice in a span (two words of its prefix) counts once
        span = np.repeat(np.arange(n_spans, dtype=np.int64), ends - starts)
        keys = np.sort(self.postings[_concat_ranges(starts, ends)].astype(np.int64) * n_spans + span)
        all_names = keys // n_spans
        name_start = np.flatnonzero(np.concatenate([[True], all_names[1:] != all_names[:-1]]))
        key_new = np.concatenate([[True], keys[1:] != keys[:-1]])
        names = all_names[name_start]
        hits = np.add.reduceat(key_new, name_start)  # spans each name is in [C]
        miss = PREFIX if exact_only else UNMATCHED_KEYWORD
        bound = hits * EXACT + (n_spans - hits) * miss + (n_keywords - n_spans) * EXACT
        if not short_keywords:  # a name's words beyond its postings in the spans start with no keyword
            postings = np.diff(np.append(name_start, len(keys)))  # >= the words of the name keywords match
            lengths = self.name_ptr[names + 1] - self.name_ptr[names]
            bound += UNMATCHED_WORD * np.maximum(lengths - postings, 0)
        return names, bound

    def _score(
        self, names: np.ndarray, ranges: list, finders: list[bool], exact_only: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Score every candidate name against every keyword, on its own words (docs/method.md section 5.2);
        returns the found names' items (int64 [F]) and their best score (float64 [F]), one per item."""
        if len(names) == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        lengths = self.name_ptr[names + 1] - self.name_ptr[names]  # words per name [C]
        positions = _concat_ranges(self.name_ptr[names], self.name_ptr[names + 1])
        words = self.name_words[positions]  # word ids of all candidate names, concatenated [W]
        seg = np.cumsum(lengths) - lengths  # start of each name's words in `words`
        score = np.zeros(len(names))
        found = np.zeros(len(names), dtype=bool)
        word_matched = np.zeros(len(words), dtype=bool)
        for (lo, hi, exact), finder in zip(ranges, finders):
            hit = (words >= lo) & (words < hi)  # word starts with the keyword
            any_hit = np.logical_or.reduceat(hit, seg)
            exact_hit = np.logical_or.reduceat(words == exact, seg)
            score += np.where(exact_hit, EXACT, np.where(any_hit, PREFIX, UNMATCHED_KEYWORD))
            word_matched |= hit
            if finder:
                found |= exact_hit if exact_only else any_hit
        score += UNMATCHED_WORD * (lengths - np.add.reduceat(word_matched, seg))
        # --- an item scores its best name
        return _best_per_item(self.name_item[names[found]].astype(np.int64), score[found])


def name_groups(vocab: np.ndarray, name_words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each name's group (int64 [N]): at least how many of its words a query keyword that finds it leaves
    unmatched, capped at NAME_GROUPS - 1. A finder keyword (MIN_KEYWORD_LEN characters, so 3 bytes or more)
    matches only words that start with it, which share their first three bytes: the name's length less the
    most of its words that share their first three bytes. `name_words` are ids into the sorted `vocab`,
    name after name (`lengths` [N] words each)."""
    if len(lengths) == 0:
        return np.zeros(0, np.int64)
    classes, word_class = np.unique(vocab.astype("S3"), return_inverse=True)  # first three bytes of each word
    matchable = (np.char.str_len(vocab) >= 3)[name_words]  # a shorter word matches no finder keyword
    name_of_word = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    keys, shared = np.unique(
        name_of_word[matchable] * len(classes) + word_class.ravel()[name_words][matchable], return_counts=True
    )
    most_shared = np.zeros(len(lengths), np.int64)
    if len(keys):
        names = keys // len(classes)
        first = np.flatnonzero(np.concatenate([[True], names[1:] != names[:-1]]))
        most_shared[names[first]] = np.maximum.reduceat(shared, first)
    return np.minimum(lengths - most_shared, NAME_GROUPS - 1)


def _by_tiers(names: np.ndarray, bound: np.ndarray, score: Callable, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Items and best scores (`score`) of the candidate `names`, scored by tiers of their `bound` (the most each
    can score), best first, until the k-th best item beats the next tier's bound: the later tiers cannot
    change the top k."""
    scored = []  # (items, best score of each) per tier
    tiers = np.unique(bound)[::-1]
    for i, tier in enumerate(tiers):
        scored.append(score(names[bound == tier]))
        items, scores = (np.concatenate(parts) for parts in zip(*scored))
        if i + 1 < len(tiers) and _kth_best(items, scores, k) > tiers[i + 1]:
            break
    if len(scored) <= 1:
        return scored[0] if scored else (np.zeros(0, np.int64), np.zeros(0))
    return _best_per_item(*map(np.concatenate, zip(*scored)))


def _best_per_item(items: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct item once, with its best score (items sorted)."""
    order = np.lexsort((-scores, items))
    items, scores = items[order], scores[order]
    first = np.concatenate([[True], items[1:] != items[:-1]]) if len(items) else np.zeros(0, bool)
    return items[first], scores[first]


def _kth_best(items: np.ndarray, scores: np.ndarray, k: int) -> float:
    """The k-th best score over distinct items (an item scores its best); -inf if fewer than k items."""
    items, scores = _best_per_item(items, scores)
    return float(np.partition(scores, -k)[-k]) if len(items) >= k else -np.inf


class EmbeddingIndex:
    """Cosine-similarity index; one vector per item name, results de-duplicated by item.

    Arrays: vectors float32 [M, D] (unit rows, grouped by item), item_ptr int64 [I+1] (rows
    item_ptr[i]:item_ptr[i+1] embed item i), popularity float32 [I]. `encoder(texts) -> float32
    [n, D]` embeds queries with the same model that embedded the names.
    """

    ARRAYS = ["vectors", "item_ptr", "popularity"]

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        encoder: Callable[[list[str]], np.ndarray] | None,
        encoder_name: str,
    ):
        self.vectors, self.item_ptr, self.popularity = (arrays[n] for n in self.ARRAYS)
        self.encoder, self.encoder_name = encoder, encoder_name
        self.embedded = np.flatnonzero(np.diff(self.item_ptr) > 0)  # items with at least one vector

    @classmethod
    def build(
        cls,
        names: Iterable[list[str]],
        popularity: np.ndarray,
        encoder,
        encoder_name: str,
        batch_size: int = 256,
        progress: Callable | None = None,
    ) -> "EmbeddingIndex":
        """Embed every distinct name of every item; `progress` (e.g. tqdm) wraps the batch loop."""
        texts, counts = [], []
        for item_names in names:
            distinct = list(dict.fromkeys(n.strip() for n in item_names if n.strip()))
            texts.extend(distinct)
            counts.append(len(distinct))
        batches = range(0, len(texts), batch_size)
        batches = progress(batches) if progress else batches
        chunks = [encoder(texts[i : i + batch_size]) for i in batches]
        vectors = np.concatenate(chunks) if chunks else np.zeros((0, 1), np.float32)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        arrays = {
            "vectors": vectors.astype(np.float32),
            "item_ptr": np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
            "popularity": np.asarray(popularity, dtype=np.float32),
        }
        assert len(arrays["item_ptr"]) == len(arrays["popularity"]) + 1, f"{len(counts)=} {len(popularity)=}"
        return cls(arrays, encoder, encoder_name)

    def save(self, directory: Path) -> None:
        arrays = {n: getattr(self, n) for n in self.ARRAYS}
        save_arrays(
            Path(directory),
            arrays,
            {
                "type": "embedding",
                "encoder": self.encoder_name,
                "dim": self.vectors.shape[1],
                "vectors_from": VECTORS_FROM,
            },
        )

    @staticmethod
    def is_current(directory: Path) -> bool:
        """Whether the index at `directory` holds the float64 encoder's vectors (older ones: float32's,
        whose last bits depend on the CPU that built them)."""
        config = Path(directory) / "config.json"
        return config.exists() and json.loads(config.read_text()).get("vectors_from") == VECTORS_FROM

    @classmethod
    def load(cls, directory: Path, encoder=None) -> "EmbeddingIndex":
        """Load arrays memory-mapped; `encoder` defaults to the one named in config.json, loaded
        at the first search (so opening an index stays cheap)."""
        name = json.loads((Path(directory) / "config.json").read_text())["encoder"]
        return cls(load_arrays(Path(directory), cls.ARRAYS), encoder, name)

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self.encoder is None:
            from llm.encoder import load_encoder  # torch only once an embedding search happens

            self.encoder = load_encoder(self.encoder_name)
        return self.encoder(texts)

    def search(
        self, query: str, k: int = 10, allowed_ids: Iterable[int] | None = None
    ) -> list[tuple[int, float]]:
        """Top-k `(item row, cosine)`; an item scores its best-matching name."""
        if not query.strip() or k <= 0:
            return []
        items = self.embedded
        if allowed_ids is not None:
            allowed = _allowed_array(allowed_ids, len(self.popularity))
            items = allowed[self.item_ptr[allowed + 1] > self.item_ptr[allowed]]
        if len(items) == 0:
            return []
        q = np.asarray(self._encode([query])[0], dtype=np.float64)
        q /= max(float(np.linalg.norm(q)), 1e-12)
        # float32 scores find the candidates: every item within a margin of the k-th best, a margin above
        # float32 rounding, so the top k is among them whatever the CPU's kernel summed in which order
        if len(items) > k:
            best = self._best_scores(items, q.astype(np.float32), all_rows=allowed_ids is None)
            items = items[best >= np.partition(best, -k)[-k] - FLOAT32_MARGIN]
        # float64 scores of the candidates, rounded to 9 decimals, rank them: CPUs agree but at a rare boundary
        return _top_k(items, np.round(self._best_scores(items, q), 9), self.popularity, k)

    def _best_scores(self, items: np.ndarray, q: np.ndarray, all_rows: bool = False) -> np.ndarray:
        """Each item's best cosine over its names, computed in q's precision. [len(items)]"""
        starts, ends = self.item_ptr[items], self.item_ptr[items + 1]
        if all_rows:  # every embedded item: one matrix product, no gather
            return np.maximum.reduceat(self.vectors @ q, starts)
        sims = self.vectors[_concat_ranges(starts, ends)].astype(q.dtype) @ q
        return np.maximum.reduceat(sims, np.cumsum(ends - starts) - (ends - starts))


# ---------------------------------------------------------------------------- the index directory API
KINDS = {"entity": "entities", "property": "properties"}  # search kind -> sub-directory
ITEM_FIELDS = ("id", "label", "aliases", "description", "popularity")


@dataclass
class Item:
    """A knowledge-graph item as indexed: full IRI, main label, all aliases, description, popularity."""

    id: str
    label: str
    aliases: list[str]
    description: str
    popularity: float

    def named_by(self, wording: str) -> bool:
        """Whether one of the item's names (label or alias) holds every word of `wording`, each as a word
        or the start of one, as the prefix index matches keywords: "Van Gogh" names Vincent van Gogh,
        "Jimmy Hoffa" does not name Jimmy Wales."""
        keywords = normalize(wording)
        return any(
            all(any(word.startswith(keyword) for word in normalize(name)) for keyword in keywords)
            for name in [self.label, *self.aliases]
        )


@dataclass
class Hit(Item):
    """A search result: the item plus its search score (prefix score or cosine similarity)."""

    score: float


class ItemStore:
    """Item metadata of one kind, memory-light: row i is line i of `items.jsonl`.

    Files: items.jsonl ({"id", "label", "aliases", "description", "popularity"} per line),
    offsets.npy int64 [I+1] (byte offset of each line), popularity.npy float32 [I], and for IRI
    lookup id_hash.npy uint64 [I] (sorted 64-bit BLAKE2b of the IRIs) with id_row.npy int64 [I].
    """

    def __init__(self, directory: Path):
        self.directory = directory = Path(directory)
        with open(directory / "items.jsonl", "rb") as f:  # the map keeps its own file handle
            empty = directory.joinpath("items.jsonl").stat().st_size == 0
            self._map = b"" if empty else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        arrays = load_arrays(directory, ["offsets", "popularity", "id_hash", "id_row"])
        self.offsets, self.popularity, self.id_hash, self.id_row = arrays.values()

    @staticmethod
    def write(
        directory: Path,
        items: Iterable[dict],
        run_items: int = 1 << 23,
        batch: int = 10_000,
        first_row: int = 0,
    ) -> int:
        """Write items (dicts with id, label, aliases, description, popularity) to `directory`, streamed: memory
        holds `batch` items and the IRI hashes of `run_items` (64 MB by default), whatever the number of items;
        the hashes are sorted in runs of `run_items` and merged from disk (common/external_sort.py). Returns the
        number of items; their rows (id_row) start at `first_row` (a part of a larger store, to concatenate)."""
        directory, items, rows = Path(directory), iter(items), first_row
        directory.mkdir(parents=True, exist_ok=True)
        runs, hashes = [], []  # (hash run, row run) paths; the hashes of the run being gathered
        with (
            open(directory / "items.jsonl", "wb") as f,
            NpyWriter(directory / "offsets.npy", np.int64) as offsets,
            NpyWriter(directory / "popularity.npy", np.float32) as popularity,
        ):
            offsets.append(np.zeros(1))
            while part := list(itertools.islice(items, batch)):
                lines = [jsonl.line({key: item[key] for key in ITEM_FIELDS}).encode() for item in part]
                # the byte offset of every line's end: `get` reads one item without parsing the file
                offsets.append(f.tell() + np.cumsum([len(line) for line in lines]))
                f.writelines(lines)
                popularity.append(np.array([item["popularity"] for item in part], dtype=np.float32))
                hashes.append(np.array([_iri_hash(item["id"]) for item in part], dtype=np.uint64))
                rows += len(part)
                if sum(map(len, hashes)) >= run_items:
                    runs.append(_spill_hashes(directory, len(runs), np.concatenate(hashes), rows))
                    hashes = []
        if hashes or not runs:
            runs.append(
                _spill_hashes(directory, len(runs), np.concatenate(hashes or [np.zeros(0, np.uint64)]), rows)
            )
        try:
            write_id_lookup(directory, [run for run, _ in runs], [rows_run for _, rows_run in runs])
        finally:
            for run in [path for pair in runs for path in pair]:
                run.unlink()
        (directory / "config.json").write_text(
            json.dumps({"type": "items", "items": rows - first_row}, indent=2)
        )
        return rows - first_row

    def stream(self, start: int = 0) -> Iterator[Item]:
        """The items from row `start` on, in row order, read front to back (faster than row by row)."""
        with open(self.directory / "items.jsonl", "rb") as f:
            f.seek(int(self.offsets[min(start, len(self))]))
            for line in f:
                yield Item(**json.loads(line))

    def __len__(self) -> int:
        return len(self.popularity)

    def __iter__(self):
        return (self[row] for row in range(len(self)))

    def __getitem__(self, row: int) -> Item:
        return Item(**json.loads(self._map[self.offsets[row] : self.offsets[row + 1]]))

    def rows(self, iris: Iterable[str]) -> np.ndarray:
        """Rows of the IRIs present in this store (unknown IRIs are skipped). int64 [<= len(iris)]."""
        hashes = np.array([_iri_hash(iri) for iri in iris], dtype=np.uint64)
        pos = np.minimum(np.searchsorted(self.id_hash, hashes), max(len(self) - 1, 0))
        found = self.id_hash[pos] == hashes if len(self) else np.zeros(len(hashes), bool)
        return np.asarray(self.id_row[pos[found]], dtype=np.int64)

    def get(self, iri: str) -> Item | None:
        rows = self.rows([iri])
        item = self[int(rows[0])] if len(rows) else None
        return item if item is not None and item.id == iri else None


def _spill_hashes(directory: Path, number: int, hashes: np.ndarray, end: int) -> tuple[Path, Path]:
    """Sort the IRI hashes of rows end - len(hashes) .. end - 1 into run files (hashes, rows)."""
    order = np.argsort(hashes, kind="stable")
    paths = directory / f"id_hash.run{number}.npy", directory / f"id_row.run{number}.npy"
    np.save(paths[0], hashes[order]), np.save(paths[1], end - len(hashes) + order)
    return paths


def write_id_lookup(directory: Path, hash_runs: list[Path], row_runs: list[Path]) -> None:
    """id_hash.npy (sorted IRI hashes) and id_row.npy (their rows) of an item store from sorted runs (hashes,
    rows); ValueError on a repeated hash."""
    last = None
    with (
        NpyWriter(directory / "id_hash.npy", np.uint64) as id_hash,
        NpyWriter(directory / "id_row.npy", np.int64) as id_row,
    ):
        for hashes, rows in merge(hash_runs, row_runs):
            if len(hashes) and ((np.diff(hashes) == 0).any() or hashes[0] == last):
                raise ValueError(f"duplicate item IRIs (or a 64-bit hash collision) in {directory}")
            id_hash.append(hashes)
            id_row.append(rows)
            last = hashes[-1]


def _iri_hash(iri: str) -> int:
    return int.from_bytes(hashlib.blake2b(iri.encode(), digest_size=8).digest(), "little")


class Indices:
    """The search indices of one knowledge graph, as built by build_index.py.

    search(kind, query, k, allowed_ids) -> list[Hit]   kind "entity" or "property"
    item(iri) -> Item, get(iri) -> Item | None, `iri in indices`   metadata of any indexed item
    Ids are full IRIs; Wikidata properties by their entity IRI (http://www.wikidata.org/entity/P19),
    so callers map wdt:/p:/ps:/pq: variants to that before calling (skeleton.split_variant).
    """

    def __init__(self, directory: Path, encoder=None):
        directory = Path(directory).expanduser()
        manifest = directory / "manifest.json"
        if not manifest.exists():
            raise FileNotFoundError(f"no index at {directory} (no manifest.json); run build_index.py")
        self.directory, self.manifest = directory, json.loads(manifest.read_text())
        self.stores: dict[str, ItemStore] = {}  # kind -> item metadata
        self.methods: dict[str, dict] = {}  # kind -> {"prefix": PrefixIndex, "embedding": ...}
        for kind, sub in KINDS.items():
            self.stores[kind] = ItemStore(directory / sub / "items")
            self.methods[kind] = {"prefix": PrefixIndex.load(directory / sub / "prefix")}
            if (directory / sub / "embedding" / "config.json").exists():
                embedding = EmbeddingIndex.load(directory / sub / "embedding", encoder)
                self.methods[kind]["embedding"] = embedding
            sizes = {name: len(method.popularity) for name, method in self.methods[kind].items()}
            stamps = [directory / sub / part / "build.json" for part in ("items", "prefix", "embedding")]
            sources = [json.loads(stamp.read_text()) for stamp in stamps if stamp.exists()]
            other = any(
                any(built.get(k) != v for k, v in self.manifest["source"].items()) for built in sources
            )
            if other or set(sizes.values()) != {
                len(self.stores[kind])
            }:  # parts of other builds: rows mean other items
                raise ValueError(
                    f"the {kind} parts of the index at {directory} disagree ({len(self.stores[kind])} "
                    f"items, {sizes} rows, built from the manifest's source: {not other}); rebuild it "
                    f"with build_index.py --force"
                )

    def default_method(self, kind: str) -> str:
        """GRASP's defaults: prefix search for entities, embedding search for properties if built."""
        return "embedding" if kind == "property" and "embedding" in self.methods[kind] else "prefix"

    def search(
        self,
        kind: str,
        query: str,
        k: int = 10,
        allowed_ids: Iterable[str] | None = None,
        method: str | None = None,
    ) -> list[Hit]:
        """Top-k items of `kind` for `query`, restricted to the IRIs `allowed_ids` if given.

        Unknown IRIs in `allowed_ids` are ignored; an empty or whitespace query gives [].
        `method` ("prefix" or "embedding") overrides `default_method(kind)`.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; use one of {sorted(KINDS)}")
        method = method or self.default_method(kind)
        if method not in self.methods[kind]:
            built = sorted(self.methods[kind])
            raise ValueError(f"no {method!r} index for {kind} in {self.directory}; built: {built}")
        store = self.stores[kind]
        rows = None if allowed_ids is None else store.rows(allowed_ids)
        results = self.methods[kind][method].search(query, k, rows)
        return [Hit(**asdict(store[row]), score=score) for row, score in results]

    def item(self, iri: str) -> Item:
        """Metadata of an indexed entity or property; KeyError if the IRI is not indexed."""
        for store in self.stores.values():
            if (item := store.get(iri)) is not None:
                return item
        raise KeyError(f"{iri} is not in the index at {self.directory}")

    def get(self, iri: str) -> Item | None:
        """Metadata of an indexed entity or property, or None if the IRI is not indexed."""
        return next((item for store in self.stores.values() if (item := store.get(iri)) is not None), None)

    def __contains__(self, iri: str) -> bool:
        return self.get(iri) is not None


def prefixes_current(directory: Path) -> bool:
    """Whether every prefix part of the index at `directory` was built with today's `normalize`."""
    return all(PrefixIndex.is_current(Path(directory) / sub / "prefix") for sub in KINDS.values())


def embeddings_current(directory: Path) -> bool:
    """Whether every embedding part of the index at `directory` holds the float64 encoder's vectors."""
    parts = (Path(directory) / sub / "embedding" for sub in KINDS.values())
    return all(EmbeddingIndex.is_current(part) for part in parts if part.exists())


def load_indices(directory: Path, encoder=None) -> Indices:
    """Open an index directory; arrays are memory-mapped. `encoder` overrides the saved encoder. An index
    of float32 encoder vectors (built before the float64 encoder) or of another `normalize` (NORMALIZATION)
    is used with a warning."""
    indices = Indices(directory, encoder)
    if not prefixes_current(indices.directory):
        print(
            f"warning: {indices.directory} was built with another text normalisation than today's, so "
            "names with accents, symbols or invisible characters may not be found; build_index.py rebuilds "
            "it",
            file=sys.stderr,
        )
    if not embeddings_current(indices.directory):
        print(
            f"warning: {indices.directory} holds float32 encoder vectors, whose property rankings may differ "
            "between CPUs; build_index.py --force rebuilds it",
            file=sys.stderr,
        )
    return indices


def main(args: argparse.Namespace) -> None:
    indices = load_indices(args.index)
    queries = [args.query] if args.query is not None else _read_queries()
    for query in queries:
        for hit in indices.search(args.kind, query, args.k, method=args.method):
            aliases = f" [{', '.join(hit.aliases[:3])}]" if hit.aliases else ""
            print(f"{hit.score:7.3f}  {hit.id}  {hit.label}{aliases}: {hit.description}", end="")
            print(f" (popularity {hit.popularity:g})")


def _read_queries():
    while True:
        try:
            yield input("query> ")
        except EOFError:
            return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Query a GRISP search index.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--index",
        type=Path,
        default=defaults.DEMO_INDEX_DIR,
        help="index directory (build_index.py)",
    )
    parser.add_argument("--kind", choices=sorted(KINDS), default="entity", help="which items to search")
    parser.add_argument(
        "--method",
        choices=["prefix", "embedding"],
        default=None,
        help="index type (default: prefix for entities, embedding for properties)",
    )
    parser.add_argument("--k", type=int, default=10, help="number of results")
    parser.add_argument(
        "--query",
        default=None,
        help="answer this one query and exit (default: read queries from stdin)",
    )
    args = parser.parse_args()
    try:
        main(args)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
