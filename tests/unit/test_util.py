"""util: atomic writes, running a program for its output, uv's environment, a log's tail."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from servematrix import util
from servematrix.util import atomic_write, log_tail, run_captured, uv_env


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def test_atomic_write_writes_text_and_bytes_into_new_directories(tmp_path):
    text_path = tmp_path / "a" / "b" / "table.md"
    assert atomic_write(text_path, "naïve ✓\nline 2\r\n") == text_path
    assert text_path.read_bytes() == "naïve ✓\nline 2\r\n".encode()  # UTF-8, newlines as given
    blob = tmp_path / "plot.svg"
    atomic_write(blob, b"\x00\xff<svg/>")
    assert blob.read_bytes() == b"\x00\xff<svg/>"
    assert _leftovers(tmp_path, {"a", "plot.svg"}) == []
    assert _leftovers(tmp_path / "a" / "b", {"table.md"}) == []


def test_atomic_write_gives_the_permissions_of_a_plain_write(tmp_path):
    # A temporary file from mkstemp is 0600: a published page or a lock must stay readable by others.
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic = atomic_write(tmp_path / "atomic.txt", "x")
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_atomic_write_replaces_an_existing_file(tmp_path):
    path = tmp_path / "latest.json"
    path.write_text("old")
    atomic_write(path, "new")
    assert path.read_text() == "new"
    assert _leftovers(tmp_path, {"latest.json"}) == []


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    # The target is a directory: the rename fails for real, after the temporary was written.
    target = tmp_path / "out"
    target.mkdir()
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        atomic_write(target, "new text")
    assert (target / "inside").read_text() == "kept"
    assert _leftovers(tmp_path, {"out"}) == []


def test_a_writer_that_fails_midway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "env.lock.txt"
    path.write_text("old lock\n")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(util.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, "new lock\n" * 1000, durable=True)
    assert path.read_text() == "old lock\n"
    assert _leftovers(tmp_path, {"env.lock.txt"}) == []


def test_an_interrupted_writer_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "page.html"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(util.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, "<html>")
    assert not path.exists()
    assert _leftovers(tmp_path, set()) == []


def test_two_concurrent_writers_of_one_path_never_mix(tmp_path):
    # With one shared temporary name (path + ".tmp") the writers truncate and rename each other's file:
    # a reader then sees a mixture or a short file, and a rename fails with FileNotFoundError.
    path = tmp_path / "shared.json"
    size = 256 * 1024
    payloads = {b"A" * size, b"B" * size}
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(payload: bytes) -> None:
        try:
            for _ in range(150):
                atomic_write(path, payload)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    seen: list[bytes] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(path.read_bytes())
            except FileNotFoundError:
                continue

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    assert errors == []
    assert seen and all(content in payloads for content in seen)
    assert path.read_bytes() in payloads
    assert _leftovers(tmp_path, {"shared.json"}) == []


@pytest.fixture(params=["plain", "interruptible"])
def runs(request):
    """run_captured as a library call runs it (subprocess.run) and inside `interrupt_on_signals`, as a
    `servematrix run` runs it (a wait polled for the interrupt): the two must give the same results."""
    if request.param == "plain":
        yield request.param
        return
    with util.interrupt_on_signals():
        yield request.param


def test_run_captured_gives_status_and_output(runs):
    done = run_captured(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        timeout_s=60,
    )
    assert (done.returncode, done.stdout, done.stderr, done.problem, done.timed_out) == (
        3,
        "out\n",
        "err\n",
        None,
        False,
    )


def test_run_captured_closes_stdin_and_passes_env_and_cwd(tmp_path, runs):
    done = run_captured(
        [sys.executable, "-c", "import os, sys; print(repr(sys.stdin.read()), os.getcwd(), os.environ['ONLY'])"],
        timeout_s=60,
        env={**os.environ, "ONLY": "here"},
        cwd=tmp_path,
    )
    assert done.stdout.split() == ["''", str(tmp_path), "here"]


def test_a_program_that_runs_too_long_is_a_timed_out_result(runs):
    done = run_captured([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert done.timed_out and done.returncode == 124
    assert done.problem == f"{sys.executable} timed out after 0.5 s" == done.stderr


def test_a_large_output_is_captured_whole_across_the_interrupt_polls(runs):
    """The wait for a program is cut into polls of `INTERRUPT_POLL_S`; output written across them is all kept."""
    script = "import sys, time\nfor i in range(4):\n    sys.stdout.write(str(i) * 200_000); sys.stdout.flush(); time.sleep(0.3)"
    done = run_captured([sys.executable, "-c", script], timeout_s=60)
    assert done.returncode == 0 and done.stdout == "".join(str(i) * 200_000 for i in range(4))


def test_an_interrupted_run_kills_a_worker_threads_program_and_interrupts_that_thread():
    """Only the main thread gets a signal's KeyboardInterrupt: a worker waiting on a program sees `INTERRUPTED`,
    the program is killed, and the worker is interrupted too (its caller must not read a killed program's exit
    status as the program's own: an import check would record a failure of the lock)."""
    import psutil

    outcome: dict[str, object] = {}

    def worker() -> None:
        try:
            outcome["result"] = run_captured([sys.executable, "-c", "import time; time.sleep(300)"], timeout_s=None)
        except KeyboardInterrupt:
            outcome["interrupted"] = True

    with util.interrupt_on_signals():
        thread = threading.Thread(target=worker)
        thread.start()
        try:
            for _ in range(200):
                sleepers = psutil.Process().children()
                if sleepers:
                    break
                threading.Event().wait(0.05)
            assert len(sleepers) == 1
            util.INTERRUPTED.set()  # what the signal handler sets, before it interrupts the main thread
            thread.join(timeout=30)
            assert not thread.is_alive() and outcome == {"interrupted": True}
            assert not sleepers[0].is_running()
        finally:
            util.INTERRUPTED.set()
            thread.join()


def test_signals_interrupt_inside_the_block_and_the_handlers_before_come_back():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), util.interrupt_on_signals():
        assert not util.INTERRUPTED.is_set()
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before and not util.INTERRUPTED.is_set()


