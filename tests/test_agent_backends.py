"""grasp/backends.py, local_backend.py and tool_grammar.py: the OpenAI-compatible backend against a local
fake HTTP server, Qwen2.5's tool-call prompt against transformers' rendering of the model's own template,
and constrained decoding with tiny random models (every call parses and fits its function's schema).

The fake server's answers are synthetic, written in the shape of OpenAI / vLLM chat-completion responses
(`choices[0].message` with `content` and `tool_calls[{id, type, function: {name, arguments}}]`); they
are not recordings of a real provider.
"""

import json
import re
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent import Agent
from common import defaults
from grasp.backends import BackendError, BackendTimeout, OpenAIBackend, check_call, parse_qwen_calls
from grasp.config import AgentConfig, ModelConfig, make_backend
from grasp.local_backend import LocalBackend, call_arguments, settled_content, turn_content
from grasp.prompts import task_definitions
from grasp.tool_grammar import call_grammar, schema_errors
from llm.tokenizer import Tokenizer, chat_prompt, qwen_tool_prompt
from tests.agent_helpers import demo_kg
from tests.tiny import make_model_dir, tiny_tokenizer

torch.set_num_threads(1)
KG = {"type": "string", "enum": ["wikidata", "dblp"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute",
            "description": "run a query",
            "parameters": {
                "type": "object",
                "properties": {"kg": KG, "sparql": {"type": "string"}},
                "required": ["kg", "sparql"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list",
            "description": "triples",
            "parameters": {
                "type": "object",
                "properties": {
                    "kg": KG,
                    "subject": {"type": "string"},
                    "page": {"type": "integer"},
                    "unclipped": {"type": "boolean"},
                },
                "required": ["kg"],
                "additionalProperties": False,
            },
        },
    },
    *task_definitions("sparql-qa", ["wikidata", "dblp"]),  # cancel has an optional nested object
]


def completion(content="", calls=()):
    """A chat completion in the OpenAI / vLLM response shape (synthetic)."""
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "fake",
        "created": 0,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
    }


@pytest.fixture
def server():
    """A local HTTP server answering POST /v1/chat/completions from a script of (status, body, delay)."""
    state = {"script": [], "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            state["requests"].append(
                {
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": json.loads(self.rfile.read(int(self.headers["Content-Length"]))),
                }
            )
            status, body, delay = state["script"].pop(0) if len(state["script"]) > 1 else state["script"][0]
            time.sleep(delay)
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield state
    httpd.shutdown()


def test_openai_backend_sends_tools_and_parses_calls(server):
    server["script"] = [
        (200, completion("Let me run it.", [("execute", '{"kg": "wikidata", "sparql": "ASK {}"}')]), 0)
    ]
    backend = OpenAIBackend(server["url"], "qwen-7b", api_key="secret", temperature=0.0)
    reply = backend.chat([{"role": "user", "content": "q?"}], TOOLS)
    assert reply.content == "Let me run it." and len(reply.tool_calls) == 1
    c = reply.tool_calls[0]
    assert (c.id, c.name, c.arguments, c.error) == (
        "call_0",
        "execute",
        {"kg": "wikidata", "sparql": "ASK {}"},
        None,
    )
    request = server["requests"][0]
    assert (
        request["path"] == "/v1/chat/completions" and request["headers"]["Authorization"] == "Bearer secret"
    )
    assert request["body"]["model"] == "qwen-7b" and request["body"]["tools"] == TOOLS
    assert request["body"]["tool_choice"] == "auto" and request["body"]["temperature"] == 0.0


def test_malformed_tool_calls_come_back_with_a_clear_error(server):
    server["script"] = [
        (
            200,
            completion(
                "",
                [
                    ("execute", '{"kg": "wikidata", "sparql": '),
                    ("exeute", '{"kg": "wikidata"}'),
                    ("execute", '{"kg": "freebase", "sparql": "ASK {}"}'),
                    ("list", '{"subject": "wd:Q1", "colour": 1}'),
                ],
            ),
            0,
        )
    ]
    calls = OpenAIBackend(server["url"], "m").chat([{"role": "user", "content": "q?"}], TOOLS).tool_calls
    assert "not valid JSON" in calls[0].error
    assert calls[1].error.startswith("there is no function 'exeute'; the functions are execute, list")
    assert 'arguments.kg must be one of ["wikidata", "dblp"], not "freebase"' in calls[2].error
    assert "lacks the required key 'kg'" in calls[3].error and "unknown key 'colour'" in calls[3].error
    assert all(c.arguments == {} for c in calls) and calls[0].message()["function"]["arguments"] == "{}"


