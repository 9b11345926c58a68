"""Our own model as a chat backend with function calling: Qwen2.5 (model.py) in-process, its tool-call
format, and constrained decoding of the calls (docs/agent.md section 6).

- `LocalBackend`: the same `chat(messages, tools, deadline)` protocol as grasp.backends.OpenAIBackend;
  the model may write some text first, then its call is decoded under the grammar of tool_grammar.py,
  so it always parses and names a real function with arguments that fit the function's schema.
- Streaming: `chat(..., on_delta=f)` calls f("content", text), f("call", name) and f("arguments", text)
  as the turn is decoded; the pieces join to the Reply's content and its call's arguments exactly (text
  that a call opening or the final strip may still remove is held back until it is settled).

    backend = LocalBackend(defaults.MODEL_DIR)
    reply = backend.chat([{"role": "user", "content": "Who directed Pulp Fiction?"}], tools)
    reply.content, reply.tool_calls[0].name, reply.tool_calls[0].arguments
"""

import json
import re
import time
from pathlib import Path
from typing import Callable

import torch

from grasp.backends import BackendCancelled, BackendError, BackendTimeout, Reply, check_call
from grasp.tool_grammar import call_grammar
from grisp.peft_format import load_for_inference
from llm.cpu_speed import pick_precision
from llm.prompt_cache import PromptCache
from llm.tokenizer import Tokenizer, qwen_tool_prompt
from model import pick_device

_CALL_OPENING = re.compile(r'<tool_call>|\{\s*"name"')  # where the free text of a local turn ends
_CALL_NAME = re.compile(
    r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*'
)  # a call's start, up to its arguments


def turn_content(text: str, call_follows: bool) -> str:
    """A turn's content from its free text: stripped, and without the code fence a call opened in (```json)."""
    content = text.strip()
    if call_follows and content.count("```") % 2:
        content = content[: content.rfind("```")].strip()
    return content


def settled_content(text: str) -> str:
    """The start of turn_content that no continuation of the free text `text` can change: it stops before
    trailing whitespace and backticks, an unclosed code fence, a possible start of a call opening (`<tool`,
    `{ "na`) and an incomplete character. (A complete opening ends the free text before it is in `text`.)"""
    text = text.lstrip().partition("\ufffd")[0]  # from a multi-byte character still incomplete on, unknown
    cut = len(text.rstrip().rstrip("`").rstrip())
    for i, char in enumerate(text[:cut]):
        if (char == "<" and "<tool_call>".startswith(text[i:])) or (
            char == "{" and '"name"'.startswith(text[i + 1 :].lstrip())
        ):
            cut = i
            break
    if text[:cut].count("```") % 2:
        cut = text.rfind("```", 0, cut)
    return text[:cut].rstrip()


def call_arguments(call: str) -> str | None:
    """The arguments object's text in a call's text so far (`{"name": "f", "arguments": {...`), up to its
    closing brace once it has one; None before the arguments begin."""
    match = _CALL_NAME.match(call)
    if match is None:
        return None
    depth, in_string, escaped = 0, False, False
    for i in range(match.end(), len(call)):
        char = call[i]
        if in_string:
            in_string, escaped = (char != '"' or escaped), (char == "\\" and not escaped)
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return call[match.end() : i + 1]
    return call[match.end() :]


