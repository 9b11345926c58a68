"""serve.py and jobs.py: the HTTP API on a tiny model and the demo endpoint, served by a real uvicorn.

Answer and stream (the stream's trace is the answer's trace, event by event, notes included), the
generate-only mode, options, 400s, a full queue (503), the time limit (504, timeout event), cancelling
by leaving, the endpoint failing mid-question, and 8 concurrent clients.
"""

import asyncio
import json
import re
import socket
import threading
import time
from dataclasses import asdict, fields
from urllib.parse import urlparse

import pytest
import requests
import torch

import serve
from common import defaults
from grisp.options import Options
from grisp.sparql import SparqlClient
from llm.cpu_speed import cpu_name
from serve import make_app
from tests.serving import GOLD, KNOXVILLE, QUESTION, running, scripted_grisp, sse
from tests.tiny import make_model_dir
from web.jobs import Job, QueueFull, Worker

torch.set_num_threads(1)
DEAD_END = "SELECT ?x WHERE { <iri>zzzz qqqq</iri> <iri>director (wdt)</iri> ?x . }"


@pytest.fixture(scope="module")
def grisp(tmp_path_factory, demo_endpoint):
    return scripted_grisp(
        tmp_path_factory,
        demo_endpoint,
        {QUESTION: [GOLD], "two skeletons?": [DEAD_END, GOLD], "slow " + QUESTION: [GOLD]},
    )


@pytest.fixture()
def server(grisp):
    """server(max_waiting=8, time_limit=60) -> base URL of a fresh app over the module's Grisp."""
    with_servers = []

    def start(max_waiting: int = 8, time_limit: float = 60.0) -> str:
        context = running(
            make_app(grisp, {"model": "tiny"}, Options(rerank=False), [QUESTION], max_waiting, time_limit)
        )
        with_servers.append(context)
        return context.__enter__()

    yield start
    for context in with_servers:
        context.__exit__(None, None, None)


def stream(url: str, question: str, **body) -> requests.Response:
    return requests.post(url + "/api/stream", json={"question": question, **body}, stream=True, timeout=60)


def test_config_names_the_setup_the_options_and_the_limits(server):
    config = requests.get(server() + "/api/config", timeout=10).json()
    assert config["model"] == "tiny" and config["examples"] == [QUESTION]
    assert config["options"] == asdict(Options(rerank=False))  # the server's defaults
    assert set(config["option_help"]) == {f.name for f in fields(Options)}
    assert config["option_choices"] == {
        "beam_ranking": ["sum", "length-normalised"],  # a menu on the page
        "skeleton_dedupe": ["exact", "merge"],
        "precision": ["auto", "float32", "bfloat16", "int8", "fp16-weights"],
    }
    assert config["load_time_options"] == ["precision"]  # shown, but fixed when the server loads the model
    # the default is auto, and in-process the tests' CPU has no native bf16 (conftest)
    assert (config["precision"], config["why_precision"]) == (
        "float32",
        f"auto: float32, no native bf16 on {cpu_name()}",
    )
    assert (
        config["max_waiting"] == 8
        and config["time_limit"] == 60
        and config["modes"] == ["answer", "generate"]
    )
    assert config["prefixes"]["wd"] == "http://www.wikidata.org/entity/"


def test_a_grisp_loaded_without_the_reranker_fixes_rerank_off(server, grisp, monkeypatch):
    monkeypatch.setattr(grisp.resolver, "reranker", None)  # as Grisp(..., Options(rerank=False)) loads it
    url = server()
    assert requests.get(url + "/api/config", timeout=10).json()["load_time_options"] == [
        "precision",
        "rerank",
    ]
    response = requests.post(
        url + "/api/answer", json={"question": QUESTION, "options": {"rerank": True}}, timeout=10
    )
    assert (
        response.status_code == 400
        and "loaded with rerank off; it cannot re-rank" in response.json()["error"]
    )
    assert requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60).status_code == 200


