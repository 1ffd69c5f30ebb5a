"""Readiness at the engine's ready line: one confirming request as soon as the log says so, not at the
next poll. sglang's poll was every 10 s, and a real H200 start was confirmed 10 s after its ready line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from servematrix.backends import LaunchSpec
from servematrix.engines import Readiness, load_engine
from servematrix.run import ports
from servematrix.stages.serve import Server

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "fake_derived_port_server.py"
READY_LINE = load_engine("sglang").readiness.ready_log


def _server(tmp_path: Path, ready_log: str, interval_s: float = 60.0, confirm_path: str = "") -> Server:
    port = ports.pick_port((10000,))
    # The first poll finds nothing; /health_generate answers slowly, as sglang's does.
    argv = (sys.executable, str(FAKE), "--port", str(port), "--delay", "1.5", "--slow-path", "/health_generate",
            "--slow-s", "1.5")  # fmt: skip
    launch = LaunchSpec(argv=argv, env=dict(os.environ), owns_listener=True)
    # A poll interval far longer than the test: only the ready line can make it quick.
    readiness = Readiness(
        path="/health_generate", interval_s=interval_s, timeout_s=90.0, ready_log=ready_log, confirm_path=confirm_path
    )
    return Server(launch, engine="sglang", port=port, log_path=tmp_path / "s.log", readiness=readiness, timeout_s=90.0)


def test_ready_within_a_second_of_the_ready_line(tmp_path):
    assert READY_LINE == "The server is fired up and ready to roll!"
    assert load_engine("sglang").readiness.confirm_path == "/v1/models"
    with _server(tmp_path, READY_LINE, confirm_path="/v1/models") as server:
        ready = server.wait_ready()
    assert ready.ok
    assert ready.after_ready_line_s is not None and ready.after_ready_line_s < 1.0
    assert 1.5 <= ready.seconds < 30  # after the start-up, long before the next 60 s poll


def test_confirming_with_the_slow_path_costs_its_delay(tmp_path):
    # Why sglang confirms with /v1/models: its health endpoints wait in 1 s steps (1.05-1.07 s on an H200).
    with _server(tmp_path, READY_LINE) as server:
        ready = server.wait_ready()
    assert ready.ok and ready.after_ready_line_s is not None and ready.after_ready_line_s >= 1.5


def test_without_the_line_only_the_poll_decides(tmp_path):
    with _server(tmp_path, "a line this server never prints", interval_s=4.0) as server:
        ready = server.wait_ready()
    assert ready.ok and ready.after_ready_line_s is None
    assert ready.seconds >= 4.0  # the first poll came too early; the second, a full interval later
