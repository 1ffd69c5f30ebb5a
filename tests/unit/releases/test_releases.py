"""`servematrix releases`: the releases a matrix lacks, read from a stand-in index on localhost (standin.py:
PEP 691 JSON pages and real wheels), what it leaves out and why, `--add` writing them in with the matrix's
comments kept and every cell id unchanged, and its failures: a yanked release, an index that is down, a release
without a wheel for the platform, a write that fails half-way."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.planning.plan import make_plan
from servematrix.releases import edit
from servematrix.releases.edit import with_values
from tests.conftest import MATRIX
from tests.unit.releases.standin import Upload, standin_index

SMOKE = MATRIX / "cpu-smoke.toml"
LINUX_311 = "cp311-cp311-manylinux_2_34_x86_64"

PROJECTS = {
    "transformers": [
        Upload("5.5.4", "2026-04-01T10:00:00Z"),
        Upload("5.20.0", "2026-09-01T10:00:00Z", yanked="broken serve"),
        Upload("5.21.0", "2026-09-10T10:00:00Z", tag="sdist"),
        Upload("5.22.0", "2026-09-20T10:00:00Z", tag="cp311-cp311-macosx_11_0_arm64"),
        Upload("5.23.0", "2026-10-01T10:00:00Z", tag=LINUX_311),
        Upload("5.24.0", "2026-10-10T10:00:00Z", requires=["tokenizers==0.22.1", "requests"]),
        Upload("5.24.0.post1", "2026-10-11T10:00:00Z", requires=["requests", "tokenizers==0.22.1"]),
        Upload("5.24.0.post2", "2026-10-12T10:00:00Z", requires=["tokenizers==0.22.2", "requests"]),
        Upload("5.25.0", "2026-11-02T10:00:00Z"),
        Upload("5.26.0rc1", "2026-11-20T10:00:00Z"),
    ],
    "torch": [
        Upload("2.9.1", "2025-11-12T10:00:00Z"),
        Upload("2.10.0", "2026-01-21T10:00:00Z"),
        Upload("2.11.0", "2026-03-18T10:00:00Z"),
    ],
}


@pytest.fixture
def index(tmp_path: Path):
    with standin_index(tmp_path / "index", PROJECTS) as url:
        yield url


@pytest.fixture
def matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # release METADATA is cached there
    copy = tmp_path / "work" / "smoke.toml"
    copy.parent.mkdir()
    shutil.copy(SMOKE, copy)
    return copy


def releases(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["releases", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def listing(capsys, matrix: Path, index: str, *argv: str) -> dict:
    code, out, err = releases(capsys, str(matrix), "--index-url", index, "--format", "json", *argv)
    assert code == 0, err
    return {axis["axis"]: axis for axis in json.loads(out)["axes"]}


def test_lists_what_the_matrix_lacks_with_dates_and_what_it_leaves_out(capsys, matrix, index):
    axes = listing(capsys, matrix, index)
    engine = axes["transformers"]
    assert engine["policy"] == "every"
    assert engine["range"] == {"from": "5.5.4", "from_reason": "the matrix's oldest value", "to": "5.25.0"}
    missing = {c["version"]: c for c in engine["missing"]}
    assert list(missing) == ["5.23.0", "5.24.0.post2", "5.25.0"]  # the pre-release is not listed
    assert missing["5.25.0"] == {"version": "5.25.0", "uploaded": "2026-11-02", "add": True, "note": ""}
    assert "tokenizers ==0.22.1 -> ==0.22.2" in missing["5.24.0.post2"]["note"]
    left = {s["version"]: s["reason"] for s in engine["left_out"]}
    assert left["5.20.0"] == "yanked (broken serve)"
    assert left["5.21.0"] == "no wheel for cp311 x86_64-manylinux_2_34 (an sdist only)"
    assert left["5.22.0"] == "no wheel for cp311 x86_64-manylinux_2_34 (other wheels only)"
    assert left["5.24.0.post1"] == "same Requires-Dist as 5.24.0"  # the same pins in another order
    # A companion axis: every missing release is listed, the index's newest alone is added.
    torch = {c["version"]: c["add"] for c in axes["torch"]["missing"]}
    assert torch == {"2.10.0": False, "2.11.0": True}


def test_the_table_names_the_range_dates_and_reasons(capsys, matrix, index):
    code, out, _ = releases(capsys, str(matrix), "--index-url", index)
    assert code == 0
    assert "transformers (transformers): releases from 5.5.4 (the matrix's oldest value) to 5.25.0" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("5.20.0"))
    assert "2026-09-01" in row and "left out: yanked (broken serve)" in row


def test_since_and_pre(capsys, matrix, index):
    axes = listing(capsys, matrix, index, "--since", "transformers=5.24.0", "--pre")
    engine = axes["transformers"]
    assert engine["range"]["from"] == "5.24.0" and engine["range"]["from_reason"] == "--since"
    assert [c["version"] for c in engine["missing"]] == ["5.24.0.post2", "5.25.0", "5.26.0rc1"]


def test_add_writes_the_values_in_order_keeps_comments_and_every_cell_id(capsys, matrix, index):
    before_text = matrix.read_text()
    before = {c.id for c in make_plan(matrix).cells}
    code, out, err = releases(capsys, str(matrix), "--index-url", index, "--add", "--format", "json")
    assert code == 0, err
    after_text = matrix.read_text()
    changed = [(a, b) for a, b in zip(before_text.splitlines(), after_text.splitlines(), strict=True) if a != b]
    assert changed == [
        (
            'transformers = ["5.5.4", "5.24.0"]',
            'transformers = ["5.5.4", "5.23.0", "5.24.0", "5.24.0.post2", "5.25.0"]',
        ),
        ('torch = ["2.9.1"]', 'torch = ["2.9.1", "2.11.0"]'),
    ]
    after = make_plan(matrix).cells
    assert before <= {c.id for c in after}
    added = json.loads(out)["added"]
    assert added["values"] == {"transformers": ["5.23.0", "5.24.0.post2", "5.25.0"], "torch": ["2.11.0"]}
    assert set(added["new_cells"]) == {c.id for c in after} - before
    assert len(added["new_envs"]) == 5 * 2 - 2
    assert f"the {len(before)} existing cell(s) keep their ids" in err
    # Run again: nothing is missing that --add would write, and the file is left alone.
    code, _, err = releases(capsys, str(matrix), "--index-url", index, "--add")
    assert code == 0 and "nothing to add" in err and matrix.read_text() == after_text


def test_only_adds_one_release(capsys, matrix, index):
    code, out, err = releases(
        capsys, str(matrix), "--index-url", index, "--add", "--only", "transformers=5.23.0", "--format", "json"
    )
    assert code == 0, err
    assert [a["axis"] for a in json.loads(out)["axes"]] == ["transformers"]  # the other axes are not read
    assert 'transformers = ["5.5.4", "5.23.0", "5.24.0"]' in matrix.read_text()
    assert 'torch = ["2.9.1"]' in matrix.read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "transformers=5.20.0"], "--only transformers=5.20.0: not a release this matrix lacks"),
        (["--only", "transformers=5.24.0"], "--only transformers=5.24.0: not a release this matrix lacks"),
        (["--only", "cuda=12.8"], "--only cuda=...: not a version axis"),
        (["--since", "transformers"], "--since 'transformers': expected AXIS=VERSION"),
        (["--since", "torch=latest"], "--since torch=latest: not a version"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, matrix, index, argv, message):
    text = matrix.read_text()
    code, out, err = releases(capsys, str(matrix), "--index-url", index, "--add", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert matrix.read_text() == text


def test_a_project_the_index_lacks_is_bad_input(capsys, matrix, tmp_path):
    with standin_index(tmp_path / "other", {"torch": PROJECTS["torch"]}) as url:
        code, _, err = releases(capsys, str(matrix), "--index-url", url)
    assert code == 2 and "transformers: no such project on the index" in err


def test_an_index_that_is_down_is_one_line_exit_1_and_nothing_written(capsys, matrix):
    with socket.socket() as held:  # a port nothing listens on
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    text = matrix.read_text()
    code, out, err = releases(capsys, str(matrix), "--index-url", f"http://127.0.0.1:{port}/simple", "--add")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "the index does not answer" in err and "ConnectError" in err
    assert "nothing written" in err and "Traceback" not in err
    assert matrix.read_text() == text


def test_an_html_index_is_bad_input(capsys, matrix, tmp_path):
    (tmp_path / "html" / "simple" / "transformers").mkdir(parents=True)
    (tmp_path / "html" / "simple" / "transformers" / "index.html").write_text("<a href='x'>x</a>")
    from tests.wheelserver import PlainHandler, serve

    with serve(tmp_path / "html", PlainHandler) as (base, _):
        code, _, err = releases(capsys, str(matrix), "--index-url", f"{base}/simple")
    assert code == 2 and "does not serve PEP 691 JSON" in err


def test_a_write_that_fails_leaves_the_matrix_whole_and_no_temporary_file(capsys, matrix, index, monkeypatch):
    text = matrix.read_text()
    real = edit.os.replace

    def failing(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(edit.os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        main(["releases", str(matrix), "--index-url", index, "--add"])
    monkeypatch.setattr(edit.os, "replace", real)
    assert matrix.read_text() == text
    assert sorted(p.name for p in matrix.parent.iterdir()) == ["smoke.toml"]


def test_an_addition_that_would_change_a_cell_id_is_refused(capsys, matrix, index, monkeypatch):
    real = make_plan
    text = matrix.read_text()

    class Renamed:
        def __init__(self, plan):
            self.cells = [type("C", (), {"id": c.id + "x", "env_id": c.env_id}) for c in plan.cells]

    monkeypatch.setattr(
        "servematrix.planning.plan.make_plan",
        lambda path, *a, **k: Renamed(real(path)) if Path(path).name.startswith(".") else real(path),
    )
    code, _, err = releases(capsys, str(matrix), "--index-url", index, "--add")
    assert code == 2 and "would change the ids of" in err and "not written" in err
    assert matrix.read_text() == text
    assert sorted(p.name for p in matrix.parent.iterdir()) == ["smoke.toml"]


def test_with_values_keeps_pinned_where_it_is_and_the_comments():
    text = '# head\n[axes]\n# why 0.6.12\nflashinfer = ["pinned", "0.6.12"]  # trailing\nsglang = ["0.5.9"]\n'
    out = with_values(text, {"flashinfer": ["0.7.4", "0.6.3"], "sglang": ["0.5.10"]})
    assert out == (
        '# head\n[axes]\n# why 0.6.12\nflashinfer = ["pinned", "0.6.3", "0.6.12", "0.7.4"]  # trailing\n'
        'sglang = ["0.5.9", "0.5.10"]\n'
    )
