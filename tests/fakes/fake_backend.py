"""A FAKE backend for pipeline tests: `build` makes nothing, `launch` runs tests/fakes/fake_crashing_server.py
on the port the harness picked, whatever engine argv it is given (or, given `server`, that script with the
engine's argv: tests/fakes/fake_multi_gpu_server.py). It lets the real pipeline, store and serve stage run
end to end in a second, with faults on demand."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from servematrix.backends import BuildInput, Built, HostProcesses, LaunchSpec

FAKE_SERVER = Path(__file__).resolve().parent / "fake_crashing_server.py"

# A transformers matrix of two environments x two modes; the fake backend ignores what it would install.
MATRIX = """
engine = "transformers"
[model]
name = "m"
path = "m"
[axes]
transformers = ["5.5.4", "5.24.0"]
torch = ["2.9.1"]
gpu = ["cpu"]
mode = ["static", "continuous-batching"]
[gpu.cpu]
arch = "cpu"
count = 0
[server]
ready_timeout_s = 30
{server}
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


class FakeBackend(HostProcesses):
    name = "fake"
    bind_host = "127.0.0.1"

    def __init__(
        self,
        root: Path,
        *,
        server_args: Sequence[str] = ("--serve-after", "0.1"),
        build_log: str | None = None,
        build_raises: bool = False,
        launches: Path | None = None,
        builds: Path | None = None,
        server: Path | None = None,
    ) -> None:
        self.root = root
        self.server_args = tuple(server_args)
        self.build_log = build_log  # a failed build that printed this
        self.build_raises = build_raises
        self.launches = launches  # a JSON line per launch: the argv and env the harness asked for
        self.builds = builds  # a line per build: the environment's id
        self.server = server  # a script run with the engine's argv (less its program), instead of FAKE_SERVER

    def build(self, request: BuildInput, log_path: Path) -> Built:
        if self.builds is not None:
            with self.builds.open("a") as out:
                out.write(request.env_id + "\n")
        if self.build_raises:
            raise RuntimeError("the fake backend fell over")
        if self.build_log is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(self.build_log)
            return Built(ok=False, env_id=request.env_id, excerpt=self.build_log.splitlines()[-1])
        return Built(ok=True, env_id=request.env_id, prefix=self.root, lock_hash="fake")

    def model_location(self, model_dir: Path) -> str:
        return str(model_dir)

    def launch(
        self, built: Built, argv: tuple[str, ...], env: Mapping[str, str], port: int, *, model_dir: Path | None
    ) -> LaunchSpec:
        if self.launches is not None:
            with self.launches.open("a") as out:
                out.write(json.dumps({"argv": list(argv), "env": dict(env), "pid": os.getpid()}) + "\n")
        if self.server is not None:
            return LaunchSpec(
                argv=(sys.executable, str(self.server), *argv[1:]), env={**os.environ, **env}, owns_listener=True
            )
        return LaunchSpec(
            argv=(sys.executable, str(FAKE_SERVER), "--port", str(port), *self.server_args),
            env={**os.environ, **env},
            owns_listener=True,
        )

    def python(self, built: Built, *, visible: tuple[Path, ...] = ()) -> tuple[str, ...]:
        return (sys.executable,)
