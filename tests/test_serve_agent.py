"""web/agent_routes.py and serve.py's configuration: the page's agent mode over a real uvicorn server, with the
GRASP agent on a tiny random model (local backend, constrained calls) or on a scripted stand-in for a
remote model, over the demo endpoint; and serve.py reading the agent's config file with flags over it.

The stream sends each step in order (seq 1, 2, ...; the question first, the output last, a call after its
model turn), Cancel stops the local model within its turn and a remote run between steps, a run still
waiting is ended at once, GRISP's questions are not held up by a remote agent run, bad requests are 400.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import requests
import torch

import serve
from agent import Agent
from common import defaults
from grasp.backends import Reply
from grasp.config import AgentConfig, ConfigError
from grasp.local_backend import LocalBackend
from grisp.options import Options
from serve import make_app
from tests.agent_helpers import call, demo_index, demo_kg
from tests.serving import GOLD, QUESTION, Events, free_port, running, scripted_grisp, slowed, sse
from tests.tiny import make_model_dir

torch.set_num_threads(1)
ASKED = "Who directed Pulp Fiction?"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, demo_endpoint):
    grisp = scripted_grisp(tmp_path_factory, demo_endpoint, {QUESTION: [GOLD]})
    backend = LocalBackend(
        make_model_dir(tmp_path_factory.mktemp("agent") / "tiny"), max_reasoning_tokens=6, max_call_tokens=60
    )
    return grisp, backend, demo_kg(demo_endpoint)


def app(setup, backend=None, **options):
    grisp, local, kg = setup
    agent = Agent({kg.name: kg}, backend or local, AgentConfig(**options))
    return running(
        make_app(
            grisp,
            {"model": "tiny"},
            Options(rerank=False),
            [QUESTION],
            agent=agent,
            chat=local if backend is None else None,
        )
    )


def stream(url: str, **body) -> requests.Response:
    response = requests.post(
        url + "/api/agent/stream", json={"question": ASKED, **body}, stream=True, timeout=60
    )
    assert response.status_code == 200, response.text
    return response


def cancel(url: str, job_id) -> requests.Response:
    return requests.post(url + "/api/agent/cancel", json={"id": job_id}, timeout=10)


def test_config_offers_the_agent_and_the_stream_sends_each_step_in_order(setup):
    with app(setup, max_steps=3) as url:
        agent = requests.get(url + "/api/config", timeout=10).json()["agent"]
        assert agent["backend"] == "local:tiny" and [k["name"] for k in agent["kgs"]] == ["wikidata"]
        assert agent["tasks"] == ["sparql-qa", "general-qa"] and agent["max_steps"] == 3
        response = stream(url)
        assert response.headers["X-Job-Id"] and response.headers["Content-Type"].startswith(
            "text/event-stream"
        )
        messages = list(sse(response))
    types = [m["type"] for m in messages]
    assert types[:2] == ["queued", "started"] and types[-1] == "answer" and set(types[2:-1]) == {"trace"}
    trace = [m for m in messages if m["type"] == "trace"]
    assert [m["seq"] for m in trace] == list(range(1, len(trace) + 1))  # each event once, in order
    events = [m["event"] for m in trace]
    assert (
        events[0]["event"] == "question"
        and events[0]["question"] == ASKED
        and events[-1]["event"] == "output"
    )
    answer = messages[-1]["answer"]
    turns = [e for e in events if e["event"] == "model"]
    assert len(turns) == answer["steps"] <= 3 and answer["status"] == events[-1]["status"]
    for i, e in enumerate(events):  # the local backend: one call per turn, right after it, for that step
        if e["event"] == "model":
            assert events[i + 1]["event"] in ("call", "loop") and events[i + 1]["step"] == e["step"], events
            assert e["calls"] == events[i + 1].get("name", e["calls"])
    assert sum(answer["calls"].values()) == answer["steps"]
    assert set(answer["timings"]) == {"model", "functions", "total"}


def test_cancel_stops_the_local_model_within_its_turn_and_a_waiting_run_at_once(setup):
    with app(setup) as url, slowed(setup[1].model, 0.05):  # a turn: some 70 forwards of 0.05 s
        first = Events(stream(url))
        assert [m["type"] for m in first.take("trace")] == ["queued", "started", "trace"]  # generating now
        second = Events(stream(url))  # waits behind the first
        assert [m["type"] for m in second.take("queued")] == ["queued"]
        assert cancel(url, second.headers["X-Job-Id"]).status_code == 200
        assert [(m["type"], m["kind"]) for m in second.take()] == [("error", "cancelled")]
        start = time.monotonic()
        assert cancel(url, first.headers["X-Job-Id"]).json() == {"cancelled": first.headers["X-Job-Id"]}
        rest = first.take()
        assert time.monotonic() - start < 2.0, "the cancel did not stop the turn"
        assert [m["event"]["event"] for m in rest if m["type"] == "trace"] == ["cancelled", "output"]
        assert rest[0]["event"]["during"] == "generation" and rest[-1]["answer"]["status"] == "cancelled"
        assert rest[-1]["answer"]["steps"] == 0  # the turn never finished
        assert cancel(url, first.headers["X-Job-Id"]).status_code == 404  # over: nothing left to cancel
        start = time.monotonic()  # the worker is free for the next run
        assert [m["type"] for m in Events(stream(url)).take("started")] == ["queued", "started"]
        assert time.monotonic() - start < 2.0


def test_a_remote_run_cancels_between_steps_and_does_not_hold_up_grisp(setup):
    turns = iter(range(10**6))

    def slow_turn(messages):  # a remote model that takes its time (30 steps: 15 s), a new search every turn
        time.sleep(0.5)
        return Reply("", [call("search_entity", kg="wikidata", query=f"film {next(turns)}")], seconds=0.5)

    class Remote:
        name = "remote"

        def chat(self, messages, tools, deadline=None, tool_choice=None):
            return slow_turn(messages)

    with app(setup, backend=Remote()) as url:
        events = Events(stream(url))
        events.take("started")
        start = time.monotonic()  # GRISP answers on its own worker meanwhile
        answered = requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=30)
        assert answered.status_code == 200 and answered.json()["sparql"] and time.monotonic() - start < 5
        assert cancel(url, events.headers["X-Job-Id"]).status_code == 200
        rest = events.take()
    events = [m["event"] for m in rest if m["type"] == "trace"]
    assert events[-2] == {"event": "cancelled"}, "stopped between steps"  # not during a turn
    assert rest[-1]["answer"]["status"] == "cancelled" and rest[-1]["answer"]["steps"] >= 1


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("stream", b"{not json", 400, "the body is not JSON"),
        ("stream", b'{"question": " "}', 400, "the question is empty"),
        ("stream", b'{"question": "q?", "task": "chat"}', 400, "task must be one of sparql-qa, general-qa"),
        ("stream", b'{"question": "q?", "kgs": ["dblp"]}', 400, "configured knowledge graphs (wikidata)"),
        ("stream", b'{"question": "q?", "kgs": [[]]}', 400, "configured knowledge graphs (wikidata)"),
        ("stream", b'{"question": "q?", "kgs": [{}]}', 400, "configured knowledge graphs (wikidata)"),
        (
            "stream",
            b'{"question": "q?", "kgs": ["wikidata", "wikidata"]}',
            400,
            "distinct configured knowledge graphs",
        ),
        ("stream", b'{"question": "q?", "options": {}}', 400, "unknown field options"),
        ("cancel", b"[]", 400, "must be a JSON object"),
        ("cancel", b'{"id": "nope"}', 404, "no agent run is going on with id 'nope'"),
        ("cancel", b'{"id": ["x"]}', 404, "no agent run"),
    ],
)
def test_bad_agent_requests(setup, path, body, status, message):
    with app(setup) as url:
        response = requests.post(f"{url}/api/agent/{path}", data=body, timeout=10)
    assert response.status_code == status and message in response.json()["error"], response.text


def test_serve_reads_the_agents_config_with_flags_over_it(tmp_path, monkeypatch, capsys):
    path = tmp_path / "grasp.toml"
    path.write_text(
        '[[knowledge_graphs]]\nname = "films"\nendpoint = "http://127.0.0.1:7001/query"\nindex = "films"\n'
        '[[knowledge_graphs]]\nname = "dblp"\nendpoint = "https://sparql.dblp.org/sparql"\nindex = "dblp"\n'
        '[model]\nmodel_dir = "model"\n'
        '[server]\nkg = "dblp"\nport = 9001\nadapter = "none"\nexamples = "none"\nagent = false\n'
    )
    monkeypatch.setenv("GRASP_SERVER_MAX_WAITING", "3")

    def settings(*flags):
        return serve.settings(serve.build_parser().parse_args(["--config", str(path), *flags]))

    config = settings()
    s = config.server
    assert (s.kg, s.port, s.adapter, s.examples, s.agent, s.max_waiting, s.host) == (
        "dblp",
        9001,
        None,
        None,
        False,
        3,
        "127.0.0.1",
    )
    assert config.model.model_dir == str(tmp_path / "model")  # relative to the file, as for agent.py
    config = settings(
        "--port",
        "9002",
        "--endpoint",
        "http://127.0.0.1:7002/query",
        "--kg",
        "films",
        "--adapter",
        "adapters/x",
        "--time-limit",
        "30",
    )
    assert (config.server.port, config.server.kg, config.server.adapter, config.server.time_limit_s) == (
        9002,
        "films",
        "adapters/x",
        30.0,
    )
    films, dblp = (
        config.knowledge_graphs
    )  # --endpoint changes the graph GRISP answers over, for the agent too
    assert (
        films.endpoint == "http://127.0.0.1:7002/query" and dblp.endpoint == "https://sparql.dblp.org/sparql"
    )
    assert films.index == str(tmp_path / "films")
    with pytest.raises(
        ConfigError, match="server.kg = 'wikidata' must name a knowledge graph \\(films, dblp\\)"
    ):
        settings("--kg", "wikidata")
    path.write_text('[server]\nport = "http"\n')
    assert serve.main(serve.build_parser().parse_args(["--config", str(path)])) == 2
    err = capsys.readouterr().err
    assert "server.port must be int" in err and "Traceback" not in err
    path.write_text("[server]\nportt = 1\n")
    with pytest.raises(ConfigError, match="server: unknown setting\\(s\\) portt"):
        settings()
    assert serve.settings(serve.build_parser().parse_args([])).server.agent is True  # the built-in defaults
    monkeypatch.setenv("GRASP_SERVER_PORTS", "1")
    with pytest.raises(ConfigError, match="GRASP_SERVER_PORTS names no setting"):
        serve.settings(serve.build_parser().parse_args([]))


def test_serve_py_starts_from_the_config_file_with_the_agent_and_v1(tmp_path, demo_endpoint):
    make_model_dir(tmp_path / "tiny")  # the config names it relative to its own directory
    path, port = tmp_path / "grasp.toml", free_port()
    path.write_text(
        f'[[knowledge_graphs]]\nname = "films"\nendpoint = "{demo_endpoint}"\n'
        f'index = "{demo_index(demo_endpoint)}"\n[model]\nmodel_dir = "tiny"\nadapter = "none"\nmax_call_tokens = 40\n'
        f'[agent]\nmax_steps = 2\n[server]\nadapter = "none"\nexamples = "none"\n'
    )
    process = subprocess.Popen(
        [
            sys.executable,
            str(defaults.REPO_DIR / "serve.py"),
            "--config",
            str(path),
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "GRASP_CONFIG": ""},
    )
    try:
        lines = []
        while not (lines and lines[-1].startswith("open http://")):
            line = process.stdout.readline()
            assert line, "serve.py ended before it served:\n" + "".join(lines)
            lines.append(line)
        assert "agent: local:tiny over films; /v1/chat/completions serves it" in "".join(lines)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
        while True:  # the line comes just before uvicorn listens
            try:
                config = requests.get(url + "/api/config", timeout=10).json()
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None, (
                    "serve.py did not start listening"
                )
                time.sleep(0.1)
        assert (
            config["kg"] == "films" and config["endpoint"] == demo_endpoint and config["config"] == str(path)
        )
        assert config["agent"]["kgs"][0]["name"] == "films" and config["agent"]["max_steps"] == 2
        reply = requests.post(
            url + "/v1/chat/completions",
            timeout=60,
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"x": {"type": "integer"}},
                                "required": ["x"],
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
        )
        call = reply.json()["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "f" and isinstance(json.loads(call["arguments"])["x"], int)
        answer = list(
            sse(requests.post(url + "/api/agent/stream", json={"question": ASKED}, stream=True, timeout=60))
        )
        assert answer[-1]["type"] == "answer" and answer[-1]["answer"]["steps"] <= 2
    finally:
        process.terminate()
        process.wait(20)
