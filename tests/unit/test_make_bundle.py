"""ci/gpu/make_bundle.py: what a GPU node's bundle carries of a release's lock, read from the real 0.5.15 lock
(tests/integration/test_make_bundle_real.py makes one with uv)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("make_bundle", REPO / "ci" / "gpu" / "make_bundle.py")
assert _spec is not None and _spec.loader is not None
make_bundle = importlib.util.module_from_spec(_spec)  # a script of ci/, not a module of the package
_spec.loader.exec_module(make_bundle)

LOCK_0_5_15 = REPO / "matrix" / "locks" / "9fd74eab7972.lock.txt"  # h200-smoke, sglang 0.5.15


def test_the_bundle_carries_the_engine_and_what_the_node_lacks_never_its_cuda_stack(tmp_path: Path):
    node = tmp_path / "node.txt"
    # the node's: one at the lock's version, one by name alone, two of the engine's pinned stack
    node.write_text("# a comment\nfastapi==0.165.0\nnumpy\nkernels==0.17.2\ntransformers\n")
    carried, skipped = make_bundle.select(LOCK_0_5_15, node)
    names = {block.split("==")[0] for block in carried}
    assert {"sglang", "sglang-kernel", "sgl-deep-gemm", "flashinfer-python", "ipython"} <= names
    # the engine's pinned stack goes first on the path whatever the node has
    assert {"kernels", "transformers"} <= names
    assert "fastapi" not in names and "fastapi==0.165.0: the node has it (0.165.0)" in skipped
    assert "numpy" not in names and any(s.startswith("numpy==") and "its own version" in s for s in skipped)
    assert not names & {"torch", "triton", "torchvision", "nvidia-cublas", "nvidia-nccl-cu13", "cuda-toolkit"}
    assert "torch==2.11.0: the node's CUDA stack, never bundled" in skipped
    assert "nvidia-cudnn-frontend" in names  # an ordinary package, not torch's stack
    assert not names & {"tilelang", "flash-attn-4", "flashinfer-cubin", "nvidia-cuda-nvcc"}
    # every carried block keeps the lock's hashes: uv installs it with --require-hashes
    assert all("--hash=sha256:" in block and not block.endswith("\\") for block in carried)
    sglang = next(b for b in carried if b.startswith("sglang==0.5.15"))
    assert sglang.count("--hash=") >= 1


def test_carry_torch_carries_torchs_stack_where_the_node_has_another_or_an_unknown_version(tmp_path: Path):
    """sglang 0.5.23 pins torch 2.14.1, which the node lacks: `--carry-torch` lifts NEVER only where the node's
    version is not the lock's (read here from the 0.5.15 lock: torch 2.11.0, triton 3.6.0)."""
    node = tmp_path / "node.txt"
    node.write_text("torch==2.10.0\ntriton==3.6.0\nnvidia-cublas\nnumpy\n")
    default, default_skipped = make_bundle.select(LOCK_0_5_15, node)
    assert not {b.split("==")[0] for b in default} & {"torch", "triton", "nvidia-cublas"}  # unchanged
    assert "torch==2.11.0: the node's CUDA stack, never bundled" in default_skipped
    carried, skipped = make_bundle.select(
        LOCK_0_5_15, node, carry_torch=True, node_versions={"nvidia-cuda-runtime": "13.0.96"}
    )
    names = {block.split("==")[0] for block in carried}
    assert "torch" in names  # the node has another version
    assert "nvidia-cublas" in names  # the node's version is not known
    assert "nvidia-nccl-cu13" in names  # the node lacks it (by this list)
    assert "triton" not in names and any(s.startswith("triton==3.6.0: the node has it") for s in skipped)
    assert "nvidia-cuda-runtime" not in names  # --node-version says the node has the lock's
    assert "numpy" not in names  # the ordinary rule is unchanged
    assert not names & {"nvidia-cuda-nvcc", "flashinfer-cubin"}  # LEFT_OUT still applies
    assert all("--hash=sha256:" in block for block in carried)
    assert {b.split("==")[0] for b in default} < names


def test_a_node_version_that_is_not_name_equals_version_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    node = tmp_path / "node.txt"
    node.write_text("torch\n")
    out = tmp_path / "out"
    assert make_bundle.main([str(LOCK_0_5_15), str(node), str(out), "--carry-torch", "--node-version", "torch"]) == 2
    assert "--node-version 'torch': not NAME==VERSION" in capsys.readouterr().err
    assert not out.exists()


def test_a_missing_lock_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert make_bundle.main([str(tmp_path / "nope.lock.txt"), str(tmp_path), str(tmp_path / "out")]) == 2
    assert "nope.lock.txt: no such file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_committed_node_list_keeps_the_h200_bundle_to_what_the_node_lacks():
    carried, _ = make_bundle.select(LOCK_0_5_15, REPO / "ci" / "gpu" / "h200-node-packages.txt")
    names = {block.split("==")[0] for block in carried}
    assert not names & {"numpy", "pandas", "pyarrow", "scipy", "aiohttp", "requests"}  # the node has them
    assert {"sglang", "fastapi", "ipython", "transformers"} <= names
    # Without CuTe DSL's `cutlass`, 0.5.15 skipped its deepseek_v2 module and served GLM-5 through the
    # Transformers fallback, which failed (the H200, 2026-12-05).
    assert {"nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-cu13"} <= names


def test_a_part_is_what_the_working_tree_leaves_of_a_device_call():
    mib = 1024 * 1024
    assert make_bundle.part_bytes(22 * mib) == 64 * mib - 22 * mib - make_bundle.MARGIN_BYTES
    # part + tree + margin is one call, whatever the tree
    for tree in (0, 10 * mib, 40 * mib):
        assert make_bundle.part_bytes(tree) + tree + make_bundle.MARGIN_BYTES == make_bundle.CALL_BYTES
    assert make_bundle.part_bytes(70 * mib) == make_bundle.MIN_PART_BYTES  # the tree must shrink first


def test_the_working_tree_is_what_a_device_call_carries(tmp_path: Path):
    """Tracked files and untracked ones git does not ignore travel; ignored ones (bundles, venvs) do not."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("parts/\n")
    (tmp_path / "tracked.txt").write_bytes(b"x" * 1000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt", ".gitignore"], check=True)
    (tmp_path / "untracked.txt").write_bytes(b"y" * 300)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "site.tar.xz.00").write_bytes(b"z" * 5000)
    assert make_bundle.tree_bytes(tmp_path) == 1000 + 300 + len("parts/\n")
