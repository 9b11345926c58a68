"""Chat models with function calling behind one protocol: any OpenAI-compatible HTTP API, or our own model.

The GRASP agent (agent.py, docs/agent.md) talks to a model only through `backend.chat(messages, tools,
deadline)`, messages and tools in the OpenAI chat-completions format, and gets back a `Reply`: the
model's text and its function calls, each checked against the function's JSON schema. Two backends:

- `OpenAIBackend`: POST {base_url}/chat/completions over plain HTTP (`requests`), for a hosted model or
  a vLLM / Ollama / llama.cpp server. A call naming an unknown function, with arguments that are not
  JSON or do not fit the schema comes back as a ToolCall with `error` set (the agent reports it to the
  model); an unreachable server, a timeout or an HTTP error raises BackendError with a clear message.
- `LocalBackend` (grasp/local_backend.py): our Qwen2.5 in-process, with Qwen2.5's tool-call format and
  constrained decoding, so every call names a real function with arguments that fit its schema.
  serve.py can answer /v1/chat/completions with it, so both backends are the same to a client.

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-7B-Instruct")   # key: OPENAI_API_KEY
    backend = make_backend(config.model)      # either, from the configuration (grasp/config.py)
    reply = backend.chat([{"role": "user", "content": "..."}], tools, deadline=time.monotonic() + 60)
    reply.content, [(c.name, c.arguments, c.error) for c in reply.tool_calls]
"""

import json
import re
import time
from dataclasses import dataclass, field

import requests

from grasp.tool_grammar import schema_errors


class BackendError(Exception):
    """The model could not be asked (server down, HTTP error, invalid answer); the message says why."""


class BackendTimeout(BackendError):
    """No answer before the deadline (the agent's time limit or the backend's own timeout)."""


class BackendCancelled(BackendError):
    """The turn was stopped on request while the model was generating (serve.py's Cancel, local model)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict  # parsed; {} when `error` is set
    raw: str = ""  # the arguments as the model wrote them (JSON text)
    error: str | None = None  # why the call is malformed (unknown function, invalid JSON, schema)

    @classmethod
    def made(cls, call_id: str, name: str, arguments: dict) -> "ToolCall":
        """A call we write ourselves (a forced call, a training conversation, a test), its raw text
        the arguments as JSON."""
        return cls(call_id, name, arguments, json.dumps(arguments, ensure_ascii=False))

    def message(self) -> dict:
        """The call as it goes back to the model in an assistant message (OpenAI format)."""
        raw = self.raw if _is_json(self.raw) else "{}"
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": raw}}


@dataclass
class Reply:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # e.g. a call closed early at the token budget
    finish_reason: str = ""  # OpenAI's: "tool_calls", "stop" (the model ended its turn) or "length" (budget)
    usage: dict = field(default_factory=dict)  # OpenAI's: prompt_tokens, completion_tokens, total_tokens


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except (TypeError, ValueError):
        return False


def check_call(call_id: str, name: str, raw: str | dict, tools: list[dict]) -> ToolCall:
    """A ToolCall for a received call, with `error` set if it does not fit any of `tools`."""
    raw = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if not isinstance(name, str) or name not in schemas:
        return ToolCall(
            call_id,
            str(name),
            {},
            raw,
            f"there is no function {name!r}; the functions are {', '.join(schemas)}",
        )
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        return ToolCall(call_id, name, {}, raw, f"the arguments are not valid JSON ({e}): {raw[:200]!r}")
    errors = schema_errors({"type": "object", **schemas[name]}, args)
    if errors:
        return ToolCall(call_id, name, {}, raw, "the arguments do not fit the function: " + "; ".join(errors))
    return ToolCall(call_id, name, args, raw)


_QWEN_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_qwen_calls(text: str, tools: list[dict], first_id: int = 0) -> tuple[str, list[ToolCall]]:
    """(text before the first call, calls) from Qwen's `<tool_call>{...}</tool_call>` blocks in text."""
    calls = []
    for n, match in enumerate(_QWEN_CALL.finditer(text)):
        try:
            body = json.loads(match.group(1))
            name, args = body["name"], body.get("arguments", {})
        except (ValueError, KeyError, TypeError) as e:
            calls.append(
                ToolCall(
                    f"call_{first_id + n}",
                    "?",
                    {},
                    match.group(1),
                    f'a <tool_call> block is not {{"name": ..., "arguments": ...}} JSON ({e})',
                )
            )
            continue
        calls.append(check_call(f"call_{first_id + n}", name, args, tools))
    return text.split("<tool_call>")[0].strip(), calls


