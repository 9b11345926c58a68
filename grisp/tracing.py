"""The trace of a resolution: what each step did (events) and how long each stage took (timings).

Kept apart from resolve.py so the depth-first search reads as the algorithm: a step records itself
with one `trace.event(...)` or `trace.note(...)` line and times itself with `with trace.timed(...)`.
infer.py prints the events (`describe`), evaluate.py stores them, the tests read their fields.

    trace = Trace()
    trace.event("placeholder", placeholder="<iri>Pulp Fiction</iri>", position="subject", kind="entity")
    with trace.timed("search"):
        hits = ...
    trace.note(hits=[...])           # adds fields to the latest event
    trace.events, trace.timings      # [{"event": "placeholder", ..., "hits": [...]}], {"search": 0.002}

A listener (serve.py's live trace) is called with the event each time one is recorded and again, with
the same dict, each time a note adds to it; if it raises (a cancelled question), the step stops there.
"""

import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

Listener = Callable[[dict], None]  # called with a new event, and with the latest event after each note


class Trace:
    def __init__(self, listener: Listener | None = None):
        self.events: list[dict] = []  # in order; each {"event": name, **fields}
        self.timings: dict[str, float] = {}  # stage -> seconds, summed over its runs
        self.listener = listener

    def event(self, name: str, /, **fields) -> dict:
        """Record a new event {"event": name, **fields} and return it (later steps may add fields with
        `note`). `name` is positional-only, so any field name is free (a placeholder event has `kind`)."""
        self.events.append({"event": name, **fields})
        if self.listener is not None:
            self.listener(self.events[-1])
        return self.events[-1]

    def note(self, **fields) -> None:
        """Add fields to the latest event (a step reporting what it found)."""
        assert self.events, f"no event to note {sorted(fields)} on"
        self.events[-1].update(fields)
        if self.listener is not None:
            self.listener(self.events[-1])

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the seconds spent in the `with` block to `timings[stage]`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - start


class Stopwatch:
    """Seconds spent inside an iterator's steps (answer(): the generation between resolutions)."""

    def __init__(self):
        self.seconds = 0.0

    def timed(self, iterable: Iterable) -> Iterator:
        iterator = iter(iterable)
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - start
            yield item
