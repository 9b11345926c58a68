"""What serve.py's routes share: GRISP's /api, the agent's /api/agent (web/agent_routes.py) and the
OpenAI-compatible /v1 (web/openai_api.py). Request bodies read with a size cap and checked (BadRequest,
HTTP 400), JSON-safe copies, the labels of a result, and a job of the one worker (jobs.py) answered
either as one final message or as Server-Sent Events (each message as it happens).

    data = json_object(await read_body(request), '{"question": "Who directed Pulp Fiction?"}')
    job = Job(request_object, asyncio.get_running_loop(), time_limit); worker.submit(job)   # QueueFull: busy()
    message = await final_message(request, job)     # the terminal message, or None if the client left
    return event_stream(job)                          # or: stream every message as an SSE event
"""

import json
import math
import time
from typing import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from web.jobs import TERMINAL, Job, QueueFull

MAX_BODY_BYTES = 64 * 1024
MAX_QUESTION_CHARS = 1000
TICK = 1.0  # seconds between keep-alives on a stream (and looks for a lost client)
STATUS = {"timeout": 504, "endpoint": 502, "cancelled": 503, "internal": 500}  # terminal message kind -> HTTP


class BadRequest(Exception):
    """The request cannot be answered as sent (HTTP 400); the message says what to change."""


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadRequest(f"the request body is over {limit // 1024} KB")
    return body


def json_object(body: bytes, example: str) -> dict:
    """The body as a JSON object, or BadRequest showing `example`."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than Python's parser goes
        raise BadRequest(
            f"the body is not JSON we read ({type(e).__name__}: {str(e)[:200]}); send {example}"
        ) from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object like {example}")
    return data


def question_text(question: object) -> str:
    """A question as sent, checked: a non-empty string of at most MAX_QUESTION_CHARS characters."""
    if not isinstance(question, str) or not question.strip():
        raise BadRequest('the question is empty; ask something, e.g. "Who directed Pulp Fiction?"')
    if len(question) > MAX_QUESTION_CHARS:
        raise BadRequest(
            f"the question has {len(question)} characters; at most {MAX_QUESTION_CHARS} are allowed"
        )
    return question.strip()


def busy(e: QueueFull, body: dict) -> JSONResponse:
    """HTTP 503 for a full queue, with Retry-After."""
    return JSONResponse(body, 503, headers={"Retry-After": str(e.retry_after)})


def plain(value: object) -> object:
    """A JSON-safe copy: tuples become lists, non-finite floats None (JSON has no infinity)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def result_labels(indices, result, limit: int = 500) -> dict[str, str]:
    """IRI -> label for the IRIs of the first `limit` rows of a sparql.Result that the search.Indices know."""
    labels = {}
    for row in result.rows[:limit] if result is not None and indices is not None else []:
        for term in row.values():
            if term["type"] == "uri" and term["value"] not in labels:
                try:
                    labels[term["value"]] = indices.item(term["value"]).label
                except KeyError:
                    pass
    return labels


async def final_message(request: Request, job: Job) -> dict | None:
    """The job's terminal message; None if the client left first. Either way the work ends here. The
    client is looked for at least every TICK, also while messages keep coming (a trace event per beam)."""
    try:
        checked = time.monotonic()
        async for message in job.messages(TICK):
            if message is not None and message["type"] in TERMINAL:
                return message
            if message is None or time.monotonic() - checked >= TICK:
                checked = time.monotonic()
                if await request.is_disconnected():
                    return None  # nobody reads it; `finally` cancels the work
    finally:
        job.cancel("client")


def event_stream(job: Job, on_close: Callable[[], None] | None = None) -> StreamingResponse:
    """Every message of the job as a Server-Sent Event (`event: type`, `data: json`), keep-alive comments
    between; closing the connection cancels the job. `on_close` runs when the stream ends."""

    async def events():
        try:
            async for message in job.messages(TICK):
                yield (
                    ": keep-alive\n\n"
                    if message is None
                    else f"event: {message['type']}\ndata: {json.dumps(message)}\n\n"
                )
        finally:  # the last message went out, or the client left: either way the work is over
            job.cancel("client")
            if on_close is not None:
                on_close()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Job-Id": job.id},
    )