def test_page_is_served_and_needs_nothing_from_the_network(server):
    url = server()
    page = requests.get(url + "/", timeout=10)
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")
    for name in ("app.js", "agent.js", "style.css"):
        assert requests.get(f"{url}/static/{name}", timeout=10).status_code == 200
    for path in (
        defaults.REPO_DIR / "web" / "static"
    ).iterdir():  # nothing from elsewhere; links to Wikidata pages only
        hosts = set(re.findall(r"https?:(?://|\\/\\/)([\w.\\-]+)", path.read_text()))
        assert hosts <= {"www.wikidata.org", r"www\.wikidata\.org"}, f"{path.name} refers to {hosts}"
    assert set(re.findall(r'(?:src|href)="([^"]*)"', page.text)) == {
        "/static/app.js",
        "/static/agent.js",
        "/static/style.css",
        "data:,",
    }


def test_answer_holds_query_result_labels_skeletons_trace_and_timings(server):
    response = requests.post(server() + "/api/answer", json={"question": QUESTION}, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["failure"] is None and answer["mode"] == "answer" and answer["options"]["rerank"] is False
    assert "PREFIX wd: <http://www.wikidata.org/entity/>" in answer["sparql"]
    assert answer["sparql"].endswith("SELECT DISTINCT ?x WHERE { wd:Q104123 wdt:P57 ?y . ?y wdt:P19 ?x . }")
    assert answer["result"]["results"]["bindings"] == [{"x": {"type": "uri", "value": KNOXVILLE}}]
    assert answer["labels"] == {KNOXVILLE: "Knoxville"}
    assert answer["skeletons"] == [[GOLD, -1.0]]
    assert [e["event"] for e in answer["trace"]] == ["skeleton", "resolve"] + [
        "placeholder",
        "choose",
    ] * 3 + ["validate"]
    assert {"generate", "resolve", "search", "validate", "total"} <= set(answer["timings"])
    # its confidence (without re-ranking 1.0: nothing tells answers apart) and the query found
    assert answer["confidence"] == 1.0 and answer["guess"] == answer["sparql"] and answer["declined"] is False


def test_stream_sends_each_event_as_it_happens_then_the_answer(server):
    messages = list(sse(stream(server(), "two skeletons?", options={"top_k": 5})))
    types = [m["type"] for m in messages]
    assert types[:2] == ["queued", "started"] and types[-1] == "answer" and set(types[2:-1]) == {"trace"}
    answer = messages[-1]["answer"]
    latest = {}  # seq -> the event as last sent: a repeated seq is a note on that event
    for m in messages[2:-1]:
        assert m["seq"] >= max(latest, default=0), "a note may only update the latest event"
        latest[m["seq"]] = m["event"]
    assert list(latest.values()) == answer["trace"]  # exactly the answer's trace, in order
    assert len(messages) - 3 > len(latest), "notes (constraint, hits, re-ranking) are streamed as they come"
    names = [e["event"] for e in answer["trace"]]
    # generation is lazy: the second skeleton comes out only after the first one's resolution failed
    assert names[:2] == ["skeleton", "resolve"] and names.count("resolve") == 2 and names[-1] == "validate"
    second = names.index("skeleton", 1)
    assert second > 2 and names[second + 1] == "resolve"
    first_placeholder = next(
        m["event"] for m in messages if m["type"] == "trace" and m["event"]["event"] == "placeholder"
    )
    assert "hits" not in first_placeholder  # sent before its search ran
    assert answer["options"]["top_k"] == 5 and answer["sparql"] is not None


def test_rerank_option_streams_reranked_candidates_with_none(server):
    messages = list(sse(stream(server(), QUESTION, options={"rerank": True})))
    answer = messages[-1]["answer"]
    placeholders = [e for e in answer["trace"] if e["event"] == "placeholder"]
    searched = [e for e in placeholders if e["hits"]]
    assert searched and all(None in [iri for iri, _ in e["reranked"]] for e in searched)
    streamed = [m["event"] for m in messages if m["type"] == "trace" and m["event"]["event"] == "placeholder"]
    assert any("reranked" in e for e in streamed)  # streamed as it happened, before the answer
    assert answer["options"]["rerank"] is True and answer["failure"] in (None, "dead_end")


def test_generate_mode_gives_skeletons_without_resolution(grisp, server):
    url = server()
    answer = requests.post(
        url + "/api/answer", json={"question": QUESTION, "mode": "generate"}, timeout=60
    ).json()
    assert answer["mode"] == "generate" and answer["sparql"] is None and answer["failure"] is None
    assert answer["skeletons"] == [[GOLD, -1.0]] and [e["event"] for e in answer["trace"]] == ["skeleton"]
    assert set(answer["timings"]) == {"generate", "total"}
    # the real beam search of the tiny random model: nothing parses
    scripted, grisp.skeleton_stream = grisp.skeleton_stream, type(grisp).skeleton_stream.__get__(grisp)
    try:
        answer = requests.post(
            url + "/api/answer",
            json={"question": "q?", "mode": "generate", "options": {"num_beams": 2}},
            timeout=120,
        ).json()
    finally:
        grisp.skeleton_stream = scripted
    assert answer["failure"] == "no_skeleton" and answer["trace"] and answer["skeletons"] == []


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "the body is not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"question": "   "}', "the question is empty"),
        (json.dumps({"question": "a" * 10_000}).encode(), "10000 characters; at most 1000"),
        (b'{"question": "q?", "options": {"beam": false}}', "no option beam; the options are beam_search"),
        (
            b'{"question": "q?", "options": {"top_k": 13, "num_beams": 0}}',
            "num_beams = 0 must be >= 1; top_k = 13 must be in [1, 12]",
        ),
        (b'{"question": "q?", "options": {"rerank": "no"}}', "rerank must be a JSON boolean"),
        (b'{"question": "q?", "options": {"top_k": 2.5}}', "top_k must be a JSON whole number"),
        (b'{"question": "q?", "options": {"num_beams": 64}}', "over this server's limit of 16"),
        (
            b'{"question": "q?", "options": {"precision": "int8"}}',
            f"loaded in float32 (auto: float32, no native bf16 on {cpu_name()}); it cannot answer in int8",
        ),
        (b'{"question": "q?", "options": {"precision": "bfloat16"}}', "; it cannot answer in bfloat16"),
        (
            b'{"question": "q?", "options": {"skeleton_dedupe": 1}}',
            "skeleton_dedupe = 1 must be one of exact, merge",
        ),
        (b'{"question": "q?", "options": [1]}', "options must be a JSON object"),
        (b'{"question": "q?", "options": {"none_margin": Infinity}}', "none_margin must be a finite number"),
        (b'{"question": "q?", "options": {"none_margin": NaN}}', "none_margin must be a finite number"),
        (
            b'{"question": "q?", "options": {"time_budget": 1' + b"0" * 400 + b"}}",
            "time_budget must be a finite number",
        ),
        (
            b'{"question": "q?", "options": {"none_margin": -1' + b"0" * 400 + b"}}",
            "none_margin must be a finite number",
        ),
        (b'{"question": "q?", "mode": "fast"}', "mode must be one of answer, generate"),
        (b'{"question": "q?", "extra": 1}', "unknown field extra"),
        (b"x" * (70 * 1024), "over 64 KB"),
        (
            b'{"question": ' + b"[" * 30000 + b"]" * 30000 + b"}",
            "the body is not JSON",
        ),  # deeper than json reads
        (
            b'{"question": "q?", "options": {"seed": 1000000000000000000000000000000}}',
            "seed = 1000000000000000000000000000000 must be in [0, 2**63)",
        ),
    ],
)
def test_bad_requests_are_400_with_a_message(server, body, message):
    url = server()
    for path in ("/api/answer", "/api/stream"):
        response = requests.post(url + path, data=body, timeout=10)
        assert response.status_code == 400 and message in response.json()["error"], response.text