# ---------------------------------------------------------------------------- any OpenAI-compatible API


class OpenAIBackend:
    """Chat completions with tools over plain HTTP; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        temperature: float | None = None,
        tool_choice: str = "auto",
        retries: int = 2,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the model server URL must start with http:// or https://, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.temperature = model, timeout_s, temperature
        self.tool_choice, self.retries = tool_choice, retries
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.name = f"openai:{model}@{base_url}"

    def chat(
        self,
        messages: list[dict],
        tools: list[dict],
        deadline: float | None = None,
        tool_choice: str | None = None,
    ) -> Reply:
        body = {"model": self.model, "messages": messages}
        if tools:
            body |= {"tools": tools, "tool_choice": tool_choice or self.tool_choice}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        start = time.monotonic()
        for attempt in range(self.retries + 1):
            timeout = self.timeout_s if deadline is None else min(self.timeout_s, deadline - time.monotonic())
            if timeout <= 0:
                raise BackendTimeout("no time left to ask the model (time limit reached)")
            try:
                response = self.session.post(self.url, json=body, timeout=(min(10.0, timeout), timeout))
            except requests.ReadTimeout:
                raise BackendTimeout(
                    f"the model server {self.url} did not answer within {timeout:.0f} s"
                ) from None
            except (
                requests.ConnectionError,
                requests.ConnectTimeout,
            ) as e:  # ConnectTimeout: unreachable, retried
                if attempt < self.retries:
                    time.sleep(0.5 * 2**attempt)
                    continue
                raise BackendError(
                    f"cannot reach the model server {self.url} ({type(e).__name__}); is it "
                    f"running, and is base_url right?"
                ) from None
            except requests.RequestException as e:  # e.g. the answer cut off mid-body
                raise BackendError(
                    f"a broken answer from the model server {self.url} ({type(e).__name__}: {e})"
                ) from None
            if (response.status_code >= 500 or response.status_code == 429) and attempt < self.retries:
                time.sleep(0.5 * 2**attempt)
                continue
            if response.status_code >= 400:
                raise BackendError(
                    f"HTTP {response.status_code} from {self.url}: {response.text[:300].strip()}"
                )
            return self._reply(response, tools, time.monotonic() - start)
        raise AssertionError(f"unreachable: {self.retries + 1} attempts without an answer")

    def _reply(self, response: requests.Response, tools: list[dict], seconds: float) -> Reply:
        try:
            body = response.json()
            choice = body["choices"][0]
            message = choice["message"]
            assert isinstance(message, dict), f"message is {type(message).__name__}"
        except (ValueError, KeyError, IndexError, TypeError, AssertionError) as e:
            raise BackendError(
                f"{self.url} answered, but not with a chat completion "
                f"({type(e).__name__}: {e}): {response.text[:300]!r}"
            ) from None
        content, calls = message.get("content") or "", []
        if isinstance(content, list):  # OpenAI's list of content parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        content = str(content)
        tool_calls = message.get("tool_calls") or []
        for n, call in enumerate(tool_calls if isinstance(tool_calls, list) else [tool_calls]):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                calls.append(
                    ToolCall(f"call_{n}", "?", {}, str(call)[:200], "a tool call without a function")
                )
                continue
            calls.append(
                check_call(call.get("id") or f"call_{n}", fn.get("name"), fn.get("arguments") or "", tools)
            )
        if not calls and "<tool_call>" in content:  # a server without a tool parser: Qwen's format in text
            content, calls = parse_qwen_calls(content, tools)
        usage = body.get("usage")
        return Reply(
            content.strip(),
            calls,
            seconds,
            finish_reason=str(choice.get("finish_reason") or ""),
            usage=usage if isinstance(usage, dict) else {},
        )
