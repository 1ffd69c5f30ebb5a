"""A FAKE GPU server, for the packing and tensor-parallelism tests: what a real multi-GPU server does on a GPU
host, on a CPU.

The fake backend starts it with the test engine's argv (toyserve: `MODEL --host H --port P [--tp-size N
--nccl-port Q] ...`). Like a real server it binds --port, the port the engine derives from it (--port + 10000,
toyserve's data) and, with several ranks, the ranks' rendezvous port (--nccl-port), and exits when one is
taken. With --tp-size N it starts N-1 more ranks that leave its process tree (a double fork) but stay in its
process group, as a real server's workers may: only a teardown by process group reaches them. After
$FAKE_READY_AFTER_S seconds it serves the OpenAI API (the fake streaming server).

It records what it was given, as a GPU server would see it, in $FAKE_GPU_RECORDS/<pid>.json: its GPUs
(CUDA_VISIBLE_DEVICES), its CPUs (its affinity), every port it holds, its ranks' pids, when it started and
stopped (SIGTERM), and which processes of the servers recorded before it on any of its GPUs were still alive
when it started (the process table: a rank the harness left behind would be there).

    python fake_multi_gpu_server.py MODEL --host H --port P [--tp-size N] [--nccl-port Q] [ignored args]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

from servematrix.stages.bench_fake import FakeBehavior, FakeOpenAIServer
from servematrix.util import atomic_write

DERIVED_OFFSET = 10000  # toyserve's derived_ports
ALL = "all"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--nccl-port", type=int)
    args, _ = parser.parse_known_args()
    folder = Path(os.environ["FAKE_GPU_RECORDS"])
    gpus = _gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    record: dict[str, object] = {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "argv": sys.argv[1:],
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpus": sorted(os.sched_getaffinity(0)),
        "pythonpath": os.environ.get("PYTHONPATH"),  # what a server's own Python would import first
        "start": time.time(),
        "left_before": _left_before(folder, gpus),
    }
    held = [args.port + DERIVED_OFFSET] + ([args.nccl_port] if args.tp_size > 1 and args.nccl_port else [])
    sockets = []
    for port in held:
        sock = socket.socket()
        try:
            sock.bind((args.host, port))
        except OSError as exc:
            print(f"ERROR: port {port} is taken: {exc}", flush=True)
            return 1
        sock.listen()
        sockets.append(sock)
    # The ranks, forked before any thread exists.
    record["ranks"] = [_rank() for _ in range(args.tp_size - 1)]
    record["ports"] = [args.port, *held]
    out = folder / f"{os.getpid()}.json"

    def stop(signum: int, frame: object) -> None:
        record["end"] = time.time()
        atomic_write(out, json.dumps(record))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    atomic_write(out, json.dumps(record))
    print(f"[fake] {args.tp_size} rank(s) on GPUs {record['gpus']}, CPUs {record['cpus']}", flush=True)
    time.sleep(float(os.environ.get("FAKE_READY_AFTER_S", "0")))
    server = FakeOpenAIServer(FakeBehavior(record=False), host=args.host, port=args.port).start()
    print(f"[fake] serving on {server.base_url}", flush=True)
    while True:
        time.sleep(3600)


def _gpus(visible: str | None) -> set[str]:
    return set(visible.split(",")) if visible else {ALL}  # unset: every GPU of the host


def _left_before(folder: Path, gpus: set[str]) -> list[int]:
    """The processes (servers and ranks) of the servers recorded before this one on its GPUs that still live.
    Servers packed at once write their records meanwhile: each is written whole (`atomic_write`), or a read here
    could see half of one and end this server (a likely cause of the one `fail:server-exited` the packing test
    gave, on a loaded host)."""
    alive = []
    for path in folder.glob("*.json"):
        earlier = json.loads(path.read_text())
        if gpus & _gpus(earlier["gpus"]) or ALL in gpus | _gpus(earlier["gpus"]):
            for pid in (earlier["pid"], *earlier["ranks"]):
                try:
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        alive.append(pid)
                except psutil.NoSuchProcess:
                    pass
    return alive


def _rank() -> int:
    """A rank process outside this one's tree, in its process group; its pid."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        grandchild = os.fork()
        if grandchild:
            os.write(write, str(grandchild).encode())
            os._exit(0)
        os.close(write)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(3600)
    os.close(write)
    pid = int(os.read(read, 32))
    os.close(read)
    os.wait()  # the intermediate child
    return pid


if __name__ == "__main__":
    sys.exit(main())
