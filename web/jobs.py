"""One model, many clients: a bounded queue of questions answered one at a time by one worker thread.

serve.py's web server is asynchronous and holds many connections; the model is not: it answers one
question at a time on both CPU cores. So every request becomes a `Job` in a bounded queue, one worker
thread takes the jobs in order and runs them, and each job's messages (its live trace, then the answer,
a timeout or an error) travel back to the event loop through the job's asyncio queue.

A job stops early when it is cancelled, because its client left or its time limit passed: the work
calls `job.check()` at its cancel points (serve.py: every trace event and every model forward), which
raises `Cancelled`. Between cancel points (a slow SPARQL query) the event loop side gives up on its own
shortly after the deadline, so a client never waits much past the time limit.

    worker = Worker(run, max_waiting=8).start()    # run(job) -> the final message; may raise Cancelled
    job = Job(request, asyncio.get_running_loop(), time_limit=120)
    worker.submit(job)                              # QueueFull (with retry_after) if 8 already wait
    async for message in job.messages(tick=1.0):    # dicts {"type": ...}; None after each quiet tick
        ...
    job.cancel("client")
"""

import asyncio
import math
import secrets
import threading
import time
import traceback
from collections import deque
from typing import Any, AsyncIterator, Callable

TERMINAL = ("answer", "timeout", "error")  # the message types that end a job
GRACE = 2.0  # seconds past the deadline before the event loop stops waiting for a stuck job


class Cancelled(Exception):
    """Raised at a cancel point of a cancelled job; args[0] is the reason: "client" or "timeout"."""


class QueueFull(Exception):
    """The queue is full; retry_after estimates the seconds until a place frees up."""

    def __init__(self, waiting: int, retry_after: int):
        waiting_text = (
            "a question is being answered and none may wait"
            if waiting == 0
            else "1 question is waiting"
            if waiting == 1
            else f"{waiting} questions are waiting"
        )
        super().__init__(f"the server is busy: {waiting_text}; try again in {retry_after} s")
        self.retry_after = retry_after


class Job:
    """One question on its way through the queue: the request, its messages, its cancel flag."""

    def __init__(self, request: Any, loop: asyncio.AbstractEventLoop, time_limit: float):
        self.request, self.loop, self.time_limit = request, loop, time_limit
        self.queue: asyncio.Queue = asyncio.Queue()  # messages for the client, filled from the worker thread
        self.cancelled = threading.Event()
        self.reason: str | None = None  # why it was cancelled
        self.submitted, self.deadline = time.monotonic(), None  # the deadline is set when the work starts
        self.id = secrets.token_urlsafe(
            9
        )  # names the job to a client that may cancel it (web/agent_routes.py)

    def emit(self, message: dict) -> None:
        """Send a message to the client side (safe from any thread; dropped once the server has stopped)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, message)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def cancel(self, reason: str) -> None:
        """Ask the work to stop at its next cancel point (the first reason given wins)."""
        if not self.cancelled.is_set():
            self.reason = reason
            self.cancelled.set()

    def stopped(self) -> bool:
        """Whether the work should stop: the job was cancelled, or its time is up."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.cancel("timeout")
        return self.cancelled.is_set()

    def check(self) -> None:
        """A cancel point: raise Cancelled if the job was cancelled or its time is up."""
        if self.stopped():
            raise Cancelled(self.reason)

    def timeout_message(self) -> dict:
        return {
            "type": "timeout",
            "seconds": self.time_limit,
            "message": f"no answer within the time limit of {self.time_limit:g} s per question",
        }

    async def messages(self, tick: float) -> AsyncIterator[dict | None]:
        """The job's messages up to and including the terminal one; None after each `tick` seconds without
        one (the caller's moment to send a keep-alive or look for a lost client)."""
        while True:
            try:
                message = await asyncio.wait_for(self.queue.get(), tick)
            except asyncio.TimeoutError:
                message = None
            if message is not None and message["type"] in TERMINAL:
                yield message
                return
            if self.deadline is not None and time.monotonic() > self.deadline + GRACE:
                self.cancel(
                    "timeout"
                )  # stuck between cancel points (or past them, talking): stop waiting for it
                yield self.timeout_message()
                return
            yield message


class Worker:
    """The one thread that runs the jobs in order; at most `max_waiting` jobs wait behind the running one
    (jobs cancelled while waiting give up their place at once). With 0, a job is taken only when the worker
    is free."""

    def __init__(self, run: Callable[[Job], dict], max_waiting: int):
        self.run, self.max_waiting = run, max_waiting
        self.waiting: deque[Job] = deque()
        self.changed = threading.Condition()  # guards `waiting` and `stopping`; notified on each change
        self.current: Job | None = None
        self.stopping = False
        self.seconds_per_job = 20.0  # a running mean of the work per job, for Retry-After
        self.thread = threading.Thread(target=self.loop, name="grisp-worker", daemon=True)

    def start(self) -> "Worker":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Cancel the running and the waiting jobs and end the thread."""
        with self.changed:
            self.stopping = True
            for job in [*self.waiting, self.current]:
                if job is not None:
                    job.cancel("shutdown")
            self.changed.notify()

    def submit(self, job: Job) -> int:
        """Queue `job`; return how many jobs are ahead of it. QueueFull if `max_waiting` already wait."""
        with self.changed:
            self.waiting = deque(j for j in self.waiting if not j.cancelled.is_set())
            busy = self.current is not None or bool(
                self.waiting
            )  # else the job starts at once: it does not wait
            if busy and len(self.waiting) >= self.max_waiting or self.stopping:
                raise QueueFull(len(self.waiting), math.ceil(self.seconds_per_job))
            ahead = len(self.waiting) + (self.current is not None)
            self.waiting.append(job)
            self.changed.notify()
        job.emit({"type": "queued", "ahead": ahead})
        return ahead

    def check(self) -> None:
        """A cancel point for the running job (called from the worker thread, e.g. by a model hook)."""
        if self.current is not None:
            self.current.check()

    def stop_requested(self) -> bool:
        """Whether the running job should stop, for work that ends itself cleanly instead of at a raising
        cancel point (the agent's local model: local_backend.LocalBackend.should_stop)."""
        job = self.current
        return job is not None and job.stopped()

    def next_job(self) -> Job | None:
        """The next job not cancelled while it waited; None once the worker stops."""
        with self.changed:
            while not self.stopping:
                while self.waiting:
                    job = self.waiting.popleft()
                    if not job.cancelled.is_set():
                        self.current = job
                        return job
                self.changed.wait()
            return None

    def loop(self) -> None:
        while (job := self.next_job()) is not None:
            start = time.monotonic()
            job.deadline = start + job.time_limit
            job.emit({"type": "started", "waited": round(start - job.submitted, 3)})
            try:
                message = self.run(job)
            except Cancelled as e:
                message = (
                    job.timeout_message()
                    if e.args[0] == "timeout"
                    else {"type": "error", "kind": "cancelled", "message": f"cancelled ({e.args[0]})"}
                )
            except Exception as e:  # a bug, not the user's fault: report it and keep serving
                traceback.print_exc()
                message = {
                    "type": "error",
                    "kind": "internal",
                    "message": f"internal error: {type(e).__name__}: {e}",
                }
            finally:
                self.current = None
            self.seconds_per_job = 0.8 * self.seconds_per_job + 0.2 * (time.monotonic() - start)
            job.emit(message)
