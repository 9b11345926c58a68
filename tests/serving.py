"""Helpers of the serve.py tests: a tiny Grisp, scripted skeletons, a real uvicorn server in a thread.

A tiny random model writes no skeleton that parses, so the tests that need a resolution replace
generation by `ScriptedSkeletons`: it runs model forwards like beam search does (each one a cancel point
of the server) and then gives fixed skeletons; everything after it (search, re-ranking, the endpoint,
validation, the server) is the real code.

    grisp = scripted_grisp(tmp_path_factory, endpoint_url, {QUESTION: [GOLD]})
    with running(make_app(grisp, {...}, Options(), [])) as url: requests.get(url + "/api/config")
    with slowed(backend.model, 0.05): ...                  # a slow model turn (cancel, time limits)
"""

import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import requests
import torch
import uvicorn

from common import defaults
from grisp.options import Options
from grisp.pipeline import Grisp
from tests.tiny import make_model_dir
from web.jobs import Cancelled

QUESTION = "where was the pulp fiction director born?"
GOLD = "SELECT DISTINCT ?x WHERE { <iri>Pulp Fiction</iri> <iri>director (wdt)</iri> ?y . ?y <iri>place of birth (wdt)</iri> ?x . }"
KNOXVILLE = "http://www.wikidata.org/entity/Q185582"


def scripted_grisp(tmp_path_factory, endpoint_url: str, script: dict[str, list[str]]) -> Grisp:
    """A Grisp over a tiny random model and an index of the endpoint's KG, generation scripted."""
    index = tmp_path_factory.mktemp("index")
    subprocess.run(
        [
            sys.executable,
            str(defaults.REPO_DIR / "build_index.py"),
            "--endpoint",
            endpoint_url,
            "--out",
            str(index),
            "--embed",
            "none",
        ],
        check=True,
        capture_output=True,
    )
    grisp = Grisp(make_model_dir(tmp_path_factory.mktemp("tiny")), None, index, endpoint_url, Options())
    grisp.skeleton_stream = ScriptedSkeletons(grisp, script)
    return grisp


class ScriptedSkeletons:
    """Stands in for Grisp.skeleton_stream: `forwards` model forwards `pause` seconds apart (a question with
    "slow" in it: `slow_forwards`), then the skeletons scripted for the question (none if not scripted);
    for a question with "hold" in it, `hold` seconds more after them (time to watch the live page).
    `cancelled` counts the runs the server stopped at a forward."""

    def __init__(
        self,
        grisp: Grisp,
        script: dict[str, list[str]],
        forwards: int = 2,
        slow_forwards: int = 600,
        pause: float = 0.05,
        hold: float = 2.0,
    ):
        self.grisp, self.script, self.forwards, self.slow_forwards = grisp, script, forwards, slow_forwards
        self.pause, self.hold = pause, hold
        self.cancelled = 0

    def __call__(self, question: str, trace: list, listener=None):
        try:
            for _ in range(self.slow_forwards if "slow" in question else self.forwards):
                with torch.inference_mode():
                    self.grisp.model(torch.tensor([[5, 6, 7]]))
                time.sleep(self.pause)
        except Cancelled:
            self.cancelled += 1
            raise
        script = self.script.get(question, [])
        for number, skeleton in enumerate(script):
            trace.append(
                {"event": "skeleton", "skeleton": skeleton, "score": -1.0 - number, "verdict": "kept"}
            )
            if listener is not None:
                listener(trace[-1])
            if "hold" in question and number == len(script) - 1:
                time.sleep(self.hold)
            yield skeleton, -1.0 - number
        if "hold" in question and not script:
            time.sleep(self.hold)


@contextmanager
def slowed(model, seconds: float) -> Iterator[None]:
    """Every forward of `model` takes `seconds` longer: a model turn long enough to cancel or time out."""
    hook = model.register_forward_pre_hook(lambda module, args: time.sleep(seconds))
    try:
        yield
    finally:
        hook.remove()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(app) -> Iterator[str]:
    """Serve `app` with uvicorn on a free local port in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "the test server did not stop"


def sse(response: requests.Response, until: str | None = None) -> Iterator[dict]:
    """The messages of a Server-Sent Events response (keep-alive comments skipped); stops after a
    message of type `until` if given."""
    data = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            message = json.loads("\n".join(data))
            data = []
            yield message
            if message["type"] == until:
                return


class Events:
    """One Server-Sent Events response read a part at a time, the connection kept open (sse() with `until`
    ends it: urllib3 closes a stream left early)."""

    def __init__(self, response: requests.Response):
        self.headers, self._messages = response.headers, sse(response)

    def take(self, until: str | None = None) -> list[dict]:
        """The next messages up to and including one of type `until` (None: all that are left)."""
        taken = []
        for message in self._messages:
            taken.append(message)
            if message["type"] == until:
                break
        return taken