def test_full_queue_is_503_with_retry_after(grisp, server):
    url = server(max_waiting=2)
    first = stream(url, "slow " + QUESTION)
    messages = sse(first)  # kept: a dropped reader closes the connection, which cancels the question
    assert [next(messages)["type"], next(messages)["type"]] == ["queued", "started"]
    waiting = [stream(url, QUESTION) for _ in range(2)]
    refused = requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=10)
    assert refused.status_code == 503 and "2 questions are waiting" in refused.json()["error"]
    assert int(refused.headers["Retry-After"]) >= 1
    for response in [first, *waiting]:  # leaving frees the queue and stops the slow question
        response.close()
    start = time.monotonic()
    assert requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60).status_code == 200
    assert time.monotonic() - start < 10


def test_max_waiting_0_takes_a_job_only_when_none_runs():
    release = threading.Event()
    worker = Worker(lambda job: release.wait(10) and {"type": "answer"}, max_waiting=0).start()
    loop = asyncio.new_event_loop()

    def until(condition) -> None:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        first = Job("first", loop, time_limit=60)
        assert (
            worker.submit(first) == 0
        )  # a free worker takes it (before: refused, as every job passes the queue)
        until(lambda: worker.current is first)
        with pytest.raises(QueueFull, match="a question is being answered and none may wait"):
            worker.submit(Job("second", loop, time_limit=60))
        release.set()
        until(lambda: worker.current is None)
        assert worker.submit(Job("third", loop, time_limit=60)) == 0
    finally:
        release.set()
        worker.stop()
        loop.close()


