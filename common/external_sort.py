"""Arrays larger than memory: `.npy` files written a block at a time and sorted runs merged from disk.

How the index build (grisp/prefix_build.py) and the item store (search.ItemStore.write) handle more values
than fit in their memory budget (docs/wikidata-scale.md): each chunk of the input is sorted in memory and
written as a run (a `.npy` file of sorted values, with an optional payload file in the same order);
`merge` then yields the values of all runs in sorted order, block by block. Runs are read through small
buffers with plain reads, never memory-mapped: a map reserves the whole file's address space, which the
build's memory cap (an address-space limit, tests/test_index_build.py) counts.

    with NpyWriter(path, np.int64) as out:      # a .npy file whose length is known only at the end
        out.append(block)
    for keys, payload in merge([run_a, run_b], [rows_a, rows_b], block=1 << 16):
        ...                                         # keys sorted; payload: rows, or the run index of each key
"""

import struct
from pathlib import Path
from typing import Iterator

import numpy as np

HEADER_BYTES = 128  # a fixed header (a multiple of 64, as the .npy format wants) leaves room for any shape


def npy_header(dtype: np.dtype, count: int) -> bytes:
    """The .npy (version 1.0) header of a 1-D array of `count` values, padded to HEADER_BYTES."""
    text = repr(
        {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (count,)}
    )
    text = text.ljust(HEADER_BYTES - 11) + "\n"  # magic (6) + version (2) + length (2) + text = HEADER_BYTES
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


class NpyWriter:
    """A 1-D `.npy` file written by appending blocks; the header gets the final length at `close`."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype, self.count = Path(path), np.dtype(dtype), 0
        self.file = open(self.path, "wb")
        self.file.write(npy_header(self.dtype, 0))  # rewritten at close

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self.file.write(values.data if values.ndim else values.reshape(1).data)
        self.count += values.size

    def close(self) -> None:
        self.file.seek(0)
        self.file.write(npy_header(self.dtype, self.count))
        self.file.close()

    def __enter__(self) -> "NpyWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NpyReader:
    """Reads a 1-D `.npy` file front to back in blocks, with plain reads (no memory map)."""

    def __init__(self, path: Path, dtype=None):
        self.file = open(path, "rb")
        version = np.lib.format.read_magic(self.file)
        read_header = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, _, self.stored = read_header(self.file)
        assert len(shape) == 1, f"{path}: a 1-D array expected, not shape {shape}"
        self.left, self.dtype = shape[0], np.dtype(dtype or self.stored)

    def read(self, count: int) -> np.ndarray:
        """The next `count` values (fewer at the end), cast to `dtype` (a wider string, say)."""
        count = min(count, self.left)
        self.left -= count
        values = np.frombuffer(self.file.read(count * self.stored.itemsize), self.stored)
        return values.astype(self.dtype, copy=False) if self.dtype != self.stored else values

    def __iter__(self) -> Iterator[np.ndarray]:
        """All values (the rest), in blocks of 1M; the file is closed at the end."""
        while self.left:
            yield self.read(1 << 20)
        self.close()

    def close(self) -> None:
        self.file.close()


def merge(
    runs: list[Path], payloads: list[Path] | None = None, block: int = 1 << 16, dtype=None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The values of the sorted `runs`, in sorted order, as blocks (keys, payload). Equal keys come in run
    order. `payload` is the values of the `payloads` files (one per run, in the runs' order), else the index
    of each key's run (int32). Memory: about `block` values per run; `dtype` casts every run's keys (strings
    of several widths to the widest)."""
    keys = [NpyReader(path, dtype) for path in runs]
    extra = [NpyReader(path) for path in payloads] if payloads else None
    buffers = [(k.read(block), extra[r].read(block) if extra else None) for r, k in enumerate(keys)]
    try:
        while live := [r for r, (values, _) in enumerate(buffers) if len(values)]:
            # every value up to the smallest last buffered value is in a buffer: those can be emitted now
            bound = min(buffers[r][0][-1] for r in live)
            taken, carried = [], []
            for r in live:
                values, payload = buffers[r]
                cut = int(np.searchsorted(values, bound, "right"))
                taken.append(values[:cut])
                carried.append(payload[:cut] if extra else np.full(cut, r, dtype=np.int32))
                if cut == len(values):  # emptied: read the run's next block
                    buffers[r] = (keys[r].read(block), extra[r].read(block) if extra else None)
                else:
                    buffers[r] = (values[cut:], payload[cut:] if extra else None)
            values = np.concatenate(taken)
            order = np.argsort(values, kind="stable")  # stable: equal keys stay in run order
            yield values[order], np.concatenate(carried)[order]
    finally:
        for reader in keys + (extra or []):
            reader.close()
