"""The serve stage against FAKE server processes (tests/fakes/fake_crashing_server.py), for the faults a
real SGLang cannot be made to show on a CPU: crash-then-hang, early exit, hang, a port already in use."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from servematrix.backends import LaunchSpec
from servematrix.engines import Readiness
from servematrix.stages.serve import Server, free_port

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "fake_crashing_server.py"
LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _server(tmp_path: Path, *fake_args: str, timeout_s: float = 20.0, port: int | None = None) -> Server:
    port = port or free_port()
    launch = LaunchSpec(
        argv=(sys.executable, str(FAKE), "--port", str(port), *fake_args), env=dict(os.environ), owns_listener=True
    )
    return Server(
        launch,
        engine="sglang",
        port=port,
        log_path=tmp_path / "server.log",
        readiness=Readiness(path="/health_generate", interval_s=0.2, timeout_s=timeout_s),
        timeout_s=timeout_s,
    )


def _tree(pid: int) -> list[int]:
    root = psutil.Process(pid)
    return [root.pid, *(c.pid for c in root.children(recursive=True))]


def _all_gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def test_fatal_line_aborts_early_and_kills_a_hung_tree(tmp_path):
    server = _server(
        tmp_path,
        "--replay",
        str(LOGS / "dynamo-untraceable-sglang-0.5.10.log"),
        "--after",
        "0.5",
        "--then",
        "hang",
        "--child",
        "--ignore-term",
        timeout_s=120,
    )
    with server:
        time.sleep(0.3)
        pids = _tree(server.pid)
        assert len(pids) >= 2  # the fake and its worker
        started = time.monotonic()
        ready = server.wait_ready()
        took = time.monotonic() - started
    assert not ready.ok
    assert ready.verdict is not None and ready.verdict.kind == "fail"
    assert ready.verdict.detail == "dynamo-untraceable"
    assert "Attempted to call function marked as skipped" in ready.verdict.excerpt
    assert took < 60  # far below the 120 s deadline; the ratio is measured in benchmarks
    assert _all_gone(pids)


def test_early_exit_gives_last_lines(tmp_path):
    with _server(tmp_path, "--after", "0.1", "--then", "exit", "--exit-code", "3") as server:
        ready = server.wait_ready()
    assert not ready.ok and ready.verdict is not None
    assert ready.verdict.detail == "server-exited"
    assert "exit code 3" in ready.verdict.excerpt
    assert "[fake] starting" in ready.verdict.excerpt


def test_hang_is_server_timeout(tmp_path):
    with _server(tmp_path, "--after", "0", "--child", timeout_s=1.5) as server:
        pids = _tree(server.pid)
        ready = server.wait_ready()
    assert not ready.ok and ready.verdict is not None
    assert ready.verdict.detail == "server-timeout"
    assert _all_gone(pids)


def test_ready_when_it_answers(tmp_path):
    with _server(tmp_path, "--serve-after", "0.3") as server:
        ready = server.wait_ready()
        assert ready.ok
        assert server.check() is None


class _Foreign(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Foreign)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


def test_port_in_use_is_not_mistaken_for_ready(tmp_path, foreign_server):
    # Another server answers 200 on the port: the harness must not call our (failed) server ready.
    with _server(tmp_path, "--bind", port=foreign_server) as server:
        ready = server.wait_ready()
    assert not ready.ok and ready.verdict is not None
    assert ready.verdict.detail in ("address-in-use", "server-exited")
    assert "address already in use" in ready.verdict.excerpt


# -- the log is redacted as it is written ---------------------------------------------------------

SECRET_KEY = "sk-" + "Lq8" * 10
HF_SECRET = "hf_" + "Mz5" * 10

# A server that echoes its arguments and a token, over and over, as real servers echo their config.
CHATTY_SERVER = """
import sys, time
while True:
    print("ServerArgs(argv=%r)" % (sys.argv[1:],), flush=True)
    print("downloading with token " + sys.argv[-1], flush=True)
    time.sleep(0.05)
"""

# The harness: a Server held open until the test SIGKILLs it.
HARNESS = """
import os, sys, time
from pathlib import Path
from servematrix.backends import LaunchSpec
from servematrix.engines import Readiness
from servematrix.stages.serve import Server

log, code, *server_args = sys.argv[1:]
launch = LaunchSpec(argv=(sys.executable, "-c", code, *server_args), env=dict(os.environ), owns_listener=True)
readiness = Readiness(path="/", interval_s=1.0, timeout_s=600)
with Server(launch, engine="transformers", port=1, log_path=Path(log), readiness=readiness, timeout_s=600) as server:
    print(server.pid, flush=True)
    time.sleep(600)
