"""Endpoint faults end to end (issue 18): infer.py against a local SPARQL endpoint that answers the
start-up `ASK { }` and then misbehaves (HTTP 500, truncated JSON, HTML, no answer, connection reset).

Each test runs infer.py's real command line (argparse, main, exit code) with a tiny random model, the
demo index and the faulty server below, and checks the exit code, the final message, the JSON and
that the run ends within the time budget plus a small margin. The tiny model writes no skeleton that
parses, so the tests hand the pipeline the skeleton a trained model writes for the question
(`Grisp.skeleton_stream` is replaced); everything after it is real: resolver, HTTP client, messages.
"""

import argparse
import json
import runpy
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

import pytest
import requests
import torch
from conftest import start_http_server, stop_http_server

import evaluate
from common import defaults
from grisp import resolve
from grisp.options import Options
from grisp.pipeline import Grisp
from grisp.sparql import SparqlClient
from model import Transformer
from tests.test_infer import demo_index, run_infer, tiny_model  # noqa: F401 (fixtures)

torch.set_num_threads(1)

QUESTION = "Who directed Pulp Fiction?"
SKELETON = "SELECT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?x . }"
ANSWER = "SELECT ?x WHERE { wd:Q104123 wdt:P57 ?x . }"
BUDGET = 3.0  # --time-budget of every run: small, so that the tests stay fast
MARGIN = 1.5  # seconds on top of the budget: loading the tiny model and the index, the start-up ASK
ROW = json.dumps(
    {"head": {"vars": ["x"]}, "results": {"bindings": [{"x": {"type": "uri", "value": "http://e/1"}}]}}
)


class FaultyEndpoint:
    """A SPARQL endpoint in a thread. `ASK { }` (unless `ask` is False) and the queries `healthy(query)`
    accepts are forwarded to the real endpoint `real_url`; every other query gets the `fault`:
    "500", "truncated" (HTTP 200, JSON cut off), "html" (HTTP 200, a web page), "hang" (no answer at
    all), "reset" (headers and part of the body, then a TCP reset), "reset-early" (a reset, no answer)."""

    def __init__(self, real_url: str, fault: str, healthy=lambda query: False, ask: bool = True):
        self.requests: list[str] = []
        self.release = threading.Event()  # ends hanging handlers when the server closes
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                query = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
                outer.requests.append(query)
                if (ask and query.strip() == "ASK { }") or healthy(query):
                    real = requests.post(
                        real_url,
                        data={"query": query},
                        headers={"Accept": "application/sparql-results+json"},
                        timeout=30,
                    )
                    return self.answer(real.status_code, real.content)
                if fault == "500":
                    return self.answer(500, b"internal error", "text/plain")
                if fault == "truncated":
                    return self.answer(200, ROW[:40].encode())
                if fault == "html":
                    return self.answer(
                        200, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"
                    )
                if fault == "hang":
                    outer.release.wait(60)
                    return
                # a reset: SO_LINGER 0 makes close() send RST instead of FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                if fault == "reset":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(ROW[:40].encode())
                    self.wfile.flush()
                else:
                    assert fault == "reset-early", f"unknown fault {fault!r}"
                self.connection.close()

            def answer(self, status: int, body: bytes, content_type="application/sparql-results+json"):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first

            def log_message(self, *args):
                pass

        self.server, self.url = start_http_server(Handler)

    def close(self):
        self.release.set()
        stop_http_server(self.server)


@pytest.fixture
def faulty(demo_endpoint):
    servers = []

    def make(fault: str, healthy=lambda query: False, ask: bool = True) -> FaultyEndpoint:
        servers.append(FaultyEndpoint(demo_endpoint, fault, healthy, ask))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def constraint_queries(query: str) -> bool:
    """The constraint queries of the resolver (their variable is ?candidate); the final one is not."""
    return "?candidate" in query


@pytest.fixture
def infer(tiny_model, demo_index, tmp_path, monkeypatch, capsys):  # noqa: F811 (fixtures)
    """infer(endpoint_url, skeleton=SKELETON) -> (exit code, stdout, stderr, JSON answer, seconds)."""
    Transformer.from_pretrained(tiny_model)  # torch's one-time start-up (seconds) is not the run's time

    def run(endpoint_url: str, skeleton: str = SKELETON):
        monkeypatch.setattr(
            Grisp, "skeleton_stream", lambda self, question, trace, listener=None: iter([(skeleton, -1.0)])
        )
        monkeypatch.setattr(
            sys,
            "argv",
            [
                "infer.py",
                QUESTION,
                "--model-dir",
                str(tiny_model),
                "--adapter",
                "none",
                "--index",
                str(demo_index),
                "--endpoint",
                endpoint_url,
                "--no-rerank",
                "--top-k",
                "3",
                "--time-budget",
                str(BUDGET),
                "--json",
                str(tmp_path / "answer.json"),
            ],
        )
        capsys.readouterr()
        start = time.monotonic()
        with pytest.raises(SystemExit) as exit:
            runpy.run_path(str(defaults.REPO_DIR / "infer.py"), run_name="__main__")
        seconds = time.monotonic() - start
        out, err = capsys.readouterr()
        path = tmp_path / "answer.json"
        saved = json.loads(path.read_text()) if path.exists() else None
        path.unlink(missing_ok=True)
        assert "Traceback" not in out + err
        return exit.value.code, out, err, saved, seconds

    return run