def test_qwen_calls_in_the_text_of_a_server_without_a_tool_parser(server):
    text = 'I will search.\n<tool_call>\n{"name": "list", "arguments": {"kg": "dblp"}}\n</tool_call>'
    server["script"] = [(200, completion(text), 0)]
    reply = OpenAIBackend(server["url"], "m").chat([{"role": "user", "content": "q?"}], TOOLS)
    assert reply.content == "I will search." and reply.tool_calls[0].arguments == {"kg": "dblp"}
    _, calls = parse_qwen_calls("<tool_call>{not json}</tool_call>", TOOLS)
    assert 'is not {"name": ..., "arguments": ...} JSON' in calls[0].error


def test_odd_answers_become_call_errors_or_backend_errors(server, monkeypatch):
    _, calls = parse_qwen_calls('<tool_call>{"name": ["execute"], "arguments": {}}</tool_call>', TOOLS)
    assert calls[0].error.startswith("there is no function ['execute']")  # a name that is not a string
    odd = completion("")
    odd["choices"][0]["message"] |= {
        "content": [{"type": "text", "text": "parts"}],
        "tool_calls": {"id": "x"},
    }
    server["script"] = [(200, odd, 0)]
    reply = OpenAIBackend(server["url"], "m").chat([{"role": "user", "content": "q?"}], TOOLS)
    assert reply.content == "parts" and reply.tool_calls[0].error == "a tool call without a function"

    def cut_off(*args, **kwargs):
        raise __import__("requests").exceptions.ChunkedEncodingError("connection broken mid-body")

    backend = OpenAIBackend(server["url"], "m", retries=0)
    monkeypatch.setattr(backend.session, "post", cut_off)
    with pytest.raises(BackendError, match="a broken answer from the model server"):
        backend.chat([], [])


def test_http_errors_retries_unreachable_and_timeouts(server):
    server["script"] = [(503, "busy", 0), (200, completion("ok"), 0)]
    assert OpenAIBackend(server["url"], "m").chat([], []).content == "ok"  # a 5xx is retried
    server["script"] = [(401, '{"error": "invalid api key"}', 0)]
    with pytest.raises(BackendError, match="HTTP 401 .*invalid api key"):
        OpenAIBackend(server["url"], "m").chat([], [])
    server["script"] = [(200, "<html>not json</html>", 0)]
    with pytest.raises(BackendError, match="not with a chat completion"):
        OpenAIBackend(server["url"], "m").chat([], [])
    with pytest.raises(
        BackendError, match="cannot reach the model server http://127.0.0.1:9/v1/chat/completions"
    ):
        OpenAIBackend("http://127.0.0.1:9/v1", "m", retries=0).chat([], [])
    server["script"] = [(200, completion("late"), 2.0)]
    start = time.monotonic()
    with pytest.raises(BackendTimeout, match="did not answer within"):
        OpenAIBackend(server["url"], "m", retries=0).chat([], [], deadline=time.monotonic() + 0.5)
    assert time.monotonic() - start < 1.5
    with pytest.raises(ValueError, match="must start with http"):
        OpenAIBackend("localhost:8000", "m")


def test_the_agent_runs_against_an_openai_compatible_url_from_the_config(server, demo_endpoint):
    query = "SELECT ?d WHERE { wd:Q104123 wdt:P57 ?d }"
    server["script"] = [
        (200, completion("", [("search_entity", '{"kg": "wikidata", "query": "pulp fiction"}')]), 0),
        (200, completion("", [("search_property", '{"kg": "wikidata", "query": "director"}')]), 0),
        (200, completion("", [("execute", json.dumps({"kg": "wikidata", "sparql": query}))]), 0),
        (
            200,
            completion(
                "", [("answer", json.dumps({"kg": "wikidata", "sparql": query, "answer": "Tarantino"}))]
            ),
            0,
        ),
    ]
    backend = make_backend(ModelConfig(backend="openai", base_url=server["url"], model="m", api_key_env=""))
    kg = demo_kg(demo_endpoint)
    r = Agent({kg.name: kg}, backend, AgentConfig()).run("Who directed Pulp Fiction?")
    assert (r.status, r.sparql, r.steps) == ("answer", query, 4)
    sent = server["requests"][-1]["body"]["messages"]  # results went back as tool messages
    assert [m["role"] for m in sent] == ["system", "user"] + ["assistant", "tool"] * 3
    assert "Quentin Tarantino (wd:Q3772)" in sent[-1]["content"]


