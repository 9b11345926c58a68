"""Chat models with function calling behind one protocol: any OpenAI-compatible HTTP API, or our own model.

The GRASP agent (agent.py, docs/agent.md) talks to a model only through `backend.chat(messages, tools,
deadline)`, messages and tools in the OpenAI chat-completions format, and gets back a `Reply`: the
model's text and its function calls, each checked against the function's JSON schema. Two backends:

- `OpenAIBackend`: POST {base_url}/chat/completions over plain HTTP (`requests`), for a hosted model or
  a vLLM / Ollama / llama.cpp server. A call naming an unknown function, with arguments that are not
  JSON or do not fit the schema comes back as a ToolCall with `error` set (the agent reports it to the
  model); an unreachable server, a timeout or an HTTP error raises BackendError with a clear message.
- `LocalBackend`: our Qwen2.5 (model.py) in-process, with Qwen2.5's tool-call format (`qwen_tool_prompt`:
  the function signatures in `<tools>` in the system turn, calls as `<tool_call>{"name": ..., "arguments":
  ...}</tool_call>` in the answer) and constrained decoding (tool_grammar.py): the model may write some
  text first, then every call names a real function with arguments that fit its schema. serve.py can
  answer /v1/chat/completions with it, so both backends are the same to a client.

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-7B-Instruct")   # key: OPENAI_API_KEY
    backend = LocalBackend(defaults.MODEL_DIR)
    reply = backend.chat([{"role": "user", "content": "..."}], tools, deadline=time.monotonic() + 60)
    reply.content, [(c.name, c.arguments, c.error) for c in reply.tool_calls]
"""
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tool_grammar import call_grammar, schema_errors


class BackendError(Exception):
    """The model could not be asked (server down, HTTP error, invalid answer); the message says why."""


class BackendTimeout(BackendError):
    """No answer before the deadline (the agent's time limit or the backend's own timeout)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict  # parsed; {} when `error` is set
    raw: str = ""  # the arguments as the model wrote them (JSON text)
    error: str | None = None  # why the call is malformed (unknown function, invalid JSON, schema)

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
    if name not in schemas:
        return ToolCall(call_id, str(name), {}, raw, f"there is no function {name!r}; the functions are "
                                                     f"{', '.join(schemas)}")
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        return ToolCall(call_id, name, {}, raw, f"the arguments are not valid JSON ({e}): {raw[:200]!r}")
    errors = schema_errors({"type": "object", **schemas[name]}, args)
    if errors:
        return ToolCall(call_id, name, {}, raw, "the arguments do not fit the function: " + "; ".join(errors))
    return ToolCall(call_id, name, args, raw)


_CALL_OPENING = re.compile(r'<tool_call>|\{\s*"name"')  # where the free text of a local turn ends
_QWEN_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_qwen_calls(text: str, tools: list[dict], first_id: int = 0) -> tuple[str, list[ToolCall]]:
    """(text before the first call, calls) from Qwen's `<tool_call>{...}</tool_call>` blocks in text."""
    calls = []
    for n, match in enumerate(_QWEN_CALL.finditer(text)):
        try:
            body = json.loads(match.group(1))
            name, args = body["name"], body.get("arguments", {})
        except (ValueError, KeyError, TypeError) as e:
            calls.append(ToolCall(f"call_{first_id + n}", "?", {}, match.group(1),
                                  f"a <tool_call> block is not {{\"name\": ..., \"arguments\": ...}} JSON ({e})"))
            continue
        calls.append(check_call(f"call_{first_id + n}", name, args, tools))
    return text.split("<tool_call>")[0].strip(), calls


# ---------------------------------------------------------------------------- any OpenAI-compatible API

