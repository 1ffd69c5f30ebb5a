"""The load pre-flight: sglang's own start-up path on the CPU, as far as it goes, for one cell (issue 33).

`load_script.py` runs in the environment the import check installs (the cell's whole lock, handed to the hook
by the runner as `PreflightInput.python`) and walks the release's own code with the cell's exact argv and the
model's config files (no weights): ServerArgs through the release's argparse, the model config through its
loader and the locked transformers, the architecture in its registry, the MoE runner and attention backends
it chooses for the cell's arch, one single-rank process group, the quantization method, and the model's
modules built on the meta device with the layers reduced (the dense layers and the first MoE layer).
The device is faked at the level of sglang's platform helpers; everything faked is reported.

Verdicts:
- an exception in the release's own code: `predicted-fail:<class>`, the frames that raised it as the excerpt
  (`moe-runner-unsupported` for the MoE runner a release cannot build for this quantization,
  `model-unsupported` as data/signatures/sglang.toml names a model the release or its transformers does not
  know, else `load-failed`);
- the module build reached: a `pass` whose evidence says how far ("loaded to the module build for sm_120,
  4 of 78 layers"), shown beside the cell's verdict;
- the probe stopped for a reason that is not the stack's (a GPU the CPU cannot fake, a stub called, a fault of
  the probe itself): a `pass` whose evidence names the last step reached and why it stopped (never called
  passed); no environment here (a host with the GPUs, no import check): nothing to say.

How far it reaches (measured 2026-12-04 on a 2-core CPU host, GLM-5-NVFP4's config, the RTX PRO 6000 recipe on
sm_120; every release fakes the device queries and sglang's platform helpers, a one-rank group and 4 of 78
layers):

| sglang (lock) | --moe-runner-backend cutlass | flashinfer_cutlass |
|---|---|---|
| 0.5.6 (84437ddb6538) | nothing: its server_args imports sgl_kernel, which wants libcuda.so.1 | the same |
| 0.5.9 (6e4497e8ccf6) | fails at ServerArgs: transformers 4.57.1 does not know `glm_moe_dsa` | the same |
| 0.5.10 (766fa65aeb1e) | the model config; the registry skipped deepseek_v2 (sgl_kernel wants libcuda) | the same |
| 0.5.12 (ea51dcc11cfb) | fails at the module build: runner.py "Unsupported runner backend" | the module build |
| 0.5.14 (eceb89215a2f) | fails at the module build: runner.py "Unsupported runner backend" | the module build |
| 0.5.17 (6e276500a12c) | fails at the module build: modelopt_quant.py "Use ... flashinfer_cutlass" | the module build |
| 0.5.23 (ab2d99e82a89) | fails at the module build: modelopt_quant.py "Use ... flashinfer_cutlass" | the module build |

Also the module build: 0.5.23's B200 recipe (flashinfer_trtllm) on sm_100, and sglang 0.5.12 with the random
Llama of h200-smoke on sm_90 (2 of 16 layers), in each of its modes.

One probe process per environment and arch: it imports sglang once (about 70-170 s on a 2-core host) and
answers each cell from a fork in under a second. Results are cached by the lock's pins, the request, the
config files and this code.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import select
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Any

from servematrix.engines.hooks import PreflightInput, PreflightUnavailable
from servematrix.formats.verdict import Verdict
from servematrix.util import atomic_write

RESULT_SCHEMA = 1
READY_TIMEOUT_S = 900.0  # importing sglang once, on a loaded 2-core host
REQUEST_TIMEOUT_S = 300.0
LAUNCHER = "sglang.launch_server"
# What each step is, as the page says it ("loaded to the module build").
STEPS = {
    "server-args": "ServerArgs",
    "model-config": "the model config",
    "architecture": "the model registry",
    "backends": "the backend choice",
    "distributed": "the process group",
    "quantization": "the quantization method",
    "modules": "the module build",
}
# sglang's own messages that name a failure class; the first that matches wins, else `load-failed`.
CLASSES = (
    # 0.5.12, 0.5.14: moe_runner/runner.py; 0.5.17, 0.5.23: modelopt_quant.py create_moe_runner.
    (
        re.compile(
            r"Unsupported runner backend|is not supported for NVFP4 MoE|moe_runner_backend=\S+ is not supported"
        ),
        "moe-runner-unsupported",
    ),
    (
        re.compile(r"does not support NVFP4|not supported for the current GPU|Please use Blackwell"),
        "quantization-unsupported-gpu",
    ),
    # The release's argparse refused the argv (the flags pre-flight, which runs first, says so from the wheel).
    (re.compile(r"error: unrecognized arguments:|error: argument "), "unknown-flag"),
    # The class data/signatures/sglang.toml has for these messages (its model-unsupported patterns).
    (
        re.compile(
            r"but Transformers does not recognize this architecture|Model architectures \[[^\]]*\] are not supported"
        ),
        "model-unsupported",
    ),
)
DEFAULT_CLASS = "load-failed"
SCRIPT = "load_script.py"


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    steps: tuple[dict[str, Any], ...]
    reached: str | None
    faked: tuple[str, ...]
    error: dict[str, Any] | None
    seconds: float = 0.0
    cached: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any], *, cached: bool = False) -> LoadResult:
        return cls(
            steps=tuple(data.get("steps") or ()),
            reached=data.get("reached"),
            faked=tuple(data.get("faked") or ()),
            error=data.get("error") or None,
            seconds=float(data.get("seconds") or 0.0),
            cached=cached,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "reached": self.reached,
            "faked": list(self.faked),
            "error": self.error,
            "seconds": self.seconds,
        }

    @property
    def failed_step(self) -> str | None:
        return next((s["name"] for s in self.steps if not s.get("ok")), None)

    def layers(self) -> tuple[int | None, int | None]:
        """(layers built, of how many) from the module build's detail."""
        step = next((s for s in self.steps if s.get("name") == "modules" and s.get("ok")), None)
        if step is None:
            return None, None
        try:
            detail = json.loads(step.get("detail") or "{}")
        except json.JSONDecodeError:
            return None, None
        return detail.get("layers_built"), detail.get("of")