# ---------------------------------------------------------------------------- the endpoint fails


def test_http_500_on_every_query_is_an_endpoint_fault(faulty, infer):
    code, out, err, saved, seconds = infer(faulty("500").url)
    assert code == 3 and seconds < BUDGET + MARGIN
    # the constraint query and the final query, each tried 3 times (the retries fit in the budget)
    assert "no answer: the endpoint" in err and "answered HTTP 5xx for 2 of 2 queries" in err
    assert "first error: ServerError: HTTP 500" in err and "internal error" in err
    assert out.strip().splitlines()[-1].startswith("timings:"), (
        "an unchecked query from a broken endpoint is no answer"
    )
    assert saved["failure"] == "endpoint_error" and saved["exit_code"] == 3 and saved["sparql"] is None
    assert (
        saved["queries"] == 2
        and saved["queries_answered"] == 0
        and saved["endpoint_faults"] == {"ServerError": 2}
    )
    assert saved["verified"] is None
    # the trace still shows what happened: the final query was accepted by the reference's rule
    assert [e["ok"] for e in saved["trace"] if e["event"] == "validate"] == [True]


@pytest.mark.parametrize("fault", ["truncated", "html", "reset"])
def test_invalid_answers_are_named_as_endpoint_faults(faulty, infer, fault):
    code, out, err, saved, seconds = infer(faulty(fault).url)
    assert code == 3 and seconds < BUDGET + MARGIN
    n = saved["queries"]
    # 3 films x (1 constraint query + 1 final query with the one "director" hit): all fail, a dead end
    assert n == 6 and saved["endpoint_faults"] == {"InvalidResponse": n} and saved["queries_answered"] == 0
    assert f"sent invalid JSON or a broken answer for {n} of {n} queries" in err
    assert "no skeleton resolved" not in err, "an endpoint fault is not a dead end of the method"
    assert {"truncated": "invalid or truncated JSON", "html": "<html>", "reset": "Connection reset by peer"}[
        fault
    ] in err
    assert saved["failure"] == "endpoint_error" and saved["sparql"] is None
    assert out.strip().splitlines()[-1].startswith("timings:"), "no query is printed after the trace"


def test_a_hanging_endpoint_cannot_outlast_the_time_budget(faulty, infer):
    code, out, err, saved, seconds = infer(faulty("hang").url)
    assert code == 3 and BUDGET - 0.5 < seconds < BUDGET + MARGIN
    # the first query (a constraint query, 60 s read timeout) is cut at the end of the budget
    assert "did not answer in time for 1 of 1 queries" in err and "the rest of the time budget" in err
    assert saved["endpoint_faults"] == {"QueryTimeout": 1} and saved["failure"] == "endpoint_error"


def test_a_connection_reset_before_any_answer_ends_the_question(faulty, infer):
    code, out, err, saved, seconds = infer(faulty("reset-early").url)
    assert code == 3 and seconds < BUDGET + MARGIN
    assert (
        "could not be reached or refused the request for 1 of 1 queries" in err
        and "dropped the connection" in err
    )
    assert saved["trace"][-1]["event"] == "endpoint_lost" and "endpoint lost" in out


def test_a_fault_on_the_startup_query_is_exit_3(faulty, infer):
    code, out, err, saved, seconds = infer(faulty("500", ask=False).url)
    assert code == 3 and "failed the start-up query ASK { }: ServerError: HTTP 500" in err and saved is None


# ---------------------------------------------------------------------------- unverified answers


@pytest.mark.parametrize("fault", ["500", "hang"])
def test_final_query_failing_on_a_working_endpoint_is_unverified(faulty, infer, fault, monkeypatch):
    # constraint queries are answered: the endpoint works; only the final query fails or hangs (its least
    # wait shortened below the budget: the hang is cut at the budget's end)
    monkeypatch.setattr(resolve, "FINAL_QUERY_WAIT_S", 1.0)
    code, out, err, saved, seconds = infer(faulty(fault, healthy=constraint_queries).url)
    assert code == 4 and seconds < BUDGET + MARGIN
    assert ANSWER in out and "(unverified: the final query was not checked" in out
    assert "warning: unverified answer" in err
    assert saved["verified"] is False and saved["exit_code"] == 4 and saved["failure"] is None
    assert saved["queries_answered"] >= 1 and saved["result"] is None
    expected = {"500": ("ServerError", "HTTP 500"), "hang": ("QueryTimeout", "the rest of the time budget")}[
        fault
    ]
    assert expected[0] in saved["error"] and expected[1] in saved["error"]
    if fault == "hang":
        assert seconds > BUDGET - 0.5, "the final query was cut at the end of the budget"


