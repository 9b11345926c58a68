"""Serve GRISP over HTTP: one process, the model loaded once, a JSON API with a live trace and a web page.

The web page (static/, served here; no build step, nothing from the network) asks a question and
shows the search as it unfolds: the skeletons ranked, each placeholder's candidates re-ranked with
None's place and the choice, the backtracks and validations, then the query and the answers
(docs/method.md section 6 for what each step is). The API, for the page and for scripts:

    GET  /api/config   model, adapter, index, endpoint, default options (with help), limits, examples
    POST /api/answer   {"question": str, "options": {name: value}, "mode": "answer"|"generate"}
                       -> the answer (query with PREFIXes, result with labels, skeletons, trace, timings,
                       failure); 400 bad request, 503 busy (Retry-After), 504 time limit, 502 endpoint
    POST /api/stream   the same request -> Server-Sent Events: queued, started, trace (each event as it
                       happens; a repeated seq updates that event), then answer, timeout or error.
                       Closing the connection cancels the question.

Options are the fields of options.Options (the paper's switches and knobs); mode "generate" returns the
skeletons without resolving them. One worker thread runs the questions one after another (jobs.py).

    python serve.py                                 # then open http://127.0.0.1:8000
    python serve.py --host 0.0.0.0 --port 8080      # expose it on the network, deliberately
    curl -s 127.0.0.1:8000/api/answer -d '{"question": "Who directed Pulp Fiction?", "options": {"rerank": false}}'
"""
import argparse
import asyncio
import json
import math
import socket
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import defaults
from jsonl import read_jsonl
from grisp import Answer, Grisp, answer_to_json
from jobs import TERMINAL, Job, QueueFull, Worker
from options import GrispError, Options, add_flags, from_flags, preset
from search import Indices
from sparql import Result, SparqlError
from sparql_syntax import PREFIXES

STATIC_DIR = defaults.REPO_DIR / "static"
MAX_BODY_BYTES = 64 * 1024
MAX_QUESTION_CHARS = 1000
MODES = ("answer", "generate")  # generate: the skeletons only, no resolution
CAPS = {"num_beams": 16, "num_skeletons": 16, "max_new_tokens": 512}  # cost knobs a client cannot raise past these
STATUS = {"timeout": 504, "endpoint": 502, "cancelled": 503, "internal": 500}  # terminal message -> HTTP status
TICK = 1.0  # seconds between keep-alives on a stream (and looks for a lost client)
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:"}  # nothing from elsewhere


class BadRequest(Exception):
    """The request cannot be answered as sent (HTTP 400); the message says what to change."""


@dataclass
class Question:
    question: str
    options: Options
    mode: str


# --- requests: validated at the boundary
def parse_options(values: object, base: Options) -> Options:
    """`base` with the overrides `values` (JSON), checked: known names (options.preset), JSON types of
    the fields' defaults, the fields' own rules, and this server's CAPS."""
    if not isinstance(values, dict):
        raise BadRequest(f"options must be a JSON object of names and values, e.g. {{\"rerank\": false}}, not {values!r}")
    types = {f.name: type(f.default) for f in fields(Options)}
    problems = []
    for name, value in values.items():
        kind = types.get(name)
        if kind is bool and not isinstance(value, bool) or kind in (int, float) and (
                isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float))):
            problems.append(f"{name} must be a JSON {'boolean' if kind is bool else 'whole number' if kind is int else 'number'}"
                            f", not {json.dumps(value)}")
        elif name in CAPS and value > CAPS[name]:
            problems.append(f"{name} = {value} is over this server's limit of {CAPS[name]}")
    if problems:
        raise BadRequest("bad options: " + "; ".join(problems))
    try:
        preset(**values)  # unknown names and bad values, with the Options' own messages
        return replace(base, **{k: float(v) if types[k] is float else v for k, v in values.items()})
    except GrispError as e:
        raise BadRequest(str(e)) from None


