"""Early abort: time from a fatal log line to the verdict, against the readiness deadline.

Uses the FAKE server (tests/fakes/fake_crashing_server.py) replaying a real dynamo crash and then
hanging, as SGLang does after a scheduler dies. Target: <= 2 s from the fatal line to the verdict (a
benchmark, printed, not a timed assertion). Without early abort it would be the whole deadline: the baseline,
measured in the same run, is the same crash served as an engine whose signatures do not know the line
(transformers), under a short deadline; the ratio of the two is asserted.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from servematrix.backends import LaunchSpec
from servematrix.engines import Readiness
from servematrix.stages.serve import Server, free_port

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "fake_crashing_server.py"
LOG = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "dynamo-untraceable-sglang-0.5.10.log"
CRASH_AFTER_S = 1.0
DEADLINE_S = 600.0
BASELINE_DEADLINE_S = 10.0  # the baseline waits its deadline out: keep it short


def _abort_latency(tmp_path: Path, engine: str = "sglang", deadline_s: float = DEADLINE_S) -> float:
    port = free_port()
    launch = LaunchSpec(
        argv=(
            sys.executable,
            str(FAKE),
            "--port",
            str(port),
            "--replay",
            str(LOG),
            "--after",
            str(CRASH_AFTER_S),
            "--then",
            "hang",
            "--child",
        ),
        env=dict(os.environ),
        owns_listener=True,
    )
    readiness = Readiness(path="/health_generate", interval_s=10.0, timeout_s=deadline_s)
    with Server(
        launch, engine=engine, port=port, log_path=tmp_path / "fake.log", readiness=readiness, timeout_s=deadline_s
    ) as server:
        ready = server.wait_ready()  # includes killing the tree: the runner's hours stop here
        decided = time.time()
        # The fatal line is written CRASH_AFTER_S after start; the log's mtime is when it landed.
        fatal_written = (tmp_path / "fake.log").stat().st_mtime
    assert ready.verdict is not None
    if engine == "sglang":
        assert ready.verdict.detail == "dynamo-untraceable"
    return decided - fatal_written


def test_fatal_line_to_verdict(benchmark, tmp_path):
    latencies: list[float] = []

    def once() -> None:
        latencies.append(_abort_latency(tmp_path))

    benchmark.pedantic(once, rounds=3, iterations=1)
    worst = max(latencies)
    baseline = _abort_latency(tmp_path, engine="transformers", deadline_s=BASELINE_DEADLINE_S)
    benchmark.extra_info["fatal_to_verdict_s"] = worst
    benchmark.extra_info["baseline_no_early_abort_s"] = baseline
    print(
        f"\nfatal line -> verdict: worst {worst:.2f} s (target <= 2 s); without early abort (same crash, a "
        f"{BASELINE_DEADLINE_S:.0f} s deadline) {baseline:.2f} s: ratio {worst / baseline:.2f}; against the "
        f"{DEADLINE_S:.0f} s deadline it would be {worst / DEADLINE_S:.4f}"
    )
    assert worst / baseline < 0.5
