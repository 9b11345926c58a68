"""Qwen2.5's tokenizer and chat prompt: text <-> token ids for every GRISP stage.

`Tokenizer` wraps the model directory's tokenizer.json (byte-level BPE, read by the `tokenizers`
library) and finds Qwen's special ids; `chat_prompt` writes Qwen's chat format by hand, so prompts need
no chat-template engine; `qwen_tool_prompt` writes the same format with tools (function calling: the
agent's local backend, and agent traces for training). tests/test_model.py and
tests/test_agent_backends.py check them against transformers' tokenizer and template.

    tokenizer = Tokenizer(model_dir)
    ids = tokenizer.encode(chat_prompt([{"role": "user", "content": "Who directed Pulp Fiction?"}]))
"""

import json
import re
from pathlib import Path

import tokenizers

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Qwen's control tokens as text: <|im_end|>, <|endoftext|>, ... and <tool_call>, </tool_call>
_CONTROL_TEXT = re.compile(r"<(?=\|[A-Za-z0-9_]+\|>|/?tool_call>)")


def as_text(content: str) -> str:
    """`content` with every control token written in it (a question, a label, a query result ending in
    "<|im_end|>") broken by a zero-width space after its "<", so that encoding reads it as text and not
    as the end of a turn or a tool call. Other text is returned unchanged."""
    return _CONTROL_TEXT.sub("<\u200b", content)


def chat_prompt(
    messages: list[dict[str, str]], add_generation_prompt: bool = True, default_system: str = DEFAULT_SYSTEM
) -> str:
    """Qwen's chat format, by hand: each turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`; a system
    turn with `default_system` comes first unless the messages start with one; the generation prompt
    `<|im_start|>assistant\\n` asks the model to answer."""
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": default_system}, *messages]
    for m in messages:
        if m["role"] not in ("system", "user", "assistant"):
            raise ValueError(f"unknown chat role {m['role']!r}; use system, user or assistant")
    text = "".join(f"<|im_start|>{m['role']}\n{as_text(m['content'])}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def qwen_tool_prompt(messages: list[dict], tools: list[dict], add_generation_prompt: bool = True) -> str:
    """Qwen2.5's chat template with tools, written by hand (tests compare it with transformers'
    rendering of the template shipped with the model): the tool signatures go into the system turn,
    an assistant's calls become `<tool_call>` blocks, tool results `<tool_response>` blocks of a user turn.
    Without tools only the system turn differs (no signatures); the turns are written the same way."""
    system = (
        as_text(messages[0]["content"]) if messages and messages[0]["role"] == "system" else DEFAULT_SYSTEM
    )
    if tools:
        signatures = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        out = [
            f"<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more functions to assist with the "
            f"user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{signatures}\n</tools>\n\nFor each function call, return a json object with function name and "
            f'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
            f'"arguments": <args-json-object>}}\n</tool_call><|im_end|>\n'
        ]
    else:
        out = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    for i, m in enumerate(messages):
        role, content = m["role"], as_text(m.get("content") or "")
        if role == "system" and i == 0:
            continue
        if role == "tool":
            opens = i == 0 or messages[i - 1]["role"] != "tool"
            closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            out.append(
                ("<|im_start|>user" if opens else "")
                + f"\n<tool_response>\n{content}\n</tool_response>"
                + ("<|im_end|>\n" if closes else "")
            )
        elif role == "assistant" and m.get("tool_calls"):
            calls = "".join(
                '\n<tool_call>\n{"name": "'
                + as_text(c["function"]["name"])
                + '", "arguments": '
                + as_text(json.dumps(json.loads(c["function"]["arguments"] or "{}"), ensure_ascii=False))
                + "}\n</tool_call>"
                for c in m["tool_calls"]
            )
            out.append("<|im_start|>assistant" + (f"\n{content}" if content else "") + calls + "<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    return "".join(out) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class Tokenizer:
    """The model directory's tokenizer.json (byte-level BPE) plus Qwen's special token ids.

    im_start_id, im_end_id, endoftext_id: the chat and document markers.
    eos_ids: ids that end an answer (generation_config.json / config.json eos_token_id, plus im_end).
    pad_id: the padding id (pad_token_id from the same files, else <|endoftext|>)."""

    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        if not (model_dir / "tokenizer.json").exists():
            raise FileNotFoundError(f"{model_dir / 'tokenizer.json'} is missing (run `python get_model.py`)")
        self.tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.im_start_id, self.im_end_id, self.endoftext_id = (
            self.special_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
        )
        config = {}  # generation_config.json overrides config.json, as in transformers
        for name in ("config.json", "generation_config.json"):
            if (model_dir / name).exists():
                config.update(
                    {k: v for k, v in json.loads((model_dir / name).read_text()).items() if v is not None}
                )
        eos = config.get("eos_token_id", [])
        self.eos_ids = sorted({*(eos if isinstance(eos, list) else [eos]), self.im_end_id})
        self.pad_id = config.get("pad_token_id", self.endoftext_id)

    def special_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer.json has no {token} token: not a Qwen2 tokenizer")
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. <|im_start|>) map to their ids."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def last_word_start(self, text: str) -> int:
        """Where the last pre-token of `text` starts (pre-tokens: the pieces the tokenizer's regex cuts a
        text into before BPE; no token crosses their borders). len(text) for empty text."""
        words = self.tokenizer.pre_tokenizer.pre_tokenize_str(text)
        return words[-1][1][0] if words else len(text)
