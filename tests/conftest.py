"""Shared pytest fixtures: real oxigraph SPARQL servers started by the tests themselves.

In-process, every test but the slow ones sees a CPU without native bf16 (`float32_on_every_cpu`): "auto"
precision is float32 there on every machine; `mock_native_bf16(True or False)` shows a test either kind.

`oxigraph_server(rdf_path, timeout_s=30) -> url` starts (once per file and timeout) a read-only
oxigraph server on a free port over a store in a temporary directory; all are stopped at the end
of the session. `demo_endpoint` is the URL of one over the demo KG `data/demo/kg.ttl`.
"""

import socket
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's top-level modules
import endpoint  # noqa: E402
from common import defaults  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def float32_on_every_cpu():
    """Precision "auto" reads the CPU (bfloat16 where it has native bf16): in-process, the tests see a CPU
    without it, so they give the same numbers on every machine; tests of bf16 ask for it (or mock the
    CPU). Yields the real reader of the CPU's flags."""
    from llm import cpu_speed

    machine_flags = cpu_speed.cpu_flags
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            cpu_speed, "cpu_flags", lambda cpuinfo=None: set() if cpuinfo is None else machine_flags(cpuinfo)
        )
        yield machine_flags


@pytest.fixture
def mock_native_bf16(monkeypatch):
    """mock_native_bf16(True or False): the code then sees a CPU with or without native bf16."""
    from llm import cpu_speed

    def set_to(native: bool) -> None:
        monkeypatch.setattr(cpu_speed, "native_bf16", lambda flags=None: native)

    return set_to


@pytest.fixture(autouse=True)
def slow_tests_run_as_the_machine_would(request, monkeypatch, float32_on_every_cpu):
    """A slow test (the real model, loaded in the test) runs the precision this machine ships with."""
    if request.node.get_closest_marker("slow") is not None:
        from llm import cpu_speed

        monkeypatch.setattr(cpu_speed, "cpu_flags", float32_on_every_cpu)


def start_http_server(handler) -> tuple[ThreadingHTTPServer, str]:
    """A local HTTP server with `handler` (a BaseHTTPRequestHandler class) in a daemon thread, and its
    /query URL: the stand-in endpoints of the SPARQL client and endpoint-fault tests."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/query"


def stop_http_server(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def oxigraph_server(tmp_path_factory):
    """Factory fixture: oxigraph_server(rdf_path, timeout_s=30) -> SPARQL query URL."""
    servers: dict[tuple[Path, int], tuple[str, Path]] = {}

    def start_server(rdf_path: Path, timeout_s: int = 30) -> str:
        key = (Path(rdf_path).resolve(), timeout_s)
        if key not in servers:
            store = tmp_path_factory.mktemp("oxigraph-store")
            url = endpoint.start([key[0]], store, port=free_port(), timeout_s=timeout_s)
            servers[key] = (url, store)
        return servers[key][0]

    yield start_server
    for _, store in servers.values():
        endpoint.stop(store)


@pytest.fixture(scope="session")
def demo_endpoint(oxigraph_server) -> str:
    """URL of a real oxigraph server over the committed demo KG (data/demo/kg.ttl)."""
    kg = defaults.DEMO_DIR / "kg.ttl"
    assert kg.exists(), f"{kg} is committed: its absence is a broken checkout, not a reason to skip"
    return oxigraph_server(kg)


@pytest.fixture(scope="session")
def demo_search_index(demo_endpoint, tmp_path_factory) -> Path:
    """The demo index exactly as demo.sh builds it (embedding search for properties included), built from
    the demo endpoint into a temporary directory: for the slow tests of the README's answers."""
    out = tmp_path_factory.mktemp("demo-search-index")
    subprocess.run(
        [
            sys.executable,
            str(defaults.REPO_DIR / "build_index.py"),
            "--endpoint",
            demo_endpoint,
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out
