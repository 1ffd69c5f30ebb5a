"""The lock file's one owner: header written and read back, the body read with continuations and hashes, and
the target (marker environment, wheel tags) every reader of a lock chooses packages by."""

from __future__ import annotations

import textwrap

import pytest
from packaging.markers import Marker

from servematrix.formats.lockfile import (
    LockedPackage,
    LockHeader,
    TargetError,
    lock_layers,
    marker_environment,
    parse_header,
    parse_lock,
    parse_pins,
    render_header,
    target_tags,
)
from servematrix.stages.resolve import parse_release_pins
from tests.conftest import REPO

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def test_a_header_reads_back_as_written():
    header = LockHeader(
        format="1",
        inputs_hash="f" * 64,
        env_id="0123abcd4567",
        axes={"sglang": "0.5.12", "kernels": "0.14.1"},
        requirements=("sglang==0.5.12",),
        overrides=("kernels==0.14.1",),
        python_version="3.12",
        platform="x86_64-manylinux_2_34",
        index_url=None,
        extra_index_urls=("http://127.0.0.1:9/simple",),
        crossed={"kernels": {"release_pin": "unpinned", "used": "0.14.1"}},
        resolver="uv 0.13.9",
        command="uv pip compile requirements.in",
    )
    text = render_header(header)
    assert parse_header(text + "sglang==0.5.12\n") == header
    assert text.splitlines()[0] == "# servematrix-lock: 1"


def test_every_committed_lock_has_a_header_and_hashes_for_every_package():
    locks = sorted((REPO / "matrix" / "locks").glob("*.lock.txt"))
    assert locks
    for lock in locks:
        text = lock.read_text()
        assert parse_header(text) is not None, lock.name
        packages = parse_lock(text)
        assert packages and all(p.hashes and all(len(h) == 64 for h in p.hashes) for p in packages.values())
        assert parse_pins(text) == {name: p.version for name, p in packages.items()}


def test_the_body_is_read_with_continuations_markers_comments_and_extras():
    text = textwrap.dedent(
        f"""\
        # header
        Foo_Bar==1.0 ; sys_platform == 'linux' \\
            --hash=sha256:{SHA_A.upper()} \\
            --hash=sha256:{SHA_B}
            # via baz
        torch==2.9.1+cu128 \\
            --hash=sha256:{SHA_C}
        uvicorn[standard]===0.38.0
        """
    )
    assert parse_lock(text) == {
        "foo-bar": LockedPackage(version="1.0", hashes=frozenset({SHA_A, SHA_B})),
        "torch": LockedPackage(version="2.9.1+cu128", hashes=frozenset({SHA_C})),
        "uvicorn": LockedPackage(version="0.38.0", hashes=frozenset()),
    }


def test_lock_layers_take_each_entry_whole_into_the_first_group_that_names_it():
    text = textwrap.dedent(
        f"""\
        # header
        nvidia-cublas-cu12==12.8.4.1 ; sys_platform == 'linux' \\
            --hash=sha256:{SHA_A}
            # via torch
        Torch==2.9.1 \\
            --hash=sha256:{SHA_B} \\
            --hash=sha256:{SHA_C}
        transformers==5.24.0 \\
            --hash=sha256:{SHA_C}
        """
    )
    cuda, torch, empty = lock_layers(text, [("nvidia-*",), ("torch", "nvidia-cublas-cu12"), ("flashinfer-*",)])
    assert cuda == f"nvidia-cublas-cu12==12.8.4.1 ; sys_platform == 'linux' --hash=sha256:{SHA_A}\n"
    assert parse_lock(torch) == {"torch": LockedPackage(version="2.9.1", hashes=frozenset({SHA_B, SHA_C}))}
    assert empty == ""  # transformers is in no layer: the whole lock installs it last
    assert lock_layers(text, []) == []


def test_target_tags_rank_like_an_installer():
    tags = [str(t) for t in target_tags("3.12", "x86_64-manylinux_2_34")]
    rank = {t: i for i, t in enumerate(tags)}
    assert rank["cp312-cp312-manylinux_2_34_x86_64"] < rank["cp312-cp312-manylinux_2_28_x86_64"]
    assert rank["cp312-cp312-manylinux_2_28_x86_64"] < rank["cp312-cp312-manylinux2014_x86_64"]
    assert rank["cp312-cp312-manylinux2014_x86_64"] < rank["cp312-abi3-manylinux_2_34_x86_64"]
    assert rank["cp311-abi3-manylinux_2_17_x86_64"] < rank["py3-none-any"]
    # Newer glibc than the target, another Python, another architecture: not installable.
    assert "cp312-cp312-manylinux_2_35_x86_64" not in rank
    assert "cp313-cp313-manylinux_2_34_x86_64" not in rank
    assert "cp312-cp312-manylinux_2_34_aarch64" not in rank
    assert "cp312-cp312-linux_x86_64" not in rank


@pytest.mark.parametrize(
    ("python", "platform"), [("3.12", "x86_64-unknown-linux-gnu"), ("three", "x86_64-manylinux_2_34")]
)
def test_a_target_that_is_not_python_on_manylinux_is_refused(python, platform):
    with pytest.raises(TargetError):
        target_tags(python, platform)


@pytest.mark.parametrize(
    ("marker", "x86_linux", "arm_linux"),
    [
        ("sys_platform == 'linux' and platform_machine == 'x86_64'", True, False),
        ("platform_machine == 'aarch64'", False, True),
        ("python_full_version >= '3.12.0' and implementation_name == 'cpython'", True, True),
        ("platform_system == 'Darwin'", False, False),
        ("extra == 'dev'", False, False),
    ],
)
def test_one_marker_environment_for_every_reader(marker, x86_linux, arm_linux):
    assert Marker(marker).evaluate(marker_environment("3.12", "x86_64-manylinux_2_34")) is x86_linux
    assert Marker(marker).evaluate(marker_environment("3.12", "aarch64-manylinux_2_28")) is arm_linux


def test_release_pins_follow_metadata_continuation_lines():
    # A folded Requires-Dist (RFC 822 continuation) is one header; a hand-split reader lost its marker.
    metadata = textwrap.dedent(
        """\
        Metadata-Version: 2.1
        Name: sglang
        Version: 0.5.12
        Requires-Dist: torch==2.9.1
        Requires-Dist: flashinfer_python==0.6.11.post1;
         sys_platform == 'linux'
        Requires-Dist: triton==3.5.0; platform_machine == 'aarch64'
        Requires-Dist: pytest==8.0; extra == 'test'

        Requires-Dist: not-a-header==1.0
        """
    )
    assert parse_release_pins(metadata) == {"flashinfer-python": "0.6.11.post1", "torch": "2.9.1"}
