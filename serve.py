"""Serve GRISP and the GRASP agent over HTTP: one process, the models loaded once, a JSON API with a live
trace, an OpenAI-compatible chat API and a web page.

The web page (web/static/, served here; no build step, nothing from the network) asks a question and
shows the work as it unfolds. GRISP mode: the skeletons ranked, each placeholder's candidates re-ranked
with None's place and the choice, the backtracks and validations, then the query and the answers
(docs/method.md section 6). Agent mode: each step of the GRASP agent (its text, each function call and
its result), then its answer, with a Cancel that stops it on the server (docs/agent.md). The API:

    GET  /api/config   model, adapter, index, endpoint, default options (with help), limits, examples, agent
    POST /api/answer   {"question": str, "options": {name: value}, "mode": "answer"|"generate"}
                       -> the answer (query with PREFIXes, result with labels, skeletons, trace, timings,
                       failure); 400 bad request, 503 busy (Retry-After), 504 time limit, 502 endpoint
    POST /api/stream   the same request -> Server-Sent Events: queued, started, trace (each event as it
                       happens; a repeated seq updates that event), then answer, timeout or error.
                       Closing the connection cancels the question.
    POST /api/agent/stream, /api/agent/cancel   the agent, step by step (web/agent_routes.py)
    POST /v1/chat/completions, GET /v1/models    our model for any OpenAI client, with tools (web/openai_api.py)

Options are the fields of options.Options (the paper's switches and knobs); mode "generate" returns the
skeletons without resolving them. One worker thread runs the jobs one after another (jobs.py). The
configuration is the agent's file (config.py, grasp.toml: knowledge graphs, model, agent, `[server]`);
flags override it. /v1 and the agent mode need `[server] agent = true` (the default); /v1 serves the
agent's local model, so it is there with `[model] backend = "local"`.

    python serve.py                                 # then open http://127.0.0.1:8000
    python serve.py --config grasp.toml --kg wikidata --port 8080
    curl -s 127.0.0.1:8000/api/answer -d '{"question": "Who directed Pulp Fiction?", "options": {"rerank": false}}'

About 350 lines, over a script's ~300: GRISP's routes, the app that mounts the others and the settings
shared with agent.py stay in one place; the agent's and /v1's routes are in their own modules.
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
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agent import Agent, build_agent
from common import defaults
from common.jsonl import read_jsonl
from grasp.backends import BackendError
from grasp.config import Config, ConfigError, check, load_config, override, unset_flag
from grasp.local_backend import LocalBackend
from grisp.options import GrispError, Options, add_flags, from_flags, preset
from grisp.pipeline import Answer, Grisp, answer_to_json
from grisp.sparql import SparqlError
from grisp.sparql_syntax import PREFIXES
from model import DEVICES
from web.agent_routes import AgentQuestion, agent_info, agent_routes, run_agent
from web.jobs import Job, QueueFull, Worker
from web.openai_api import ChatRequest, openai_routes, run_chat
from web.shared import (
    MAX_QUESTION_CHARS,
    STATUS,
    BadRequest,
    busy,
    event_stream,
    final_message,
    json_object,
    plain,
    question_text,
    read_body,
    result_labels,
)

STATIC_DIR = defaults.REPO_DIR / "web" / "static"
MODES = ("answer", "generate")  # generate: the skeletons only, no resolution
CAPS = {
    "num_beams": 16,
    "num_skeletons": 16,
    "max_new_tokens": 512,
}  # cost knobs a client cannot raise past these
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:"
}  # nothing from elsewhere


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
        raise BadRequest(
            f'options must be a JSON object of names and values, e.g. {{"rerank": false}}, not {values!r}'
        )
    types = {f.name: type(f.default) for f in fields(Options)}
    problems = []
    for name, value in values.items():
        kind = types.get(name)
        if (
            kind is bool
            and not isinstance(value, bool)
            or kind in (int, float)
            and (isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)))
        ):
            problems.append(
                f"{name} must be a JSON {'boolean' if kind is bool else 'whole number' if kind is int else 'number'}"
                f", not {json.dumps(value)}"
            )
        elif kind is float and not abs(value) <= sys.float_info.max:  # Python's json reads Infinity and NaN;
            # a whole number past a float's range compares exactly here, where math.isfinite would overflow
            problems.append(
                f"{name} must be a finite number of at most {sys.float_info.max:.3g}, not {value} "
                f"(JSON has no infinity; a large number such as 1000 does the same here)"
            )
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
    data = json_object(body, '{"question": "Who directed Pulp Fiction?"}')
    unknown = sorted(set(data) - {"question", "options", "mode"})
    if unknown:
        raise BadRequest(f"unknown field {', '.join(unknown)}; the fields are question, options and mode")
    question, mode = question_text(data.get("question")), data.get("mode", "answer")
    if mode not in MODES:
        raise BadRequest(f"mode must be one of {', '.join(MODES)}, not {json.dumps(mode)}")
    return Question(question, parse_options(data.get("options", {}), base), mode)


# --- the work, in the worker thread
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
            answer = Answer(
                q.question,
                None,
                None,
                skeletons,
                trace,
                {"generate": seconds, "total": seconds},
                failure=None if skeletons else "no_skeleton",
            )
        else:
            answer = grisp.answer(q.question, listener)
    except SparqlError as e:  # an endpoint fault the pipeline did not record in the answer
        return {"type": "error", "kind": "endpoint", "message": f"the SPARQL endpoint failed: {e}"}
    data = plain(
        answer_to_json(answer)
        | {
            "labels": result_labels(grisp.indices, answer.result),
            "mode": q.mode,
            "options": asdict(q.options),
        }
    )
    if answer.failure == "endpoint_error":  # the endpoint went away or kept failing mid-question
        return {
            "type": "error",
            "kind": "endpoint",
            "message": f"the SPARQL endpoint failed: {answer.error}",
            "answer": data,
        }
    return {"type": "answer", "answer": data}


# --- the web app
def page_config(
    grisp: Grisp,
    info: dict,
    options: Options,
    examples: list[str],
    max_waiting: int,
    time_limit: float,
    agent: Agent | None,
) -> dict:
    """What /api/config tells the page: what was loaded (`info`), the default options with their help and
    choices, what a request cannot change, the limits, the examples, and the agent mode if any."""
    return info | {
        "options": asdict(options),
        "option_help": {f.name: f.metadata["help"] for f in fields(Options)},
        "option_choices": {
            f.name: list(f.metadata["choices"]) for f in fields(Options) if f.metadata["choices"]
        },
        "load_time_options": grisp.fixed_options(),  # shown on the page, not changeable
        "precision": grisp.precision,
        "why_precision": grisp.why_precision,  # what runs, and why (auto: the CPU)
        "caps": CAPS,
        "modes": list(MODES),
        "max_question_chars": MAX_QUESTION_CHARS,
        "max_waiting": max_waiting,
        "time_limit": time_limit,
        "examples": examples,
        "prefixes": PREFIXES,
        "agent": agent_info(agent) if agent is not None else None,
    }


def grisp_routes(grisp: Grisp, options: Options, worker: Worker, time_limit: float) -> list[Route]:
    """POST /api/answer (the answer as JSON, or an error with its status) and POST /api/stream (the
    answer's steps as Server-Sent Events): each question a job of `worker`, `options` its defaults."""

    async def submit(request: Request) -> Job | Response:
        try:
            question = parse_question(await read_body(request), options)
            grisp.check_options(question.options)  # what the loaded model cannot do (precision, no re-ranker)
        except (BadRequest, GrispError) as e:
            return JSONResponse({"error": str(e)}, 400)
        job = Job(question, asyncio.get_running_loop(), time_limit)
        try:
            worker.submit(job)
        except QueueFull as e:
            return busy(e, {"error": str(e)})
        return job

    async def answer(request: Request) -> Response:
        job = await submit(request)
        if isinstance(job, Response):
            return job
        message = await final_message(request, job)
        if message is None:
            return Response(status_code=499)  # nobody reads it; the work was cancelled
        if message["type"] == "answer":
            return JSONResponse(message["answer"])
        kind = message.get("kind", message["type"])
        return JSONResponse(
            {"error": message["message"], "kind": kind}
            | ({"answer": message["answer"]} if "answer" in message else {}),
            STATUS[kind],
        )

    async def stream(request: Request) -> Response:
        job = await submit(request)
        return job if isinstance(job, Response) else event_stream(job)

    return [Route("/api/answer", answer, methods=["POST"]), Route("/api/stream", stream, methods=["POST"])]


def make_app(
    grisp: Grisp,
    info: dict,
    options: Options,
    examples: list[str],
    max_waiting: int = 8,
    time_limit: float = 120.0,
    agent: Agent | None = None,
    chat: LocalBackend | None = None,
) -> Starlette:
    """The Starlette app over a loaded `grisp`; `info` names what it was loaded from (for /api/config).
    `agent` adds the page's agent mode, `chat` (our model in-process) the OpenAI-compatible /v1."""
    runs = {Question: lambda job: run(grisp, job)}  # the worker runs each kind of job with its own function
    worker = Worker(lambda job: runs[type(job.request)](job), max_waiting)
    workers, models = [worker], [grisp.model]
    config = page_config(grisp, info, options, examples, max_waiting, time_limit, agent)
    extra = []
    for backend in (chat, agent.backend if agent is not None else None):
        if isinstance(backend, LocalBackend):  # a cancel or the time limit ends its turn at the next forward
            backend.should_stop = worker.stop_requested
    if chat is not None:
        runs[ChatRequest] = lambda job: run_chat(chat, job)
        extra += openai_routes(chat, worker, time_limit)
    if agent is not None:  # on our model: the one worker; on a remote model: a worker of its own
        if isinstance(agent.backend, LocalBackend):
            runs[AgentQuestion], agent_worker = (lambda job: run_agent(agent, job)), worker
        else:
            agent_worker = Worker(lambda job: run_agent(agent, job), max_waiting)
            workers.append(agent_worker)
        extra += agent_routes(agent, agent_worker)

    @asynccontextmanager
    async def lifespan(app):
        hooks = [
            m.register_forward_pre_hook(lambda module, args: worker.check()) for m in models
        ]  # cancel points
        for w in workers:
            w.start()
        yield
        for w in workers:
            w.stop()
        for hook in hooks:
            hook.remove()

    routes = [
        Route("/", lambda request: FileResponse(STATIC_DIR / "index.html", headers=PAGE_HEADERS)),
        Route("/api/config", lambda request: JSONResponse(config)),
        *grisp_routes(grisp, options, worker, time_limit),
        *extra,
        Mount("/static", StaticFiles(directory=STATIC_DIR)),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def example_questions(path: str | None, count: int = 6) -> list[str]:
    """A few questions of `path` (JSONL with "question"): the first of each shape ("info.shape") first."""
    if path is None or path.lower() == "none":
        return []
    records = read_jsonl(Path(path))
    first_of_shape = {}
    for r in records:
        first_of_shape.setdefault(str(r.get("info", {}).get("shape")), r["question"])
    return list(dict.fromkeys([*first_of_shape.values(), *(r["question"] for r in records)]))[:count]


def settings(args: argparse.Namespace) -> Config:
    """The agent's configuration (--config, else $GRASP_CONFIG, else the defaults) with the flags given;
    --endpoint and --index change the knowledge graph GRISP answers over (for the agent too)."""
    flag = vars(args).get  # a flag not given is absent (argparse.SUPPRESS): the config's value stays
    config = load_config(flag("config"))
    config.server = override(
        config.server,
        host=flag("host"),
        port=flag("port"),
        max_waiting=flag("max_waiting"),
        time_limit_s=flag("time_limit"),
        kg=flag("kg"),
        adapter=flag("adapter"),
        examples=flag("examples"),
        threads=flag("threads"),
        agent=False if flag("no_agent") else None,
    )
    # --precision is GRISP's; given (not its default) it holds for the agent's local model too
    precision = flag("precision") if flag("precision") != Options.precision else None
    config.model = override(
        config.model, model_dir=flag("model_dir"), device=flag("device"), precision=precision
    )
    check(config)  # server.kg names a configured knowledge graph
    name = config.server.kg or config.knowledge_graphs[0].name
    config.knowledge_graphs = [
        override(kg, endpoint=flag("endpoint"), index=flag("index")) if kg.name == name else kg
        for kg in config.knowledge_graphs
    ]
    config.server = replace(config.server, kg=name)
    check(config)
    if config.kg(name).index is None:
        raise ConfigError(
            f"knowledge graph {name} has no index; GRISP needs one (python build_index.py, then "
            f"its index in the config or --index)"
        )
    return config


def main(args: argparse.Namespace) -> int:
    # --- setup: the configuration, a free port (checked before the models load for seconds)
    try:
        config = settings(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    srv, kg = config.server, config.kg(config.server.kg)
    try:
        with socket.create_server((srv.host, srv.port)):
            pass
    except OSError as e:
        print(
            f"error: cannot listen on {srv.host}:{srv.port} ({e.strerror}); pick another --port",
            file=sys.stderr,
        )
        return 2
    if srv.threads:
        torch.set_num_threads(srv.threads)
    try:
        options = from_flags(args)
        if infinite := [
            f.name
            for f in fields(Options)
            if isinstance(getattr(options, f.name), float) and not math.isfinite(getattr(options, f.name))
        ]:
            raise GrispError(
                f"{', '.join(infinite)} must be finite here: the web page and the API speak JSON, "
                f"which has no infinity (a large number such as 1000 does the same)"
            )
        examples = example_questions(srv.examples)
        start = time.perf_counter()
        # always load the re-ranker: a request may turn re-ranking on even if the default is off
        grisp = Grisp(
            config.model.model_dir,
            srv.adapter,
            kg.index,
            kg.endpoint,
            replace(options, rerank=True),
            config.model.device,
        )
        agent = build_agent(config) if srv.agent else None
    except (GrispError, SparqlError, OSError, ConfigError, BackendError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    chat = agent.backend if agent is not None and isinstance(agent.backend, LocalBackend) else None
    info = {
        "model": config.model.model_dir,
        "adapter": srv.adapter,
        "index": kg.index,
        "endpoint": kg.endpoint,
        "kg": kg.name,
        "config": config.source,
    }
    print(
        f"loaded in {time.perf_counter() - start:.1f}s, precision {grisp.why_precision}: "
        + json.dumps(info | {"options": asdict(options)})
    )
    if agent is not None:
        print(
            f"agent: {agent_info(agent)['backend']} over {', '.join(agent.kgs)}"
            + ("; /v1/chat/completions serves it" if chat else "")
        )

    # --- serve
    if srv.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: serving on {srv.host}: anyone who can reach this machine can use the model",
            file=sys.stderr,
        )
    app = make_app(grisp, info, options, examples, srv.max_waiting, srv.time_limit_s, agent, chat)
    print(f"open http://{srv.host}:{srv.port}")
    uvicorn.run(app, host=srv.host, port=srv.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0


def add_network_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the server itself: where it listens, how many jobs wait, how long one may run."""
    S = argparse.SUPPRESS  # the default lives in the config (one definition); a flag not given stays unset
    parser.add_argument(
        "--host", default=S, help=f"address to listen on; 0.0.0.0 exposes it {unset_flag('server', 'host')}"
    )
    parser.add_argument(
        "--port", type=int, default=S, help=f"port to listen on {unset_flag('server', 'port')}"
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=S,
        help=f"jobs that may wait behind the running one, more get 503; 0: a job only when none runs "
        f"{unset_flag('server', 'max_waiting')}",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=S,
        help="seconds per GRISP question or chat completion from the start of its work, then 504; an "
        f"agent run has [agent] time_limit_s {unset_flag('server', 'time_limit_s')}",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="uvicorn's log level",
    )


def build_parser() -> argparse.ArgumentParser:
    """serve.py's command line: the config file, the server, the model and knowledge graph, the options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=defaults.HelpFormatter
    )
    S = argparse.SUPPRESS  # the default lives in the config (one definition); a flag not given stays unset
    parser.add_argument(
        "--config",
        default=None,
        help="TOML or JSON config shared with agent.py (grasp.toml); default $GRASP_CONFIG or built-in",
    )
    add_network_flags(parser)
    # model, index and knowledge graph
    parser.add_argument(
        "--kg",
        default=S,
        help="the configured knowledge graph GRISP answers over (config [server] kg, default: the first)",
    )
    parser.add_argument(
        "--model-dir",
        default=S,
        help=f"base model directory of GRISP and the agent {unset_flag('model', 'model_dir')}",
    )
    parser.add_argument(
        "--adapter",
        default=S,
        help=f"GRISP's LoRA adapter directory (PEFT layout), or 'none' {unset_flag('server', 'adapter')}",
    )
    parser.add_argument(
        "--index", default=S, help="search index directory of that knowledge graph (its index)"
    )
    parser.add_argument(
        "--endpoint", default=S, help="SPARQL endpoint URL of that knowledge graph (its endpoint)"
    )
    parser.add_argument(
        "--examples",
        default=S,
        help=f"JSONL with example questions for the page, or 'none' {unset_flag('server', 'examples')}",
    )
    parser.add_argument(
        "--no-agent",
        action="store_true",
        help="GRISP only: no agent mode and no /v1 (the agent's model is not loaded)",
    )
    # the default options of every request (a request may override each): one flag per options.Options field
    add_flags(parser)
    # runtime
    parser.add_argument(
        "--device",
        default=S,
        help=f"{DEVICES}; auto: cuda, then mps, then cpu {unset_flag('model', 'device')}",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=S,
        help=f"torch CPU threads, 0: torch's {unset_flag('server', 'threads')}",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
