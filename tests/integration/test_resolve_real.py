"""The resolve stage against the real package index, with the real uv (its default index configuration).

These pin down the facts in shared/domain.md ("Pins of each sglang release", "Resolution notes"): if the
index or uv changes them, these tests say so.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from packaging.version import Version

from servematrix.formats.lockfile import parse_header
from servematrix.stages import resolve as resolve_stage
from servematrix.stages.resolve import ResolveRequest, release_pins, resolve

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH"),
]

# A closed port on this machine: nothing listens on discard (9), so the connection is refused at once.
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"


@pytest.fixture
def locks(tmp_path):
    return tmp_path / "locks"


@pytest.fixture
def pins_cache(tmp_path):
    return tmp_path / "release-pins"


def lock(locks, pins_cache, env_id, requirements, overrides=(), **kw):
    req = ResolveRequest(
        env_id=env_id,
        requirements=tuple(requirements),
        overrides=tuple(overrides),
        axes={"sglang": requirements[0].split("==")[1], "flashinfer": overrides[0] if overrides else "pinned"},
        **{k: v for k, v in kw.items() if k in ("python_version", "platform", "index_url")},
    )
    opts = {k: v for k, v in kw.items() if k == "timeout_s"}
    return resolve(req, out_dir=locks, pins_cache_dir=pins_cache, **opts)


def test_sglang_0_5_9_pinned(locks, pins_cache):
    out = lock(locks, pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    assert out.status == "resolved", out.reason
    assert out.pins["sglang"] == "0.5.9"
    assert out.pins["torch"] == "2.9.1"
    assert out.pins["flashinfer-python"] == "0.6.3"
    assert out.pins["sgl-kernel"] == "0.3.21"
    assert out.crossed == {}
    text = out.lockfile.read_text()
    assert "--hash=sha256:" in text
    assert parse_header(text).inputs_hash == out.inputs_hash
    assert str(locks) not in text and "/tmp" not in text  # reproducible: no machine paths


def test_sglang_0_5_12_with_flashinfer_0_6_12_crosses_the_pin(locks, pins_cache):
    out = lock(locks, pins_cache, "sglang-0.5.12-fi-0.6.12", ["sglang==0.5.12"], ["flashinfer-python==0.6.12"])
    assert out.status == "resolved", out.reason
    assert out.pins["torch"] == "2.11.0"
    assert out.pins["flashinfer-python"] == "0.6.12"
    assert out.crossed == {"flashinfer-python": {"release_pin": "0.6.11.post1", "used": "0.6.12"}}
    header = parse_header(out.lockfile.read_text())
    assert header.crossed == out.crossed
    assert header.overrides == ("flashinfer-python==0.6.12",)
    assert header.resolver.startswith("uv ")


@pytest.mark.parametrize("sglang", ["0.5.9", "0.5.6"])
def test_old_sglang_with_flashinfer_0_6_12_is_unresolvable(locks, pins_cache, sglang):
    out = lock(locks, pins_cache, f"sglang-{sglang}-fi-0.6.12", [f"sglang=={sglang}"], ["flashinfer-python==0.6.12"])
    assert out.status == "unresolvable", out.reason
    assert "nvidia-cutlass-dsl" in out.reason
    assert out.reason.startswith("No solution found")
    assert "hint" not in out.reason.lower()
    assert len(out.reason.splitlines()) <= 15
    assert out.lockfile is None and not (locks / f"sglang-{sglang}-fi-0.6.12.lock.txt").exists()
    assert out.crossed["flashinfer-python"]["used"] == "0.6.12"


def test_sglang_0_5_12_on_manylinux_2_28_is_unresolvable(locks, pins_cache):
    out = lock(locks, pins_cache, "sglang-0.5.12-228", ["sglang==0.5.12"], platform="x86_64-manylinux_2_28")
    assert out.status == "unresolvable", out.reason
    assert "no wheels with a matching platform tag" in out.reason


def test_second_resolve_is_cached_without_calling_uv(locks, pins_cache, monkeypatch):
    first = lock(locks, pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    assert first.status == "resolved" and not first.cached

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"uv was called for a cached lock: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    again = lock(locks, pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    assert again.cached and again.status == "resolved"
    assert again.pins == first.pins and again.lockfile == first.lockfile


def test_lock_is_byte_identical_across_output_dirs(tmp_path, pins_cache):
    a = lock(tmp_path / "a", pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    b = lock(tmp_path / "b", pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    assert a.lockfile.read_bytes() == b.lockfile.read_bytes()


def test_unreachable_index_is_an_error_not_unresolvable(locks, pins_cache, monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # the verdict is the same, only faster
    out = lock(locks, pins_cache, "unreachable", ["sglang==0.5.9"], index_url=UNREACHABLE_INDEX)
    assert out.status == "error", out.reason
    assert "Connection refused" in out.reason
    assert out.reason.startswith("no lock for this environment (unreachable.lock.txt in ")
    assert out.lockfile is None


def test_unreachable_index_while_reading_release_pins_is_an_error(locks, pins_cache, monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    out = lock(
        locks,
        pins_cache,
        "unreachable-crossed",
        ["sglang==0.5.12"],
        ["flashinfer-python==0.6.12"],
        index_url=UNREACHABLE_INDEX,
    )
    assert out.status == "error", out.reason
    assert "Connection refused" in out.reason


def test_release_pins_of_sglang_0_5_12(pins_cache, monkeypatch):
    pins = release_pins("sglang", "0.5.12", cache_dir=pins_cache)
    assert pins["flashinfer-python"] == "0.6.11.post1"
    assert pins["torch"] == "2.11.0"
    assert pins["sglang-kernel"] == "0.4.2.post2"
    assert (pins_cache / "sglang-0.5.12.METADATA").is_file()

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("release pins were not cached"))
    assert release_pins("sglang", "0.5.12", cache_dir=pins_cache) == pins


@pytest.mark.parametrize(
    ("sglang", "torch", "flashinfer"),
    [("0.5.6", "2.9.1", "0.5.3"), ("0.5.9", "2.9.1", "0.6.3"), ("0.5.12", "2.11.0", "0.6.11.post1")],
)
def test_release_pins_match_domain_table(pins_cache, sglang, torch, flashinfer):
    pins = release_pins("sglang", sglang, cache_dir=pins_cache)
    assert pins["torch"] == torch
    assert pins["flashinfer-python"] == flashinfer


def test_a_second_resolution_of_a_run_reads_the_index_from_uvs_cache(tmp_path, pins_cache, monkeypatch):
    """PyPI's cache policy, said to uv on every call: pages and metadata read moments ago by another
    resolution are reused, even where a proxy strips the index's own cache headers (as on this machine).
    The second resolution has no network at all: every connection goes to a closed port."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    first = lock(tmp_path / "a", pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    assert first.status == "resolved", first.reason
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    for variable in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")
    again = lock(tmp_path / "b", pins_cache, "sglang-0.5.9", ["sglang==0.5.9"])
    assert again.status == "resolved", again.reason
    assert again.lockfile.read_bytes() == first.lockfile.read_bytes()


