"""The client's worker processes: one start barrier, each its share of the streams, results merged."""

import contextlib
import os
import pickle
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import servematrix
from servematrix.stages.bench_worker import (
    BatchSpec,
    RequestResult,
    format_cpus,
    read_message,
    write_message,
)


def child_env() -> dict[str, str]:
    """The environment for a child that imports servematrix: this servematrix, whatever put it on sys.path."""
    env = dict(os.environ)
    root = Path(servematrix.__file__).resolve().parents[1]
    site_dirs = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in site_dirs:  # a source checkout: put it first (never a site-packages, which would shadow stdlib)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


@dataclass(frozen=True)
class Batch:
    results: list[RequestResult]  # in the order of the bodies
    wall_s: float  # from the first worker's start to the last worker's end
    cpu_s: float  # user+sys of the workers that took part, summed, and of the thread that ran the batch
    processes: int  # the workers that took part


class ClientPool:
    """``processes`` worker processes (``python -m servematrix.stages.bench_worker``), pinned to ``cpus`` if any.

    A batch is split over the workers by streams (at most one worker per stream) and requests (in proportion).
    Each worker gets its share, answers ready, and all start on one "go"; connections stay open between batches.
    """

    def __init__(self, processes: int, cpus: Sequence[int] = ()) -> None:
        argv = [sys.executable, "-m", "servematrix.stages.bench_worker"]
        if cpus:
            argv += ["--cpus", format_cpus(cpus)]
        env = child_env()
        self._stderr: list[IO[bytes]] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(processes):
                err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
                self._stderr.append(err)
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
                self._procs.append(proc)
            for i in range(processes):  # each worker says hello once it runs (and is pinned, if asked)
                self._receive(i, "hello")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "ClientPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                write_message(proc.stdin, ("exit",))
                proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for err in self._stderr:
            err.close()
        self._procs, self._stderr = [], []

    def _stopped(self, i: int) -> RuntimeError:
        proc = self._procs[i]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1)
        err = self._stderr[i]
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace").strip()
        return RuntimeError(f"benchmark worker {proc.pid} stopped (exit {proc.poll()}): {tail or 'no output'}")

    def _send(self, i: int, message: Any) -> None:
        stdin = self._procs[i].stdin
        assert stdin is not None
        try:
            write_message(stdin, message)
        except OSError as exc:  # a broken pipe: the worker is gone
            raise self._stopped(i) from exc

    def _receive(self, i: int, expect: str) -> Any:
        stdout = self._procs[i].stdout
        assert stdout is not None
        msg = read_message(stdout)
        if msg is None or msg[0] != expect:
            raise self._stopped(i)
        return msg

    def run_batch(self, url: str, bodies: Sequence[bytes], concurrency: int, *, api: str, timeout_s: float) -> Batch:
        """Send ``bodies`` with at most ``concurrency`` in flight in all. Results come back in order."""
        k = min(len(self._procs), concurrency, len(bodies))
        if k == 0:
            return Batch([], 0.0, 0.0, 0)
        # This thread's own share of the work (pickling bodies and results) counts as client CPU too.
        parent_cpu0 = time.thread_time()
        streams = [concurrency // k + (i < concurrency % k) for i in range(k)]
        shares = [len(bodies) * s // concurrency for s in streams]
        for i in range(len(bodies) - sum(shares)):
            shares[i % k] += 1
        start = 0
        for i in range(k):
            spec = BatchSpec(url, list(bodies[start : start + shares[i]]), streams[i], api, timeout_s)
            start += shares[i]
            self._send(i, ("batch", spec))
        for i in range(k):
            self._receive(i, "ready")
        for i in range(k):  # the start barrier: every worker has its share ready before any starts
            self._send(i, ("go",))
        done = [self._receive(i, "done") for i in range(k)]
        results: list[RequestResult] = [r for msg in done for r in pickle.loads(msg[1])]
        wall = max(msg[3] for msg in done) - min(msg[2] for msg in done)
        cpu = sum(msg[4] for msg in done) + time.thread_time() - parent_cpu0
        return Batch(results, wall, cpu, k)
