"""Start, stop and inspect a local read-only SPARQL endpoint (oxigraph) over RDF files.

GRISP's KG guidance (constrained search, backtracking, final validation; paper Section 3) and its
evaluation query a SPARQL endpoint over HTTP. This script gives an offline one: it loads RDF files
into an oxigraph store directory with the `oxigraph` CLI (PyPI package `oxigraph`), serves it
read-only on localhost with a per-query timeout in the background, waits until it answers, and
prints the endpoint URL. The store is stamped with the data files' SHA-256: starting again over
unchanged files reuses it, changed files are reloaded. The store directory also holds the server's
pid file (`server.json`), its log (`server.log`) and a lock file (`server.lock`: one start or stop at
a time per store).

    python endpoint.py start                       # the demo KG data/demo/kg.ttl on port 7878
    python endpoint.py start --data my.ttl more.nt --store /tmp/mystore --port 7879
    python endpoint.py status                      # python endpoint.py stop
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import defaults
from common.jsonl import write_atomic, write_json
from grisp.sparql import SparqlClient, SparqlError

RDF_SUFFIXES = (".ttl", ".nt", ".nq", ".trig", ".rdf", ".xml", ".owl", ".n3", ".jsonld")


class EndpointError(Exception):
    """An expected failure (missing file, bad RDF, busy port, oxigraph missing); message says the fix."""


def oxigraph_binary() -> str:
    """Path of the `oxigraph` CLI, next to this Python interpreter or on PATH."""
    beside = Path(sys.executable).with_name("oxigraph")
    found = str(beside) if beside.exists() else shutil.which("oxigraph")
    if found is None:
        raise EndpointError("the oxigraph CLI was not found; install it with: pip install oxigraph")
    return found


def _run_env() -> dict[str, str]:
    return {**os.environ, "RUST_BACKTRACE": "0"}  # keep oxigraph's error messages short


def data_stamp(files: list[Path]) -> dict:
    """What the store was loaded from: each file's absolute path and SHA-256, and the oxigraph version."""
    entries = []
    for path in files:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        entries.append([str(path.resolve()), digest.hexdigest()])
    version = subprocess.run([oxigraph_binary(), "--version"], capture_output=True, text=True).stdout
    return {"files": entries, "oxigraph": version.strip()}


def check_data(files: list[Path]) -> None:
    for path in files:
        if not path.is_file():
            raise EndpointError(f"RDF file {path} does not exist; pass existing files with --data")
        if path.suffix.lower() not in RDF_SUFFIXES:
            raise EndpointError(
                f"cannot tell the RDF format of {path} from its extension; "
                f"rename it to one of {', '.join(RDF_SUFFIXES)}"
            )


def load_store(files: list[Path], store_dir: Path) -> bool:
    """Load `files` into `store_dir/db` unless its stamp matches; returns True if it (re)loaded."""
    check_data(files)
    stamp, stamp_path, db = data_stamp(files), store_dir / "stamp.json", store_dir / "db"
    if db.is_dir() and _read_stamp(stamp_path) == stamp:
        return False
    # load into a fresh directory first, so a failed load never leaves a half store behind
    tmp = store_dir / "db.loading"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    cmd = [oxigraph_binary(), "load", "--location", str(tmp), "--file", *map(str, files)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_run_env())
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = [line for line in done.stderr.splitlines() if "rror" in line] or done.stderr.splitlines()[-3:]
        raise EndpointError(f"oxigraph could not load {', '.join(map(str, files))}:\n  " + "\n  ".join(lines))
    stamp_path.unlink(missing_ok=True)
    shutil.rmtree(db, ignore_errors=True)
    tmp.rename(db)
    write_json(stamp_path, stamp)  # atomic: a cut-off stamp would make every later start fail
    return True


