"""verdict: which failures are the harness's (data/harness_faults.toml), and what is retried."""

from __future__ import annotations

from importlib import resources

import pytest

from servematrix.errors import InputError
from servematrix.formats import tomlsource
from servematrix.formats.verdict import (
    RETRY_KINDS,
    HarnessFaults,
    Verdict,
    build_failed,
    failed,
    harness_faults,
    served,
)
from servematrix.stages.resolve import classify_failure

DATA = resources.files("servematrix.data").joinpath("harness_faults.toml").read_bytes()


def test_the_packaged_harness_faults_load():
    faults = harness_faults()
    assert "address-in-use" in faults.serve.harness_port_classes
    assert faults.resolve.network_patterns and faults.resolve.conflict_patterns


@pytest.mark.parametrize(
    ("old", "new", "at", "where"),
    [
        (b"network_fault =", b"network_faults =", b"network_faults =", ": build.network_faults: unknown key"),
        (
            b"'\\bunsatisfiable\\b',",
            b"'(unsatisfiable',",
            b"conflict_patterns =",
            ": resolve.conflict_patterns: invalid regex",
        ),
        (b"schema = 1", b"schema = 2", b"schema = 2", ": schema: must be 1, got 2"),
    ],
)
def test_malformed_harness_faults_name_file_line_and_key(old, new, at, where):
    assert old in DATA
    broken = DATA.replace(old, new, 1)
    line = broken[: broken.index(at)].count(b"\n") + 1
    with pytest.raises(InputError) as info:
        tomlsource.validate(tomlsource.parse(broken, "harness_faults.toml"), HarnessFaults)
    assert str(info.value).startswith(f"harness_faults.toml:{line}{where}"), str(info.value)


def test_retried_verdicts_are_not_final():
    assert {kind for kind in ("pass", "fail", "skipped", "unresolvable", "error", "interrupted")
            if not Verdict(kind=kind).final} == RETRY_KINDS == {"error", "interrupted"}  # fmt: skip


def test_a_port_race_the_harness_caused_is_its_own_error():
    lost = failed("address-in-use", excerpt="OSError: [Errno 98] Address already in use")
    assert str(served(lost, harness_picked_port=True)) == "error:port-in-use"
    assert served(lost, harness_picked_port=False) == lost


@pytest.mark.parametrize(
    ("tail", "verdict"),
    [
        (
            "error: Failed to fetch: https://x/simple/torch/\n  Caused by: dns error: failed to lookup address",
            "error:build-network",
        ),
        ("Error: initializing source docker://nvidia/cuda: pinging container registry", "error:build-network"),
        ("error: Failed to fetch: https://x/torch.whl\n  HTTP status client error (404 Not Found)", "fail:build"),
    ],
)
def test_a_build_that_could_not_reach_the_network_is_retried(tail, verdict):
    assert str(build_failed("step 3/5 failed", tail)) == verdict


@pytest.mark.parametrize(
    "tail",
    [
        # podman, out of space after the step ran (issue 38): was a published fail:build
        "STEP 7/9: RUN uv pip sync /lock.txt\nInstalled 180 packages\nError: committing container for step "
        '{Env:[] Command:run}: copying layers and metadata for container "3f2": writing blob: adding layer '
        'with blob "sha256:9a1": processing tar file(write /usr/lib/libcudnn.so.9): no space left on device',
        "OSError: [Errno 28] No space left on device: '/root/.cache/uv/archive-v0/x'",
        "error: failed to write to file `/venv/lib/x.so`: Disk quota exceeded (os error 122)",
        'Error: creating build container: creating read-write layer with ID "a": mkdir /var/lib/x: read-only file system',
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
    ],
)
def test_a_fault_of_the_hosts_storage_or_container_engine_is_the_harnesss(tail):
    assert str(build_failed("step 7/9 failed", tail)) == "error:build-storage"


@pytest.mark.parametrize(
    ("stderr", "status"),
    [
        ("error: Request failed after 3 retries\n  Caused by: connection reset", "error"),
        ("error: Package `torch` was not found in the cache and network was disabled", "error"),
        (
            "× No solution found when resolving dependencies:\n  ╰─▶ sglang==0.5.9 depends on torch==2.8.0",
            "unresolvable",
        ),
        ("× No solution found ... error sending request for url", "error"),  # the network first
        ("error: something new", "error"),
    ],
)
def test_resolve_failures_follow_the_data(stderr, status):
    assert classify_failure(stderr)[0] == status