def test_time_limit_is_504_and_a_timeout_event(grisp, server):
    url = server(time_limit=1.0)
    cancelled, start = grisp.skeleton_stream.cancelled, time.monotonic()
    response = requests.post(url + "/api/answer", json={"question": "slow " + QUESTION}, timeout=60)
    assert response.status_code == 504 and "time limit of 1 s" in response.json()["error"]
    assert (
        time.monotonic() - start < 10 and grisp.skeleton_stream.cancelled == cancelled + 1
    )  # the work stopped
    messages = list(sse(stream(url, "slow " + QUESTION)))
    assert [m["type"] for m in messages] == ["queued", "started", "timeout"]
    assert requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60).status_code == 200


def test_leaving_cancels_the_work(grisp, server):
    url = server()
    cancelled = grisp.skeleton_stream.cancelled
    response = stream(url, "slow " + QUESTION)
    list(sse(response, until="started"))
    response.close()  # a stream client leaves
    deadline = time.monotonic() + 10
    while grisp.skeleton_stream.cancelled == cancelled:
        assert time.monotonic() < deadline, "closing the stream did not cancel the question"
        time.sleep(0.05)
    # a plain /api/answer client leaves: a raw request, then close the socket
    address = urlparse(url)
    body = json.dumps({"question": "slow " + QUESTION}).encode()
    with socket.create_connection((address.hostname, address.port)) as s:
        s.sendall(
            b"POST /api/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.5)
    while grisp.skeleton_stream.cancelled == cancelled + 1:
        assert time.monotonic() < deadline + 5, "leaving /api/answer did not cancel the question"
        time.sleep(0.05)
    assert requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60).status_code == 200


def test_endpoint_down_mid_question_is_an_error_event_and_502(grisp, server):
    url, client = server(), grisp.resolver.client
    grisp.resolver.client = SparqlClient("http://127.0.0.1:9/query", retries=0)  # nothing listens there
    try:
        messages = list(sse(stream(url, QUESTION)))
        posted = requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60)
    finally:
        grisp.resolver.client = client
    assert messages[-1]["type"] == "error" and messages[-1]["kind"] == "endpoint"
    assert "cannot connect to http://127.0.0.1:9/query" in messages[-1]["message"]
    assert any(
        m["type"] == "trace" and m["event"]["event"] == "placeholder" for m in messages
    )  # it failed midway
    answer = messages[-1]["answer"]  # what was done up to there, recorded by the pipeline
    assert answer["failure"] == "endpoint_error" and answer["trace"][-1]["event"] == "endpoint_lost"
    assert posted.status_code == 502 and posted.json()["kind"] == "endpoint"
    assert requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60).status_code == 200


