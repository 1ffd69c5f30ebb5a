"""The tiny model and the benchmark client against a REAL `transformers serve` on the CPU.

Venvs (uv, transformers[serving] + torch) and the model are cached under ``SERVEMATRIX_TEST_CACHE`` (default
``.servematrix/test-cache`` in the repository, which is gitignored). Environment knobs:

* ``SERVEMATRIX_TEST_TRANSFORMERS``: comma-separated versions (default ``5.5.4,5.24.0``, the oldest and newest
  that serve a local directory offline with usage in the stream);
* ``SERVEMATRIX_TEST_TORCH``: the torch pin (default ``2.9.1``).

The helpers here (:func:`ensure_venv`, :func:`ensure_model`, :func:`transformers_serve`) are also used by
``tests/benchmarks/test_client_headroom.py``.
"""

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from servematrix.engines.transformers import tinymodel
from servematrix.stages.bench import Workload, run_workload_sync, smoke_check_sync

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SERVEMATRIX_TEST_CACHE") or REPO / ".servematrix" / "test-cache")
VERSIONS = [v.strip() for v in os.environ.get("SERVEMATRIX_TEST_TRANSFORMERS", "5.5.4,5.24.0").split(",") if v.strip()]
TORCH = os.environ.get("SERVEMATRIX_TEST_TORCH", "2.9.1")
# Without these two, continuous batching sizes its KV cache from free RAM (14 GiB RSS, a 15-30 s first request).
CB_FLAGS = ("--continuous-batching", "--cb-num-blocks", "512", "--cb-max-batch-tokens", "512")
MODES = {"static": (), "continuous-batching": CB_FLAGS}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between concurrent test sessions sharing the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_venv(version: str, torch_version: str = TORCH) -> Path:
    """A cached venv with ``transformers[serving]==version`` and torch; returns its python."""
    venv = CACHE / "venvs" / f"transformers-{version}-torch-{torch_version}"
    ready = venv / ".servematrix-ready"
    python = venv / "bin" / "python"
    with _locked(CACHE / "venvs" / ".lock"):
        if ready.exists():
            return python
        env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
        # `requests` is missing from the [serving] extra of 5.4-5.20.
        reqs = [f"transformers[serving]=={version}", f"torch=={torch_version}", "requests"]
        for cmd in (
            ["uv", "venv", "--clear", str(venv), "-p", sys.executable],
            ["uv", "pip", "install", "-p", str(python), *reqs],
        ):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        ready.write_text(json.dumps({"transformers": version, "torch": torch_version}) + "\n")
    return python


def ensure_model(python: Path) -> Path:
    """The tiny model, built with ``python`` (a cell-like environment) by running tinymodel.py as a script."""
    out = CACHE / "models" / f"tiny-llama-{tinymodel.input_hash()[:12]}"
    with _locked(CACHE / "models" / ".lock"):
        if not tinymodel.is_built(out):
            proc = subprocess.run(
                [str(python), str(tinymodel.builder_path()), str(out)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                pytest.fail(f"tinymodel build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    base_url: str
    model: str  # what to send as the request's "model": exactly the positional argument given to serve
    log: Path
    pid: int


@contextmanager
def transformers_serve(
    python: Path, model_dir: Path, extra: tuple[str, ...] = (), *, ready_timeout_s: float = 180.0
) -> Iterator[Served]:
    """Start `transformers serve MODEL_DIR` (5.5+ argv) on a free port, in its own process group."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tf-serve-"))
    hf_home = work / "hf"
    # Before 5.24, GET /v1/models answers 500 (CacheNotFound) unless the hub cache folder exists.
    (hf_home / "hub").mkdir(parents=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(hf_home))
    log = work / "serve.log"
    argv = [
        str(python.parent / "transformers"),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]
    with log.open("wb") as logf:
        proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:  # a fresh connection per probe: a failed probe may drop the connection
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"not ready in {ready_timeout_s} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield Served(base_url=base, model=str(model_dir), log=log, pid=proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        shutil.rmtree(work, ignore_errors=True)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("version", VERSIONS)
def test_tiny_model_builds_deterministically_with_the_cell_python(version, tmp_path):
    python = ensure_venv(version)
    cached = ensure_model(python)
    marker = tinymodel.read_marker(cached)
    assert marker["input_hash"] == tinymodel.input_hash() and tinymodel.is_built(cached)

    proc = subprocess.run(
        [str(python), str(tinymodel.builder_path()), str(tmp_path / "m"), "--force"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = tinymodel.read_marker(tmp_path / "m")
    assert again["versions"]["transformers"] == version
    for name in ("model.safetensors", "tokenizer.json"):  # the same bytes, whatever transformers wrote them
        assert again["files"][name] == marker["files"][name] == _sha256(tmp_path / "m" / name)
    assert 1000 <= again["vocab_size"] <= 2000
    assert (tmp_path / "m" / "model.safetensors").stat().st_size < 2_000_000


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("version", VERSIONS)
def test_real_server_bench_and_smoke(version, mode):
    python = ensure_venv(version)
    model_dir = ensure_model(python)
    w = Workload(concurrency=(1, 4), input_len=32, output_len=16, prompts_per_concurrency=8, warmup=1, repeats=2)
    with transformers_serve(python, model_dir, MODES[mode]) as srv:
        smoke = smoke_check_sync(srv.base_url, srv.model)
        assert smoke.ok, smoke.reason

        report = run_workload_sync(srv.base_url, srv.model, w, progress=print)
        assert report.error_count == 0, report.to_dict()
        # usage is the only token count, and the tiny model never stops early (EOS logit pinned to 0):
        expected = len(w.concurrency) * w.repeats * w.prompts_per_concurrency * w.output_len
        assert report.completion_tokens == expected
        for lv in report.levels:
            assert sum(r.completion_tokens for r in lv.runs) == lv.completion_tokens
            assert all(r.prompt_tokens > w.prompts_per_concurrency * w.input_len * 0.5 for r in lv.runs)
            assert all(r.ttft.count == w.prompts_per_concurrency for r in lv.runs)
        print(f"transformers {version} {mode}: tok/s { ({c: report.output_tok_s(c) for c in w.concurrency}) }")

        if mode != "static":
            return
        # ignore_eos is sglang's; transformers validates fields and answers 422.
        w1 = Workload(concurrency=(1,), input_len=8, output_len=4, prompts_per_concurrency=1, warmup=0, repeats=1)
        bad = run_workload_sync(srv.base_url, srv.model, Workload(**{**w1.__dict__, "ignore_eos": True}))
        assert bad.levels[0].runs[0].errors == {"http_422": 1}

        completions = run_workload_sync(srv.base_url, srv.model, Workload(**{**w1.__dict__, "api": "completions"}))
        models = httpx.get(srv.base_url + "/v1/models", timeout=10)
        assert models.status_code == 200  # needs the hub cache folder before 5.24
        if version == "5.5.4":
            assert completions.levels[0].runs[0].errors == {"http_404": 1}  # no /v1/completions yet
        else:
            assert completions.error_count == 0 and completions.completion_tokens == 4
            assert smoke_check_sync(srv.base_url, srv.model, api="completions").ok
            assert [m["id"] for m in models.json()["data"]] == [srv.model]
