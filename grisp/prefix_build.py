"""A prefix-keyword index (search.PrefixIndex) of any number of names, built in a fixed memory budget: the
same arrays as `PrefixIndex.build`, from chunks that spill sorted runs to disk, merged (docs/wikidata-scale.md).

`PrefixIndex.build` holds every word of every name as a Python object (~340 MB per million names); this build
holds one chunk of `budget` bytes and small merge buffers, whatever the number of names. Four stages, in
the directory `work`:

1. chunks: items are read in order and normalised as `PrefixIndex.build` does (each distinct name of an item
   once); each chunk writes work/cNNNNN/: its sorted distinct words `vocab` (S<=64), its word occurrences in
   name order as ids into that `vocab` (`words`), each name's word count (`lengths`) and item row
   (`name_item`), and the items' `popularity`.
2. vocabulary: the chunk vocabularies merged into vocab.npy; each chunk gets `to_global` (its ids -> global).
3. names: name_words, name_ptr, name_item, item_ptr and popularity are appended chunk by chunk; each chunk's
   (word, group, name) triples (search.name_groups), as int64 keys word << 34 | group << 32 | name, are
   sorted into a run.
4. postings: the runs merged; the keys' names are `postings`, the places where their word changes
   `word_ptr`, where their (word, group) does `group_ptr`.

Resume: work/chunks.json lists the finished chunks (item range, counts) under a digest of the settings; a
chunk is listed only after its files are written, so a build stopped at 90% goes on after its last finished
chunk with the same settings (stages 2-4 are fast and run again).

    build_prefix(out, items=lambda start: ..., settings={"source": ...}, work=out.with_suffix(".chunks"))
"""

import hashlib
import json
import os
import shutil
import time
from array import array
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from common.external_sort import NpyWriter, merge
from search import MAX_WORD_BYTES, NAME_GROUPS, NORMALIZATION, PrefixIndex, name_groups, normalize

DEFAULT_BUDGET = 4 << 30  # bytes
# a chunk's memory per word occurrence, an upper estimate (its distinct words in a dict, its id arrays, np.unique of
# its vocabulary): 200k synthetic names grow a build by 23 MB with a budget of 32 MB, 8 MB with 8 MB (+ ~20 MB fixed)
BYTES_PER_WORD = 160
GROUP_BITS = 2  # a posting key's bits for the name's group, between its word and its name
assert NAME_GROUPS == 1 << GROUP_BITS, "a key's (word, group) is word * NAME_GROUPS + group"
# (names, popularity) of item rows start, start + 1, ...: the items a build reads, from any row on
ItemSource = Callable[[int], Iterable[tuple[list[str], float]]]


