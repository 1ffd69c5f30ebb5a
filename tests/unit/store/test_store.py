"""The SQLite store: resumable rows, unchanged-input skips, idempotent merges, orphan reaping."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from servematrix.cli import main
from servematrix.errors import InputError
from servematrix.run import hostinfo
from servematrix.run.reaper import reap_orphans
from servematrix.stages import serve
from servematrix.store.store import SCHEMA, Store, now

HF_TOKEN = "hf_" + "Wd2" * 10


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
        assert out.merge([tmp_path / "a.sqlite"]) == [2]
        assert out.merge([tmp_path / "b.sqlite"]) == [2]
        assert out.merge([tmp_path / "a.sqlite"]) == [0]
        assert len(out.all_rows()) == 4


def _orphan(argv):
    """A server as a harness starts it: carrying its row's marker (r1/c1)."""
    env = {**os.environ, serve.HARNESS_MARKER: serve.harness_marker("r1", "c1")}
    return subprocess.Popen(argv, env=env, start_new_session=True)


HERE = {"hostname": hostinfo.host().hostname}


def test_reaper_kills_the_orphan_of_a_dead_harness(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store(tmp_path / "s.sqlite") as store:
        store.start(**_row("r1", "c1"), host=HERE)
        orphan = _orphan([sys.executable, "-c", "import time; time.sleep(600)", "--fake-server-marker"])
        store.update(
            "r1",
            "c1",
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


def test_reaper_knows_an_orphan_whose_stored_argv_is_masked(tmp_path):
    """The store keeps `--api-key ***`; the orphan's command line has the secret. It is still our server."""
    argv = [
        sys.executable,
        "-c",
        "import time; time.sleep(600)",
        "--api-key",
        "k3y-" + "x" * 20,
        f"--hf-token={HF_TOKEN}",
    ]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store(tmp_path / "s.sqlite") as store:
        store.start(**_row("r1", "c1"), host=HERE)
        orphan = _orphan(argv)
        store.update("r1", "c1", argv=argv, harness_pid=dead.pid, server_pid=orphan.pid, server_pgid=orphan.pid)
        assert store.running()[0]["argv"][-3:] == ["--api-key", "***", "--hf-token=***"]
        assert orphan.pid in reap_orphans(store)
        assert orphan.wait(timeout=10) is not None


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


# -- only the newest result counts -------------------------------------------------------------------


def test_a_harness_error_after_a_pass_runs_the_cell_again(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.record(**_row("r1", "c1"), verdict="pass")
        time.sleep(1.1)
        store.record(**_row("r2", "c1"), verdict="error:port-in-use")
        assert store.finished("c1", "h1") is None  # the pass no longer stands: the report shows the error
        time.sleep(1.1)
        store.record(**_row("r3", "c1"), verdict="fail:cuda-oom")
        assert store.finished("c1", "h1")["run_id"] == "r3"


# -- stores in odd states ---------------------------------------------------------------------------


def test_a_file_that_is_not_a_database_is_bad_input(tmp_path):
    notes = tmp_path / "README.md"
    notes.write_text("# not a database\n" * 100)
    with pytest.raises(InputError, match=r"README.md: not a servematrix store \(file is not a database\)"):
        Store(notes)
    assert notes.read_text() == "# not a database\n" * 100


def test_another_programs_database_is_not_taken_over(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE bookmarks (url TEXT)")
    with pytest.raises(InputError, match="not a servematrix store"):
        Store(path)
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["bookmarks"]


def test_a_directory_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        Store(tmp_path)


def test_corrupt_and_foreign_stores_exit_2_from_the_command_line(tmp_path, capsys):
    notes = tmp_path / "README.md"
    notes.write_text("hello\n" * 200)
    assert main(["report", "--store", str(notes), "--out", str(tmp_path / "out")]) == 2
    assert main(["merge", str(tmp_path / "out.sqlite"), str(notes)]) == 2
    assert main(["merge", str(notes), str(_shard(tmp_path / "a.sqlite", "ra"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all("not a servematrix store" in line for line in err), err
    assert not (tmp_path / "out.sqlite").exists()  # a failed merge leaves no target behind


# A child that opens a store in a directory it cannot write. As root (file modes do not bind root) it
# imports what it needs, then drops to nobody.
READ_ONLY_CHILD = """
import os, sys
from servematrix.cli import main
import servematrix.store.store, servematrix.engines, servematrix.store.redact
import email.parser  # --version reads the installed metadata; as nobody, root's Python library is unreadable
if os.getuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
sys.exit(main(["merge", sys.argv[1], sys.argv[2]]))
"""


@pytest.fixture
def shared_dir():
    """A directory other users may enter (pytest's tmp_path is private to its user)."""
    path = Path(tempfile.mkdtemp(prefix="servematrix-ro-"))
    path.chmod(0o755)
    yield path
    for sub in (path, *path.rglob("*")):
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path)


def test_a_read_only_store_is_bad_input(shared_dir):
    shard = _shard(shared_dir / "a.sqlite", "ra")
    locked = shared_dir / "locked"
    locked.mkdir()
    target = _shard(locked / "out.sqlite", "rb")
    for path in shared_dir.rglob("*.sqlite*"):
        path.chmod(0o444)
    locked.chmod(0o555)
    done = subprocess.run(
        [sys.executable, "-c", READ_ONLY_CHILD, str(target), str(shard)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"{target}: the store is read-only" in done.stderr and "Traceback" not in done.stderr


# -- merge: all or nothing ----------------------------------------------------------------------------


def _shard(path, run_id, cells=("c1", "c2"), **extra):
    with Store(path) as store:
        for cell in cells:
            store.record(**_row(run_id, cell), verdict="pass", **extra)
    return path


def _corrupt(path):
    """A real store whose pages past the header are garbage: it opens, and breaks when read."""
    with Store(path) as store:
        for i in range(400):
            store.record(**_row("rc", f"c{i:04d}"), verdict="pass", excerpt="x" * 200)
    data = bytearray(path.read_bytes())
    for offset in range(4096 * 2, len(data), 4096):
        data[offset : offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    return path


def test_a_corrupt_shard_in_the_middle_merges_nothing(tmp_path, capsys):
    out = _shard(tmp_path / "out.sqlite", "r0", cells=("c0",))
    before = [r.values for r in Store(out).all_rows()]
    a = _shard(tmp_path / "a.sqlite", "ra")
    bad = _corrupt(tmp_path / "bad.sqlite")
    b = _shard(tmp_path / "b.sqlite", "rb")
    assert main(["merge", str(out), str(a), str(bad), str(b)]) == 2
    err = capsys.readouterr().err
    assert "bad.sqlite" in err and "Traceback" not in err
    with Store(out) as store:
        assert [r.values for r in store.all_rows()] == before


def test_merge_refuses_a_target_that_is_also_an_input(tmp_path, capsys):
    shard = _shard(tmp_path / "s.sqlite", "ra")
    (tmp_path / "link.sqlite").symlink_to(shard)
    started = time.monotonic()
    assert main(["merge", str(shard), str(shard)]) == 2
    assert main(["merge", str(tmp_path / "link.sqlite"), str(_shard(tmp_path / "t.sqlite", "rt")), str(shard)]) == 2
    assert time.monotonic() - started < 5  # no wait for a lock it would hold itself
    assert capsys.readouterr().err.count("also the merge target") == 2
    assert len(Store(shard).all_rows()) == 2


def test_merge_takes_rows_of_an_older_store_and_redacts_them(tmp_path):
    """A shard written before argv was redacted (and before the redacted_flags column): merged, redacted."""
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.executescript(SCHEMA.replace("    redacted_flags TEXT,", "").replace("redacted_flags", "x"))
        db.execute(
            "INSERT INTO cell_runs (run_id, cell_id, env_id, engine, mode, matrix, axes, inputs_hash, status, verdict,"
            " excerpt, argv, started_at) VALUES ('r', 'c', 'e', 'sglang', 'baseline', 'm.toml', '{}', 'h', 'finished',"
            " 'fail:x', ?, ?, '2026-01-01T00:00:00+00:00')",
            (f"token {HF_TOKEN}", json.dumps(["python", "--api-key", "plainvalue1", f"--hf-token={HF_TOKEN}"])),
        )
    assert "redacted_flags" not in [r[1] for r in sqlite3.connect(old).execute("PRAGMA table_info(cell_runs)")]
    with Store(tmp_path / "out.sqlite") as out:
        assert out.merge([old]) == [1]
        (row,) = out.all_rows()
    assert row["argv"] == ["python", "--api-key", "***", "--hf-token=***"]
    assert HF_TOKEN not in row["excerpt"]
    with Store(old) as reopened:  # an old store opened for writing gets the new column
        assert reopened.all_rows()[0]["redacted_flags"] is None


def test_the_store_redacts_what_it_is_given(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.record(
            **_row("r1", "c1"),
            argv=["serve", "--token", "abc", "--db", "x"],
            redacted_flags=["--db"],
            verdict="fail:x",
            excerpt=f"Authorization: Bearer abcdefghijkl and {HF_TOKEN}",
            evidence=[f"saw {HF_TOKEN}"],
        )
        (row,) = store.all_rows()
    assert row["argv"] == ["serve", "--token", "***", "--db", "***"]
    assert HF_TOKEN not in row["excerpt"] + "".join(row["evidence"]) and "abcdefghijkl" not in row["excerpt"]


# -- the per-cell lock ------------------------------------------------------------------------------


def test_a_cell_a_live_harness_runs_cannot_be_claimed(tmp_path):
    here = hostinfo.host().hostname
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Store(tmp_path / "s.sqlite") as store:
            time.sleep(0.05)
            store.start(**_row("r1", "c1"), harness_pid=live.pid, host={"hostname": here})
            claim = store.claim(**_row("r2", "c1"), harness_pid=os.getpid(), hostname=here)
            assert not claim.claimed and claim.owner_pid == live.pid
            assert store.claim(**_row("r2", "c2"), harness_pid=os.getpid(), hostname=here).claimed
    finally:
        live.kill()
        live.wait()
    with Store(tmp_path / "s.sqlite") as store:  # its harness is gone: the cell is free
        assert store.claim(**_row("r2", "c1"), harness_pid=os.getpid(), hostname=here).claimed


def test_a_claim_is_refused_for_a_cell_already_done(tmp_path):
    here = hostinfo.host().hostname
    with Store(tmp_path / "s.sqlite") as store:
        since = now()
        store.record(**_row("r1", "c1"), verdict="pass")
        assert store.claim(**_row("r2", "c1"), harness_pid=os.getpid(), hostname=here).unchanged
        # --rerun runs it again, unless another run finished it since this run began
        assert store.claim(
            **_row("r2", "c1"), harness_pid=os.getpid(), hostname=here, rerun=True, since=since
        ).unchanged
        assert store.claim(**_row("r3", "c1"), harness_pid=os.getpid(), hostname=here, rerun=True, since="9999").claimed


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from servematrix.store.store import Store
path, start = map(Path, sys.argv[1:3])
while not start.exists():
    time.sleep(0.001)
Store(path).close()
"""


def test_harnesses_that_open_a_new_store_at_the_same_moment_all_get_it(tmp_path):
    # SQLite refuses a journal-mode change that meets another connection at once, without its busy handler:
    # before the store retried it, about one opener in six failed here with "database is locked".
    for trial in range(8):
        start = tmp_path / f"go-{trial}"
        openers = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_AT_ONCE, str(tmp_path / f"s{trial}.sqlite"), str(start)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        time.sleep(0.5)  # every opener is waiting for the start file
        start.touch()
        for opener in openers:
            _, err = opener.communicate(timeout=120)
            assert opener.returncode == 0, err


def test_an_excerpt_and_evidence_are_bounded_as_stored_and_as_merged(tmp_path):
    """M8: a crash printing 30 lines of a million characters, or a crafted store's 20,000 items of evidence,
    is stored as a bounded excerpt: a recorded row is bounded on its way in, a merged row again."""
    huge = "exit code 1; last lines:\n" + "\n".join(f"{i} " + "x" * 1_000_000 for i in range(30))
    with Store(tmp_path / "a.sqlite") as store:
        store.record(**_row("r1", "c1"), verdict="fail:server-exited", excerpt=huge, evidence=["e" * 5000] * 20_000)
        row = store.latest()[0]
    assert len(row["excerpt"]) < 40_000 and row["excerpt"].startswith("exit code 1; last lines:\n")
    assert row["excerpt"].splitlines()[-1].startswith("29 xxx") and "characters cut" in row["excerpt"]
    assert len(row["evidence"]) <= 40 and all(len(e) <= 1000 for e in row["evidence"])
    # A store written by something else (its text unbounded) is bounded as it is merged.
    crafted = tmp_path / "crafted.sqlite"
    shutil.copy(tmp_path / "a.sqlite", crafted)
    with sqlite3.connect(crafted) as db:
        db.execute("UPDATE cell_runs SET excerpt = ?, evidence = ?", (huge, json.dumps(["e" * 5000] * 20_000)))
    with Store(tmp_path / "out.sqlite") as out:
        assert out.merge([crafted]) == [1]
        merged = out.latest()[0]
    assert len(merged["excerpt"]) < 40_000 and len(merged["evidence"]) <= 40
    # Bounding is idempotent: what is bounded once is kept as it is.
    with Store(tmp_path / "again.sqlite") as again:
        again.record(**_row("r1", "c1"), verdict="fail:server-exited", excerpt=row["excerpt"], evidence=row["evidence"])
        assert again.latest()[0]["excerpt"] == row["excerpt"]
        assert again.latest()[0]["evidence"] == row["evidence"]


DETACHING = (
    "import os, signal, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "        open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "        time.sleep(600)\n"
    "    os._exit(0)\n"
    "time.sleep(600)\n"
)


def test_reaper_kills_a_worker_of_the_orphan_that_left_its_group(tmp_path):
    """M2: the orphan's worker left its group (double fork, setsid); it carries the row's marker, and the
    reaper finds it by that."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    worker_pid = tmp_path / "worker.pid"
    argv = [sys.executable, "-c", DETACHING, str(worker_pid)]
    with Store(tmp_path / "s.sqlite") as store:
        store.start(**_row("r1", "c1"), host=HERE)
        orphan = _orphan(argv)
        deadline = time.monotonic() + 10
        while not worker_pid.exists() or not worker_pid.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        worker = int(worker_pid.read_text())
        store.update("r1", "c1", argv=argv, harness_pid=dead.pid, server_pid=orphan.pid, server_pgid=orphan.pid)
        try:
            killed = reap_orphans(store)
            assert orphan.pid in killed and worker in killed
            assert orphan.wait(timeout=10) is not None
            with contextlib.suppress(psutil.NoSuchProcess):
                assert psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