class LocalBackend:
    """Our Qwen2.5 with constrained tool calls, one call per turn; greedy, or sampled at `temperature`.

    A turn: free text (the model's reasoning) for at most `max_reasoning_tokens`, until the model starts
    a `<tool_call>` (or writes `{"name"` without it, as small models do) or ends its turn; then, with
    tool_choice "required" (the default: a small model that stops calling functions has stopped
    working), a call is forced and decoded under the grammar of tool_grammar.call_grammar, at most
    `max_call_tokens` (then closed by the grammar's shortest completion). The KV cache of the
    conversation so far is kept between turns (prompts only grow). Not thread-safe: one chat at a time
    (serve.py runs every chat on its one worker thread). `should_stop`, if set, is asked before every
    forward pass; True ends the turn with BackendCancelled (serve.py: the running job was cancelled)."""

    def __init__(
        self,
        model_dir: str | Path,
        adapter: str | Path | None = None,
        device: str = "auto",
        precision: str = "auto",
        max_reasoning_tokens: int = 128,
        max_call_tokens: int = 768,
        max_string: int = 1500,
        tool_choice: str = "required",
        temperature: float | None = None,
        seed: int = 0,
        model=None,
        tokenizer=None,
        should_stop: Callable[[], bool] | None = None,
    ):
        model_dir = Path(model_dir).expanduser()
        if model is None:
            if not (model_dir / "config.json").exists():
                raise BackendError(
                    f"no model at {model_dir} (config.json missing); run `python get_model.py`"
                )
            try:
                dev = pick_device(device)
            except ValueError as e:
                raise BackendError(f"model.device: {e}") from None
            try:
                self.precision, self.why_precision = pick_precision(
                    precision, dev
                )  # "auto": bf16 if the CPU has it
            except ValueError as e:
                raise BackendError(f"model.precision: {e}") from None
            try:
                model = load_for_inference(model_dir, adapter or None, self.precision, dev)
            except (OSError, ValueError, KeyError) as e:
                if not adapter:
                    raise BackendError(f"cannot load the model {model_dir}: {e}") from e
                raise BackendError(
                    f"cannot load the model {model_dir} with the adapter {adapter}: {e} "
                    f'(adapter = "none" in [model], or --adapter none, runs the base model)'
                ) from e
        else:
            self.precision, self.why_precision = "as given", "a model object passed in"
        self.model, self.tokenizer = model, tokenizer or Tokenizer(model_dir)
        self.max_reasoning_tokens, self.max_call_tokens = max_reasoning_tokens, max_call_tokens
        self.max_string, self.tool_choice, self.temperature = max_string, tool_choice, temperature
        self.should_stop = should_stop
        self._generator = torch.Generator().manual_seed(seed)  # sampling (temperature > 0) only
        self.name = f"local:{model_dir.name}" + (f"+{Path(adapter).name}" if adapter else "")
        self._prompts, self._calls = (
            PromptCache(self.model, room=4096),
            0,
        )  # the conversation's KV cache, calls made
        self._texts: dict[int, str] = {}  # token id -> its text (complete characters only, else "")
        # control tokens (end of turn included): never inside a call, and they end a turn's free text
        self._special = set(self.tokenizer.tokenizer.get_added_tokens_decoder()) | set(self.tokenizer.eos_ids)
        self._char_ids = {c: self.tokenizer.encode(c) for c in map(chr, range(32, 127))}
        self._char_ids["\n"] = self.tokenizer.encode("\n")

    def chat(
        self,
        messages: list[dict],
        tools: list[dict],
        deadline: float | None = None,
        tool_choice: str | None = None,
        on_delta: Callable[[str, str], None] | None = None,
    ) -> Reply:
        """One turn. `on_delta(kind, text)`, if given, receives the turn as it is decoded: "content" pieces,
        then for a call "call" with the function's name and "arguments" pieces."""
        with torch.inference_mode():
            return self._chat(messages, tools, deadline, tool_choice or self.tool_choice, Stream(on_delta))

    def _chat(self, messages, tools, deadline, tool_choice, stream: "Stream") -> Reply:
        start = time.monotonic()
        prompt = self.tokenizer.encode(qwen_tool_prompt(messages, tools))
        logits = self._prefill(prompt, deadline)
        # --- free text until the model opens a call or ends its turn
        text, boundaries, stop = "", [len(self._ids)], "budget"  # cache length after each generated token
        for _ in range(
            self.max_reasoning_tokens if tools else self.max_reasoning_tokens + self.max_call_tokens
        ):
            token = self._sample(logits, None)
            piece = self.tokenizer.decode([token], skip_special_tokens=False)
            opening = _CALL_OPENING.search(text + piece)  # `<tool_call>`, or a call written without it
            if opening:
                stop, cut = "call", opening.start()
                while len(boundaries) > 1 and len(text) > cut:  # drop a call opening split over tokens
                    boundaries.pop()
                    text = self.tokenizer.decode(
                        self._ids[boundaries[0] : boundaries[-1]], skip_special_tokens=False
                    )
                self._truncate(boundaries[-1])
                break
            if token in self._special:  # `<|im_end|>`, or another control token (`<|im_start|>` ...)
                stop = "end"
                break
            text += piece
            logits = self._feed([token], deadline)
            boundaries.append(len(self._ids))
            if stream:
                stream.content(
                    settled_content(
                        self.tokenizer.decode(self._ids[boundaries[0] :], skip_special_tokens=False)
                    )
                )
        content = turn_content(
            self.tokenizer.decode(self._ids[boundaries[0] : boundaries[-1]], skip_special_tokens=False),
            call_follows=stop == "call",
        )
        stream.content(content)
        if not tools or (tool_choice == "auto" and stop == "end"):
            return Reply(
                content,
                [],
                time.monotonic() - start,
                finish_reason="length" if stop == "budget" else "stop",
                usage=self._usage(len(prompt)),
            )
        # --- one call, decoded under the grammar of the functions
        # the call ends with the newline before `</tool_call>`, as in the chat template: the model's own
        # last token of a call is often `"}}\n` (one token), which a grammar ending at `}}` would refuse
        notes, state = [], call_grammar(tools, self.max_string, end="\n")
        call = self._feedable("", state.forced())  # the call's text so far, all of it fed to the model
        state = state.consume(call)
        logits = self._feed(
            self.tokenizer.encode(("\n" if content else "") + "<tool_call>\n" + call), deadline
        )
        for _ in range(self.max_call_tokens):
            if state.exact:
                break
            token, piece = self._choose(logits, state)
            state = state.consume(piece)
            forced = "" if state.exact else self._feedable(call + piece, state.forced())
            state = state.consume(forced)
            call += piece + forced
            stream.call(call)
            logits = self._feed([token, *(self.tokenizer.encode(forced) if forced else [])], deadline)
        if not state.exact:
            notes.append(f"the call reached {self.max_call_tokens} tokens and was closed by the grammar")
        call += state.shortest()
        stream.call(call)
        body = json.loads(call)  # valid by construction
        # the arguments as the model wrote them (OpenAI's `arguments` is the model's text): what was streamed
        tool_call = check_call(self.next_call_id, body["name"], call_arguments(call), tools)
        self._calls += 1
        return Reply(
            content, [tool_call], time.monotonic() - start, notes, "tool_calls", self._usage(len(prompt))
        )

    @property
    def next_call_id(self) -> str:
        """The id the next call will get (a stream names the call before it is decoded)."""
        return f"call_{self._calls + 1}"

    def _feedable(self, call: str, forced: str) -> str:
        """The part of the grammar's `forced` text to feed after `call`: all but its last pre-token. The
        model writes that word itself, cut as its tokenizer cuts it: after `search` the grammar forces
        `_` (search_entity or search_property), and fed alone `_` is a token the model never saw there;
        left to the model, its next token is `_property` or `_entity`, which the grammar still checks."""
        return forced[: max(0, self.tokenizer.last_word_start(call + forced) - len(call))]

    def _usage(self, prompt_tokens: int) -> dict:
        """OpenAI's usage of the turn just decoded: its prompt, and the tokens generated after it."""
        completion = len(self._ids) - prompt_tokens
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }

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
        allowed = [
            (float(logits[ids[0]]), c, ids[0])
            for c, ids in self._char_ids.items()
            if len(ids) == 1 and state.step(c) is not None
        ]
        assert allowed, f"the grammar allows no ASCII character after {state.shortest()!r}"
        _, char, token = max(allowed)
        return token, char

    def _sample(self, logits, among: list[int] | None) -> int:
        """The most likely token (of `among`, else of all), or one drawn from softmax(logits / temperature)."""
        ids = torch.tensor(among) if among is not None else torch.arange(logits.shape[-1])
        if not self.temperature:
            return int(ids[int(logits[ids].argmax())])
        probs = torch.softmax(logits[ids] / self.temperature, dim=-1)
        return int(ids[int(torch.multinomial(probs, 1, generator=self._generator))])

    def _text(self, token: int) -> str:
        if token not in self._texts:
            piece = (
                "" if token in self._special else self.tokenizer.decode([token], skip_special_tokens=False)
            )
            self._texts[token] = "" if "\ufffd" in piece else piece  # part of a multi-byte character
        return self._texts[token]

    def _prefill(self, ids: list[int], deadline):
        """Logits after `ids`, reusing the cached start that this prompt shares with the last one."""
        return self._prompts.run(ids, check=lambda: self._check(deadline)).float()

    def _feed(self, ids: list[int], deadline):
        return self._prompts.feed(ids, check=lambda: self._check(deadline)).float()

    def _check(self, deadline) -> None:
        """Raise if the turn must end before the next forward pass: the time limit, or a stop request."""
        if deadline is not None and time.monotonic() > deadline:
            raise BackendTimeout("the time limit was reached while the local model was generating")
        if self.should_stop is not None and self.should_stop():
            raise BackendCancelled("stopped on request while the local model was generating")

    @property
    def _ids(self) -> list[int]:
        return self._prompts.ids

    def _truncate(self, length: int) -> None:
        self._prompts.truncate(length)


class Stream:
    """A turn's deltas for `on_delta` (nothing without one): content and the call's arguments are passed
    as the growing settled text, and only what is new since the last time goes out."""

    def __init__(self, on_delta: Callable[[str, str], None] | None):
        self.on_delta, self.sent_content, self.sent_name, self.sent_arguments = on_delta, "", False, ""

    def __bool__(self) -> bool:
        return self.on_delta is not None

    def content(self, settled: str) -> None:
        if self.on_delta and len(settled) > len(self.sent_content):
            assert settled.startswith(self.sent_content), (settled, self.sent_content)
            self.on_delta("content", settled[len(self.sent_content) :])
            self.sent_content = settled

    def call(self, call: str) -> None:
        arguments = call_arguments(call) if self.on_delta else None
        if arguments is None:
            return
        if not self.sent_name:
            self.on_delta("call", json.loads('"' + _CALL_NAME.match(call).group(1) + '"'))
            self.sent_name = True
        if len(arguments) > len(self.sent_arguments):
            self.on_delta("arguments", arguments[len(self.sent_arguments) :])
            self.sent_arguments = arguments