def test_a_missing_program_or_directory_is_a_not_found_result(tmp_path, runs):
    missing = tmp_path / "no-such-tool"
    done = run_captured([str(missing), "--version"], timeout_s=60)
    assert (done.returncode, done.problem, done.timed_out) == (127, f"{missing}: not found", False)
    gone = tmp_path / "gone"
    done = run_captured([sys.executable, "-V"], timeout_s=60, cwd=gone)
    assert done.returncode == 127 and done.problem == f"{gone}: not found"


def test_a_file_that_is_not_a_program_cannot_run(tmp_path, runs):
    script = tmp_path / "notes.txt"
    script.write_text("not a program\n")
    script.chmod(0o644)
    done = run_captured([str(script)], timeout_s=60)
    assert done.returncode == 126
    assert done.problem is not None and done.problem.startswith(f"cannot run {script}: ")


def test_uv_env_forbids_interpreter_downloads_and_adds_extras(monkeypatch):
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "automatic")
    env = uv_env(NO_COLOR="1")
    assert env["UV_PYTHON_DOWNLOADS"] == "never" and env["NO_COLOR"] == "1"
    assert env["PATH"] == os.environ["PATH"]
    assert os.environ["UV_PYTHON_DOWNLOADS"] == "automatic"  # this process's environment is untouched


def test_log_tail_is_the_last_lines_with_bad_bytes_replaced(tmp_path):
    log = tmp_path / "build.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)) + b"bad \xff byte\n")
    assert log_tail(log, 3) == "line 98\nline 99\nbad \ufffd byte"
    assert log_tail(log, 500).count("\n") == 100
    assert log_tail(log, 500, max_bytes=16) == "e 99\nbad \ufffd byte"  # only the end of a large log is read
    assert log_tail(tmp_path / "missing.log", 3) == ""