"""


def test_a_sigkilled_harness_leaves_no_secret_in_the_log(tmp_path):
    log = tmp_path / "logs" / "cell.log"
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(log), CHATTY_SERVER, "--api-key", SECRET_KEY, HF_SECRET],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert harness.stdout is not None
    server_pid = int(harness.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and log.read_text().count("downloading with token") < 5:
            time.sleep(0.05)
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=10)
        time.sleep(0.3)  # the orphaned server goes on printing into a pipe nobody reads
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server_pid, signal.SIGKILL)
    text = log.read_text()
    assert text.count("downloading with token") >= 5  # the server's output did reach the file
    assert SECRET_KEY not in text and HF_SECRET not in text


def test_secret_flag_values_of_the_launch_are_redacted_in_the_log(tmp_path):
    """A secret with no telltale shape is known by its flag: its value is redacted wherever the server echoes it."""
    plain = "correct-horse-battery"
    code = "import sys; print('ServerArgs(dsn=%s)' % sys.argv[2], flush=True); print('ready', flush=True)"
    launch = LaunchSpec(argv=(sys.executable, "-c", code, "--db-dsn", plain), env=dict(os.environ), owns_listener=True)
    server = Server(
        launch,
        engine="transformers",
        port=free_port(),
        log_path=tmp_path / "server.log",
        readiness=Readiness(path="/", interval_s=0.2, timeout_s=10),
        timeout_s=10,
        secret_flags=("--db-dsn",),
    )
    with server:
        ready = server.wait_ready()
    assert not ready.ok
    text = (tmp_path / "server.log").read_text()
    assert "ServerArgs(dsn=" in text and "ready" in text
    assert plain not in text and plain not in (ready.verdict.excerpt if ready.verdict else "")


def test_a_crash_printing_huge_lines_gives_a_bounded_excerpt(tmp_path):
    """M8: a server that prints a huge repr (30 lines of 200,000 characters) and exits: the excerpt is a
    bounded number of bounded lines, ending with what it printed last."""
    replay = tmp_path / "huge.log"
    replay.write_text("".join(f"line{i} " + "y" * 200_000 + "\n" for i in range(30)))
    with _server(tmp_path, "--replay", str(replay), "--after", "0.1", "--then", "exit") as server:
        ready = server.wait_ready()
    assert not ready.ok and ready.verdict is not None and ready.verdict.detail == "server-exited"
    excerpt = ready.verdict.excerpt
    assert len(excerpt) < 40_000
    assert all(len(line) <= 1000 for line in excerpt.splitlines())
    assert "line29 yyy" in excerpt.splitlines()[-1] and "characters cut" in excerpt


STUBBORN_SERVER = """
import os, signal, subprocess, sys, time
mode, pids = sys.argv[1], sys.argv[2]
def record(pid):
    with open(pids, "a") as f:
        f.write(f"{pid}\\n")
if mode == "respawn":  # a SIGTERM starts a worker (in the server's group) and is otherwise ignored
    signal.signal(signal.SIGTERM, lambda *_: record(subprocess.Popen(["sleep", "300"]).pid))
elif mode == "daemon":  # a worker that leaves the group: double fork, setsid, SIGTERM ignored
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            record(os.getpid())
            time.sleep(300)
            os._exit(0)
        os._exit(0)
print("started", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("mode", ["respawn", "daemon"])
def test_teardown_kills_every_process_carrying_the_servers_marker(tmp_path, mode):
    """M1, M2: a worker started while the server is being stopped, or one that left the server's group, is
    not in the teardown's first snapshot of the tree and the group; it carries the harness marker, and the
    teardown finds and kills it by that."""
    pids = tmp_path / "pids"
    launch = LaunchSpec(
        argv=(sys.executable, "-c", STUBBORN_SERVER, mode, str(pids)), env=dict(os.environ), owns_listener=True
    )
    server = Server(
        launch,
        engine="sglang",
        port=free_port(),
        log_path=tmp_path / "server.log",
        readiness=Readiness(path="/health", interval_s=0.2, timeout_s=5),
        timeout_s=5,
        marker="r1/c-stubborn",
    )
    server.__enter__()  # one stop, as a run's teardown does (a second one would snapshot the group again)
    try:
        deadline = time.monotonic() + 10
        while "started" not in (tmp_path / "server.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        server.stop(grace_s=1.0)
    workers = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    assert workers, "the server started no worker"
    assert _all_gone(workers), [psutil.Process(p).cmdline() for p in workers if psutil.pid_exists(p)]
