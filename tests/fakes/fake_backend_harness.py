"""A harness process for the tests to kill: `run_plan` with the FAKE backend serving the fake multi-GPU server,
as `servematrix run` runs with a real backend (the CLI offers only real ones). SIGINT and SIGTERM stop it as
they stop `servematrix run`.

    python -m tests.fakes.fake_backend_harness MATRIX STORE WORKDIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from servematrix.planning.plan import make_plan
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.util import interrupt_on_signals
from tests.fakes.fake_backend import FakeBackend

FAKE_MULTI_GPU_SERVER = Path(__file__).resolve().parent / "fake_multi_gpu_server.py"


def main() -> int:
    matrix, store, workdir = (Path(arg) for arg in sys.argv[1:4])
    options = RunOptions(stages=("build", "serve"), store=store, workdir=workdir)
    try:
        with interrupt_on_signals():
            run_plan(make_plan(matrix), FakeBackend(workdir, server=FAKE_MULTI_GPU_SERVER), options)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