def parse_question(body: bytes, base: Options) -> Question:
    """The request body -> Question, or BadRequest saying what is wrong."""
    try:
        data = json.loads(body)
    except ValueError as e:
        raise BadRequest(f"the body is not JSON ({e}); send {{\"question\": \"Who directed Pulp Fiction?\"}}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object like {\"question\": \"Who directed Pulp Fiction?\"}")
    unknown = sorted(set(data) - {"question", "options", "mode"})
    if unknown:
        raise BadRequest(f"unknown field {', '.join(unknown)}; the fields are question, options and mode")
    question, mode = data.get("question"), data.get("mode", "answer")
    if not isinstance(question, str) or not question.strip():
        raise BadRequest("the question is empty; ask something, e.g. \"Who directed Pulp Fiction?\"")
    if len(question) > MAX_QUESTION_CHARS:
        raise BadRequest(f"the question has {len(question)} characters; at most {MAX_QUESTION_CHARS} are allowed")
    if mode not in MODES:
        raise BadRequest(f"mode must be one of {', '.join(MODES)}, not {json.dumps(mode)}")
    return Question(question.strip(), parse_options(data.get("options", {}), base), mode)


async def read_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise BadRequest(f"the request body is over {MAX_BODY_BYTES // 1024} KB")
    return body


# --- the work, in the worker thread
def plain(value: object) -> object:
    """A JSON-safe copy: tuples become lists, non-finite floats None (JSON has no infinity)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def result_labels(indices: Indices, result: Result | None, limit: int = 500) -> dict[str, str]:
    """IRI -> label for the IRIs of the result's first `limit` rows that the index knows."""
    labels = {}
    for row in result.rows[:limit] if result is not None else []:
        for term in row.values():
            if term["type"] == "uri" and term["value"] not in labels:
                try:
                    labels[term["value"]] = indices.item(term["value"]).label
                except KeyError:
                    pass
    return labels


def run(grisp: Grisp, job: Job) -> dict:
    """Answer the job's question, streaming each trace event; the final message (answer or error)."""
    q: Question = job.request
    seq, last = 0, None

    def listener(event: dict) -> None:  # a new event, or the latest one again after a note added to it
        nonlocal seq, last
        job.check()
        if event is not last:
            seq, last = seq + 1, event
        job.emit({"type": "trace", "seq": seq, "event": plain(event)})  # a copy: notes change the event later

    grisp.use_options(q.options)
    try:
        if q.mode == "generate":
            start = time.perf_counter()
            skeletons, trace = grisp.skeletons(q.question, listener)
            seconds = time.perf_counter() - start
            answer = Answer(q.question, None, None, skeletons, trace, {"generate": seconds, "total": seconds},
                            failure=None if skeletons else "no_skeleton")
        else:
            answer = grisp.answer(q.question, listener)
    except SparqlError as e:  # an endpoint fault the pipeline did not record in the answer
        return {"type": "error", "kind": "endpoint", "message": f"the SPARQL endpoint failed: {e}"}
    data = plain(answer_to_json(answer) | {"labels": result_labels(grisp.indices, answer.result), "mode": q.mode,
                                           "options": asdict(q.options)})
    if answer.failure == "endpoint_error":  # the endpoint went away or kept failing mid-question
        return {"type": "error", "kind": "endpoint", "message": f"the SPARQL endpoint failed: {answer.error}",
                "answer": data}
    return {"type": "answer", "answer": data}


