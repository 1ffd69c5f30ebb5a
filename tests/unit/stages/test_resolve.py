"""Unit tests of the resolve stage: no network, uv replaced by a recorded fake where it would run."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from servematrix.formats.lockfile import parse_header, parse_pins, read_lock_header, render_header
from servematrix.stages import resolve as rs
from servematrix.stages.resolve import (
    ResolveOutcome,
    ResolveRequest,
    classify_failure,
    inputs_hash,
    lock_header,
    parse_release_pins,
    release_pins,
    resolve,
    trim_reason,
)
from tests.wheelserver import METADATA, PlainHandler, RangeHandler, make_wheel, serve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "uv"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def request(**kw) -> ResolveRequest:
    base = {
        "env_id": "env-0123abcd",
        "requirements": ("sglang==0.5.12",),
        "overrides": ("flashinfer-python==0.6.12",),
        "axes": {"sglang": "0.5.12", "flashinfer": "0.6.12", "torch": "pinned", "cuda": "13.0"},
    }
    base.update(kw)
    return ResolveRequest(**base)


# ------------------------------------------------------------------------------------------- inputs hash


def test_inputs_hash_ignores_axes_dict_order():
    a = request(axes={"sglang": "0.5.12", "torch": "pinned", "cuda": "13.0"})
    b = request(axes={"cuda": "13.0", "torch": "pinned", "sglang": "0.5.12"})
    assert inputs_hash(a) == inputs_hash(b)


def test_inputs_hash_ignores_requirement_order_and_env_id():
    a = request(requirements=("transformers[serving]==5.24.0", "torch==2.9.1"), env_id="a")
    b = request(requirements=("torch==2.9.1", "transformers[serving]==5.24.0"), env_id="b")
    assert inputs_hash(a) == inputs_hash(b)


@pytest.mark.parametrize(
    "change",
    [
        {"requirements": ("sglang==0.5.11",)},
        {"overrides": ()},
        {"overrides": ("flashinfer-python==0.6.13",)},
        {"python_version": "3.11"},
        {"platform": "x86_64-manylinux_2_28"},
        {"index_url": "http://127.0.0.1:9/simple"},
        {"extra_index_urls": ("http://127.0.0.1:9/simple",)},
        {"axes": {"sglang": "0.5.12"}},
    ],
)
def test_inputs_hash_changes_with_every_input(change):
    assert inputs_hash(request(**change)) != inputs_hash(request())


def test_inputs_hash_is_a_fixed_value():
    # A golden value: the hash must be the same on every machine and Python version. If this changes on
    # purpose (new inputs), bump LOCK_FORMAT so old locks are re-resolved rather than silently reused.
    req = ResolveRequest(env_id="x", requirements=("sglang==0.5.9",), axes={"sglang": "0.5.9"})
    assert inputs_hash(req) == "1f74a623f5f4d9fa254eab676594ad663a5ad6523016c01185185c5647f7110a"


def test_inputs_hash_does_not_include_credentials():
    a = request(index_url="https://user:secret@127.0.0.1:9/simple")
    b = request(index_url="https://other:token@127.0.0.1:9/simple")
    assert inputs_hash(a) == inputs_hash(b)
    assert "secret" not in render_header(lock_header(a, crossed={}, resolver="uv 0.13.9"))


def test_request_validation():
    with pytest.raises(ValueError):
        request(env_id="../escape")
    with pytest.raises(ValueError):
        request(requirements=())
    with pytest.raises(TypeError):
        request(requirements="sglang==0.5.9")
    assert request(requirements=["sglang==0.5.9"]).requirements == ("sglang==0.5.9",)


# ------------------------------------------------------------------------------------------------ header

CROSSED = {"flashinfer-python": {"release_pin": "0.6.11.post1", "used": "0.6.12"}}


def test_header_round_trip():
    req = request(extra_index_urls=("http://127.0.0.1:9/simple",))
    header = parse_header(render_header(lock_header(req, crossed=CROSSED, resolver="uv 0.13.9")))
    assert header is not None
    assert header.inputs_hash == inputs_hash(req)
    assert header.env_id == req.env_id
    assert header.axes == {"cuda": "13.0", "flashinfer": "0.6.12", "sglang": "0.5.12", "torch": "pinned"}
    assert list(header.axes) == sorted(header.axes)
    assert header.requirements == ("sglang==0.5.12",)
    assert header.overrides == ("flashinfer-python==0.6.12",)
    assert header.python_version == "3.12"
    assert header.platform == "x86_64-manylinux_2_34"
    assert header.index_url is None
    assert header.extra_index_urls == ("http://127.0.0.1:9/simple",)
    assert header.crossed == CROSSED
    assert header.resolver == "uv 0.13.9"


def test_header_is_deterministic_and_has_no_paths_or_times():
    req = request()
    a = render_header(lock_header(req, crossed=CROSSED, resolver="uv 0.13.9"))
    assert a == render_header(lock_header(request(), crossed=dict(CROSSED), resolver="uv 0.13.9"))
    assert all(line.startswith("# ") for line in a.splitlines())
    assert "/tmp" not in a and str(Path.home()) not in a
    assert not any(word in a.lower() for word in ("date", "time", "generated at"))


SAMPLE_LOCK = """\
# servematrix-lock: 1
# inputs-hash: abc123
# env-id: env-1
# axis: sglang=0.5.9
# axis: torch=pinned
# requirement: sglang==0.5.9
# python-version: 3.12
# python-platform: x86_64-manylinux_2_34
# index-url: (default)
# resolver: uv 0.13.9
# command: uv pip compile requirements.in --python-version 3.12
Flashinfer_Python==0.6.3 \\
    --hash=sha256:00
    # via sglang
