"""The search indices of a knowledge graph, as the rest of GRISP uses them (docs/method.md section 5).

GRISP resolves every placeholder by a search followed by SLM re-ranking (paper section 3): entities
by the prefix-keyword index, properties by the embedding index (indices.py), optionally restricted
to the IRIs a constraint query returned (KG-constrained search). This module maps full IRIs to index
rows and rows back to item metadata, and is the only search API other modules need:

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
"""

import argparse
import hashlib
import json
import mmap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

import defaults
import jsonl
from indices import EmbeddingIndex, PrefixIndex, load_arrays, save_arrays

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
        directory = Path(directory)
        with open(directory / "items.jsonl", "rb") as f:  # the map keeps its own file handle
            empty = directory.joinpath("items.jsonl").stat().st_size == 0
            self._map = b"" if empty else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        arrays = load_arrays(directory, ["offsets", "popularity", "id_hash", "id_row"])
        self.offsets, self.popularity, self.id_hash, self.id_row = arrays.values()

    @staticmethod
    def write(directory: Path, items: Iterable[dict]) -> int:
        """Write items (dicts with id, label, aliases, description, popularity) to `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        offsets, popularity, hashes = [0], [], []
        with open(directory / "items.jsonl", "wb") as f:
            for item in items:
                # byte offsets of every line, so that `get` reads one item without parsing the file
                offsets.append(offsets[-1] + f.write(jsonl.line({key: item[key] for key in ITEM_FIELDS}).encode()))
                popularity.append(item["popularity"])
                hashes.append(_iri_hash(item["id"]))
        hashes = np.array(hashes, dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        if len(hashes) and (np.diff(hashes[order]) == 0).any():
            raise ValueError(f"duplicate item IRIs (or a 64-bit hash collision) in {directory}")
        save_arrays(directory, {
            "offsets": np.array(offsets, dtype=np.int64),
            "popularity": np.array(popularity, dtype=np.float32),
            "id_hash": hashes[order],
            "id_row": order.astype(np.int64),
        }, {"type": "items", "items": len(popularity)})  # fmt: skip
        return len(popularity)

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
            raise FileNotFoundError(
                f"no index at {directory} (no manifest.json); run build_index.py"
            )
        self.directory, self.manifest = directory, json.loads(manifest.read_text())
        self.stores: dict[str, ItemStore] = {}  # kind -> item metadata
        self.methods: dict[str, dict] = {}  # kind -> {"prefix": PrefixIndex, "embedding": ...}
        for kind, sub in KINDS.items():
            self.stores[kind] = ItemStore(directory / sub / "items")
            self.methods[kind] = {"prefix": PrefixIndex.load(directory / sub / "prefix")}
            if (directory / sub / "embedding" / "config.json").exists():
                embedding = EmbeddingIndex.load(directory / sub / "embedding", encoder)
                self.methods[kind]["embedding"] = embedding

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


def load_indices(directory: Path, encoder=None) -> Indices:
    """Open an index directory; arrays are memory-mapped. `encoder` overrides the saved encoder."""
    return Indices(directory, encoder)


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
    parser.add_argument(
        "--kind", choices=sorted(KINDS), default="entity", help="which items to search"
    )
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
        raise SystemExit(f"error: {e}")