def test_eight_concurrent_clients_are_answered_or_cleanly_refused(server):
    url, outcomes = server(max_waiting=8), []

    def client(number: int) -> None:
        for i in range(3):
            try:
                if (number + i) % 2:
                    response = requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=120)
                    ok = response.status_code == 200 and response.json()["labels"] == {KNOXVILLE: "Knoxville"}
                else:
                    response = stream(url, QUESTION)
                    ok = response.status_code == 200 and list(sse(response))[-1]["answer"]["labels"] == {
                        KNOXVILLE: "Knoxville"
                    }
                refused = response.status_code == 503 and int(response.headers["Retry-After"]) >= 1
                outcomes.append("answered" if ok else "refused" if refused else f"bad {response.status_code}")
            except Exception as e:  # a hang (timeout) or a dead connection
                outcomes.append(f"failed {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert len(outcomes) == 24 and set(outcomes) <= {"answered", "refused"}, outcomes
    assert outcomes.count("answered") >= 8
    assert requests.post(url + "/api/answer", json={"question": QUESTION}, timeout=60).status_code == 200


def test_help_and_setup_errors_are_clear(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        serve.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit.value.code == 0 and "--time-limit" in text
    assert "(default: None)" not in text  # a None default: the help says what unset means

    def run_main(*flags: str) -> str:
        assert serve.main(serve.build_parser().parse_args(["--model-dir", str(tmp_path), *flags])) == 2
        return capsys.readouterr().err

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in run_main("--port", str(port))
    assert "get_model.py" in run_main("--port", "0")
    assert "server.time_limit_s = 0.0 must be > 0" in run_main("--time-limit", "0")
    assert "top_k = 13" in run_main("--port", "0", "--top-k", "13")
    assert "none_margin must be finite here" in run_main("--port", "0", "--none-margin", "inf")
    assert "server.threads = -1 must be >= 0" in run_main("--port", "0", "--threads", "-1")
    tiny, index = make_model_dir(tmp_path / "tiny"), tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text("{}")  # an index directory: the device is checked before it is read
    assert "unknown device 'bogus': use auto, cpu, cuda" in run_main(
        "--port",
        "0",
        "--model-dir",
        str(tiny),
        "--adapter",
        "none",
        "--index",
        str(index),
        "--no-kg-guidance",
        "--device",
        "bogus",
    )


def test_a_client_that_leaves_is_noticed_while_events_keep_coming(monkeypatch):
    import asyncio
    import time

    from web import shared

    monkeypatch.setattr(shared, "TICK", 0.2)

    class Chatty:  # a job that sends a trace event every 20 ms for 3 s
        reason = None

        async def messages(self, tick):
            for _ in range(150):
                await asyncio.sleep(0.02)
                yield {"type": "trace"}
            yield {"type": "answer"}

        def cancel(self, reason):
            self.reason = self.reason or reason

    class Gone:
        async def is_disconnected(self):
            return True

    job, start = Chatty(), time.monotonic()
    assert asyncio.run(shared.final_message(Gone(), job)) is None
    assert time.monotonic() - start < 1.0 and job.reason == "client"


def test_example_questions_take_one_of_each_shape_first():
    examples = serve.example_questions(str(defaults.DEMO_DIR / "questions.jsonl"), count=5)
    assert (
        len(examples) == 5 == len(set(examples)) and "where was the pulp fiction director born?" in examples
    )
    assert serve.example_questions("none") == []