def test_qwen_tool_prompt_matches_the_models_template():
    config = defaults.MODEL_DIR / "tokenizer_config.json"
    if not config.exists():
        pytest.skip(
            "the base model's tokenizer_config.json (its chat template) is not there (python get_model.py)"
        )
    from transformers import PreTrainedTokenizerFast

    template = json.loads(config.read_text())["chat_template"]
    messages = [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": "Wer? ünïcode"},
        {
            "role": "assistant",
            "content": "Searching.",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "list", "arguments": '{"kg": "dblp", "page": 2}'},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "execute", "arguments": '{"kg": "wikidata", "sparql": "ASK {}"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "no triples"},
        {"role": "tool", "tool_call_id": "b", "content": "ASK result: yes"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "list", "arguments": '{"kg": "dblp"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "none"},
    ]

    def with_dict_arguments(call):  # transformers' templates take the arguments as a dict
        return {
            **call,
            "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])},
        }

    hf_messages = [
        {**m, "tool_calls": [with_dict_arguments(c) for c in m["tool_calls"]]} if "tool_calls" in m else m
        for m in messages
    ]
    hf = PreTrainedTokenizerFast(tokenizer_file=str(defaults.MODEL_DIR / "tokenizer.json"))
    for msgs in (messages, messages[1:2]):  # with and without a system message
        hf_msgs = hf_messages if msgs is messages else hf_messages[1:2]
        expected = hf.apply_chat_template(
            hf_msgs, tools=TOOLS, chat_template=template, tokenize=False, add_generation_prompt=True
        )
        assert qwen_tool_prompt(msgs, TOOLS) == expected
    assert qwen_tool_prompt(messages[:2], []) == chat_prompt(messages[:2])  # no tools: the plain chat format
    # without tools only the system turn changes: calls and results are written as with tools (they became
    # plain user turns and an empty assistant turn before; OpenAI clients ask for the answer with tool_choice none)
    expected = hf.apply_chat_template(
        hf_messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert qwen_tool_prompt(messages, []) == expected


# ---------------------------------------------------------------------------- the grammar


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_grammar_accepts_exactly_the_calls_that_fit(data):
    tool = data.draw(st.sampled_from(TOOLS))["function"]
    props, required = tool["parameters"]["properties"], tool["parameters"]["required"]
    text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
    args = {}
    for key, schema in props.items():  # schema order, as json.dumps writes a dict
        if key in required or data.draw(st.booleans()):
            if "enum" in schema:
                args[key] = data.draw(st.sampled_from(schema["enum"]))
            elif schema.get("type") == "integer":
                args[key] = data.draw(st.integers(0, 10**6))
            elif schema.get("type") == "boolean":
                args[key] = data.draw(st.booleans())
            elif schema.get("type") == "object":
                args[key] = {"kg": data.draw(st.sampled_from(KG["enum"])), "sparql": data.draw(text)}
            else:
                args[key] = data.draw(text)
    call = json.dumps({"name": tool["name"], "arguments": args}, ensure_ascii=data.draw(st.booleans()))
    grammar = call_grammar(TOOLS, max_string=40)
    state = grammar.consume(call)
    assert state is not None and state.nullable and state.exact, call
    assert schema_errors({"type": "object", **tool["parameters"]}, args) == []
    prefix = grammar.consume(call[: data.draw(st.integers(0, len(call) - 1))])
    assert prefix is not None and not prefix.nullable  # a proper prefix continues, and cannot end there
    assert grammar.consume(call[:-1] + "]") is None


def test_grammar_details():
    g = call_grammar(TOOLS, max_string=3)
    assert g.forced() == '{"name": "'
    s = g.consume('{"name": "e')
    assert s.forced() == 'xecute", "arguments": {"kg": "'
    s = g.consume('{"name": "list", "arguments": {"kg": "dblp", "page": 0')
    assert s.step("7") is None and s.consume(', "unclipped": ') is not None  # no leading zeros
    s = g.consume('{"name": "execute", "arguments": {"kg": "dblp", "sparql": "abc')
    assert s.forced() == '"}}' and s.step("d") is None  # the string cap: only the closing quote
    assert (
        g.consume('{"name": "execute", "arguments": {"kg": "dblp", "sparql": "\n') is None
    )  # raw control char
    s = g.consume('{"name": "cancel", "arguments": {"explanation": "x", "best_attempt": {"k')
    assert json.loads(
        '{"name": "cancel", "arguments": {"explanation": "x", "best_attempt": {"k' + s.shortest()
    )
    with pytest.raises(ValueError, match="cannot constrain decoding"):
        call_grammar(
            [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"xs": {"type": "array"}}},
                    },
                }
            ]
        )
    assert check_call("1", "list", '{"kg": "dblp", "page": true}', TOOLS).error.endswith(
        "must be integer, not true"
    )