class OpenAIBackend:
    """Chat completions with tools over plain HTTP; see the module docstring."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 120.0,
                 temperature: float | None = None, tool_choice: str = "auto", retries: int = 2):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the model server URL must start with http:// or https://, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.temperature = model, timeout_s, temperature
        self.tool_choice, self.retries = tool_choice, retries
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.name = f"openai:{model}@{base_url}"

    def chat(self, messages: list[dict], tools: list[dict], deadline: float | None = None,
             tool_choice: str | None = None) -> Reply:
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
            except requests.Timeout:
                raise BackendTimeout(f"the model server {self.url} did not answer within {timeout:.0f} s") from None
            except requests.ConnectionError as e:
                if attempt < self.retries:
                    time.sleep(0.5 * 2 ** attempt)
                    continue
                raise BackendError(f"cannot reach the model server {self.url} ({type(e).__name__}); is it "
                                   f"running, and is base_url right?") from None
            if (response.status_code >= 500 or response.status_code == 429) and attempt < self.retries:
                time.sleep(0.5 * 2 ** attempt)
                continue
            if response.status_code >= 400:
                raise BackendError(f"HTTP {response.status_code} from {self.url}: {response.text[:300].strip()}")
            return self._reply(response, tools, time.monotonic() - start)
        raise AssertionError(f"unreachable: {self.retries + 1} attempts without an answer")

    def _reply(self, response: requests.Response, tools: list[dict], seconds: float) -> Reply:
        try:
            message = response.json()["choices"][0]["message"]
            assert isinstance(message, dict), f"message is {type(message).__name__}"
        except (ValueError, KeyError, IndexError, TypeError, AssertionError) as e:
            raise BackendError(f"{self.url} answered, but not with a chat completion "
                               f"({type(e).__name__}: {e}): {response.text[:300]!r}") from None
        content, calls = message.get("content") or "", []
        for n, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                calls.append(ToolCall(f"call_{n}", "?", {}, str(call)[:200], "a tool call without a function"))
                continue
            calls.append(check_call(call.get("id") or f"call_{n}", fn.get("name"), fn.get("arguments") or "", tools))
        if not calls and "<tool_call>" in content:  # a server without a tool parser: Qwen's format in text
            content, calls = parse_qwen_calls(content, tools)
        return Reply(content.strip(), calls, seconds)


# ---------------------------------------------------------------------------- our model, in-process

def qwen_tool_prompt(messages: list[dict], tools: list[dict], add_generation_prompt: bool = True) -> str:
    """Qwen2.5's chat template with tools, written by hand (tests compare it with transformers'
    rendering of the template shipped with the model): the tool signatures go into the system turn,
    an assistant's calls become `<tool_call>` blocks, tool results `<tool_response>` blocks of a user turn."""
    from tokenizer import DEFAULT_SYSTEM, chat_prompt

    if not tools:
        plain = [{"role": m["role"] if m["role"] != "tool" else "user", "content": m.get("content") or ""}
                 for m in messages]
        return chat_prompt(plain, add_generation_prompt)
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else DEFAULT_SYSTEM
    signatures = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    out = [f"<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more functions to assist with the "
           f"user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
           f"{signatures}\n</tools>\n\nFor each function call, return a json object with function name and "
           f"arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, "
           f"\"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n"]
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content") or ""
        if role == "system" and i == 0:
            continue
        if role == "tool":
            opens = i == 0 or messages[i - 1]["role"] != "tool"
            closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            out.append(("<|im_start|>user" if opens else "") + f"\n<tool_response>\n{content}\n</tool_response>"
                       + ("<|im_end|>\n" if closes else ""))
        elif role == "assistant" and m.get("tool_calls"):
            calls = "".join('\n<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": '
                            + json.dumps(json.loads(c["function"]["arguments"] or "{}"), ensure_ascii=False)
                            + "}\n</tool_call>" for c in m["tool_calls"])
            out.append("<|im_start|>assistant" + (f"\n{content}" if content else "") + calls + "<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    return "".join(out) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class LocalBackend:
    """Our Qwen2.5 with constrained tool calls, one call per turn; greedy, or sampled at `temperature`.

    A turn: free text (the model's reasoning) for at most `max_reasoning_tokens`, until the model starts
    a `<tool_call>` (or writes `{"name"` without it, as small models do) or ends its turn; then, with
    tool_choice "required" (the default: a small model that stops calling functions has stopped
    working), a call is forced and decoded under the grammar of tool_grammar.call_grammar, at most
    `max_call_tokens` (then closed by the grammar's shortest completion). The KV cache of the
    conversation so far is kept between turns (prompts only grow). Not thread-safe: one chat at a time."""

    def __init__(self, model_dir: str | Path, adapter: str | Path | None = None, device: str = "auto",
                 max_reasoning_tokens: int = 128, max_call_tokens: int = 768, max_string: int = 1500,
                 tool_choice: str = "required", temperature: float | None = None, seed: int = 0,
                 model=None, tokenizer=None):
        import torch  # (the model stack only when this backend is used)
        from cpu_speed import prepare_for_inference
        from model import Transformer, pick_device
        from tokenizer import Tokenizer
        model_dir = Path(model_dir).expanduser()
        if model is None:
            if not (model_dir / "config.json").exists():
                raise BackendError(f"no model at {model_dir} (config.json missing); run `python get_model.py`")
            dev = pick_device(device)
            model = Transformer.from_pretrained(model_dir, torch.float32 if dev.type == "cpu" else torch.bfloat16, dev)
            if adapter:
                import peft_format
                peft_format.load_merged(model, adapter)
            prepare_for_inference(model)
        self.model, self.tokenizer = model, tokenizer or Tokenizer(model_dir)
        self.max_reasoning_tokens, self.max_call_tokens = max_reasoning_tokens, max_call_tokens
        self.max_string, self.tool_choice, self.temperature = max_string, tool_choice, temperature
        self._generator = torch.Generator().manual_seed(seed)  # sampling (temperature > 0) only
        self.name = f"local:{model_dir.name}" + (f"+{Path(adapter).name}" if adapter else "")
        self._cache, self._ids, self._calls = None, [], 0  # the KV cache, the token ids it holds, calls made
        self._texts: dict[int, str] = {}  # token id -> its text (complete characters only, else "")
        self._special = set(self.tokenizer.tokenizer.get_added_tokens_decoder())  # never inside a call
        self._char_ids = {c: self.tokenizer.encode(c) for c in map(chr, range(32, 127))}
        self._char_ids["\n"] = self.tokenizer.encode("\n")

    def chat(self, messages: list[dict], tools: list[dict], deadline: float | None = None,
             tool_choice: str | None = None) -> Reply:
        import torch
        with torch.inference_mode():
            return self._chat(messages, tools, deadline, tool_choice or self.tool_choice)

    def _chat(self, messages, tools, deadline, tool_choice) -> Reply:
        start, eos = time.monotonic(), set(self.tokenizer.eos_ids)
        logits = self._prefill(self.tokenizer.encode(qwen_tool_prompt(messages, tools)), deadline)
        # --- free text until the model opens a call or ends its turn
        text, boundaries, stop = "", [len(self._ids)], "budget"  # cache length after each generated token
        for _ in range(self.max_reasoning_tokens if tools else self.max_reasoning_tokens + self.max_call_tokens):
            token = self._sample(logits, None)
            if token in eos:
                stop = "end"
                break
            piece = self.tokenizer.decode([token], skip_special_tokens=False)
            opening = _CALL_OPENING.search(text + piece)  # `<tool_call>`, or a call written without it
            if opening:
                stop, cut = "call", opening.start()
                while len(boundaries) > 1 and len(text) > cut:  # drop a call opening split over tokens
                    boundaries.pop()
                    text = self.tokenizer.decode(self._ids[boundaries[0]:boundaries[-1]], skip_special_tokens=False)
                self._truncate(boundaries[-1])
                break
            text += piece
            logits = self._feed([token], deadline)
            boundaries.append(len(self._ids))
        content = self.tokenizer.decode(self._ids[boundaries[0]:boundaries[-1]], skip_special_tokens=False).strip()
        if not tools or (tool_choice == "auto" and stop == "end"):
            return Reply(content, [], time.monotonic() - start)
        # --- one call, decoded under the grammar of the functions
        notes, state = [], call_grammar(tools, self.max_string)
        call = state.forced()
        state = state.consume(call)
        logits = self._feed(self.tokenizer.encode(("\n" if content else "") + "<tool_call>\n" + call), deadline)
        for _ in range(self.max_call_tokens):
            if state.exact:
                break
            token, piece = self._choose(logits, state)
            state = state.consume(piece)
            forced = "" if state.exact else state.forced()
            state = state.consume(forced)
            call += piece + forced
            logits = self._feed([token, *(self.tokenizer.encode(forced) if forced else [])], deadline)
        if not state.exact:
            notes.append(f"the call reached {self.max_call_tokens} tokens and was closed by the grammar")
        call += state.shortest()
        body = json.loads(call)  # valid by construction
        self._calls += 1
        tool_call = check_call(f"call_{self._calls}", body["name"], body["arguments"], tools)
        return Reply(content, [tool_call], time.monotonic() - start, notes)

    def _choose(self, logits, state) -> tuple[int, str]:
        """The most likely token whose text keeps the call inside the grammar (the top 64 are tried,
        then the best single character the grammar allows: there always is one)."""
        fits = {}
        for token in logits.topk(min(64, logits.shape[-1])).indices.tolist():
            piece = self._text(token)
            if piece and state.consume(piece) is not None:
                fits[token] = piece
                if not self.temperature:
                    break
        if fits:
            token = self._sample(logits, list(fits))
            return token, fits[token]
        allowed = [(float(logits[ids[0]]), c, ids[0]) for c, ids in self._char_ids.items()
                   if len(ids) == 1 and state.step(c) is not None]
        assert allowed, f"the grammar allows no ASCII character after {state.shortest()!r}"
        _, char, token = max(allowed)
        return token, char

    def _sample(self, logits, among: list[int] | None) -> int:
        """The most likely token (of `among`, else of all), or one drawn from softmax(logits / temperature)."""
        import torch
        ids = torch.tensor(among) if among is not None else torch.arange(logits.shape[-1])
        if not self.temperature:
            return int(ids[int(logits[ids].argmax())])
        probs = torch.softmax(logits[ids] / self.temperature, dim=-1)
        return int(ids[int(torch.multinomial(probs, 1, generator=self._generator))])

    def _text(self, token: int) -> str:
        if token not in self._texts:
            piece = "" if token in self._special else self.tokenizer.decode([token], skip_special_tokens=False)
            self._texts[token] = "" if "\ufffd" in piece else piece  # part of a multi-byte character
        return self._texts[token]

    def _prefill(self, ids: list[int], deadline):
        """Logits after `ids`, reusing the cached start that this prompt shares with the last one."""
        same = 0
        for a, b in zip(self._ids, ids):
            if a != b:
                break
            same += 1
        self._truncate(min(same, len(ids) - 1))  # at least one token is run, for its logits
        logits = None
        rest = ids[len(self._ids):]
        for i in range(0, len(rest), 512):  # chunks bound the attention's memory
            logits = self._feed(rest[i:i + 512], deadline)
        return logits

    def _feed(self, ids: list[int], deadline):
        import torch
        if deadline is not None and time.monotonic() > deadline:
            raise BackendTimeout("the time limit was reached while the local model was generating")
        if self._cache is None:
            self._cache = self.model.new_cache(1, 4096)
        tokens = torch.tensor([ids], device=self.model.model.norm.weight.device)
        logits = self.model(tokens, cache=self._cache, logits_at=-1)[0].float()  # [V]
        self._ids += ids
        return logits

    def _truncate(self, length: int) -> None:
        if self._cache is not None:
            self._cache.truncate(length)
        self._ids = self._ids[:length]


def make_backend(model_config) -> "OpenAIBackend | LocalBackend":
    """The backend a config.ModelConfig describes (the API key comes from the environment)."""
    m = model_config
    if m.backend == "openai":
        return OpenAIBackend(m.base_url, m.model, os.environ.get(m.api_key_env) if m.api_key_env else None,
                             m.timeout_s, m.temperature, m.tool_choice)
    if m.backend == "local":
        return LocalBackend(m.model_dir, m.adapter, m.device, m.max_reasoning_tokens, m.max_call_tokens,
                            temperature=m.temperature)
    raise ValueError(f"unknown backend {m.backend!r}; use 'local' or 'openai'")
