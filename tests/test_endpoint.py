"""endpoint.py: a real oxigraph server loads a tiny KG, answers, reuses or reloads its store, and
reports bad input (missing or invalid RDF, busy port) clearly."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import free_port

import endpoint
from grisp.sparql import SparqlClient

REPO = Path(__file__).resolve().parents[1]
KG = """@prefix wd: <http://www.wikidata.org/entity/> .
@prefix wdt: <http://www.wikidata.org/prop/direct/> .
wd:Q104123 wdt:P57 wd:Q3772 .
wd:Q3772 wdt:P19 wd:Q185582 .
"""


def ask(url: str, query: str) -> bool:
    client = SparqlClient(url, retries=0)
    try:
        return client.query(query).boolean
    finally:
        client.close()


def test_fixture_server_loads_and_answers(oxigraph_server, tmp_path_factory):
    kg = tmp_path_factory.mktemp("kg") / "kg.ttl"
    kg.write_text(KG)
    url = oxigraph_server(kg)
    client = SparqlClient(url)
    result = client.query("SELECT ?place WHERE { wd:Q104123 wdt:P57 ?d . ?d wdt:P19 ?place }")
    assert result.iris() == ["http://www.wikidata.org/entity/Q185582"]
    assert oxigraph_server(kg) == url, "the same file must reuse the running server"


def test_reuse_unchanged_store_and_reload_changed_file(tmp_path):
    kg, store = tmp_path / "kg.ttl", tmp_path / "store"
    kg.write_text(KG)
    try:
        url = endpoint.start([kg], store, port=free_port())
        pid = endpoint.status(store)["pid"]
        assert endpoint.status(store)["triples"] == 2
        # unchanged data and settings: the running server is reused as is
        assert endpoint.start([kg], store, port=urlparse(url).port) == url
        assert endpoint.status(store)["pid"] == pid
        assert endpoint.load_store([kg], store) is False, "an unchanged file must not be reloaded"
        # a changed file: the server is restarted over a reloaded store
        kg.write_text(KG + "wd:Q3772 wdt:P106 wd:Q2526255 .\n")
        url = endpoint.start([kg], store, port=free_port())
        assert endpoint.status(store)["triples"] == 3
        assert ask(url, "ASK { wd:Q3772 wdt:P106 wd:Q2526255 }")
    finally:
        endpoint.stop(store)
    assert endpoint.status(store) is None
    assert endpoint.stop(store) is False, "stopping twice reports that nothing ran"


def test_bad_rdf_is_reported_and_leaves_no_store(tmp_path):
    bad = tmp_path / "bad.ttl"
    bad.write_text("<http://e/a> <http://e/b> .\n")  # a triple without object
    with pytest.raises(endpoint.EndpointError, match=r"(?s)could not load .*bad\.ttl.*line 1"):
        endpoint.start([bad], tmp_path / "store", port=free_port())
    assert not (tmp_path / "store" / "db").exists()
    with pytest.raises(endpoint.EndpointError, match="does not exist"):
        endpoint.start([tmp_path / "missing.ttl"], tmp_path / "store", port=free_port())
    odd = tmp_path / "kg.data"
    odd.write_text(KG)
    with pytest.raises(endpoint.EndpointError, match="extension"):
        endpoint.start([odd], tmp_path / "store", port=free_port())


def test_an_ipv6_host_is_served_and_its_url_has_brackets(tmp_path):
    kg, store, port = tmp_path / "kg.ttl", tmp_path / "store", free_port()
    kg.write_text(KG)
    try:
        url = endpoint.start([kg], store, port=port, host="::1")
        assert url == f"http://[::1]:{port}/query" and ask(url, "ASK { wd:Q104123 wdt:P57 wd:Q3772 }")
        assert not endpoint._port_free("::1", port)
    finally:
        endpoint.stop(store)


def test_busy_port_is_reported(tmp_path):
    kg = tmp_path / "kg.ttl"
    kg.write_text(KG)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(endpoint.EndpointError, match=f"port {port} .* in use"):
            endpoint.start([kg], tmp_path / "store", port=port)
    assert endpoint.status(tmp_path / "store") is None


def test_a_server_that_dies_at_start_is_reported_though_another_answers(tmp_path, monkeypatch):
    # the port was free when checked, then another program took it: its answers are not our server's
    kg = tmp_path / "kg.ttl"
    kg.write_text(KG)
    monkeypatch.setattr(
        endpoint, "load_store", lambda files, store_dir: Path(store_dir).mkdir(parents=True, exist_ok=True)
    )
    monkeypatch.setattr(endpoint, "oxigraph_binary", lambda: "false")  # exits at once
    monkeypatch.setattr(endpoint, "_answers", lambda url: True)
    with pytest.raises(endpoint.EndpointError, match="did not come up"):
        endpoint.start([kg], tmp_path / "store", port=free_port())
    assert not (tmp_path / "store" / "server.json").exists()


def test_a_server_that_answers_after_the_wait_is_kept(tmp_path, monkeypatch):
    # the check itself takes up to 6 s: its answer decides, not the clock after it
    kg, store = tmp_path / "kg.ttl", tmp_path / "store"
    kg.write_text(KG)
    answers = endpoint._answers

    def slow_answers(url: str) -> bool:
        for _ in range(100):  # as one slow check that ends with an answer
            if answers(url):
                return True
            time.sleep(0.05)
        return False

    monkeypatch.setattr(endpoint, "_answers", slow_answers)
    try:
        url = endpoint.start([kg], store, port=free_port(), wait_s=0.0)
        assert ask(url, "ASK { wd:Q104123 wdt:P57 wd:Q3772 }") and endpoint.status(store) is not None
    finally:
        endpoint.stop(store)


def test_two_starts_at_once_launch_one_server(tmp_path, monkeypatch):
    # both would find the port free (the check is slowed here to make sure they overlap) and launch
    kg, store, port = tmp_path / "kg.ttl", tmp_path / "store", free_port()
    kg.write_text(KG)
    endpoint.load_store([kg], store)
    port_free, popen, launched = endpoint._port_free, subprocess.Popen, []

    def slow_port_free(host: str, port: int) -> bool:
        free = port_free(host, port)
        time.sleep(0.3)
        return free

    def recording_popen(cmd, **kwargs):
        proc = popen(cmd, **kwargs)
        if "serve-read-only" in cmd:
            launched.append(proc)
        return proc

    monkeypatch.setattr(endpoint, "_port_free", slow_port_free)
    monkeypatch.setattr(endpoint.subprocess, "Popen", recording_popen)
    results = []

    def start() -> None:
        try:
            results.append(endpoint.start([kg], store, port=port))
        except endpoint.EndpointError as e:
            results.append(e)

    threads = [threading.Thread(target=start) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        url = f"http://127.0.0.1:{port}/query"
        assert results == [url, url] and len(launched) == 1
        assert endpoint.status(store)["pid"] == launched[0].pid
    finally:
        endpoint.stop(store)
        for proc in launched:  # a server left without a pid file (the old race) is ended here
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("text", ['{"pid": 12', "", '{"url": "x"}', "[1]"])
def test_a_broken_server_record_counts_as_no_server(tmp_path, text):
    (tmp_path / "server.json").write_text(text)
    assert endpoint.stop(tmp_path) is False and endpoint.status(tmp_path) is None
    assert not (tmp_path / "server.json").exists()


def test_a_cut_off_stamp_means_load_again(tmp_path):
    kg, store = tmp_path / "kg.ttl", tmp_path / "store"
    kg.write_text(KG)
    assert endpoint.load_store([kg], store) is True
    (store / "stamp.json").write_text(
        '{"files": ['
    )  # a load killed while writing its stamp (before: crashed every start)
    assert endpoint.load_store([kg], store) is True and endpoint.load_store([kg], store) is False


def test_a_server_that_exits_just_before_stop_is_no_error(tmp_path, monkeypatch):
    (tmp_path / "server.json").write_text('{"pid": 12, "url": "http://127.0.0.1:1/query"}')
    monkeypatch.setattr(
        endpoint, "_server_info", lambda store: {"pid": 2**22 + 12345, "url": "x"}
    )  # no such pid
    assert endpoint.stop(tmp_path) is False and not (tmp_path / "server.json").exists()


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "endpoint.py"), *args], capture_output=True, text=True, cwd=REPO
    )


def test_cli_help_and_clear_errors(tmp_path):
    assert run_script("--help").returncode == 0
    done = run_script("start", "--data", str(tmp_path / "nope.ttl"), "--store", str(tmp_path / "s"))
    assert done.returncode != 0
    assert "nope.ttl does not exist" in done.stderr and "Traceback" not in done.stderr
    for port in (
        "70000",
        "0",
    ):  # refused before the store is loaded (70000 was an OverflowError, 0 a minute's wait)
        done = run_script("start", "--port", port, "--store", str(tmp_path / "s"), "--wait-s", "5")
        assert done.returncode != 0 and f"port {port} is not a TCP port" in done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "s" / "db").exists()
    done = run_script("status", "--store", str(tmp_path / "s"))
    assert done.returncode != 0 and "no endpoint is running" in done.stdout


def test_missing_oxigraph_is_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(endpoint.shutil, "which", lambda name: None)
    monkeypatch.setattr(endpoint.sys, "executable", str(tmp_path / "bin" / "python"))
    with pytest.raises(endpoint.EndpointError, match="pip install oxigraph"):
        endpoint.oxigraph_binary()