# ---------------------------------------------------------------------------- constrained decoding


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    return [make_model_dir(tmp_path_factory.mktemp(f"tiny{seed}"), seed=seed) for seed in range(3)]


def test_constrained_decoding_always_yields_a_call_that_fits(tiny_models):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Who directed Pulp Fiction?"},
    ]
    for model_dir in tiny_models:
        for reasoning, budget, temperature in [(0, 400, None), (6, 400, None), (0, 8, None), (6, 400, 1.0)]:
            backend = LocalBackend(
                model_dir,
                max_reasoning_tokens=reasoning,
                max_call_tokens=budget,
                max_string=60,
                temperature=temperature,
            )
            reply = backend.chat(messages, TOOLS)
            assert len(reply.tool_calls) == 1 and reply.tool_calls[0].error is None
            call = reply.tool_calls[0]
            assert call.name in schemas
            jsonschema.validate(call.arguments, schemas[call.name])  # an independent check of the schema
            assert (budget == 8) == bool(reply.notes)  # a tiny budget: closed by the grammar, still valid
            if reasoning == 0:
                assert reply.content == ""


def test_the_kv_cache_kept_between_turns_changes_nothing(tiny_models):
    messages = [{"role": "user", "content": "Who directed Pulp Fiction?"}]
    kept = LocalBackend(tiny_models[0], max_reasoning_tokens=4, max_call_tokens=30)
    first = kept.chat(messages, TOOLS)
    messages += [
        {
            "role": "assistant",
            "content": first.content,
            "tool_calls": [c.message() for c in first.tool_calls],
        },
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "Got no rows"},
    ]
    second = kept.chat(messages, TOOLS)  # reuses the cached start of the conversation
    fresh = LocalBackend(tiny_models[0], max_reasoning_tokens=4, max_call_tokens=30).chat(messages, TOOLS)
    assert (second.content, second.tool_calls[0].raw) == (fresh.content, fresh.tool_calls[0].raw)


def test_the_local_backend_stops_at_the_deadline(tiny_models):
    backend = LocalBackend(tiny_models[1], max_reasoning_tokens=50, max_call_tokens=400)
    with pytest.raises(BackendTimeout, match="time limit"):
        backend.chat([{"role": "user", "content": "q?"}], TOOLS, deadline=time.monotonic() - 1)
    with pytest.raises(BackendError, match="get_model.py"):
        LocalBackend(defaults.GRISP_HOME / "no-such-model")


def test_the_agent_adapter_is_the_default_and_a_mismatch_is_a_clear_error(tiny_models):
    from grasp.config import load_config

    assert load_config(None, env={}).model.adapter == str(defaults.AGENT_ADAPTER_DIR)
    assert load_config(None, env={"GRASP_MODEL_ADAPTER": "none"}).model.adapter is None
    assert (defaults.AGENT_ADAPTER_DIR / "adapter_model.safetensors").is_file()  # shipped with the code
    with pytest.raises(
        BackendError, match="with the adapter .*agent.* --adapter none"
    ):  # made for the 0.5B model
        LocalBackend(tiny_models[0], defaults.AGENT_ADAPTER_DIR)
    with pytest.raises(BackendError, match="with the adapter .*no-such-adapter"):
        LocalBackend(tiny_models[0], defaults.GRISP_HOME / "no-such-adapter")


