"""The serve stage with a server that writes past its log's bounds (attack L2 of 2026-12-06): the FAKE server
(tests/fakes/fake_crashing_server.py) floods real SGLang decode lines, then prints a real ready line or a
real crash log. Its ready and fatal lines are seen as it writes them, wherever they fall in the log; the
file keeps a bounded head and tail with a marker that says what it left out, and the crash, printed last,
is named again from the file."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from servematrix.backends import LaunchSpec
from servematrix.classify import match_file
from servematrix.engines import Readiness, load_engine
from servematrix.stages.serve import Server, free_port
from servematrix.stages.serverlog import LogBounds, gap_marker
from tests.unit.stages.test_serverlog import MARKER, _split

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "fake_crashing_server.py"
LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
BOUNDS = LogBounds(head=64 * 1024, tail=64 * 1024)
FLOOD = 512 * 1024  # eight times either bound
DECODE_LINE = (
    b"[2026-12-03 06:26:06] Decode batch, #running-req: 1, #token: 299, token usage: 0.00, cuda graph: True, "
    b"gen throughput (token/s): 364.30, #queue-req: 0\n"
)
SGLANG_READY = load_engine("sglang").readiness


def _server(tmp_path: Path, *fake_args: str, readiness: Readiness, port: int) -> Server:
    launch = LaunchSpec(
        argv=(sys.executable, str(FAKE), "--port", str(port), "--after", "0", *fake_args),
        env=dict(os.environ),
        owns_listener=True,
    )
    return Server(
        launch,
        engine="sglang",
        port=port,
        log_path=tmp_path / "server.log",
        readiness=readiness,
        timeout_s=readiness.timeout_s,
        log_bounds=BOUNDS,
    )


def _flooded(size: int) -> int:
    """The bytes the fake writes for `--flood size`: whole blocks of 512 decode lines."""
    block = len(DECODE_LINE) * 512
    return -(-size // block) * block


def _bounded(log: Path) -> tuple[bytes, int, bytes]:
    """The log's head, the bytes its marker says were left out, and its tail; checked to be within bounds."""
    text = log.read_bytes()
    head, marker, tail = _split(text)
    assert len(head) <= BOUNDS.head and len(tail) <= BOUNDS.tail
    assert len(text) <= BOUNDS.head + BOUNDS.tail + len(gap_marker(int(marker[1]), int(marker[2]), BOUNDS))
    return head, int(marker[1]), tail


def test_a_ready_line_the_log_leaves_out_is_seen_and_the_server_is_ready(tmp_path):
    """The ready line comes after the head's bound, and more than a tail follows it: it is in no part of the
    file, and the harness still saw it (the readiness poll is an hour apart: only the line can make it ready
    within the test's deadline)."""
    lines = (LOGS / "h200-sglang-0.5.12-baseline-server.log").read_text().splitlines(keepends=True)
    ready_at = next(i for i, line in enumerate(lines) if SGLANG_READY.ready_log in line)
    (tmp_path / "replay.log").write_text("".join(lines[: ready_at + 1]))
    readiness = Readiness(
        path=SGLANG_READY.path,
        confirm_path=SGLANG_READY.confirm_path,
        ready_log=SGLANG_READY.ready_log,
        interval_s=3600,
        timeout_s=120,
    )
    args = ("--flood", str(FLOOD), "--replay", str(tmp_path / "replay.log"), "--serve-when-replayed")
    with _server(
        tmp_path, *args, "--flood-after", str(FLOOD), "--then", "hang", readiness=readiness, port=free_port()
    ) as server:
        ready = server.wait_ready()
        assert ready.ok and ready.after_ready_line_s is not None
        assert server.check() is None
        # Let it write the rest of its flood and its last line before the teardown.
        deadline = time.monotonic() + 60
        while b"[fake] flooded" not in (tmp_path / "server.log").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
    head, dropped, tail = _bounded(tmp_path / "server.log")
    log = head + tail
    assert SGLANG_READY.ready_log.encode() not in log  # left out of the file ...
    assert head.startswith(b"[fake] starting on") and tail.endswith(b"[fake] flooded\n")
    replayed = (tmp_path / "replay.log").stat().st_size
    start_line = len(f"[fake] starting on 127.0.0.1:{server.port}\n")
    total = start_line + _flooded(FLOOD) + replayed + _flooded(FLOOD) + len(b"[fake] flooded\n")
    assert len(head) + dropped + len(tail) == total  # ... and the marker says exactly how much was