sgl-kernel==0.3.21 \\
    --hash=sha256:11
# a comment: that looks like a header line but is in the body
torch==2.9.1 ; sys_platform == 'linux' \\
    --hash=sha256:22
uvicorn[standard]==0.38.0
"""


def test_parse_header_stops_at_the_body():
    header = parse_header(SAMPLE_LOCK)
    assert header is not None
    assert header.inputs_hash == "abc123"
    assert header.axes == {"sglang": "0.5.9", "torch": "pinned"}
    assert header.overrides == ()
    assert header.crossed == {}
    assert "a comment" not in str(header)


def test_read_lock_header(tmp_path):
    path = tmp_path / "env-1.lock.txt"
    path.write_text(SAMPLE_LOCK)
    assert read_lock_header(path).inputs_hash == "abc123"
    assert read_lock_header(tmp_path / "missing.lock.txt") is None
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("# This file was autogenerated by uv\nsglang==0.5.9\n")
    assert read_lock_header(foreign) is None


def test_parse_pins_normalizes_names():
    assert parse_pins(SAMPLE_LOCK) == {
        "flashinfer-python": "0.6.3",
        "sgl-kernel": "0.3.21",
        "torch": "2.9.1",
        "uvicorn": "0.38.0",
    }


# -------------------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("name", "must_mention"),
    [
        ("no-solution-sglang-0.5.9-flashinfer-0.6.12.stderr", ["nvidia-cutlass-dsl", "quack-kernels==0.2.4"]),
        ("no-solution-sglang-0.5.6-flashinfer-0.6.12.stderr", ["nvidia-cutlass-dsl", "sglang==0.5.6"]),
        ("no-matching-platform-sglang-0.5.12-manylinux_2_28.stderr", ["no wheels with a matching platform"]),
        ("no-version.stderr", ["there is no version of sglang==0.0.999"]),
        ("not-in-registry.stderr", ["was not found in the package registry"]),
    ],
)
def test_resolver_conflicts_are_unresolvable(name, must_mention):
    status, reason = classify_failure(fixture(name))
    assert status == "unresolvable"
    assert reason.startswith("No solution found when resolving dependencies")
    for text in must_mention:
        assert text in reason
    assert "warning:" not in reason
    assert "3.11" not in reason  # the interpreter warning is noise


@pytest.mark.parametrize(
    ("name", "must_mention"),
    [
        ("connection-refused.stderr", "Connection refused"),
        ("http-503.stderr", "503 Service Unavailable"),
        ("timeout.stderr", "operation timed out"),
        ("offline-cache-miss.stderr", "not found in the cache"),
    ],
)
def test_infrastructure_failures_are_errors(name, must_mention):
    status, reason = classify_failure(fixture(name))
    assert status == "error"
    assert must_mention in reason


@pytest.mark.parametrize(
    "stderr",
    [
        # Constructed, not observed here (no DNS failure can be provoked without leaving the machine):
        # the wording of the underlying resolver library.
        "error: Failed to fetch: `http://index.invalid/simple/sglang/`\n"
        "  Caused by: error sending request\n  Caused by: dns error: failed to lookup address information: "
        "Name or service not known\n",
        "error: Request failed after 3 retries\n  cause: Connection reset by peer (os error 104)\n",
        "error: Failed to download distribution due to network timeout. Try increasing UV_HTTP_TIMEOUT.\n",
        "error: uv did not finish: timed out after 600 s\n",
        "error: something nobody has seen before\n",
        "",
    ],
)
def test_unknown_and_network_failures_are_never_unresolvable(stderr):
    assert classify_failure(stderr)[0] == "error"


def test_package_names_that_look_like_network_words_stay_unresolvable():
    stderr = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because async-timeout==4.0.3 depends on foo>=2 and you require foo<2, we can conclude "
        "that your requirements are unsatisfiable.\n"
    )
    assert classify_failure(stderr)[0] == "unresolvable"


def test_trim_reason_drops_hints_and_caps_length():
    stderr = (
        "warning: The requested Python version 3.12 is not available\n"
        "error: No solution found when resolving dependencies\n"
        + "".join(f"         And because step {i} we can conclude more.\n" for i in range(40))
        + "\nhint: Pre-releases are available for `x` in the requested range\n"
        "      (e.g., 1.0rc1), but pre-releases weren't enabled\n"
    )
    reason = trim_reason(stderr)
    lines = reason.splitlines()
    assert len(lines) == 15
    assert lines[0] == "No solution found when resolving dependencies"
    assert lines[-1].endswith("more lines)")
    assert "hint" not in reason.lower() and "Pre-releases" not in reason


def test_trim_reason_keeps_the_platform_hint():
    reason = trim_reason(fixture("no-matching-platform-sglang-0.5.12-manylinux_2_28.stderr"))
    assert "manylinux_2_34_x86_64" in reason


def test_trim_reason_of_0_5_9_is_the_because_chain():
    reason = trim_reason(fixture("no-solution-sglang-0.5.9-flashinfer-0.6.12.stderr"))
    lines = reason.splitlines()
    assert lines[1].startswith("Because flashinfer-python==0.6.12 depends on nvidia-cutlass-dsl>=4.5.0")
    assert lines[-1].endswith("your requirements are unsatisfiable.")


# ----------------------------------------------------------------------------------------- release pins


def test_parse_release_pins_of_a_real_metadata():
    pins = parse_release_pins(fixture("sglang-0.5.12.METADATA"))
    assert pins["flashinfer-python"] == "0.6.11.post1"
    assert pins["flashinfer-cubin"] == "0.6.11.post1"
    assert pins["torch"] == "2.11.0"
    assert pins["sglang-kernel"] == "0.4.2.post2"
    assert pins["nvidia-cutlass-dsl"] == "4.5.0"
    assert pins["torchcodec"] == "0.11.1"  # x86_64 marker holds
    assert "diffusers" not in pins  # only in an extra
    assert "quack-kernels" not in pins  # >=, not a pin
    assert "torchcodec" not in parse_release_pins(fixture("sglang-0.5.12.METADATA"), platform="aarch64-manylinux_2_34")


def test_release_pins_reads_the_cache_without_uv(tmp_path, monkeypatch):
    (tmp_path / "sglang-0.5.12.METADATA").write_text(fixture("sglang-0.5.12.METADATA"))
    monkeypatch.setattr(subprocess, "run", _forbidden)
    assert release_pins("SGLang", "0.5.12", cache_dir=tmp_path)["torch"] == "2.11.0"


def _pylock(url: str, size: int) -> str:
    """What `uv pip compile --format pylock.toml --no-deps` prints for one wheel (PEP 751)."""
    return f"""lock-version = "1.0"