def test_a_broken_base_model_is_not_blamed_on_an_adapter(tiny_models, tmp_path):
    shutil.copy(tiny_models[0] / "config.json", tmp_path / "config.json")  # the weights are missing
    with pytest.raises(BackendError, match="cannot load the model .*model.safetensors") as error:
        LocalBackend(tmp_path)
    assert "with the adapter" not in str(error.value) and "--adapter none" not in str(error.value)


def test_the_local_backend_takes_the_precision_of_the_machine(tiny_models, mock_native_bf16):
    from grasp.config import load_config, make_backend

    mock_native_bf16(True)
    config = load_config(None, env={"GRASP_MODEL_ADAPTER": "none"}).model
    config.model_dir, config.max_reasoning_tokens, config.max_call_tokens = str(tiny_models[0]), 4, 30
    config.precision = "auto"
    backend = make_backend(config)
    assert backend.precision == "bfloat16" and "native bf16" in backend.why_precision
    assert backend.model.model.norm.weight.dtype == torch.bfloat16
    reply = backend.chat([{"role": "user", "content": "Who directed Pulp Fiction?"}], TOOLS)
    assert reply.tool_calls and json.loads(reply.tool_calls[0].raw)  # a bf16 turn's call parses
    config.precision = "float32"
    assert make_backend(config).model.model.norm.weight.dtype == torch.float32
    with pytest.raises(BackendError, match="model.precision: precision 'fp8'"):
        LocalBackend(tiny_models[0], precision="fp8")
    with pytest.raises(BackendError, match="model.device: unknown device 'bogus'"):
        LocalBackend(tiny_models[0], device="bogus")


class SpellingLM:
    """A stand-in for the model whose next token spells out `target` after the prompt; once the text
    has left the target (the grammar overruled it) it prefers a closing quote."""

    def __init__(self, tokenizer, target: str):
        self.tokenizer, self.target = tokenizer, target
        self.model = SimpleNamespace(norm=SimpleNamespace(weight=torch.zeros(1)))

    def new_cache(self, batch_size, max_len):
        cache = SimpleNamespace(ids=[])
        cache.truncate = lambda n: cache.ids.__delitem__(slice(n, None))
        return cache

    def __call__(self, tokens, cache, logits_at, vocab=None):  # vocab: re-ranking only
        self._cache = cache
        cache.ids += tokens[0].tolist()
        text = self.tokenizer.decode(cache.ids, skip_special_tokens=False)
        generated = text.rsplit("<|im_start|>assistant\n", 1)[-1]
        rest = self.target[len(generated) :] if self.target.startswith(generated) else '"'
        special = [t for t in ("<|im_start|>", "<|endoftext|>") if rest.startswith(t)]  # spelt as one token
        logits = torch.zeros(1, 300)
        logits[0, self.tokenizer.encode(special[0] if special else rest[:1] or '"')[0]] = 10.0
        return logits


def test_a_call_written_without_its_tag_is_decoded_under_the_grammar(tiny_models):
    tokenizer = Tokenizer(tiny_models[0])
    target = 'I will search. {"name": "search_entity", "arguments": {"kg": "wikidata", "entity": "wd:Q1"}}'
    tools = TOOLS + [
        {
            "type": "function",
            "function": {
                "name": "search_entity",
                "parameters": {
                    "type": "object",
                    "properties": {"kg": KG, "query": {"type": "string"}},
                    "required": ["kg", "query"],
                },
            },
        }
    ]
    backend = LocalBackend(
        tiny_models[0],
        model=SpellingLM(tokenizer, target),
        tokenizer=tokenizer,
        max_reasoning_tokens=60,
        max_call_tokens=60,
    )
    reply = backend.chat([{"role": "user", "content": "Who directed Pulp Fiction?"}], tools)
    assert reply.content == "I will search."  # the free text ends where the call starts
    call = reply.tool_calls[0]
    # the model's own choice of function and kg survive; its unknown key "entity" could not be written
    assert (call.name, call.arguments, call.error) == ("search_entity", {"kg": "wikidata", "query": ""}, None)