def test_a_fatal_line_past_the_logs_bound_ends_the_cell_with_its_class_named_from_the_scan_and_the_tail(tmp_path):
    """A real sglang crash log after the flood, then the hang a dead scheduler leaves: the doomed server is
    killed at its fatal line, named as the real log's class; the file is bounded, and its tail holds the
    crash, so the log names the same class when it is read again (`servematrix reclassify`)."""
    crash = LOGS / "dynamo-untraceable-sglang-0.5.10.log"
    readiness = Readiness(path="/health_generate", interval_s=0.2, timeout_s=120)
    args = ("--flood", str(FLOOD), "--replay", str(crash), "--then", "hang", "--child", "--ignore-term")
    with _server(tmp_path, *args, readiness=readiness, port=free_port()) as server:
        ready = server.wait_ready()
    assert not ready.ok and ready.verdict is not None
    assert str(ready.verdict).startswith("fail:dynamo-untraceable")
    assert "Attempted to call function marked as skipped" in ready.verdict.excerpt
    _, dropped, tail = _bounded(tmp_path / "server.log")
    assert dropped > 0 and tail.endswith(crash.read_bytes())
    found = match_file(tmp_path / "server.log", "sglang")
    assert found is not None and found.cls == "dynamo-untraceable"


def test_a_server_that_exits_after_flooding_is_named_from_the_end_of_its_output(tmp_path):
    """Exit after the flood and a traceback no signature marks fatal: the verdict comes when the process
    ends, from the scan of everything it wrote; the file's tail names the same class."""
    crash = LOGS / "python-exception.log"
    readiness = Readiness(path="/health", interval_s=0.2, timeout_s=120)
    args = ("--flood", str(FLOOD), "--replay", str(crash), "--then", "exit", "--exit-code", "1")
    with _server(tmp_path, *args, readiness=readiness, port=free_port()) as server:
        ready = server.wait_ready()
    assert not ready.ok and ready.verdict is not None
    assert ready.verdict.detail == "python-exception"
    _, dropped, tail = _bounded(tmp_path / "server.log")
    assert dropped > 0 and tail.endswith(crash.read_bytes())
    found = match_file(tmp_path / "server.log", "sglang")
    assert found is not None and found.cls == "python-exception"
    assert MARKER.search((tmp_path / "server.log").read_bytes())


def test_a_fault_of_the_scan_in_the_pumps_thread_is_raised_where_the_verdict_is_made(tmp_path):
    """The scan runs in the pump's thread: its exception must not vanish with that thread (a harness error,
    not a server that looks silent), and the pump still drains the server into its bounded log."""
    readiness = Readiness(path="/health", interval_s=0.2, timeout_s=120)
    server = _server(tmp_path, "--flood", str(FLOOD), "--then", "hang", readiness=readiness, port=free_port())

    def broken(line: str, *, truncated: bool = False) -> None:
        raise RuntimeError("a bug in the scan")

    server._scanner.feed = broken  # type: ignore[method-assign]
    with server:
        try:
            server.wait_ready()
        except RuntimeError as exc:
            raised = str(exc)
        else:
            raised = ""
        deadline = time.monotonic() + 60
        while not MARKER.search((tmp_path / "server.log").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert raised == "a bug in the scan"
    _bounded(tmp_path / "server.log")