created-by = "uv"
[[packages]]
name = "demo-pkg"
version = "1.0"
wheels = [{{ url = "{url}", size = {size}, hashes = {{ sha256 = "00" }} }}]
"""


class PinsUv:
    """Stands in for uv when release pins are read: prints the pylock.toml of one wheel for `pip compile`,
    and for `pip install --target` puts that wheel's dist-info where uv would."""

    def __init__(self, pylock: str):
        self.pylock = pylock
        self.commands: list[str] = []

    def __call__(self, argv, **kwargs):
        argv = list(argv)
        self.commands.append(argv[2])
        assert (Path(kwargs["cwd"]) / "uv.toml").is_file()
        if argv[2] == "compile":
            assert argv[argv.index("--format") + 1] == "pylock.toml" and "--no-deps" in argv
            return subprocess.CompletedProcess(argv, 0, self.pylock, "")
        dist_info = Path(argv[argv.index("--target") + 1]) / "demo_pkg-1.0.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(METADATA)
        return subprocess.CompletedProcess(argv, 0, "", "")


@pytest.mark.parametrize(("handler", "commands"), [(RangeHandler, ["compile"]), (PlainHandler, ["compile", "install"])])
def test_release_metadata_is_read_by_ranges_else_installed(tmp_path, monkeypatch, handler, commands):
    """uv names the wheel; its METADATA is read by HTTP ranges where the file host allows it, and from the
    wheel uv installs where it does not. Both give the same file."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    (tmp_path / "www").mkdir()
    wheel = make_wheel(tmp_path / "www" / "demo_pkg-1.0-py3-none-any.whl")
    with serve(tmp_path / "www", handler) as (base, _):
        fake = PinsUv(_pylock(f"{base}/{wheel.name}", wheel.stat().st_size))
        monkeypatch.setattr(subprocess, "run", fake)
        pins = release_pins("Demo_Pkg", "1.0", cache_dir=tmp_path / "pins")
    assert pins == {"torch": "2.11.0"} and fake.commands == commands
    assert (tmp_path / "pins" / "demo-pkg-1.0.METADATA").read_text() == METADATA


def test_release_that_uv_cannot_find_is_unresolvable(tmp_path, monkeypatch):
    stderr = fixture("no-version.stderr")
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", stderr))
    with pytest.raises(rs.ReleasePinsError) as caught:
        release_pins("sglang", "9.9.9", cache_dir=tmp_path)
    assert caught.value.status == "unresolvable"


# ----------------------------------------------------------------------------------------------- resolve

COMPILED = """\
flashinfer-python==0.6.12 \\
    --hash=sha256:00
    # via
    #   --override overrides.txt
    #   sglang