def test_a_healthy_endpoint_verifies_and_a_dead_end_is_the_methods_failure(faulty, infer):
    code, out, err, saved, seconds = infer(faulty("500", healthy=lambda query: True).url)
    assert code == 0 and ANSWER in out and "Quentin Tarantino" not in err
    assert saved["verified"] is True and saved["endpoint_faults"] == {} and saved["error"] is None
    code, out, err, saved, seconds = infer(
        faulty("500", healthy=lambda query: True).url,
        "SELECT ?x WHERE { <iri>zzzz qqqq</iri> <iri>director (wdt)</iri> ?x . }",
    )
    assert code == 1 and "no skeleton resolved" in err and saved["failure"] == "dead_end"


# ---------------------------------------------------------------------------- a process, and evaluate.py


def test_help_documents_the_exit_codes():
    out = run_infer("--help")
    assert out.returncode == 0 and "Exit codes:" in out.stdout
    for code in (
        "0  answered",
        "1  no answer, the method failed",
        "2  bad input or setup",
        "3  no answer, the endpoint failed",
        "4  answered but unverified",
    ):
        assert code in out.stdout


def test_no_traceback_from_the_process(faulty, tiny_model, demo_index):  # noqa: F811 (fixtures)
    # the same run as a separate process: its exit code and whole stderr, as a user sees them
    server = faulty("html")
    give_skeleton = (
        f"from grisp import pipeline; import runpy; "
        f"pipeline.Grisp.skeleton_stream = lambda self, q, trace, listener=None: iter([({SKELETON!r}, -1.0)]); "
        f"runpy.run_path({str(defaults.REPO_DIR / 'infer.py')!r}, run_name='__main__')"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            give_skeleton,
            QUESTION,
            "--model-dir",
            str(tiny_model),
            "--adapter",
            "none",
            "--index",
            str(demo_index),
            "--endpoint",
            server.url,
            "--no-rerank",
            "--top-k",
            "3",
            "--time-budget",
            str(BUDGET),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=defaults.REPO_DIR,
    )
    assert out.returncode == 3 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.startswith("no answer: the endpoint") and "for 6 of 6 queries" in out.stderr


def test_evaluate_counts_endpoint_faults_apart_from_the_method(
    faulty,
    demo_endpoint,
    tiny_model,
    demo_index,  # noqa: F811
    tmp_path,
):
    # the pipeline talks to a faulty endpoint, scoring to the healthy one: the gold query runs, the
    # question is scored, and its miss is the endpoint's, not a dead end or a wrong answer
    bench = tmp_path / "bench.jsonl"
    bench.write_text(
        json.dumps({"id": "pf", "question": QUESTION, "sparql": ANSWER, "paraphrases": [], "info": {}}) + "\n"
    )
    pipeline = Grisp(
        tiny_model,
        None,
        demo_index,
        faulty("truncated").url,
        Options(rerank=False, top_k=3, time_budget=BUDGET),
    )
    args = dict(
        benchmark=str(bench),
        out=str(tmp_path / "run"),
        limit=None,
        score_only=None,
        endpoint=demo_endpoint,
        index=demo_index,
        query_timeout=10.0,
        model_dir=tiny_model,
        adapter="none",
        device="cpu",
        ablation="none",
        oracle_skeleton=True,
        num_beams=None,
        num_skeletons=None,
        top_k=None,
        time_budget=None,
        seed=None,
        beam_ranking=None,
        skeletons_from=None,
    )
    summary = evaluate.main(argparse.Namespace(**args), pipeline=pipeline)
    assert summary["scored"] == 1 and summary["f1"] == 0.0
    assert summary["failures"]["endpoint_error"] == 1 and summary["failures"]["dead_end"] == 0
    assert summary["endpoint"] == {
        "questions_failed": 1,
        "unverified_answers": 0,
        "queries": 6,
        "faulty_queries": {"InvalidResponse": 6},
    }
    [record] = map(json.loads, (tmp_path / "run" / "predictions.jsonl").open())
    assert record["failure"] == record["pipeline_failure"] == "endpoint_error" and record["verified"] is None
    assert record["endpoint_faults"] == {"InvalidResponse": 6} and "InvalidResponse" in record["error"]


def test_scoring_counts_a_prediction_the_endpoint_failed_to_run_as_its_fault(faulty):
    # gold answered, the predicted query gets HTTP 500 when scored: not a wrong answer of the method
    client = SparqlClient(faulty("500", healthy=lambda query: query.endswith(ANSWER)).url, retries=0)
    record = {"sparql": ANSWER.replace("}", "} LIMIT 5"), "pipeline_failure": None}
    evaluate.score_record(record, ANSWER, client)
    assert record["gold_status"] == "ok" and record["f1"] == 0.0
    assert record["failure"] == "endpoint_error" and record["pred_error"].startswith("ServerError: HTTP 500")