@pytest.mark.parametrize(
    "target, content",
    [
        (
            'Searching.\n```json\n{"name": "search_entity", "arguments": {"kg": "wikidata"}}\n```',
            "Searching.",
        ),
        ("Thinking.<|im_start|>user\nmore", "Thinking."),
    ],
)
def test_the_free_text_of_a_turn_holds_no_call_fence_and_no_control_token(tiny_models, target, content):
    tokenizer = Tokenizer(tiny_models[0])
    backend = LocalBackend(
        tiny_models[0],
        model=SpellingLM(tokenizer, target),
        tokenizer=tokenizer,
        max_reasoning_tokens=60,
        max_call_tokens=60,
    )
    reply = backend.chat([{"role": "user", "content": "Who directed Pulp Fiction?"}], TOOLS)
    assert reply.content == content
    assert len(reply.tool_calls) == 1 and reply.tool_calls[0].error is None  # the call still comes


def test_sampling_is_seeded(tiny_models):
    messages = [{"role": "user", "content": "Who directed Pulp Fiction?"}]

    def sampled(seed):
        return LocalBackend(
            tiny_models[2], max_reasoning_tokens=4, max_call_tokens=30, temperature=1.0, seed=seed
        ).chat(messages, TOOLS)

    a, b = sampled(1), sampled(1)
    assert (a.content, a.tool_calls[0].raw) == (b.content, b.tool_calls[0].raw)


class TokenLM(SpellingLM):
    """A stand-in for the model that knows `target` only as its tokenizer cuts it: while the tokens fed
    after the prompt are the start of that encoding its next token continues it; fed any other cut of
    the same text (the model never saw one) it prefers a closing quote."""

    def __call__(self, tokens, cache, logits_at, vocab=None):  # vocab: re-ranking only
        cache.ids += tokens[0].tolist()
        start = max(i for i, t in enumerate(cache.ids) if t == self.tokenizer.im_start_id) + 1
        start += len(self.tokenizer.encode("assistant\n"))  # the reply starts here
        fed, target = cache.ids[start:], self.tokenizer.encode(self.target)
        logits = torch.zeros(1, self.tokenizer.tokenizer.get_vocab_size())
        on_target = target[: len(fed)] == fed and len(fed) < len(target)
        logits[0, target[len(fed)] if on_target else self.tokenizer.encode('"')[0]] = 10.0
        return logits


def test_forced_text_is_fed_as_the_tokenizer_cuts_it(tmp_path, tiny_models):
    call = '{"name": "search_property", "arguments": {"kg": "wikidata", "query": "director"}}'
    names = ["search_entity", "search_property"]
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "kg": {"type": "string", "enum": ["wikidata"]},
                        "query": {"type": "string"},
                    },
                    "required": ["kg", "query"],
                },
            },
        }
        for name in names
    ]
    target = "<tool_call>\n" + call + "\n</tool_call>"  # as the chat template writes a call
    tiny_tokenizer(400, [target, target.replace("property", "entity")], qwen_split=True).save(
        str(tmp_path / "tokenizer.json")
    )
    tokenizer = Tokenizer(tmp_path)
    assert [tokenizer.decode([t]) for t in tokenizer.encode("search_property")] == ["search", "_property"]
    assert '"}}\n' in [
        tokenizer.decode([t]) for t in tokenizer.encode(target)
    ]  # the call's last token ends the line
    backend = LocalBackend(
        tiny_models[0],
        model=TokenLM(tokenizer, target),
        tokenizer=tokenizer,
        max_reasoning_tokens=0,
        max_call_tokens=60,
    )
    reply = backend.chat([{"role": "user", "content": "Who directed Pulp Fiction?"}], tools)
    assert (reply.tool_calls[0].name, reply.tool_calls[0].arguments) == (
        "search_property",
        {"kg": "wikidata", "query": "director"},
    )
    fed = backend._ids[reply.usage["prompt_tokens"] :]
    assert (
        tokenizer.decode(fed) == target[: target.index("</tool_call>")]
    )  # the whole call, closed by '"}}\n'
    assert fed == tokenizer.encode(target)[: len(fed)]  # the model saw its own cut of the call throughout


# ---------------------------------------------------------------------------- streaming (on_delta)
def streamed(backend, messages, tools):
    """(reply, joined content deltas, call names, joined argument deltas) of one turn."""
    deltas = []
    reply = backend.chat(messages, tools, on_delta=lambda kind, text: deltas.append((kind, text)))
    joined = {kind: "".join(text for k, text in deltas if k == kind) for kind in ("content", "arguments")}
    kinds = [kind for kind, _ in deltas]
    assert kinds == sorted(kinds, key=["content", "call", "arguments"].index)  # text, then the call
    return reply, joined["content"], [text for kind, text in deltas if kind == "call"], joined["arguments"]