def _read_stamp(path: Path) -> dict | None:
    """The stamp a finished load wrote, or None (none yet, or unreadable: the store is loaded again)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _alive(pid: int) -> bool:
    """True if process `pid` runs (a zombie, i.e. exited but not yet reaped, counts as dead)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


def _server_info(store_dir: Path) -> dict | None:
    """The pid file of a server that still runs over this store, else None (stale files removed)."""
    path = store_dir / "server.json"
    if not path.exists():
        return None
    try:
        info = json.loads(path.read_text())
        int(info["pid"])
    except (ValueError, KeyError, TypeError):  # not a file this script wrote: no server to speak of
        print(f"warning: {path} is not a server record; removed", file=sys.stderr)
        path.unlink()
        return None
    cmdline = Path(f"/proc/{info['pid']}/cmdline")
    ours = not cmdline.exists() or str(store_dir / "db") in cmdline.read_text().replace("\0", " ")
    if _alive(info["pid"]) and ours:  # a recycled pid of some other program is not ours to stop
        return info
    path.unlink()
    return None


def _host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets (`[::1]:7878`), as URLs and oxigraph's --bind write it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_port(port: int) -> None:
    """Raise EndpointError unless `port` is a TCP port a server can listen on (0 asks the system for any
    free port: the server would run, but not at the URL this module waits on and hands out)."""
    if not 1 <= port <= 65535:
        raise EndpointError(f"port {port} is not a TCP port; pick one in 1..65535 with --port")


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # an IPv4 socket cannot bind ::1
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _answers(url: str) -> bool:
    client = SparqlClient(url, retries=0, connect_timeout_s=1.0, read_timeout_s=5.0)
    try:
        return client.query("ASK {}").boolean is not None
    except SparqlError:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def _locked(store_dir: Path):
    """Hold the store's lock file (an fcntl lock: released when closed, also if this process dies)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    with open(store_dir / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def start(
    files: list[Path],
    store_dir: Path,
    port: int = 7878,
    timeout_s: int = 30,
    host: str = "127.0.0.1",
    wait_s: float = 60.0,
) -> str:
    """Load (if needed) and serve `files` read-only in the background; returns the query URL.

    A server already running over the same store, data, port and timeout is reused; one with other
    settings is stopped first.
    """
    store_dir, host = Path(store_dir).expanduser().resolve(), host.removeprefix("[").removesuffix("]")
    check_port(port)
    check_data(files)
    with _locked(
        store_dir
    ):  # one start or stop per store at a time: two starts could both find the port free
        return _start(files, store_dir, port, timeout_s, host, wait_s)


def _start(files: list[Path], store_dir: Path, port: int, timeout_s: int, host: str, wait_s: float) -> str:
    """start() with the store's lock held."""
    url = f"http://{_host_port(host, port)}/query"
    info = _server_info(store_dir)
    if info is not None:
        same = info["url"] == url and info["timeout_s"] == timeout_s and info["stamp"] == data_stamp(files)
        if same and _answers(url):
            return url
        _stop(store_dir)
    load_store(files, store_dir)
    if not _port_free(host, port):
        raise EndpointError(
            f"port {port} on {host} is already in use by another program; "
            f"pick a free one with --port, or stop that program"
        )
    # --- launch in its own session, so the server outlives this process and Ctrl-C here
    log = open(store_dir / "server.log", "ab")
    cmd = [
        oxigraph_binary(),
        "serve-read-only",
        "--location",
        str(store_dir / "db"),
        "--bind",
        _host_port(host, port),
        "--timeout-s",
        str(timeout_s),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=_run_env(),
    )
    log.close()
    info = {"pid": proc.pid, "url": url, "timeout_s": timeout_s, "stamp": data_stamp(files)}
    write_atomic(store_dir / "server.json", lambda tmp: tmp.write_text(json.dumps(info, indent=1)))
    # --- wait until it answers a query, while it runs (another program that took the port answers too)
    deadline = time.monotonic() + wait_s
    # a check takes up to 6 s: its answer decides, even when it comes after the deadline
    while not (up := _answers(url)) and proc.poll() is None and time.monotonic() <= deadline:
        time.sleep(0.1)
    if not up or proc.poll() is not None:
        _stop(store_dir)
        tail = (store_dir / "server.log").read_text(errors="replace").splitlines()[-5:]
        raise EndpointError(f"oxigraph did not come up on {url}; last log lines:\n  " + "\n  ".join(tail))
    return url


