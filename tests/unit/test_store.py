"""The SQLite store: resumable rows, unchanged-input skips, idempotent merges, orphan reaping."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from servematrix.pipeline import reap_orphans
from servematrix.store import Store


def _row(run_id: str, cell_id: str, **extra):
    return {
        "run_id": run_id,
        "cell_id": cell_id,
        "env_id": "e1",
        "engine": "transformers",
        "mode": "static",
        "matrix": "m.toml",
        "axes": {"transformers": "5.24.0", "gpu": "cpu"},
        "inputs_hash": "h1",
        **extra,
    }


def test_finished_rows_are_found_by_inputs(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.start(**_row("r1", "c1"))
        assert store.finished("c1", "h1") is None  # still running
        store.finish("r1", "c1", verdict="pass", metrics={"levels": []})
        assert store.finished("c1", "h1")["verdict"] == "pass"
        assert store.finished("c1", "other-inputs") is None


def test_error_and_interrupted_are_run_again(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.record(**_row("r1", "c1"), verdict="error:resolve")
        store.record(**_row("r1", "c2"), verdict="interrupted")
        store.record(**_row("r1", "c3"), verdict="fail:dynamo-untraceable")
        assert store.finished("c1", "h1") is None
        assert store.finished("c2", "h1") is None
        assert store.finished("c3", "h1") is not None


def test_latest_takes_the_newest_finished_run(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.record(**_row("r1", "c1"), verdict="fail:server-timeout")
        time.sleep(1.1)
        store.record(**_row("r2", "c1"), verdict="pass")
        store.start(**_row("r3", "c1"))
        (latest,) = store.latest()
        assert latest["run_id"] == "r2" and latest["verdict"] == "pass"
        assert latest["axes"] == {"transformers": "5.24.0", "gpu": "cpu"}


def test_merge_is_idempotent(tmp_path):
    for name, run in (("a", "ra"), ("b", "rb")):
        with Store(tmp_path / f"{name}.sqlite") as shard:
            shard.record(**_row(run, "c1"), verdict="pass")
            shard.record(**_row(run, "c2"), verdict="fail:cuda-oom")
    with Store(tmp_path / "out.sqlite") as out:
        assert out.merge_from(tmp_path / "a.sqlite") == 2
        assert out.merge_from(tmp_path / "b.sqlite") == 2
        assert out.merge_from(tmp_path / "a.sqlite") == 0
        assert len(out.all_rows()) == 4


def test_reaper_kills_the_orphan_of_a_dead_harness(tmp_path):
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "--fake-server-marker"], start_new_session=True
    )
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store(tmp_path / "s.sqlite") as store:
        store.start(
            **_row("r1", "c1"),
            argv=[sys.executable, "-c", "import time; time.sleep(600)", "--fake-server-marker"],
            harness_pid=dead.pid,
            server_pid=orphan.pid,
            server_pgid=orphan.pid,
        )
        killed = reap_orphans(store)
        assert orphan.pid in killed
        assert orphan.wait(timeout=10) is not None
        assert store.running() == []
        assert store.all_rows()[0]["verdict"] == "interrupted"


def test_reaper_leaves_a_live_harness_alone(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Store(tmp_path / "s.sqlite") as store:
            store.start(**_row("r1", "c1"), harness_pid=live.pid, server_pid=live.pid, server_pgid=live.pid)
            assert reap_orphans(store) == []
            assert len(store.running()) == 1
            assert psutil.pid_exists(live.pid)
    finally:
        live.kill()
        live.wait()
