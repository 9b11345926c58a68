"""The web page's agent mode: the GRASP agent (agent.py; docs/agent.md section 8) behind serve.py, each step sent to
the page as it happens, and a cancel that really stops the agent on the server.

    POST /api/agent/stream   {"question": str, "task": "sparql-qa" | "general-qa", "kgs": [names]}
        -> Server-Sent Events: queued, started, trace (each agent event with its seq: question, model (the
           turn's text and the names of its calls), call (arguments and result), malformed_call, loop,
           feedback, limit, cancelled, output ...), then answer (status, answer, sparql, kg, explanation,
           error, steps, calls, timings, and the final query's result with labels), or error / timeout.
           The response header X-Job-Id names the run for cancel.
    POST /api/agent/cancel   {"id": X-Job-Id} -> the agent stops between steps, or within a model turn (the
           local model, before its next forward pass); its stream then ends with the agent's own
           cancelled and output events and the answer. Closing the stream cancels the run too.

With the local backend the agent's runs take their turn on serve.py's one worker with GRISP's questions
and the chat completions (one model at a time on the CPU); with a remote backend they get a worker of
their own (the model works elsewhere), so a long run does not hold up GRISP.
"""

import asyncio
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent import Agent, AgentResult
from grasp.config import TASKS
from grasp.functions import FunctionError
from grisp.sparql import SparqlError
from web.jobs import Job, QueueFull, Worker
from web.shared import (
    BadRequest,
    busy,
    event_stream,
    json_object,
    plain,
    question_text,
    read_body,
    result_labels,
)

EXAMPLE = '{"question": "Who directed Pulp Fiction?", "task": "sparql-qa"}'
FINAL_QUERY_S = 30.0  # beyond the agent's own time limit: running the final query once more for the page


@dataclass
class AgentQuestion:
    question: str
    task: str
    kgs: list[str] | None  # None: all configured knowledge graphs


def parse_agent_question(body: bytes, agent: Agent) -> AgentQuestion:
    """The request body -> AgentQuestion, or BadRequest saying what is wrong."""
    data = json_object(body, EXAMPLE)
    unknown = sorted(set(data) - {"question", "task", "kgs"})
    if unknown:
        raise BadRequest(f"unknown field {', '.join(unknown)}; the fields are question, task and kgs")
    question, task, kgs = question_text(data.get("question")), data.get("task", agent.o.task), data.get("kgs")
    if task not in TASKS:
        raise BadRequest(f"task must be one of {', '.join(TASKS)}, not {task!r}")
    if kgs is not None and (
        not isinstance(kgs, list)
        or not kgs
        or len(set(map(repr, kgs))) < len(kgs)
        or any(not isinstance(k, str) or k not in agent.kgs for k in kgs)
    ):
        raise BadRequest(
            f"kgs must be a non-empty list of distinct configured knowledge graphs ({', '.join(agent.kgs)}), "
            f"not {kgs!r}"
        )
    return AgentQuestion(question, task, kgs)


def answer_json(agent: Agent, r: AgentResult) -> dict:
    """The page's view of a result: the output, counts and timings, and the final query run once more (a
    sparql.Result as SPARQL JSON, with the labels the index knows)."""
    data = {
        key: getattr(r, key)
        for key in (
            "question",
            "task",
            "status",
            "failure",
            "answer",
            "sparql",
            "kg",
            "explanation",
            "error",
            "steps",
            "feedbacks",
            "timings",
        )
    }
    data |= {"calls": dict(r.calls), "result": None, "labels": {}}
    kg = agent.kgs.get(r.kg)
    if r.task == "sparql-qa" and r.sparql and kg is not None and r.status != "cancelled":
        try:
            result = kg.query(r.sparql, None, agent.o.sparql_timeout_s)
            data |= {"result": result.to_json(), "labels": result_labels(kg.indices, result)}
        except (SparqlError, FunctionError) as e:
            data["result_error"] = str(e)
    return plain(data)


def run_agent(agent: Agent, job: Job) -> dict:
    """Run the job's question in the worker thread, each trace event sent as it happens; the answer."""
    q: AgentQuestion = job.request
    seq = 0

    def listener(event: dict) -> None:
        nonlocal seq
        seq += 1
        job.emit({"type": "trace", "seq": seq, "event": plain(event)})

    r = agent.run(q.question, task=q.task, kgs=q.kgs, on_event=listener, cancel=job.cancelled)
    return {"type": "answer", "answer": answer_json(agent, r)}


def agent_info(agent: Agent) -> dict:
    """What the page shows and offers in agent mode (/api/config's "agent")."""
    o = agent.o
    return {
        "backend": getattr(agent.backend, "name", type(agent.backend).__name__),
        "precision": getattr(agent.backend, "precision", None),
        "task": o.task,
        "tasks": list(TASKS),
        "kgs": [{"name": k.name, "description": k.description} for k in agent.kgs.values()],
        "max_steps": o.max_steps,
        "time_limit_s": o.time_limit_s,
        "know_before_use": o.know_before_use,
        "feedback": o.feedback,
    }


def agent_routes(agent: Agent, worker: Worker) -> list[Route]:
    """/api/agent/stream and /api/agent/cancel; the runs go to `worker` (its runner must call run_agent)."""
    running: dict[str, Job] = {}  # id -> the job, from its submission until its stream ends

    async def stream(request: Request) -> Response:
        try:
            question = parse_agent_question(await read_body(request), agent)
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, 400)
        job = Job(question, asyncio.get_running_loop(), agent.o.time_limit_s + FINAL_QUERY_S)
        try:
            worker.submit(job)
        except QueueFull as e:
            return busy(e, {"error": str(e)})
        running[job.id] = job
        return event_stream(job, on_close=lambda: running.pop(job.id, None))

    async def cancel(request: Request) -> Response:
        try:
            job_id = json_object(await read_body(request), '{"id": "<the X-Job-Id of the stream>"}').get("id")
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, 400)
        job = running.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            return JSONResponse(
                {"error": f"no agent run is going on with id {job_id!r} (it may have ended)"}, 404
            )
        job.cancel("cancel")  # the agent sees it between steps, the local model before its next forward
        if job.deadline is None:  # still waiting: the worker skips it, so its stream ends here
            job.emit({"type": "error", "kind": "cancelled", "message": "cancelled before it started"})
        return JSONResponse({"cancelled": job.id})

    return [
        Route("/api/agent/stream", stream, methods=["POST"]),
        Route("/api/agent/cancel", cancel, methods=["POST"]),
    ]