def stop(store_dir: Path) -> bool:
    """Stop the server running over `store_dir`; returns False if none was running."""
    store_dir = Path(store_dir).expanduser().resolve()
    if not store_dir.is_dir():
        return False
    with _locked(store_dir):
        return _stop(store_dir)


def _stop(store_dir: Path) -> bool:
    """stop() with the store's lock held."""
    info = _server_info(store_dir)
    if info is None:
        return False
    try:
        os.kill(info["pid"], signal.SIGTERM)
    except ProcessLookupError:  # it exited on its own after _server_info looked
        (store_dir / "server.json").unlink(missing_ok=True)
        return False
    for _ in range(50):
        if not _alive(info["pid"]):
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):  # it may end between the last check and the kill
            os.kill(info["pid"], signal.SIGKILL)
        for _ in range(50):  # until the port is free again
            if not _alive(info["pid"]):
                break
            time.sleep(0.1)
    (store_dir / "server.json").unlink(missing_ok=True)
    return True


def status(store_dir: Path) -> dict | None:
    """{'pid', 'url', 'timeout_s', 'stamp', 'triples'} of the running server, or None."""
    info = _server_info(Path(store_dir).expanduser().resolve())
    if info is None:
        return None
    client = SparqlClient(info["url"], retries=0, read_timeout_s=30.0)
    try:
        result = client.query("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")
        info["triples"] = int(result.rows[0]["n"]["value"])
    except SparqlError as e:
        info["triples"] = f"unknown ({e})"
    finally:
        client.close()
    return info


def main(args: argparse.Namespace) -> None:
    store = args.store.expanduser()
    if args.command == "start":
        url = start(
            [Path(f) for f in args.data],
            store,
            port=args.port,
            timeout_s=args.timeout_s,
            host=args.host,
            wait_s=args.wait_s,
        )
        print(url)
    elif args.command == "stop":
        print(
            f"stopped the endpoint over {store}" if stop(store) else f"no endpoint was running over {store}"
        )
    else:
        info = status(store)
        if info is None:
            print(f"no endpoint is running over {store} (start one: python endpoint.py start)")
            sys.exit(1)
        files = ", ".join(path for path, _ in info["stamp"]["files"])
        print(
            f"running: {info['url']} (pid {info['pid']}, timeout {info['timeout_s']} s, "
            f"{info['triples']} triples from {files})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "command",
        choices=["start", "stop", "status"],
        help="start: load and serve in the background; stop: stop it; status: report",
    )
    # data
    parser.add_argument(
        "--data",
        type=Path,
        nargs="+",
        default=[str(defaults.DEMO_DIR / "kg.ttl")],
        help="RDF file(s) to serve (.ttl .nt .nq .trig .rdf ...)",
    )
    parser.add_argument(
        "--store",
        type=Path,
        default=defaults.DEMO_STORE_DIR,
        help="store directory (database, data stamp, pid file and log)",
    )
    # server
    parser.add_argument("--port", type=int, default=7878, help="TCP port to serve on")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (keep it local), e.g. ::1 for IPv6"
    )
    parser.add_argument(
        "--timeout-s",
        type=int,
        default=30,
        help="per-query timeout of the server (s); oxigraph checks it only now and then, "
        "so clients should set their own read timeout too",
    )
    parser.add_argument(
        "--wait-s", type=float, default=60.0, help="how long to wait for the server to answer"
    )
    try:
        main(parser.parse_args())
    except EndpointError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