# --- the web app
def make_app(grisp: Grisp, info: dict, options: Options, examples: list[str],
             max_waiting: int = 8, time_limit: float = 120.0) -> Starlette:
    """The Starlette app over a loaded `grisp`; `info` names what it was loaded from (for /api/config)."""
    worker = Worker(lambda job: run(grisp, job), max_waiting)
    config = info | {
        "options": asdict(options), "option_help": {f.name: f.metadata["help"] for f in fields(Options)},
        "caps": CAPS, "modes": list(MODES), "max_question_chars": MAX_QUESTION_CHARS,
        "max_waiting": max_waiting, "time_limit": time_limit, "examples": examples, "prefixes": PREFIXES}

    @asynccontextmanager
    async def lifespan(app):
        hook = grisp.model.register_forward_pre_hook(lambda module, args: worker.check())  # cancel point
        worker.start()
        yield
        worker.stop()
        hook.remove()

    async def submit(request: Request) -> Job | Response:
        try:
            question = parse_question(await read_body(request), options)
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, 400)
        job = Job(question, asyncio.get_running_loop(), time_limit)
        try:
            worker.submit(job)
        except QueueFull as e:
            return JSONResponse({"error": str(e)}, 503, headers={"Retry-After": str(e.retry_after)})
        return job

    async def answer(request: Request) -> Response:
        job = await submit(request)
        if isinstance(job, Response):
            return job
        try:
            async for message in job.messages(TICK):
                if message is None:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; `finally` cancels the work
                elif message["type"] == "answer":
                    return JSONResponse(message["answer"])
                elif message["type"] in TERMINAL:
                    kind = message.get("kind", message["type"])
                    return JSONResponse({"error": message["message"], "kind": kind}
                                        | ({"answer": message["answer"]} if "answer" in message else {}), STATUS[kind])
        finally:
            job.cancel("client")

    async def stream(request: Request) -> Response:
        job = await submit(request)
        if isinstance(job, Response):
            return job

        async def events():
            try:
                async for message in job.messages(TICK):
                    yield ": keep-alive\n\n" if message is None else \
                        f"event: {message['type']}\ndata: {json.dumps(message)}\n\n"
            finally:  # the answer went out, or the client left: either way the work is over
                job.cancel("client")
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    routes = [Route("/", lambda request: FileResponse(STATIC_DIR / "index.html", headers=PAGE_HEADERS)),
              Route("/api/config", lambda request: JSONResponse(config)),
              Route("/api/answer", answer, methods=["POST"]),
              Route("/api/stream", stream, methods=["POST"]),
              Mount("/static", StaticFiles(directory=STATIC_DIR))]
    return Starlette(routes=routes, lifespan=lifespan)


def example_questions(path: str, count: int = 6) -> list[str]:
    """A few questions of `path` (JSONL with "question"): the first of each shape ("info.shape") first."""
    if path.lower() == "none":
        return []
    records = read_jsonl(Path(path))
    first_of_shape = {}
    for r in records:
        first_of_shape.setdefault(str(r.get("info", {}).get("shape")), r["question"])
    return list(dict.fromkeys([*first_of_shape.values(), *(r["question"] for r in records)]))[:count]


def main(args: argparse.Namespace) -> int:
    # --- setup: sane limits, a free port (checked before the model loads for seconds)
    if args.max_waiting < 0 or args.time_limit <= 0:
        print(f"error: --max-waiting must be >= 0 and --time-limit > 0 (got {args.max_waiting}, {args.time_limit})",
              file=sys.stderr)
        return 2
    try:
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port} ({e.strerror}); pick another --port", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    adapter = None if args.adapter.lower() == "none" else args.adapter
    try:
        options = from_flags(args)
        examples = example_questions(args.examples)
        start = time.perf_counter()
        # always load the re-ranker: a request may turn re-ranking on even if the default is off
        grisp = Grisp(args.model_dir, adapter, args.index, args.endpoint, replace(options, rerank=True), args.device)
    except (GrispError, SparqlError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = {"model": args.model_dir, "adapter": adapter, "index": args.index, "endpoint": args.endpoint}
    print(f"loaded in {time.perf_counter() - start:.1f}s: " + json.dumps(info | {"options": asdict(options)}))

    # --- serve
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host}: anyone who can reach this machine can use the model", file=sys.stderr)
    app = make_app(grisp, info, options, examples, args.max_waiting, args.time_limit)
    print(f"open http://{args.host}:{args.port}")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # network
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 exposes the server)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--max-waiting", type=int, default=8, help="questions that may wait; more get 503")
    parser.add_argument("--time-limit", type=float, default=120.0,
                        help="seconds per question from the start of its work (generation included); then 504")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="uvicorn's log level")
    # model, index and knowledge graph
    parser.add_argument("--model-dir", default=str(defaults.MODEL_DIR), help="base model directory (get_model.py)")
    parser.add_argument("--adapter", default=str(defaults.ADAPTER_DIR),
                        help="LoRA adapter directory (PEFT layout), or 'none' for the base model")
    parser.add_argument("--index", default=str(defaults.DEMO_INDEX_DIR), help="search index directory (build_index.py)")
    parser.add_argument("--endpoint", default=defaults.ENDPOINT_URL, help="SPARQL endpoint URL")
    parser.add_argument("--examples", default=str(defaults.DEMO_DIR / "questions.jsonl"),
                        help="JSONL with example questions for the page, or 'none'")
    # the default options of every request (a request may override each): one flag per options.Options field
    add_flags(parser)
    # runtime
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda, ...")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    return parser


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
