"""web/openai_api.py: serve.py's /v1/chat/completions and /v1/models over a tiny random model (a real uvicorn
server, local_backend.LocalBackend with constrained tool calls), and the GRASP agent's OpenAI backend
(grasp.backends.OpenAIBackend) running its loop against this server over HTTP.

A tiny random model writes garbage, so the tests check the protocol: OpenAI's response shape, calls that
name an offered function with arguments that fit its schema (checked with jsonschema, independently of
our grammar), usage, finish reasons, 400s in OpenAI's error shape, one request at a time, the time
limit, and an agent run that completes within its step limit with a trace for each step.
"""

import json
import socket
import threading
import time
from urllib.parse import urlparse

import jsonschema
import openai
import pytest
import requests
import torch

from agent import Agent
from grasp.backends import OpenAIBackend
from grasp.config import AgentConfig
from grasp.functions import kg_definitions
from grasp.local_backend import LocalBackend
from grasp.prompts import task_definitions
from grisp.options import Options
from llm.tokenizer import qwen_tool_prompt
from serve import make_app
from tests.agent_helpers import demo_kg
from tests.serving import running, scripted_grisp, slowed
from tests.tiny import make_model_dir

torch.set_num_threads(1)
TOOLS = kg_definitions(["wikidata"], 10, 10, indexed=True) + task_definitions(
    "sparql-qa", ["wikidata"]
)  # the agent's
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [
    {"role": "system", "content": "You answer questions."},
    {"role": "user", "content": "Who directed Pulp Fiction?"},
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, demo_endpoint):
    grisp = scripted_grisp(tmp_path_factory, demo_endpoint, {})
    backend = LocalBackend(
        make_model_dir(tmp_path_factory.mktemp("chat") / "tiny"), max_reasoning_tokens=6, max_call_tokens=60
    )
    return grisp, backend


@pytest.fixture(scope="module")
def url(setup):
    grisp, backend = setup
    with running(make_app(grisp, {"model": "tiny"}, Options(rerank=False), [], chat=backend)) as base:
        yield base + "/v1"


def chat(url: str, **body) -> requests.Response:
    return requests.post(
        url + "/chat/completions", json={"model": "tiny", "messages": ASK, **body}, timeout=120
    )


def turn(response: requests.Response) -> tuple:
    """What the model wrote: its text and its calls (names and arguments, not their ids)."""
    message = response.json()["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    return message["content"], calls


def test_models_lists_the_one_model(url):
    models = requests.get(url + "/models", timeout=10).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]


def test_a_completion_with_tools_is_one_call_that_fits_in_openai_format(url, setup):
    response = chat(url, tools=TOOLS)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (
        body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "tiny"
    )
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and len(message["tool_calls"]) == 1
    call = message["tool_calls"][0]
    assert call["type"] == "function" and call["id"] and call["function"]["name"] in SCHEMAS
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    usage = body["usage"]  # the prompt is Qwen's template with the tools; completion: the tokens generated
    prompt = setup[1].tokenizer.encode(qwen_tool_prompt(ASK, TOOLS))
    assert usage["prompt_tokens"] == len(prompt) and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_tool_choice_named_none_and_a_conversation_with_earlier_calls(url):
    named = chat(
        url, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "search_entity"}}
    ).json()
    call = named["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "search_entity"
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS["search_entity"])
    plain = chat(url, tools=TOOLS, tool_choice="none").json()["choices"][0]
    assert "tool_calls" not in plain["message"] and isinstance(plain["message"]["content"], str)
    assert plain["finish_reason"] in ("stop", "length")
    earlier = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [  # arguments as text and as an object
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "search_entity", "arguments": '{"kg": "wikidata", "query": "pulp"}'},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "list", "arguments": {"kg": "wikidata"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "1. Pulp Fiction (wd:Q104123)"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "no triples"}]},
    ]
    response = chat(url, messages=earlier, tools=TOOLS, tool_choice="required")
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["tool_calls"]


def test_what_openai_accepts_is_accepted(url):
    developer = [{"role": "developer", "content": "Answer briefly."}, *ASK]  # OpenAI's newer name for system
    assert turn(chat(url, messages=developer, n=None)) == turn(
        chat(url, messages=[{**developer[0], "role": "system"}, *ASK])
    )