def build_prefix(
    out: Path,
    items: ItemSource,
    settings: dict,
    work: Path,
    budget: int = DEFAULT_BUDGET,
    total: int | None = None,
) -> int:
    """Write the arrays of the prefix index of `items(0)` to `out` (as PrefixIndex.save does); returns the
    number of names. `settings` identify the input (a finished chunk of other settings is not reused);
    `total` (the item count, if known) gives the progress bar its ETA. `work` is removed when done."""
    out, work = Path(out), Path(work)
    chunks = normalise_chunks(items, work, settings_digest(settings), max(1, budget // BYTES_PER_WORD), total)
    out.mkdir(parents=True, exist_ok=True)
    width = max([chunk["width"] for chunk in chunks] + [1])  # as np.array(words): the longest word's bytes
    block = max(1024, budget // (4 * max(1, len(chunks)) * max(width, 8)))  # merge buffer values per run
    words = merge_vocabularies(work, chunks, out / "vocab.npy", np.dtype(f"S{width}"), block)
    runs = write_names(work, chunks, out)
    write_postings(runs, out, block, words)
    names = sum(chunk["names"] for chunk in chunks)
    (out / "config.json").write_text(json.dumps(PrefixIndex.config(names), indent=2))
    shutil.rmtree(work)
    return names


def settings_digest(settings: dict) -> str:
    """What a finished chunk must have been built with: the input's settings and today's normalisation."""
    text = json.dumps(
        settings | {"normalization": NORMALIZATION, "word_bytes": MAX_WORD_BYTES}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------- 1. chunks (resumable)
def normalise_chunks(items: ItemSource, work: Path, digest: str, chunk_words: int, total: int | None) -> list:
    """The chunk records of work/chunks.json, after normalising the items its finished chunks lack."""
    manifest = work / "chunks.json"
    saved = json.loads(manifest.read_text()) if manifest.exists() else {}
    chunks = saved.get("chunks", []) if saved.get("settings") == digest else []
    if not chunks:  # nothing to resume (or other settings): start afresh
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    start = chunks[-1]["items"][1] if chunks else 0
    if chunks:
        print(f"resuming the prefix index after {len(chunks)} finished chunks ({start:,} items) in {work}")
    stream, started, names = iter(items(start)), time.time(), 0
    with tqdm(total=total, initial=start, unit=" items", desc="prefix index", smoothing=0.05) as bar:
        while (chunk := normalise_chunk(stream, start, chunk_words)) is not None:
            chunks.append(write_chunk(work / f"c{len(chunks):05d}", start, chunk))
            start, names = chunks[-1]["items"][1], names + chunks[-1]["names"]
            tmp = manifest.with_suffix(".tmp")  # the manifest is replaced whole: it never lists half a chunk
            tmp.write_text(json.dumps({"settings": digest, "chunks": chunks}, indent=1))
            os.replace(tmp, manifest)
            bar.update(start - bar.n)
            bar.set_postfix_str(f"{names / max(time.time() - started, 1e-9):,.0f} names/s")
    return chunks


def normalise_chunk(stream: Iterator, start: int, chunk_words: int) -> dict | None:
    """The next items of `stream` (item rows from `start`), up to about `chunk_words` word occurrences, as
    compact arrays; None when the stream is done. Names as in PrefixIndex.build: normalised, each distinct
    word sequence of an item once, words cut to MAX_WORD_BYTES."""
    ids: dict[bytes, int] = {}  # distinct word -> id in order of first occurrence
    words, lengths, name_item, popularity = array("i"), array("i"), array("i"), array("f")
    item = start
    for item_names, item_popularity in stream:
        seen = set()
        for name in item_names:
            tokens = tuple(normalize(name))
            if tokens and tokens not in seen:
                seen.add(tokens)
                words.extend(ids.setdefault(token.encode()[:MAX_WORD_BYTES], len(ids)) for token in tokens)
                lengths.append(len(tokens))
                name_item.append(item)
        popularity.append(item_popularity)
        item += 1
        if len(words) >= chunk_words or item - start >= chunk_words:
            break
    if item == start:
        return None
    # sorted distinct words; np.unique also merges words that differ only by trailing NUL bytes, as numpy does
    vocab, first_to_sorted = np.unique(np.array(list(ids)) if ids else np.zeros(0, "S1"), return_inverse=True)
    return {
        "vocab": vocab,
        "words": first_to_sorted.astype(np.int32)[np.frombuffer(words, np.int32)],
        "lengths": np.frombuffer(lengths, np.int32),
        "name_item": np.frombuffer(name_item, np.int32),
        "popularity": np.frombuffer(popularity, np.float32),
        "items": [start, item],
    }


def write_chunk(directory: Path, start: int, chunk: dict) -> dict:
    """Save a chunk's arrays in `directory` (complete, or absent); returns its record for chunks.json."""
    tmp = directory.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in ("vocab", "words", "lengths", "name_item", "popularity"):
        np.save(tmp / f"{name}.npy", chunk[name], allow_pickle=False)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
    width = chunk["vocab"].dtype.itemsize if len(chunk["vocab"]) else 0
    counts = {"names": len(chunk["lengths"]), "words": len(chunk["words"]), "width": width}
    return {"dir": directory.name, "items": chunk["items"]} | counts


# ---------------------------------------------------------------------------- 2.-4. merges
def merge_vocabularies(work: Path, chunks: list, out: Path, dtype: np.dtype, block: int) -> int:
    """Write the sorted distinct words of all chunks to `out`, and each chunk's to_global.npy (int32 [V_c]:
    the global id of each of its words). Returns the vocabulary size."""
    runs = [work / chunk["dir"] / "vocab.npy" for chunk in chunks]
    maps = [NpyWriter(work / chunk["dir"] / "to_global.npy", np.int32) for chunk in chunks]
    count, last = 0, None
    with NpyWriter(out, dtype) as vocab, tqdm(desc="merge words", unit=" words", leave=False) as bar:
        for words, run in merge(runs, block=block, dtype=dtype):
            new = np.ones(len(words), dtype=bool)  # a word unlike the one before it: the next global id
            new[1:] = words[1:] != words[:-1]
            new[0] = last is None or words[0] != last
            ids = count - 1 + np.cumsum(new)
            vocab.append(words[new])
            for r in np.unique(run):  # each chunk's words arrive in its own order: appended, its ids in order
                maps[r].append(ids[run == r])
            count, last = count + int(new.sum()), words[-1]
            bar.update(len(words))
    for writer in maps:
        writer.close()
    return count


def write_names(work: Path, chunks: list, out: Path) -> list[Path]:
    """Append each chunk's names to the name arrays in `out` and sort its (word, name) keys into a run;
    returns the runs' paths."""
    dtypes = {"name_words": np.int32, "name_ptr": np.int64, "name_item": np.int32, "item_ptr": np.int64}
    writers = {name: NpyWriter(out / f"{name}.npy", dtype) for name, dtype in dtypes.items()}
    writers["popularity"] = NpyWriter(out / "popularity.npy", np.float32)
    writers["name_ptr"].append(np.zeros(1))
    names = words = 0  # names and word occurrences of the chunks before
    runs = []
    for chunk in tqdm(chunks, desc="names", unit=" chunks", leave=False):
        arrays = {n: np.load(work / chunk["dir"] / f"{n}.npy") for n in ("to_global", "words", "lengths")}
        arrays |= {n: np.load(work / chunk["dir"] / f"{n}.npy") for n in ("name_item", "popularity", "vocab")}
        name_words = arrays["to_global"][arrays["words"]]  # global word ids in name order, int32 [W_c]
        lengths = arrays["lengths"].astype(np.int64)
        writers["name_words"].append(name_words)
        writers["name_ptr"].append(words + np.cumsum(lengths))
        writers["name_item"].append(arrays["name_item"])
        # item i's names start after every name of an item before it (all earlier chunks' names included)
        writers["item_ptr"].append(names + np.searchsorted(arrays["name_item"], np.arange(*chunk["items"])))
        writers["popularity"].append(arrays["popularity"])
        local_names = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)  # [W_c]
        group = name_groups(arrays["vocab"], arrays["words"], lengths)[local_names]
        keys = (name_words.astype(np.int64) << (32 + GROUP_BITS)) | (group << 32) | (names + local_names)
        keys = np.sort(keys)  # by word, then group, then name
        runs.append(work / chunk["dir"] / "postings_run.npy")
        np.save(runs[-1], keys, allow_pickle=False)
        names, words = names + len(lengths), words + len(name_words)
    writers["item_ptr"].append(np.array([names]))
    for writer in writers.values():
        writer.close()
    return runs


def write_postings(runs: list[Path], out: Path, block: int, vocabulary: int) -> None:
    """Merge the chunks' (word, group, name) runs into postings.npy (int32 [P]: names grouped by word, then
    by group, ascending), word_ptr.npy (int64 [V+1]) and group_ptr.npy (int64 [V*G+1], an empty group
    pointing where the next begins); every word of the vocabulary occurs at least once."""
    position, last_word, last_slot = 0, -1, -1
    with (
        NpyWriter(out / "postings.npy", np.int32) as postings,
        NpyWriter(out / "word_ptr.npy", np.int64) as word_ptr,
        NpyWriter(out / "group_ptr.npy", np.int64) as group_ptr,
    ):
        for keys, _ in tqdm(merge(runs, block=block), desc="merge postings", unit=" blocks", leave=False):
            slot = keys >> 32  # word * NAME_GROUPS + group
            word = slot >> GROUP_BITS
            # where a word starts; where a (word, group) starts, repeated for the empty groups before it
            word_ptr.append(position + np.flatnonzero(np.diff(word, prepend=last_word)))
            starts = np.flatnonzero(np.diff(slot, prepend=last_slot))
            before = np.concatenate([[last_slot], slot[starts[:-1]]])
            group_ptr.append(np.repeat(position + starts, slot[starts] - before))
            postings.append(keys & 0xFFFFFFFF)
            position, last_word, last_slot = position + len(keys), int(word[-1]), int(slot[-1])
        word_ptr.append(np.array([position]))
        group_ptr.append(np.full(vocabulary * NAME_GROUPS - last_slot, position))  # the empty ones at the end
    assert word_ptr.count == vocabulary + 1, f"{word_ptr.count=} word pointers for {vocabulary=} words"
    assert group_ptr.count == vocabulary * NAME_GROUPS + 1, f"{group_ptr.count=} for {vocabulary=} words"