def test_release_metadata_read_by_ranges_is_the_installed_wheels(tmp_path, monkeypatch):
    """The METADATA of sglang 0.5.12 read by HTTP ranges (39 MB wheel, a few hundred kB read) is byte for
    byte the one in the wheel uv installs."""
    target = tmp_path / "installed"
    argv = ["uv", "pip", "install", "--no-deps", "--only-binary", ":all:", "--target", str(target)]
    argv += ["--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_34", "sglang==0.5.12"]
    run = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    assert run.returncode == 0, run.stderr
    installed = (target / "sglang-0.5.12.dist-info" / "METADATA").read_text(encoding="utf-8")

    by_ranges: list[str] = []  # what the range reader returned: proof that the install fallback was not taken
    real = resolve_stage.wheel_metadata
    monkeypatch.setattr(
        resolve_stage, "wheel_metadata", lambda *a, **kw: by_ranges.append(real(*a, **kw)) or by_ranges[-1]
    )
    pins = release_pins("sglang", "0.5.12", cache_dir=tmp_path / "pins")
    assert by_ranges == [installed]
    assert (tmp_path / "pins" / "sglang-0.5.12.METADATA").read_text(encoding="utf-8") == installed
    assert pins["flashinfer-python"] == "0.6.11.post1"


def test_sglang_0_5_12_as_released_resolves_the_kernels_of_its_day(locks, pins_cache):
    """kernels 0.15+ (published after sglang 0.5.12) breaks its import; resolved as the index was on the release's
    day, the lock holds the kernels 0.5.12 shipped with, and the header says how it was made."""
    today = resolve(
        ResolveRequest(env_id="today", requirements=("sglang==0.5.12",), axes={"sglang": "0.5.12"}),
        out_dir=locks,
        pins_cache_dir=pins_cache,
    )
    released = resolve(
        ResolveRequest(
            env_id="released",
            requirements=("sglang==0.5.12",),
            axes={"sglang": "0.5.12", "resolution": "as-released"},
        ),
        out_dir=locks,
        pins_cache_dir=pins_cache,
    )
    assert today.status == released.status == "resolved", (today.reason, released.reason)
    assert Version(today.pins["kernels"]) >= Version("0.15")
    assert Version(released.pins["kernels"]) < Version("0.15")
    assert released.inputs_hash != today.inputs_hash
    header = parse_header(released.lockfile.read_text())
    assert "--exclude-newer 2026-05-16T18:20:19Z" in header.command
    assert header.axes["resolution"] == "as-released"
