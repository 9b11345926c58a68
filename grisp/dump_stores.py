"""The item stores of a Wikidata dump pass, written in parts so that a pass cut short resumes after its last
finished part (docs/wikidata-scale.md): build_index.py --wikidata-dump.

The pass (grisp/wikidata_dump.py) reads the dump once, hours for all of Wikidata. Its items are written as
item stores (search.ItemStore) of `part_items` items each, in work/pNNNNN/; work/parts.json lists the finished
parts, the dump line each ends at, and what the pass gathered besides items (property usage, the properties)
under the source's identity. A pass started again with the same source skips the lines of the finished parts
without parsing them (decompressing only) and goes on. When the dump is read, the parts are concatenated into
the entity store and the properties written into theirs; `work` is left for the caller to remove.

    write_dump_stores(entities_dir, properties_dir, Path("latest-all.json.gz"), "en", source, work)
"""

import itertools
import json
import os
import shutil
from pathlib import Path

import numpy as np

from common.external_sort import NpyReader, NpyWriter
from grisp.wikidata_dump import dump_pass, dump_properties, new_state
from search import ItemStore, write_id_lookup

PART_ITEMS = 5_000_000  # items per part: a resumed pass loses at most this many


def write_dump_stores(
    entities: Path,
    properties: Path,
    dump: Path,
    lang: str,
    source: dict,
    work: Path,
    part_items: int = PART_ITEMS,
) -> None:
    """Write the entity store `entities` and the property store `properties` of the dump, resuming the parts
    in `work` of a pass of the same `source` cut short."""
    manifest = work / "parts.json"
    saved = json.loads(manifest.read_text()) if manifest.exists() else {}
    if saved.get("source") != source:  # nothing to resume (or another dump): start afresh
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        saved = {"source": source, "parts": [], "line": 0, "done": False, "state": new_state()}
    parts, rows = saved["parts"], sum(part["rows"] for part in saved["parts"])
    if parts:
        print(
            f"resuming the dump pass after line {saved['line']:,}: {rows:,} items in {len(parts)} parts in {work}"
        )
    # (the state is up to date with the lines yielded)
    stream = dump_pass(dump, lang, saved["state"], saved["line"])
    while not saved["done"]:
        last = [saved["line"]]  # the line of the last item written
        directory = work / f"p{len(parts):05d}"
        shutil.rmtree(directory.with_suffix(".tmp"), ignore_errors=True)
        count = ItemStore.write(
            directory.with_suffix(".tmp"), taken(stream, part_items, last), first_row=rows
        )
        if count:
            os.replace(directory.with_suffix(".tmp"), directory)
            parts.append({"dir": directory.name, "rows": count})
            rows += count
        saved["line"], saved["done"] = last[0], count < part_items  # a short part: the dump is read
        tmp = manifest.with_suffix(".tmp")  # replaced whole: it never lists half a part
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, manifest)
    concatenate(entities, [work / part["dir"] for part in parts])
    ItemStore.write(properties, dump_properties(saved["state"]))


def taken(stream, count: int, last: list[int]):
    """The next `count` items of the (line, item) `stream`; last[0] becomes the line of the last one."""
    for number, item in itertools.islice(stream, count):
        last[0] = number
        yield item


def concatenate(directory: Path, parts: list[Path]) -> int:
    """One item store in `directory` of the item stores `parts` (their rows numbered on, as ItemStore.write's
    first_row numbered them); returns its number of items."""
    directory.mkdir(parents=True, exist_ok=True)
    with (
        open(directory / "items.jsonl", "wb") as lines,
        NpyWriter(directory / "offsets.npy", np.int64) as offsets,
        NpyWriter(directory / "popularity.npy", np.float32) as popularity,
    ):
        offsets.append(np.zeros(1))
        for part in parts:
            start = lines.tell()
            with open(part / "items.jsonl", "rb") as source:
                shutil.copyfileobj(source, lines, 1 << 24)
            part_offsets = NpyReader(part / "offsets.npy")
            part_offsets.read(1)  # its leading 0: this part starts where the last one ended
            for block in part_offsets:
                offsets.append(start + block)
            for block in NpyReader(part / "popularity.npy"):
                popularity.append(block)
    write_id_lookup(
        directory, [part / "id_hash.npy" for part in parts], [part / "id_row.npy" for part in parts]
    )
    (directory / "config.json").write_text(json.dumps({"type": "items", "items": popularity.count}, indent=2))
    return popularity.count
