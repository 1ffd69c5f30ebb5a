"""The serve stage: launch a cell's server, know when it is ready or doomed, and always tear it down.

The server runs in its own session (process group). Its output reaches the log file only through a
redacting writer (a thread of the harness, `serverlog.pump`): each line is redacted before it is written, so
the file never holds a secret, even if the harness is SIGKILLed (the server then writes into a closed pipe,
and nothing more reaches the file). The same thread hands every line to the live scan: the engine's ready
line, and its failure signatures, where a fatal line ends the cell at once (SGLang often keeps running, hung,
after a scheduler dies) without waiting for the readiness deadline. The scan reads the stream, not the file:
the file keeps a bounded head and tail (`serverlog.LOG_BOUNDS`), the scan sees every line. Teardown kills the
whole process tree, found with psutil, on every path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psutil

from servematrix.backends import LaunchSpec
from servematrix.classify import LogScanner
from servematrix.engines import Readiness
from servematrix.formats.verdict import Verdict, failed
from servematrix.stages import serverlog
from servematrix.store.redact import EXCERPT_LINE_MAX, Redactor, bounded_excerpt

TAIL_LINES = 30
SCAN_INTERVAL_S = 0.1
SETTLE_S = 0.5
# How long the log writer may keep draining a server's output after the server exited or was killed.
DRAIN_S = 2.0
# The variable every server a harness starts carries, naming its row (`harness_marker`): the reaper kills only
# a process that carries its row's value, never one a crafted or merged row merely points at.
HARNESS_MARKER = "SERVEMATRIX_HARNESS_TOKEN"


def harness_marker(run_id: str, cell_id: str) -> str:
    return f"{run_id}/{cell_id}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, kw_only=True)
class Ready:
    ok: bool
    seconds: float
    verdict: Verdict | None = None  # why it is not ready
    after_ready_line_s: float | None = None  # confirmed this long after the engine's ready line (if it has one)


class Server:
    """A running server. Use as a context manager: the process tree is gone when the block exits."""

    def __init__(
        self,
        launch: LaunchSpec,
        *,
        engine: str,
        port: int,
        log_path: Path,
        readiness: Readiness,
        timeout_s: float,
        host: str = "127.0.0.1",
        on_started: Callable[[int, int], None] | None = None,
        secret_flags: Collection[str] = (),
        public_env: Collection[str] = (),
        passed_env: Collection[str] = (),
        marker: str | None = None,
        log_bounds: serverlog.LogBounds | None = None,
    ) -> None:
        self.launch = launch
        self.engine = engine
        self.port = port
        self.host = host
        self.log_path = log_path
        self.readiness = readiness
        self.timeout_s = timeout_s
        self.on_started = on_started
        self.marker = marker
        self.base_url = f"http://{host}:{port}"
        # Secrets may be set only in the launch environment, not in the harness's own.
        # Any value it is given may be one, whatever its variable's name: masked unless engine data says public.
        # `passed_env` names the variables the cell sets (matrix, GPU kind, engine), the rest it inherits.
        self._redactor = Redactor.for_launch(
            launch.argv, {**os.environ, **launch.env}, secret_flags, passed=passed_env, public_env=public_env
        )
        self.log_bounds = log_bounds or serverlog.LOG_BOUNDS
        self.process: subprocess.Popen[bytes] | None = None
        self.log: serverlog.BoundedLog | None = None
        self._live = serverlog.LiveLines()  # the pump's: the lines of the output, an unfinished one held
        self._pump: threading.Thread | None = None
        # Fed by the pump's thread (`_on_lines`), read by the harness's: `_lock` guards the scan's state.
        self._lock = threading.Lock()
        self._scanner = LogScanner(engine, env={**os.environ, **launch.env})
        self._ready_line_at: float | None = None  # when the engine's own ready line appeared in the log
        self._lines: deque[str] = deque(maxlen=TAIL_LINES)  # the tail only: logs of long runs are large
        self._doomed = False  # a fatal line was seen
        self._scan_error: BaseException | None = None  # raised by the scan in the pump's thread
        self._fatal: Verdict | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = serverlog.BoundedLog(self.log_path, self.log_bounds)
        try:
            self.process = subprocess.Popen(
                self.launch.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.launch.env, **({HARNESS_MARKER: self.marker} if self.marker else {})},
                start_new_session=True,  # its own process group: one killpg reaches every worker
            )
        except BaseException:
            self.log.close()
            raise
        assert self.process.stdout is not None
        self._pump = threading.Thread(
            target=serverlog.pump,
            args=(self.process.stdout, self.log, self._redactor, self._on_lines, self._live),
            name="server-log",
            daemon=True,
        )
        self._pump.start()
        try:
            if self.on_started:
                self.on_started(self.process.pid, os.getpgid(self.process.pid))
        except BaseException:  # SIGTERM while its pid is stored: `with` calls no __exit__ when __enter__ raises
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        self._drain()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process is None:
            return
        kill_tree(self.process.pid, self.process.pid, grace_s=grace_s, markers=(self.marker,) if self.marker else ())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    # -- watching --------------------------------------------------------------------------------
    def wait_ready(self) -> Ready:
        """Poll readiness until the deadline, the process exits, or a fatal log line appears."""
        assert self.process is not None
        started = time.monotonic()
        deadline = started + self.timeout_s
        next_poll = started
        confirmed_line = False
        while True:
            verdict = self.check()
            if verdict is not None:
                return Ready(ok=False, seconds=time.monotonic() - started, verdict=verdict)
            now = time.monotonic()
            # The log says ready before a poll would notice: confirm at once with one request, then keep
            # polling at the engine's interval as the fallback.
            if now >= next_poll or (self._ready_line_at is not None and not confirmed_line):
                confirmed_line = self._ready_line_at is not None
                path = (self.readiness.confirm_path or self.readiness.path) if confirmed_line else self.readiness.path
                if self._responds(path, deadline) and self._we_listen():
                    after = time.monotonic() - self._ready_line_at if self._ready_line_at is not None else None
                    return Ready(ok=True, seconds=time.monotonic() - started, after_ready_line_s=after)
                next_poll = now + self.readiness.interval_s
            if now >= deadline:
                tail = self._tail()
                return Ready(
                    ok=False,
                    seconds=now - started,
                    verdict=failed("server-timeout", excerpt=f"not ready after {self.timeout_s:.0f} s\n{tail}"),
                )
            time.sleep(min(SCAN_INTERVAL_S, max(0.0, next_poll - time.monotonic())) or SCAN_INTERVAL_S)

    def check(self) -> Verdict | None:
        """A verdict if the server is doomed: a fatal signature in its output, or its process exited."""
        assert self.process is not None
        if self._fatal is not None:
            return self._fatal
        if self._scan_error is not None:
            raise self._scan_error
        if self._doomed:
            # The first fatal line is often the generic "Scheduler hit an exception"; the specific cause
            # (dynamo, OOM, NCCL) follows within the same log record. Read a moment longer, then rank.
            time.sleep(SETTLE_S)
            self.stop(grace_s=2.0)  # a fatal line means the run is over even if the process lingers
            self._drain()  # what it wrote before it went is scanned too
            with self._lock:
                match = self._scanner.best()
            assert match is not None
            self._fatal = failed(match.cls, excerpt=match.excerpt, evidence=match.evidence)
            return self._fatal
        code = self.process.poll()
        if code is not None:
            self._drain()
            with self._lock:
                found = self._scanner.best()
            if found is not None:
                self._fatal = failed(found.cls, excerpt=found.excerpt, evidence=found.evidence)
            else:
                self._fatal = failed("server-exited", excerpt=f"exit code {code}; last lines:\n{self._tail()}")
            return self._fatal
        return None

    def _on_lines(self, lines: list[str]) -> None:
        """Every line the server writes, redacted, as the pump reads it (the pump's thread): the ready line,
        fatal lines, the last lines. The file may leave a line out; this never does."""
        if self._scan_error is not None:
            return
        ready_log = self.readiness.ready_log
        try:
            with self._lock:
                for line in lines:
                    self._lines.append(line[: 4 * EXCERPT_LINE_MAX])
                    if ready_log and self._ready_line_at is None and ready_log in line:
                        self._ready_line_at = time.monotonic()
                    if self._scanner.feed(line) is not None:
                        self._doomed = True
        except Exception as exc:  # a fault of the scan is the harness's: raised where the verdict is made
            self._scan_error = exc

    def _tail(self) -> str:
        # Each line was cut well past what the excerpt keeps before it is redacted (a 1 MB line is seconds of
        # redaction), so a secret straddling the excerpt's cut is still whole when it is masked.
        with self._lock:
            lines = list(self._lines)
        return bounded_excerpt(self._redactor.text("\n".join(lines)))

    def _drain(self) -> None:
        """Let the log writer finish what the server wrote (a worker that outlives it may keep the pipe)."""
        if self._pump is not None:
            self._pump.join(timeout=DRAIN_S)

    def _responds(self, path: str, deadline: float) -> bool:
        # A fresh connection per probe: some servers drop a kept-alive connection while starting.
        budget = min(30.0, self.readiness.interval_s + 5, max(0.0, deadline - time.monotonic()) + 1.0)
        return status_is_200(self.host, self.port, path, budget)

    def _we_listen(self) -> bool:
        """The answer came from our server, not from whatever else holds the port."""
        if not self.launch.owns_listener:
            return True
        assert self.process is not None
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return False
        for proc in tree:
            try:
                for conn in proc.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self.port:
                        return True
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return False


PROBE_HEAD_BYTES = 1024


def status_is_200(host: str, port: int, path: str, timeout_s: float) -> bool:
    """Whether a GET of `path` answers 200, within `timeout_s` in all (a server that trickles its answer cannot
    stretch it), reading only the status line (never a body, so nothing to decompress)."""
    deadline = time.monotonic() + timeout_s
    head = b""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            request = (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n"
            )
            sock.sendall(request.encode("latin-1"))
            while b"\r\n" not in head and len(head) < PROBE_HEAD_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
                chunk = sock.recv(PROBE_HEAD_BYTES - len(head))
                if not chunk:
                    break
                head += chunk
    except (OSError, UnicodeEncodeError):
        return False
    status = head.split(b"\r\n", 1)[0].split()
    return len(status) >= 2 and status[0].startswith(b"HTTP/") and status[1] == b"200"


def kill_tree(pid: int, pgid: int | None, *, grace_s: float = 10.0, markers: Sequence[str] = ()) -> list[int]:
    """SIGTERM the group and every descendant, then SIGKILL what is left, then every process left that carries
    one of `markers` (`kill_processes`). Returns the pids it found."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    if pgid is not None:
        procs += [p for p in _group_members(pgid) if p not in procs]
    return kill_processes(procs, grace_s=grace_s, markers=markers)


SWEEP_ROUNDS = 5  # a worker started during a teardown is found by the next round; a respawning one is bounded


def kill_processes(procs: list[psutil.Process], *, grace_s: float = 10.0, markers: Sequence[str] = ()) -> list[int]:
    """SIGTERM each, then SIGKILL what is left. Then the processes that carry the harness marker of any of
    them (or one of `markers`) are found again and killed, round after round until none is left: a worker
    the server started while it was being stopped, or one that left its group (double fork and `setsid`, as
    Ray's daemons do), is not in the first snapshot but inherits the marker. Returns the pids killed."""
    marked = set(markers) | {m for m in (_marker_of(p) for p in procs) if m}
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    killed = [p.pid for p in procs]
    for _ in range(SWEEP_ROUNDS if marked else 0):
        left = _carrying(marked)
        if not left:
            break
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # it had its SIGTERM with the server, or left the group to avoid it
        psutil.wait_procs(left, timeout=5)
        killed += [p.pid for p in left if p.pid not in killed]
    return killed


def _marker_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get(HARNESS_MARKER)
    except (psutil.Error, OSError):
        return None


def _carrying(markers: set[str]) -> list[psutil.Process]:
    """The live processes of this host (this user's: another's environment is not readable) whose harness
    marker is one of `markers`; never this process."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if proc.status() != psutil.STATUS_ZOMBIE and _marker_of(proc) in markers:
                found.append(proc)
    return found


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return members
