"""One job of a packed run, or of a concurrent pre-flight (`pool.py`: no GPUs, its progress relayed to the
harness as events), in a process of its own: `python -m servematrix.run.packjob`, its job on stdin.

It ends with the harness that started it (PR_SET_PDEATHSIG: SIGTERM when the harness dies, SIGKILL included),
runs on its GPUs (CUDA_VISIBLE_DEVICES, numbered as nvidia-smi numbers them) and CPUs (its affinity, which its
servers and benchmark client inherit), and runs its cells through the ordinary pipeline. SIGTERM and SIGINT
stop it as they stop a run: its servers are torn down and its cell is marked interrupted (exit 130). The
harness (`packing.py`, `pool.py`) reads the verdicts from the store.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys

import psutil
from rich.console import Console

from servematrix.config.spec import load_spec
from servematrix.errors import EXIT_BAD_INPUT, InputError
from servematrix.planning.plan import plan_spec
from servematrix.run import progress
from servematrix.run.packing import JOB_PATH_ENV, PackedJob
from servematrix.run.pipeline import run_plan
from servematrix.util import interrupt_on_signals

PR_SET_PDEATHSIG = 1  # linux/prctl.h
EXIT_INTERRUPTED = 130


def main() -> int:
    found = os.environ.pop(JOB_PATH_ENV, "")  # its harness's import path (packing.job_environment)
    sys.path += [path for path in found.split(os.pathsep) if path and path not in sys.path]
    job: PackedJob = pickle.load(sys.stdin.buffer)  # written by the harness that started this process
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        _end_with(job.harness_pid)
        if job.placement is not None:
            os.sched_setaffinity(0, job.placement.cpus)
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in job.placement.gpus)
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's own order is fastest first, not nvidia-smi's
        if job.relay:
            progress.relay_to(sys.stdout)
        plan = plan_spec(load_spec(job.matrix), [f"id={'|'.join(job.cell_ids)}"], max_cells=job.max_cells)
        with interrupt_on_signals() if job.relay else contextlib.nullcontext():  # as `servematrix run` runs
            summary = run_plan(plan, job.backend, job.options, console=Console(file=sys.stdout, width=160))
        progress.relay({"reused": summary.reused, "owned": summary.skipped_owned})
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except InputError as exc:
        print(f"servematrix: {exc}", flush=True)
        return EXIT_BAD_INPUT
    finally:
        _kill_descendants()
    return 0


def _end_with(harness_pid: int) -> None:
    """SIGTERM this process when the harness dies; if it already has, stop now."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != harness_pid:
        raise KeyboardInterrupt


def _kill_descendants() -> None:
    """Kill whatever this job started that is still alive as it ends: the pipeline stops the programs it waits
    on, not one that a hook started and left (its own session: a process group's kill misses it). A job whose
    harness was SIGKILLed has nobody after it (an interrupted harness kills what is left after STOP_GRACE_S):
    a CI run once found a program alive a minute after such a job ended."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def _interrupt(signum: int, frame: object) -> None:
    # Once: a second signal must not cut short the teardown the first one started.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