# -- the request --------------------------------------------------------------------------------------
def server_argv(command: tuple[str, ...] | list[str]) -> list[str]:
    """The server's own arguments of a cell's command: what follows the launcher (`-m sglang.launch_server`)."""
    command = list(command)
    if LAUNCHER in command:
        return command[command.index(LAUNCHER) + 1 :]
    return command


def arch_of(gpu_arch: str) -> str:
    """`sm_120` -> `12.0`, `sm_100` -> `10.0`, `sm_90` -> `9.0`."""
    digits = gpu_arch.removeprefix("sm_")
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"not a CUDA arch: {gpu_arch}")
    return f"{int(digits[:-1])}.{int(digits[-1])}"


def tp_of(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg in ("--tp", "--tp-size", "--tensor-parallel-size") and i + 1 < len(argv):
            return int(argv[i + 1])
        for flag in ("--tp=", "--tp-size=", "--tensor-parallel-size="):
            if arg.startswith(flag):
                return int(arg[len(flag) :])
    return 1


def request_for(inp: PreflightInput) -> dict[str, Any]:
    assert inp.model_config is not None
    argv = server_argv(inp.cell.command)
    return {"argv": argv, "model_dir": str(inp.model_config), "tp_size": tp_of(argv)}


# -- the verdict --------------------------------------------------------------------------------------
def _where(arch: str) -> str:
    return f"for sm_{arch.replace('.', '')}"


def _faked_short(faked: tuple[str, ...]) -> str:
    """What was faked, in a few words for the page (the full list is in the excerpt)."""
    parts = []
    if any("device queries" in f or "platform helpers" in f for f in faked):
        parts.append("the GPU's capability")
    if any("tensor parallelism 1" in f for f in faked):
        parts.append("one rank")
    stubs = [f for f in faked if f.startswith("stubbed ")]
    if stubs:
        parts.append(f"{len(stubs)} stubbed op(s)")
    return ", ".join(parts)


def stopped_by_harness(error: dict[str, Any], needs_gpu: tuple[str, ...]) -> str | None:
    """Why a probe that stopped says nothing about the stack, else None: a GPU the CPU cannot fake (the
    engine's `needs_gpu` lines), a stub that was called, or a fault of the probe's own code."""
    message = f"{error.get('type', '')}: {error.get('message', '')}"
    if error.get("type") == "UsageError":  # the release's own argparse, raised through the probe's parser
        return None
    if any(pattern in message for pattern in needs_gpu):
        return "needs a GPU"
    if re.search(r"\bstub \S+ called\b", message) or error.get("type") == "crash":
        return "the CPU stand-in could not go further"
    skipped = [line for line in error.get("skipped_models") or () if "libcuda" in line or "common_ops" in line]
    if skipped:  # the architecture's module did not import off a GPU (sgl_kernel needs libcuda.so.1)
        return "needs a GPU (the registry could not import model modules here: sgl_kernel wants libcuda.so.1)"
    frames = error.get("frames") or []
    if not frames or str(frames[-1].get("file", "")).endswith(SCRIPT):
        return "a fault of the load probe itself"
    return None


def excerpt_of(result: LoadResult) -> str:
    error = result.error or {}
    lines = [f"Traceback (load pre-flight: sglang's own start-up on the CPU, step {result.failed_step}):"]
    lines += [
        f'  File "{f.get("file")}", line {f.get("line")}, in {f.get("function")}' for f in error.get("frames") or ()
    ]
    lines.append(f"{error.get('type')}: {error.get('message')}")
    lines.append("faked: " + "; ".join(result.faked))
    return "\n".join(lines)


def class_of(message: str) -> str:
    return next((name for pattern, name in CLASSES if pattern.search(message)), DEFAULT_CLASS)


def verdict_of(result: LoadResult, *, arch: str, needs_gpu: tuple[str, ...] = ()) -> Verdict:
    where = _where(arch)
    faked = _faked_short(result.faked)
    faked_note = f"; faked: {faked}" if faked else ""
    if result.error is None and result.reached == "modules":
        built, total = result.layers()
        layers = f", {built} of {total} layers" if built is not None and total is not None else ""
        return Verdict(kind="pass", evidence=(f"load: loaded to the module build {where}{layers}{faked_note}",))
    reached = STEPS.get(result.reached or "", "nothing")
    error = result.error or {"type": "unknown", "message": "the probe gave no answer", "frames": []}
    why = stopped_by_harness(error, needs_gpu)
    if why is not None:
        message = f"{error.get('type')}: {str(error.get('message'))[:200]}"
        return Verdict(
            kind="pass",
            evidence=(f"load: reached {reached} {where}, then stopped: {why} ({message}); not a verdict on the stack",),
        )
    failed = STEPS.get(result.failed_step or "", result.failed_step or "?")
    return Verdict(
        kind="predicted-fail",
        detail=class_of(f"{error.get('type')}: {error.get('message')}"),
        excerpt=excerpt_of(result),
        evidence=(
            f"load: failed at {failed} {where} with sglang's own error: {error.get('type')}: "
            f"{str(error.get('message'))[:300]}{faked_note}",
        ),
    )


# -- the probe process ----------------------------------------------------------------------------------
class ProbeFault(Exception):
    """The probe process did not answer (no verdict on the stack)."""


class _Worker:
    """One load_script.py process: sglang imported once, each request answered from a fork."""

    def __init__(self, python: Path, arch: str, log: Path, env: dict[str, str]) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = log.open("ab")
        with resources.as_file(resources.files(__package__).joinpath(SCRIPT)) as script:
            self.proc = subprocess.Popen(
                [str(python), str(script), "--arch", arch],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
                start_new_session=True,
            )
        self.ready = self._read(READY_TIMEOUT_S)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ProbeFault(f"the load probe gave no answer within {timeout_s:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.close()
                raise ProbeFault(f"the load probe exited (status {self.proc.poll()})")
            line += chunk
        return json.loads(line.splitlines()[0])

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            self.close()
            raise ProbeFault(f"the load probe is gone: {exc}") from None
        return self._read(REQUEST_TIMEOUT_S)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self._log.close()


_WORKERS: dict[tuple[str, str], _Worker] = {}


def _worker(python: Path, arch: str, inp: PreflightInput) -> _Worker:
    key = (str(python), arch)
    if key not in _WORKERS:
        for other in [k for k in _WORKERS if k[0] != key[0]]:  # the previous environment's: its venv goes
            _WORKERS.pop(other).close()
        env = {**os.environ, **inp.engine.import_check.env, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
        env.pop("VIRTUAL_ENV", None)
        log = Path(inp.cache_dir) / "load" / "logs" / f"{inp.cell.env_id}-sm{arch.replace('.', '')}.log"
        worker = _Worker(python, arch, log, env)
        if not worker.ready.get("ready"):
            worker.close()
            # sglang did not even import here: the import check decides that, not this pre-flight.
            raise ProbeFault(f"the load probe could not prepare: {json.dumps(worker.ready.get('error'))[:300]}")
        _WORKERS[key] = worker
    return _WORKERS[key]


@atexit.register
def close_all() -> None:
    while _WORKERS:
        _WORKERS.popitem()[1].close()


# -- the cache and the hook ------------------------------------------------------------------------------
def code_version() -> str:
    digest = hashlib.sha256()
    for name in (SCRIPT, "loadprobe.py"):
        digest.update(resources.files(__package__).joinpath(name).read_bytes())
    return digest.hexdigest()[:16]


# What the load pre-flight reads of a model folder: its config and tokenizer files. A local `model.path` with no
# `config_dir` is the checkpoint itself, and its weights (hundreds of GB of shards) are never read here.
CONFIG_SUFFIXES = frozenset({".json", ".md", ".py", ".txt", ".model", ".jinja", ".tiktoken", ".yaml", ".yml"})
CONFIG_FILE_MAX = 64 * 1024 * 1024  # a tokenizer.json is tens of MB; nothing of config is larger


def config_files(folder: Path) -> list[Path]:
    """The folder's config and tokenizer files (by suffix, at most CONFIG_FILE_MAX each), sorted by name."""
    found = []
    for path in folder.iterdir():
        if path.suffix.lower() in CONFIG_SUFFIXES and path.is_file() and path.stat().st_size <= CONFIG_FILE_MAX:
            found.append(path)
    return sorted(found, key=lambda p: p.name)


def _folder_digest(folder: Path) -> str:
    entries = []
    for path in config_files(folder):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        entries.append((path.name, digest.hexdigest()))
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def result_key(inp: PreflightInput, request: dict[str, Any], arch: str) -> str:
    assert inp.model_config is not None
    wanted = {
        "code": code_version(),
        "pins": sorted(inp.pins.items()),
        "argv": request["argv"],
        "tp": request["tp_size"],
        "arch": arch,
        "config": _folder_digest(inp.model_config),
        "python": inp.cell.env.python,
    }
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:20]


def probe(inp: PreflightInput) -> LoadResult | None:
    """The load probe's result for this cell (cached), or None where this host offers no environment."""
    if inp.model_config is None or not (inp.model_config / "config.json").is_file():
        raise PreflightUnavailable("no config files of the model here (the matrix's [model] config_dir)")
    arch = arch_of(inp.cell.env.gpu.arch)
    request = request_for(inp)
    path = Path(inp.cache_dir) / "load" / "results" / f"{result_key(inp, request, arch)}.json"
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") == RESULT_SCHEMA:
            return LoadResult.from_json(data["result"], cached=True)
    if inp.python is None or not inp.pins:
        return None
    python = inp.python()
    if python is None:
        raise PreflightUnavailable("the environment's lock could not be installed for the load pre-flight")
    try:
        answer = _worker(python, arch, inp).ask(request)
    except ProbeFault as exc:
        raise PreflightUnavailable(str(exc)) from None
    result = LoadResult.from_json(answer)
    record = {"schema": RESULT_SCHEMA, "cell": inp.cell.id, "request": request, "arch": arch, "result": answer}
    atomic_write(path, json.dumps(record, indent=1) + "\n")
    return result


def load(inp: PreflightInput) -> Verdict | None:
    """The `load` pre-flight of sglang's data (see the module doc)."""
    if inp.cell.env.gpu.arch in ("cpu", "") or not inp.cell.command:
        return None
    result = probe(inp)
    if result is None:
        return None
    return verdict_of(result, arch=arch_of(inp.cell.env.gpu.arch), needs_gpu=tuple(inp.engine.import_check.needs_gpu))
