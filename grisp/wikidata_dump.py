"""Items from Wikidata's JSON dump, the file Wikidata's users download (docs/wikidata-scale.md).

`latest-all.json.gz` (or `.bz2`, or uncompressed) is one JSON array with one entity per line: a line "[",
then one entity per line ending with ",", the last one without it, then "]". It is read as a stream
(gzip / bz2 of the standard library), one line at a time, so memory holds one entity however large the
dump. Each entity becomes an item as build_index.py stores them:

- label: the entity's label in `lang`, else in one of its regional variants (en-gb for en, in name order),
  else in "mul" (Wikidata's label for all languages), else its id ("Q42"); the other labels of those
  languages become aliases, before the aliases of `lang`, its variants and "mul";
- description: the first of `lang`, its variants, "mul";
- popularity: the number of sitelinks (Wikipedia and sister-project pages) of an item; for a property the
  number of statements that use it in the whole dump, external-id properties after all others (in [-1, 0)),
  as build_index.py's endpoint reader ranks them.

Items (Q ids, "type": "item") are yielded as they are read; properties (P ids) after the last line, since
their usage is counted over the whole dump (they are few: ~13k). Other entity types (lexemes) are skipped.

    for kind, item in items_from_dump(Path("latest-all.json.gz"), lang="en"):
        ...  # kind "entity" or "property"; item {"id", "label", "aliases", "description", "popularity"}
"""

import bz2
import gzip
import io
import json
from pathlib import Path
from typing import IO, Iterator

from tqdm import tqdm

WD_ENTITY = "http://www.wikidata.org/entity/"
KIND_OF_TYPE = {"item": "entity", "property": "property"}


def open_dump(raw: IO[bytes], suffix: str) -> IO[str]:
    """The dump file `raw` as text lines, decompressed on the fly by its suffix (.gz, .bz2, or none)."""
    if suffix in (".gz", ".bz2"):
        return (gzip if suffix == ".gz" else bz2).open(raw, "rt", encoding="utf-8")
    return io.TextIOWrapper(raw, encoding="utf-8")


def languages(texts: dict, lang: str) -> list[str]:
    """The language keys of `texts` to use, best first: `lang`, its regional variants, "mul"."""
    variants = sorted(key for key in texts if key.lower().startswith(lang.lower() + "-"))
    return [key for key in [lang, *variants, "mul"] if key in texts]


def dump_item(entity: dict, lang: str) -> dict:
    """The item of one dump entity (popularity: its sitelinks; a property's is set from its usage later)."""
    labels, aliases = entity.get("labels") or {}, entity.get("aliases") or {}
    names = [labels[key]["value"] for key in languages(labels, lang)]
    names += [alias["value"] for key in languages(aliases, lang) for alias in aliases[key]]
    names = list(dict.fromkeys(name for name in names if name))  # each name once, best language first
    descriptions = entity.get("descriptions") or {}
    description = next((descriptions[key]["value"] for key in languages(descriptions, lang)), "")
    return {
        "id": WD_ENTITY + entity["id"],
        "label": names[0] if names else entity["id"],
        "aliases": names[1:],
        "description": description,
        "popularity": float(len(entity.get("sitelinks") or {})),
    }


def entities(path: Path, start_line: int = 0) -> Iterator[tuple[int, dict]]:
    """(line number, entity) of the dump at `path` after line `start_line` (the lines before are decompressed
    but not parsed: a resumed pass); ValueError names a line that is not an entity."""
    size = Path(path).stat().st_size  # the bar follows the (compressed) bytes read: its ETA is the pass's
    with (
        open(path, "rb") as raw,
        open_dump(raw, Path(path).suffix) as lines,
        tqdm(total=size, unit="B", unit_scale=True, desc=f"read {Path(path).name}", smoothing=0.05) as bar,
    ):
        for number, line in enumerate(lines, start=1):
            if number % 10_000 == 0:
                bar.update(raw.tell() - bar.n)
            line = line.strip()
            if number <= start_line or line in ("[", "]", ""):
                continue
            try:
                entity = json.loads(line[:-1] if line.endswith(",") else line)
                assert isinstance(entity, dict) and isinstance(entity.get("id"), str)
            except (json.JSONDecodeError, AssertionError):
                raise ValueError(
                    f"{path}:{number}: not a Wikidata entity (a JSON object with an id)"
                ) from None
            yield number, entity
        bar.update(size - bar.n)


def new_state() -> dict:
    """What a pass gathers besides the items (JSON, saved with a resumable pass's parts): statements per
    property, the properties' items, the external-id properties."""
    return {"usage": {}, "properties": [], "external": []}


def dump_pass(path: Path, lang: str, state: dict, start_line: int = 0) -> Iterator[tuple[int, dict]]:
    """(line number, item) of every item (Q id) after line `start_line`; the properties and the usage counts
    go into `state` (up to date with every line before the one yielded)."""
    usage = state["usage"]
    for number, entity in entities(path, start_line):
        kind = KIND_OF_TYPE.get(entity.get("type"))
        # how often each property is used: its popularity
        for prop, statements in (entity.get("claims") or {}).items():
            usage[prop] = usage.get(prop, 0) + len(statements)
        if kind == "entity":
            yield number, dump_item(entity, lang)
        elif kind == "property":
            state["properties"].append(dump_item(entity, lang))
            if entity.get("datatype") == "external-id":
                state["external"].append(entity["id"])


def dump_properties(state: dict) -> Iterator[dict]:
    """The properties of a finished pass, with their popularity: statements using them, external ids after all
    others (in [-1, 0)), as build_index.py's endpoint reader ranks them."""
    usage, external = state["usage"], set(state["external"])
    top = max(usage.values(), default=0) + 1.0
    for item in state["properties"]:
        pid = item["id"].removeprefix(WD_ENTITY)
        used = float(usage.get(pid, 0))
        yield item | {"popularity": used / top - 1.0 if pid in external else used}


def items_from_dump(path: Path, lang: str = "en") -> Iterator[tuple[str, dict]]:
    """(kind, item) for every item and property of the dump: items as read, properties at the end."""
    state = new_state()
    for _, item in dump_pass(path, lang, state):
        yield "entity", item
    for item in dump_properties(state):
        yield "property", item