def test_temperature_is_for_one_request_only(url):
    greedy = turn(chat(url, tools=TOOLS))
    sampled = chat(url, tools=TOOLS, temperature=1.5)
    assert sampled.status_code == 200 and sampled.json()["choices"][0]["message"]["tool_calls"]
    assert turn(chat(url, tools=TOOLS)) == greedy  # greedy again, the same turn


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "the body is not JSON"),
        (b"[1]", "must be a JSON object"),
        (b"{}", "messages must be a non-empty list"),
        (b'{"messages": []}', "messages must be a non-empty list"),
        (
            b'{"messages": [{"role": "robot", "content": "hi"}]}',
            "messages[0] must be an object with a role in system",
        ),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            "this model reads text only",
        ),
        (
            b'{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]}',
            "messages[0].tool_calls[0] must be",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "retrieval"}]}',
            'tools[0] has type "retrieval"; only "function" tools are supported',
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {}}]}',
            "tools[0].function must be an object with a name",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"type": "object", "properties": {"xs": {"type": "array"}}}}}]}',
            "cannot constrain decoding",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"type": "object", "properties": {}, "required": ["x"]}}}]}',
            "required keys ['x'] are not among",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], '
            b'"tool_choice": {"type": "function", "function": {"name": "g"}}}',
            "names no function among the tools",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "always"}',
            "tool_choice must be auto",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}',
            "there are no tools",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
            "stream must be true or false",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true}',
            "logprobs are not supported",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}], "model": 7}', "model must be a string"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "one choice per request"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
            "temperature must be a number",
        ),
        (b"x" * (300 * 1024), "the request body is over 256 KB"),
        (
            b'{"messages": ' + b"[" * 50000 + b"]" * 50000 + b"}",
            "the body is not JSON",
        ),  # deeper than json reads
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"type": "object", "properties": {"a": {"enum": []}}}}}]}',
            "not a JSON schema this server can follow",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"type": "object", "properties": [1]}}}]}',
            "parameters.properties must map each name",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"type": "object", "properties": {"a": 5}}}}]}',
            "parameters.properties must map each name",
        ),
    ],
)
def test_bad_requests_are_400_in_openai_shape(url, body, message):
    response = requests.post(url + "/chat/completions", data=body, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error" and error["code"] == 400


def test_requests_are_served_one_at_a_time_and_give_what_they_give_alone(url):
    questions = [f"Question number {n}?" for n in range(4)]

    def ask(question: str) -> tuple:
        body = {"messages": [{"role": "user", "content": question}], "tools": TOOLS}
        return turn(requests.post(url + "/chat/completions", json=body, timeout=120))

    alone = [ask(q) for q in questions]
    together = [None] * len(questions)

    def client(i: int) -> None:
        together[i] = ask(questions[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone  # the shared model and its KV cache were never used by two requests at once


def test_time_limit_is_504_and_a_client_that_leaves_frees_the_model(setup):
    grisp, backend = setup
    with (
        running(
            make_app(grisp, {"model": "tiny"}, Options(rerank=False), [], time_limit=0.5, chat=backend)
        ) as base,
        slowed(backend.model, 0.05),
    ):
        start = time.monotonic()
        response = chat(base + "/v1", tool_choice="none")  # 66 forwards of 0.05 s: past the limit
        assert response.status_code == 504 and "time limit of 0.5 s" in response.json()["error"]["message"]
        assert time.monotonic() - start < 2.5
    with running(make_app(grisp, {"model": "tiny"}, Options(rerank=False), [], chat=backend)) as base:
        address = urlparse(base)
        body = json.dumps({"messages": ASK}).encode()
        with slowed(backend.model, 0.2):  # a turn of about 13 s, unless it is stopped
            with socket.create_connection((address.hostname, address.port)) as s:  # a client that leaves
                s.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                time.sleep(0.5)
        start = time.monotonic()
        response = chat(base + "/v1", tools=TOOLS)
        assert response.status_code == 200 and time.monotonic() - start < 5.0, "the abandoned turn went on"


def test_the_agent_runs_its_loop_over_our_server(url, demo_endpoint):
    kg = demo_kg(demo_endpoint)
    for tool_choice, max_steps in (("required", 1), ("auto", 4)):
        backend = OpenAIBackend(url, "tiny", tool_choice=tool_choice, retries=0)
        r = Agent({kg.name: kg}, backend, AgentConfig(max_steps=max_steps)).run("Who directed Pulp Fiction?")
        events = [e["event"] for e in r.trace]
        assert events[0] == "question" and events[-1] == "output" and r.error is None, r.trace
        assert 1 <= r.steps <= max_steps and events.count("model") == r.steps
        assert r.status in ("answer", "cancel", "step_limit", "loop", "no_answer")
        assert (r.status == "step_limit") == (r.steps == max_steps and events[-2] == "limit")
        assert "malformed_call" not in events and "backend_error" not in events
        calls = [c for m in r.messages if m.get("tool_calls") for c in m["tool_calls"]]
        for c in calls:  # every call the server sent names a real function with arguments that fit it
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
        run = [e["name"] for e in r.trace if e["event"] == "call"]  # run unless it repeated an earlier call
        assert len(run) + sum(e["event"] == "loop" for e in r.trace) == len(calls)
        if tool_choice == "required":
            assert len(calls) == r.steps  # one call every turn


# ---------------------------------------------------------------------------- the official openai client
@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def test_the_official_client_gets_text_whole_and_streamed(client):
    whole = client.chat.completions.create(model="tiny", messages=ASK)
    assert whole.choices[0].finish_reason in ("stop", "length") and isinstance(
        whole.choices[0].message.content, str
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == whole.choices[0].message.content
    )
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert (
        finished == [whole.choices[0].finish_reason] and chunks[-2].choices[0].finish_reason
    )  # on the last chunk
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_the_official_client_reassembles_a_streamed_tool_call(client):
    whole = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required")
    with client.chat.completions.stream(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required"
    ) as stream:
        pieces = [e.arguments_delta for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    expected, got = whole.choices[0].message.tool_calls[0], final.choices[0].message.tool_calls[0]
    assert len(pieces) > 1  # the arguments came in pieces, not at once
    assert (got.function.name, got.function.arguments) == (
        expected.function.name,
        expected.function.arguments,
    )
    assert "".join(pieces) == got.function.arguments and got.id
    jsonschema.validate(json.loads(got.function.arguments), SCHEMAS[got.function.name])
    assert final.choices[0].finish_reason == "tool_calls"
    assert (final.choices[0].message.content or "") == (whole.choices[0].message.content or "")


def test_the_official_client_gets_typed_errors(client):
    with pytest.raises(openai.BadRequestError, match="messages\\[0\\] must be an object with a role"):
        client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="one choice per request"):
        client.chat.completions.create(model="tiny", messages=ASK, n=2, stream=True)
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        client.chat.completions.create(model="gpt-5", messages=ASK, stream=True)


def test_the_official_client_sees_a_full_queue_and_a_stream_it_leaves_stops_the_turn(setup):
    grisp, backend = setup
    with (
        running(
            make_app(grisp, {"model": "tiny"}, Options(rerank=False), [], max_waiting=1, chat=backend)
        ) as base,
        slowed(backend.model, 0.2),
    ):  # a turn of many seconds unless it is stopped
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        first = client.chat.completions.create(model="tiny", messages=ASK, stream=True)
        assert next(iter(first)).choices[0].delta.role == "assistant"  # running
        waiting = client.chat.completions.create(model="tiny", messages=ASK, stream=True)  # queued
        with pytest.raises(
            openai.InternalServerError, match="the server is busy: 1 question is waiting"
        ) as refused:
            client.chat.completions.create(model="tiny", messages=ASK)
        assert refused.value.status_code == 503 and int(refused.value.response.headers["Retry-After"]) >= 1
        (
            first.close(),
            waiting.close(),
        )  # both clients leave mid-stream: the server notices within a keep-alive
        start = time.monotonic()
        while time.monotonic() - start < 20:
            try:
                client.chat.completions.create(
                    model="tiny", messages=ASK, tools=TOOLS, tool_choice="required"
                )
                break
            except openai.InternalServerError:  # still busy with the abandoned turns
                time.sleep(0.2)
        assert time.monotonic() - start < 20, "the abandoned turns went on"


def test_the_time_limit_in_a_stream_is_its_last_event(setup):
    grisp, backend = setup
    with (
        running(
            make_app(grisp, {"model": "tiny"}, Options(rerank=False), [], time_limit=0.5, chat=backend)
        ) as base,
        slowed(backend.model, 0.05),
    ):
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.APIError, match="time limit of 0.5 s"):
            for _ in client.chat.completions.create(
                model="tiny", messages=ASK, tool_choice="none", stream=True
            ):
                pass
