"""JSONL files and atomic writes: the project's one reader and writer of record files.

Benchmarks, item files, training samples, predictions and training logs are JSONL: one JSON value per
line, UTF-8, blank lines ignored. Every file that must never be seen half-written (a finished sample
file, a re-scored predictions file, a downloaded benchmark, a converted model file) is written under a
temporary name next to it and renamed over it, so it is either complete or absent (or unchanged).
Files that grow during a run (predictions, the training log) are appended a flushed line at a time.

    from common.jsonl import read_jsonl, write_jsonl, append_jsonl, write_json
    records = read_jsonl("questions.jsonl")           # ValueError "questions.jsonl:3 is not valid JSON (...)"
    write_jsonl("out.jsonl", records)                 # atomic; records may be a generator
    with open("log.jsonl", "a", encoding="utf-8") as file:
        append_jsonl(file, {"step": 1, "loss": 0.5})  # one flushed line
    done = read_jsonl("log.jsonl", appended=True)     # [] if absent; an unfinished last line is dropped
"""

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO


def line(record: Any) -> str:
    """One JSONL line: compact JSON, non-ASCII characters kept as they are, a newline at the end."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line, read lazily (for files too large to hold twice);
    a line that is not JSON raises ValueError naming the file and the line."""
    with open(path, encoding="utf-8") as file:
        yield from _parse(file, path)


def _parse(lines: Iterable[str], path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line of `path`'s `lines`; ValueError names file and line."""
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not valid JSON ({error})") from None
        yield number, record


def read_jsonl(path: str | Path, appended: bool = False) -> list:
    """The records of a JSONL file; a line that is not JSON raises ValueError naming the file and line.

    appended=True reads a file that append_jsonl writes while a run goes on: a missing file holds no
    records yet, and a last line that a killed run left unfinished (no newline) is cut from the file,
    with a message, so the run can go on appending after the last complete record."""
    path = Path(path)
    if appended:
        if not path.exists():
            return []
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            print(f"dropping an unfinished last line of {path}")
            with open(path, "r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)
    return [record for _, record in iter_jsonl(path)]


def read_finished(path: str | Path) -> list:
    """The records of the complete lines of a JSONL file that another process may be appending to (an
    unfinished last line is skipped, the file left as it is); a missing file holds none."""
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    complete = data[: data.rfind(b"\n") + 1].decode("utf-8")
    return [record for _, record in _parse(complete.split("\n"), path)]  # not splitlines: U+2028 is JSON text


def append_jsonl(file: TextIO, record: Any) -> None:
    """Write one record as one line to a JSONL file open for appending, and flush it: a run killed
    later keeps every record written so far (see read_jsonl(appended=True))."""
    file.write(line(record))
    file.flush()


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """Write `path` through `write(tmp)` and a rename, so `path` is either complete or absent (or, if
    it existed, unchanged). If `write` raises, the temporary file `<path>.tmp` is removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:  # also KeyboardInterrupt: no half file is left under either name
        tmp.unlink(missing_ok=True)
        raise


def write_jsonl(path: str | Path, records: Iterable) -> None:
    """Write the records one per line, atomically (write_atomic). `records` may be a generator: it is
    consumed while writing, so a long run of records never needs to be in memory at once."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as file:
            file.writelines(line(record) for record in records)

    write_atomic(path, write)


def write_json(path: str | Path, obj: Any) -> None:
    """Write one JSON document (indented, with a final newline), atomically (write_atomic)."""
    write_atomic(
        path,
        lambda tmp: tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"),
    )
