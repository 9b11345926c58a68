"""An OpenAI-compatible chat-completions API over our own model: serve.py answers /v1/chat/completions
with local_backend.LocalBackend (Qwen2.5's tool-call format, constrained decoding; docs/agent.md sections 6, 8),
so any OpenAI client, and the GRASP agent's HTTP backend (grasp.backends.OpenAIBackend), can use it.

    POST /v1/chat/completions  {"messages": [...], "tools": [...], "tool_choice": "auto" | "required" | "none"
                                | {"type": "function", "function": {"name": ...}}, "temperature": t,
                                "stream": false | true, "stream_options": {"include_usage": bool}}
        -> {"id", "object": "chat.completion", "created", "model", "usage": {prompt_tokens, completion_tokens,
            total_tokens}, "choices": [{"index": 0, "finish_reason": "tool_calls" | "stop" | "length",
            "message": {"role": "assistant", "content", "tool_calls": [{"id", "type": "function",
            "function": {"name", "arguments": JSON text}}]}}]}
        -> with "stream": true, Server-Sent Events `data: {chat.completion.chunk}`: the first chunk's delta
           has the role, then content pieces, then the call (id, name, "" arguments) and its argument
           pieces, the last chunk an empty delta with finish_reason; with include_usage a chunk of usage
           and no choices; then `data: [DONE]`. The pieces join to the non-streamed reply exactly.
    GET  /v1/models            -> the one model served

Where it differs from OpenAI's API: at most one call per turn, decoded under the grammar of the offered
functions (tool_grammar.py), so it names a real function and its arguments fit the schema (string,
integer, boolean, null, object and enum; a schema with number or array gets 400, as it cannot be
constrained yet). With tools the model may write some text first; "auto" lets it end its turn without a
call, "required" forces one, a named function is the only one offered, "none" leaves the tools out of
the prompt. `model` must be the served model's id or left out; `n` must be 1 and `logprobs` false (400
otherwise); top_p, max_tokens, stop, seed ... are ignored (the server's token budgets hold). Errors have
OpenAI's shape {"error": {"message", "type", "code"}}: 400 bad request (a body is at most 256 KB), 404
an unknown model, 503 + Retry-After when the queue is full, 504 past the server's time limit (in a
stream that has begun, an error is its last event, `data: {"error": ...}`). The requests run one at a
time on serve.py's worker thread; a client that leaves, streaming or not, stops its turn at the next
forward pass.

    curl -s 127.0.0.1:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
"""

import asyncio
import json
import secrets
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from grasp.backends import BackendCancelled, BackendTimeout, Reply
from grasp.tool_grammar import call_grammar
from web.jobs import TERMINAL, Cancelled, Job, QueueFull, Worker
from web.shared import STATUS, TICK, BadRequest, busy, final_message, json_object, read_body

MAX_CHAT_BYTES = 256 * 1024  # a whole agent conversation with its tables; the KV cache grows with the prompt
ROLES = ("system", "user", "assistant", "tool", "developer")  # developer: OpenAI's newer name for system
EXAMPLE = '{"messages": [{"role": "user", "content": "Who directed Pulp Fiction?"}]}'


@dataclass
class ChatRequest:
    messages: list[dict]  # OpenAI's format, checked (content as text, call arguments as JSON object text)
    tools: list[dict]  # the functions the model may call (after tool_choice)
    tool_choice: str  # "auto" or "required"
    temperature: float | None  # None: the backend's own (greedy unless configured)
    model: str | None = None  # as asked (None or "": the one served)
    stream: bool = False  # answer as Server-Sent Events of chat.completion.chunk
    include_usage: bool = False  # (stream) a last chunk with the usage