PIECES = [
    "a",
    "b c",
    " ",
    "\n",
    "<",
    "<tool",
    "_call>",
    "{",
    '"name"',
    '"na',
    "```",
    "`",
    "json",
    "\ufffd",
    "é",
    "}",
]


@given(
    st.lists(st.sampled_from(PIECES), max_size=12),
    st.lists(st.sampled_from(PIECES), max_size=12),
    st.booleans(),
)
@example(["`", "\ufffd"], ["`", "`"], True)  # a backtick before an incomplete character may open a fence
def test_settled_content_is_never_taken_back(start, rest, call_follows):
    """Whatever the model writes next, the content streamed early is a prefix of the turn's content."""
    text = "".join(start)
    opening = re.search(r'<tool_call>|\{\s*"name"', text)
    if opening:  # the free text would have ended there
        return
    later = text + "".join(rest)
    opening = re.search(r'<tool_call>|\{\s*"name"', later)
    free_text = later[: opening.start()] if opening else later.replace("\ufffd", "")
    final = turn_content(free_text, call_follows or bool(opening))
    assert final.startswith(settled_content(text))


def test_settled_content_holds_back_what_may_still_go():
    assert settled_content('  Searching now { "na') == "Searching now"  # maybe a call
    assert settled_content("See <tool") == "See"
    assert settled_content("a < b and {x} done  ") == "a < b and {x} done"  # never an opening
    assert settled_content("Here:\n```json\n") == "Here:"  # a fence a call may open in


def test_call_arguments_follow_the_json_to_its_end():
    assert call_arguments('{"name": "f') is None
    assert call_arguments('{"name": "f", "arguments": {"q": "a}\\"b"') == '{"q": "a}\\"b"'
    assert call_arguments('{"name": "f", "arguments": {"q": ["x"]}}\n') == '{"q": ["x"]}'


def test_streamed_deltas_join_to_the_reply(tiny_models):
    messages = [{"role": "user", "content": "Who directed Pulp Fiction?"}]
    for model_dir in tiny_models:
        for reasoning, budget, temperature in [(0, 400, None), (6, 400, 1.0), (6, 8, None)]:
            backend = LocalBackend(
                model_dir,
                max_reasoning_tokens=reasoning,
                max_call_tokens=budget,
                max_string=60,
                temperature=temperature,
            )
            reply, content, names, arguments = streamed(backend, messages, TOOLS)
            assert content == reply.content and names == [reply.tool_calls[0].name]
            assert arguments == reply.tool_calls[0].message()["function"]["arguments"]
            assert json.loads(arguments) == reply.tool_calls[0].arguments
        reply, content, names, arguments = streamed(
            LocalBackend(model_dir, max_reasoning_tokens=8), messages, []
        )
        assert (content, names, arguments) == (reply.content, [], "")  # no tools: text only


@pytest.mark.parametrize(
    "target, content",
    [
        (
            'Searching.\n```json\n{"name": "search_entity", "arguments": {"kg": "wikidata"}}\n```',
            "Searching.",
        ),
        (
            'I will search. {"name": "search_entity", "arguments": {"kg": "wikidata", "query": "Pulp \\"F\\""}}',
            "I will search.",
        ),
        ('Hmm <b> {x} <tool_call>\n{"name": "list", "arguments": {"kg": "wikidata"}}', "Hmm <b> {x}"),
    ],
)
def test_streamed_text_never_shows_what_the_call_takes_back(tiny_models, target, content):
    tokenizer = Tokenizer(tiny_models[0])
    tools = TOOLS + [
        {
            "type": "function",
            "function": {
                "name": "search_entity",
                "parameters": {
                    "type": "object",
                    "properties": {"kg": KG, "query": {"type": "string"}},
                    "required": ["kg"],
                },
            },
        }
    ]
    backend = LocalBackend(
        tiny_models[0],
        model=SpellingLM(tokenizer, target),
        tokenizer=tokenizer,
        max_reasoning_tokens=60,
        max_call_tokens=60,
    )
    reply, streamed_content, names, arguments = streamed(backend, [{"role": "user", "content": "q?"}], tools)
    assert reply.content == streamed_content == content
    assert names == [reply.tool_calls[0].name] and arguments == reply.tool_calls[0].raw