sglang==0.5.12 \\
    --hash=sha256:11
    # via -r requirements.in
torch==2.11.0 \\
    --hash=sha256:22
    # via sglang
"""


def _forbidden(*args, **kwargs):
    raise AssertionError(f"uv must not run here: {args}")


class FakeUv:
    """Stands in for subprocess.run: answers `uv --version` and plays scripted compile results."""

    def __init__(self, *results: tuple[int, str, str]):
        self.results = list(results)
        self.calls: list[list[str]] = []
        self.configs: list[str] = []

    def __call__(self, argv, **kwargs):
        argv = list(argv)
        if argv[1:] == ["--version"]:
            return subprocess.CompletedProcess(argv, 0, "uv 0.13.9 (x86_64-unknown-linux-gnu)\n", "")
        self.calls.append(argv)
        cwd = Path(kwargs["cwd"])
        assert (cwd / "requirements.in").is_file()  # relative names keep temp paths out of the lock
        self.configs.append((cwd / "uv.toml").read_text())
        if not self.results:
            raise AssertionError(f"unexpected uv call: {argv}")
        rc, out, err = self.results.pop(0)
        if rc == "timeout":
            raise subprocess.TimeoutExpired(argv, kwargs.get("timeout"))
        return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.fixture
def pins_cache(tmp_path):
    cache = tmp_path / "pins"
    cache.mkdir()
    (cache / "sglang-0.5.12.METADATA").write_text(fixture("sglang-0.5.12.METADATA"))
    return cache


@pytest.fixture(autouse=True)
def _fresh_uv_version():
    rs._uv_version.cache_clear()
    yield
    rs._uv_version.cache_clear()


def _resolve(tmp_path, pins_cache, req=None, **kw):
    return resolve(req or request(), out_dir=tmp_path / "locks", pins_cache_dir=pins_cache, **kw)


def test_resolved_lock_is_uvs_answer_under_its_header(tmp_path, pins_cache, monkeypatch):
    fake = FakeUv((0, COMPILED, "Resolved 3 packages\n"))
    monkeypatch.setattr(subprocess, "run", fake)
    out = _resolve(tmp_path, pins_cache)
    assert out.status == "resolved" and not out.cached and out.reason == ""
    assert len(fake.calls) == 1
    assert out.pins == {"flashinfer-python": "0.6.12", "sglang": "0.5.12", "torch": "2.11.0"}
    assert out.crossed == CROSSED
    assert out.lockfile == tmp_path / "locks" / "env-0123abcd.lock.txt"
    text = out.lockfile.read_text()
    assert text.endswith(COMPILED)
    header = parse_header(text)
    assert header.inputs_hash == out.inputs_hash == inputs_hash(request())
    assert header.crossed == CROSSED and header.resolver == "uv 0.13.9"
    assert [p.name for p in (tmp_path / "locks").iterdir()] == ["env-0123abcd.lock.txt"]  # no temp left


def test_uv_is_never_asked_offline(tmp_path, pins_cache, monkeypatch):
    # From a partial cache an offline resolution can succeed with other versions than the index's answer
    # (it skips versions whose metadata is not cached): a lock is only ever uv's online answer.
    fake = FakeUv((0, COMPILED, ""))
    monkeypatch.setattr(subprocess, "run", fake)
    _resolve(tmp_path, pins_cache)
    assert fake.calls and not any("--offline" in call for call in fake.calls)


def test_compile_arguments(tmp_path, pins_cache, monkeypatch):
    fake = FakeUv((0, COMPILED, ""))
    monkeypatch.setattr(subprocess, "run", fake)
    req = request(index_url="http://127.0.0.1:9/simple", extra_index_urls=("http://127.0.0.1:8/simple",))
    out = _resolve(tmp_path, pins_cache, req, uv="/opt/uv")
    argv = fake.calls[0]
    assert argv[:4] == ["/opt/uv", "pip", "compile", "requirements.in"]
    for flag, value in [
        ("--override", "overrides.txt"),
        ("--python-version", "3.12"),
        ("--python-platform", "x86_64-manylinux_2_34"),
        ("--index-url", "http://127.0.0.1:9/simple"),
        ("--extra-index-url", "http://127.0.0.1:8/simple"),
    ]:
        assert argv[argv.index(flag) + 1] == value
    assert "--generate-hashes" in argv and "--no-header" in argv
    assert "-o" not in argv  # an existing output file would become resolver preferences
    assert argv[argv.index("--python") + 1] == sys.executable  # no search of the machine for one
    # The header's reproduce line is the user's command: no machine path in it.
    assert "--python " not in parse_header(out.lockfile.read_text()).command


def test_every_uv_call_runs_under_pypis_cache_policy(tmp_path, monkeypatch):
    """Each call's working directory holds a uv.toml that names PyPI's cache policy on an explicit index
    entry: uv reuses a page read in the last 10 minutes, and resolves from no index it would not otherwise."""
    fake = FakeUv((0, COMPILED, ""))
    monkeypatch.setattr(subprocess, "run", fake)
    resolve(request(overrides=()), out_dir=tmp_path / "locks", pins_cache_dir=tmp_path / "pins")
    (config,) = fake.configs
    index = tomllib.loads(config)["index"]
    assert index == [
        {
            "name": index[0]["name"],
            "url": "https://pypi.org/simple",
            "explicit": True,
            "cache-control": {"api": "max-age=600", "files": "max-age=365000000, immutable"},
        }
    ]


def test_uv_environment_forbids_python_downloads(tmp_path, pins_cache, monkeypatch):
    seen = {}

    def run(argv, **kwargs):
        seen.update(kwargs["env"])
        return FakeUv((0, COMPILED, ""))(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    _resolve(tmp_path, pins_cache)
    assert seen["UV_PYTHON_DOWNLOADS"] == "never"


def test_network_failure_online_is_error_and_keeps_old_lock(tmp_path, pins_cache, monkeypatch):
    lock = tmp_path / "locks" / "env-0123abcd.lock.txt"
    lock.parent.mkdir()
    lock.write_text("# servematrix-lock: 1\n# inputs-hash: stale\nsglang==0.5.11\n")
    fake = FakeUv((2, "", fixture("connection-refused.stderr")))
    monkeypatch.setattr(subprocess, "run", fake)
    out = _resolve(tmp_path, pins_cache)
    assert out.status == "error" and out.lockfile is None and out.pins == {}
    assert "Connection refused" in out.reason
    assert f"{lock} was made from other inputs, and uv could not reach the index" in out.reason
    assert lock.read_text().endswith("sglang==0.5.11\n")


def test_network_failure_without_a_lock_says_which_lock_is_missing_and_how_to_make_it(
    tmp_path, pins_cache, monkeypatch
):
    # A GPU node that reaches no index, in a matrix that just gained a GPU kind (2026-12-05): the reason names the
    # lock it lacked, not only uv's DNS error.
    monkeypatch.setattr(subprocess, "run", FakeUv((2, "", fixture("connection-refused.stderr"))))
    out = _resolve(tmp_path, pins_cache)
    assert out.status == "error" and out.lockfile is None
    first, _, rest = out.reason.partition("\n")
    assert first.startswith("no lock for this environment (env-0123abcd.lock.txt in ")
    assert "`servematrix lock MATRIX` where an index is reachable" in first
    assert "Connection refused" in rest


def test_a_conflict_says_nothing_of_locks(tmp_path, pins_cache, monkeypatch):
    monkeypatch.setattr(
        subprocess, "run", FakeUv((1, "", fixture("no-solution-sglang-0.5.9-flashinfer-0.6.12.stderr")))
    )
    out = _resolve(tmp_path, pins_cache)
    assert out.status == "unresolvable" and "lock" not in out.reason.lower()


def test_conflict_online_is_unresolvable_without_lockfile(tmp_path, pins_cache, monkeypatch):
    stderr = fixture("no-solution-sglang-0.5.9-flashinfer-0.6.12.stderr")
    monkeypatch.setattr(subprocess, "run", FakeUv((1, "", stderr)))
    out = _resolve(tmp_path, pins_cache)
    assert out.status == "unresolvable" and out.lockfile is None
    assert "nvidia-cutlass-dsl" in out.reason
    assert out.crossed == CROSSED  # still reported: it is why the cell is unresolvable
    assert not (tmp_path / "locks" / "env-0123abcd.lock.txt").exists()


def test_timeout_is_error(tmp_path, pins_cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeUv(("timeout", "", "")))
    out = _resolve(tmp_path, pins_cache, timeout_s=5)
    assert out.status == "error" and "timed out after 5 s" in out.reason


def test_missing_uv_is_error(tmp_path, pins_cache):
    out = _resolve(tmp_path, pins_cache, uv=str(tmp_path / "no-such-uv"))
    assert out.status == "error" and "not found" in out.reason


def test_unchanged_request_is_cached_without_uv(tmp_path, pins_cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeUv((0, COMPILED, "")))
    first = _resolve(tmp_path, pins_cache)
    monkeypatch.setattr(subprocess, "run", _forbidden)
    again = _resolve(tmp_path, pins_cache)
    assert again.cached and again.status == "resolved"
    assert (again.pins, again.crossed, again.lockfile, again.inputs_hash) == (
        first.pins,
        first.crossed,
        first.lockfile,
        first.inputs_hash,
    )


def test_changed_request_is_resolved_again(tmp_path, pins_cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeUv((0, COMPILED, "")))
    _resolve(tmp_path, pins_cache)
    fake = FakeUv((0, COMPILED, ""))
    monkeypatch.setattr(subprocess, "run", fake)
    out = _resolve(tmp_path, pins_cache, request(python_version="3.11"))
    assert not out.cached and len(fake.calls) == 1
    assert parse_header(out.lockfile.read_text()).python_version == "3.11"


def test_override_equal_to_the_release_pin_is_not_crossed(tmp_path, pins_cache, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeUv((0, COMPILED, "")))
    out = _resolve(tmp_path, pins_cache, request(overrides=("flashinfer-python==0.6.11.post1",)))
    assert out.crossed == {}


def test_no_overrides_needs_no_release_pins(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", FakeUv((0, COMPILED, "")))
    out = resolve(request(overrides=()), out_dir=tmp_path, pins_cache_dir=tmp_path / "never-created")
    assert out.status == "resolved" and out.crossed == {}
    assert not (tmp_path / "never-created").exists()


def test_to_contract_shape():
    out = ResolveOutcome(
        env_id="env-1",
        status="resolved",
        reason="",
        pins={"torch": "2.11.0", "sglang": "0.5.12"},
        lockfile=Path("matrix/locks/env-1.lock.txt"),
        inputs_hash="abc",
        crossed=CROSSED,
        cached=True,
        axes={"torch": "pinned", "sglang": "0.5.12"},
    )
    contract = out.to_contract()
    assert contract == {
        "env_id": "env-1",
        "axes": {"sglang": "0.5.12", "torch": "pinned"},
        "status": "resolved",
        "reason": "",
        "pins": {"sglang": "0.5.12", "torch": "2.11.0"},
        "lockfile": "matrix/locks/env-1.lock.txt",
        "crossed": CROSSED,
    }
    assert list(contract["pins"]) == ["sglang", "torch"]


# ------------------------------------------------------------------------------------------ many at once


def test_identical_requirement_sets_are_resolved_once_each_with_its_own_header(tmp_path, pins_cache, monkeypatch):
    """The two GPU kinds of one platform ask uv the same question: one compile, two locks."""
    axes = {"sglang": "0.5.12", "flashinfer": "0.6.12", "torch": "pinned", "cuda": "13.0"}
    b200 = request(env_id="env-b200", axes={**axes, "gpu": "b200"})
    rtx = request(env_id="env-rtx", axes={**axes, "gpu": "rtx-pro-6000"})
    other = request(env_id="env-other", requirements=("sglang==0.5.12", "kernels==0.14.1"))
    fake = FakeUv(*[(0, COMPILED, "")] * 2)
    monkeypatch.setattr(subprocess, "run", fake)
    outcomes = rs.resolve_many([b200, rtx, other], out_dir=tmp_path / "locks", pins_cache_dir=pins_cache, jobs=2)
    assert [o.env_id for o in outcomes] == ["env-b200", "env-rtx", "env-other"]
    assert len(fake.calls) == 2  # b200 and rtx share one; `other` is another question
    assert all(o.status == "resolved" and not o.cached for o in outcomes)
    for outcome, req in zip(outcomes, (b200, rtx, other), strict=True):
        text = outcome.lockfile.read_text()
        header = parse_header(text)
        assert (header.env_id, header.axes, header.inputs_hash) == (req.env_id, req.axes, inputs_hash(req))
        assert text.endswith(COMPILED) and outcome.crossed == CROSSED
    # Their locks are current now: nothing asks uv again.
    monkeypatch.setattr(subprocess, "run", _forbidden)
    again = rs.resolve_many([b200, rtx, other], out_dir=tmp_path / "locks", pins_cache_dir=pins_cache)
    assert all(o.cached for o in again)


def test_one_question_is_asked_alone_before_the_others(tmp_path, pins_cache, monkeypatch):
    """The first distinct question reads the shared index pages into uv's cache; the others start after it
    ends (and run together)."""
    spans: list[tuple[str, float, float]] = []

    def compile_slowly(argv, **kwargs):
        if list(argv[1:]) == ["--version"]:
            return FakeUv()(argv, **kwargs)
        started = time.monotonic()
        time.sleep(0.2)
        spans.append((Path(kwargs["cwd"], "requirements.in").read_text().split()[0], started, time.monotonic()))
        return FakeUv((0, COMPILED, ""))(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", compile_slowly)
    requests = [request(env_id=f"env-{n}", requirements=(f"sglang==0.5.{n}",), overrides=()) for n in (1, 2, 3)]
    rs.resolve_many(requests, out_dir=tmp_path / "locks", pins_cache_dir=pins_cache, jobs=4)
    compiles = sorted(spans)
    first_end = compiles[0][2]
    assert [c[0] for c in compiles] == ["sglang==0.5.1", "sglang==0.5.2", "sglang==0.5.3"]
    assert all(started >= first_end for _, started, _ in compiles[1:])
    assert compiles[2][1] < compiles[1][2]  # the rest overlap


def test_a_shared_conflict_is_every_members_verdict(tmp_path, pins_cache, monkeypatch):
    fake = FakeUv((1, "", fixture("no-solution-sglang-0.5.9-flashinfer-0.6.12.stderr")))
    monkeypatch.setattr(subprocess, "run", fake)
    pair = [request(env_id="env-a", axes={"gpu": "b200"}), request(env_id="env-b", axes={"gpu": "rtx"})]
    outcomes = rs.resolve_many(pair, out_dir=tmp_path / "locks", pins_cache_dir=pins_cache)
    assert [(o.env_id, o.status, o.lockfile) for o in outcomes] == [
        ("env-a", "unresolvable", None),
        ("env-b", "unresolvable", None),
    ]
    assert outcomes[0].reason == outcomes[1].reason and len(fake.calls) == 1
    assert outcomes[1].inputs_hash == inputs_hash(pair[1])