# --- requests, checked at the boundary
def _text(content: object, where: str) -> str:
    """Message content as text: a string, null, or a list of {"type": "text", "text": ...} parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"{where}.content must be a string or a list of text parts; this model reads text only")


def _message(m: object, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise BadRequest(f"{where} must be an object with a role in {', '.join(ROLES)}")
    out = {
        "role": "system" if m["role"] == "developer" else m["role"],
        "content": _text(m.get("content"), where),
    }
    if m["role"] == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
    calls = m.get("tool_calls") if m["role"] == "assistant" else None
    if calls:
        if not isinstance(calls, list):
            raise BadRequest(f"{where}.tool_calls must be a list")
        out["tool_calls"] = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments", "{}") if isinstance(fn, dict) else None
            args = json.dumps(args) if isinstance(args, dict) else args
            try:
                ok = isinstance(fn.get("name"), str) and isinstance(json.loads(args or "{}"), dict)
            except (AttributeError, TypeError, ValueError):
                ok = False
            if not ok:
                raise BadRequest(
                    f'{where}.tool_calls[{j}] must be {{"type": "function", "function": '
                    f'{{"name": str, "arguments": a JSON object as text}}}}'
                )
            out["tool_calls"].append(
                {
                    "id": str(call.get("id") or f"call_{i}_{j}"),
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": args or "{}"},
                }
            )
    return out


def _tool(t: object, i: int) -> dict:
    if not isinstance(t, dict) or t.get("type") != "function":
        kind = t.get("type") if isinstance(t, dict) else t
        raise BadRequest(f'tools[{i}] has type {json.dumps(kind)}; only "function" tools are supported')
    fn = t.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadRequest(f"tools[{i}].function must be an object with a name")
    parameters = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise BadRequest(f"tools[{i}] ({fn['name']}): parameters must be a JSON schema of type object")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
        raise BadRequest(
            f"tools[{i}] ({fn['name']}): parameters.properties must map each name to a JSON schema object"
        )
    return {"type": "function", "function": {**fn, "parameters": parameters}}


def parse_chat(body: bytes) -> ChatRequest:
    """The request body -> ChatRequest, or BadRequest saying what is wrong."""
    data = json_object(body, EXAMPLE)
    stream, options = data.get("stream") or False, data.get("stream_options") or {}
    if (
        not isinstance(stream, bool)
        or not isinstance(options, dict)
        or not isinstance(options.get("include_usage", False), bool)
    ):
        raise BadRequest(
            'stream must be true or false, stream_options an object like {"include_usage": true}'
        )
    if data.get("n") not in (None, 1):  # null: the default, as OpenAI reads it
        raise BadRequest(f"n = {json.dumps(data['n'])}: this server gives one choice per request (n = 1)")
    if data.get("logprobs") or data.get("top_logprobs"):
        raise BadRequest("logprobs are not supported by this server; leave out logprobs and top_logprobs")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model must be a string (the id from /v1/models), not {json.dumps(model)}")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"messages must be a non-empty list, e.g. {EXAMPLE}")
    messages = [_message(m, i) for i, m in enumerate(messages)]
    tools = data.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest('tools must be a list of {"type": "function", "function": {...}}')
    tools = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise BadRequest(f"the tools' names must be unique: {', '.join(names)}")
    choice = data.get("tool_choice", "auto")
    if isinstance(choice, dict):  # one named function: the only one offered, and a call is forced
        name = choice.get("function", {}).get("name") if isinstance(choice.get("function"), dict) else None
        if choice.get("type") != "function" or name not in names:
            raise BadRequest(
                f"tool_choice {json.dumps(choice)} names no function among the tools ({', '.join(names)})"
            )
        tools, choice = [t for t in tools if t["function"]["name"] == name], "required"
    elif choice not in ("auto", "required", "none"):
        raise BadRequest(
            f'tool_choice must be auto, required, none or {{"type": "function", "function": '
            f'{{"name": ...}}}}, not {json.dumps(choice)}'
        )
    if choice == "none":
        tools, choice = [], "auto"
    if choice == "required" and not tools:
        raise BadRequest("tool_choice is required, but there are no tools")
    if tools:
        try:
            call_grammar(tools)  # every schema can be decoded under constraints
        except ValueError as e:
            raise BadRequest(str(e)) from None
        except (
            TypeError,
            AttributeError,
            KeyError,
            IndexError,
        ) as e:  # a schema of a shape the grammar cannot read
            raise BadRequest(
                f"a tool's parameters are not a JSON schema this server can follow ({type(e).__name__}: "
                f"{e}); use objects, strings, numbers, booleans, arrays and non-empty enums"
            ) from None
    temperature = data.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 2
    ):
        raise BadRequest(f"temperature must be a number in [0, 2], not {json.dumps(temperature)}")
    return ChatRequest(
        messages, tools, choice, temperature, model, stream, bool(options.get("include_usage"))
    )


# --- the work, in the worker thread
def model_name(backend) -> str:
    return backend.name.removeprefix("local:")


def completion(reply: Reply, model: str) -> dict:
    """A Reply as an OpenAI chat completion."""
    message = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else "")}
    if reply.tool_calls:
        message["tool_calls"] = [c.message() for c in reply.tool_calls]
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": reply.usage,
    }


def chunk(
    completion_id: str,
    created: int,
    model: str,
    delta: dict | None,
    finish: str | None = None,
    usage: dict | None = None,
) -> dict:
    """One chat.completion.chunk of a stream (delta None: the usage chunk, which has no choices)."""
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    )
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
        **({"usage": usage} if usage is not None or delta is None else {}),
    }


def delta(kind: str, text: str, call_id: str) -> dict:
    """LocalBackend's on_delta pieces as OpenAI's chunk deltas."""
    if kind == "content":
        return {"content": text}
    if kind == "call":
        call = {"index": 0, "id": call_id, "type": "function", "function": {"name": text, "arguments": ""}}
        return {"tool_calls": [call]}
    return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


def run_chat(backend, job: Job) -> dict:
    """One chat turn of the job's ChatRequest; the final message for the client (a stream's pieces go
    out before it, as {"type": "delta", "delta": ...} messages)."""
    chat: ChatRequest = job.request
    default = backend.temperature
    if chat.temperature is not None:
        backend.temperature = chat.temperature  # for this turn only (one chat at a time on the worker)
    call_id = backend.next_call_id

    def on_delta(kind: str, text: str) -> None:  # a stream's piece goes out as soon as it is decoded
        job.emit({"type": "delta", "delta": delta(kind, text, call_id)})

    try:
        stream = on_delta if chat.stream else None
        reply = backend.chat(chat.messages, chat.tools, job.deadline, chat.tool_choice, stream)
    except BackendCancelled:
        raise Cancelled(job.reason) from None  # the worker reports a client that left, or the time limit
    except BackendTimeout:
        return job.timeout_message()
    finally:
        backend.temperature = default
    return {"type": "answer", "completion": completion(reply, model_name(backend))}


# --- the routes
def error(message: str, status: int, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status, headers=headers
    )


def event_chunks(job: Job, model: str) -> StreamingResponse:
    """The job's turn as OpenAI's stream: `data: {chunk}` events and `data: [DONE]`; keep-alive comments
    while the model works; an error is the stream's last event. Closing the connection cancels the turn."""
    chat: ChatRequest = job.request
    completion_id, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
    usage_field = {"usage": None} if chat.include_usage else {}

    def event(data: dict) -> str:
        return f"data: {json.dumps(data | usage_field if data.get('choices') else data)}\n\n"

    async def events():
        try:
            yield event(chunk(completion_id, created, model, {"role": "assistant", "content": ""}))
            async for message in job.messages(TICK):
                if message is None:
                    yield ": keep-alive\n\n"
                elif message["type"] == "delta":
                    yield event(chunk(completion_id, created, model, message["delta"]))
                elif message["type"] == "answer":
                    done = message["completion"]
                    yield event(chunk(completion_id, created, model, {}, done["choices"][0]["finish_reason"]))
                    if chat.include_usage:
                        yield event(chunk(completion_id, created, model, None, usage=done["usage"]))
                    yield "data: [DONE]\n\n"
                elif message["type"] in TERMINAL:
                    kind = message.get("kind", message["type"])
                    yield event(
                        {"error": {"message": message["message"], "type": kind, "code": STATUS[kind]}}
                    )
        finally:  # the stream ended, or the client left: either way the turn is over
            job.cancel("client")

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def openai_routes(backend, worker: Worker, time_limit: float) -> list[Route]:
    """/v1/chat/completions and /v1/models over `backend` (a LocalBackend); its turns run on `worker`."""

    async def completions(request: Request) -> Response:
        try:
            chat = parse_chat(await read_body(request, MAX_CHAT_BYTES))
        except BadRequest as e:
            return error(str(e), 400, "invalid_request_error")
        if chat.model not in (None, "", model_name(backend)):
            return error(
                f"the model {chat.model!r} does not exist here; this server serves {model_name(backend)!r} "
                f"(GET /v1/models)",
                404,
                "model_not_found",
            )
        job = Job(chat, asyncio.get_running_loop(), time_limit)
        try:
            worker.submit(job)
        except QueueFull as e:
            return busy(e, {"error": {"message": str(e), "type": "server_busy", "code": 503}})
        if chat.stream:
            return event_chunks(job, model_name(backend))
        message = await final_message(request, job)
        if message is None:
            return Response(status_code=499)  # the client left; its turn was cancelled
        if message["type"] == "answer":
            return JSONResponse(message["completion"])
        kind = message.get("kind", message["type"])
        return error(message["message"], STATUS[kind], kind)

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model_name(backend), "object": "model", "created": 0, "owned_by": "grisp"}],
            }
        )

    return [Route("/v1/chat/completions", completions, methods=["POST"]), Route("/v1/models", models)]
