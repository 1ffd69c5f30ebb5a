"""Harness faults are `error:…` and run again; stack failures stay final. The real pipeline, store and serve
stage, with a fake backend (tests/fakes/fake_backend.py) whose server is a real process."""

from __future__ import annotations

import io
import socket

import pytest
from rich.console import Console

from servematrix.errors import InputError
from servematrix.planning.plan import make_plan
from servematrix.run import ports
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.store.store import Store
from tests.fakes.fake_backend import MATRIX, FakeBackend


@pytest.fixture
def matrix(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(server=""))
    return path


def _run(matrix, tmp_path, backend, **options):
    console = Console(file=io.StringIO(), width=200)
    summary = run_plan(
        make_plan(matrix, options.pop("select", ())),
        backend,
        RunOptions(stages=("build", "serve"), store=tmp_path / "s.sqlite", workdir=tmp_path / "work", **options),
        console=console,
    )
    return summary, console.file.getvalue()  # type: ignore[attr-defined]


def _verdicts(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        return [(r["cell_id"], r["verdict"]) for r in store.all_rows()]


@pytest.fixture
def taken_port():
    """A port another socket holds (bound, as in the moment before it listens), handed to the harness as if
    it had just found it free."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def test_a_port_race_is_a_harness_error_and_runs_again(tmp_path, matrix, taken_port, monkeypatch):
    # Another process takes the port between the harness's pick and the server's bind.
    monkeypatch.setattr(ports, "pick_port", lambda offsets=(), host="127.0.0.1", **_: taken_port)
    first, _ = _run(matrix, tmp_path, FakeBackend(tmp_path, server_args=("--bind",)), select=["mode=static"])
    assert set(first.verdicts.values()) == {"error:port-in-use"}
    with Store(tmp_path / "s.sqlite") as store:
        (row, _) = store.all_rows()
    assert "address already in use" in row["excerpt"]

    monkeypatch.undo()  # the port is free again: the next run runs the same cells, and they pass
    second, _ = _run(matrix, tmp_path, FakeBackend(tmp_path), select=["mode=static"])
    assert second.skipped_unchanged == 0
    assert sorted(second.verdicts) == sorted(first.verdicts)
    assert set(second.verdicts.values()) == {"pass"}


def test_a_served_cell_keeps_what_its_build_learnt(tmp_path, matrix):
    """The row is claimed before the build; the lock hash the build reports still reaches it."""
    summary, _ = _run(matrix, tmp_path, FakeBackend(tmp_path), select=["mode=static"])
    assert set(summary.verdicts.values()) == {"pass"}
    with Store(tmp_path / "s.sqlite") as store:
        assert {r["lock_hash"] for r in store.all_rows()} == {"fake"}


def test_a_stack_failure_stays_final(tmp_path, matrix):
    first, _ = _run(matrix, tmp_path, FakeBackend(tmp_path, server_args=("--then", "exit", "--after", "0")))
    assert set(first.verdicts.values()) == {"fail:server-exited"}
    second, _ = _run(matrix, tmp_path, FakeBackend(tmp_path))
    assert second.verdicts == {} and second.skipped_unchanged == 4


def test_a_harness_exception_is_an_error_the_run_survives(tmp_path, matrix):
    first, _ = _run(matrix, tmp_path, FakeBackend(tmp_path, build_raises=True))
    assert len(first.verdicts) == 4  # every cell was tried: the exception ended none but its own
    assert {v for v in first.verdicts.values()} == {"error:harness"}
    assert "the fake backend fell over" in _rows_excerpts(tmp_path)
    second, _ = _run(matrix, tmp_path, FakeBackend(tmp_path))
    assert set(second.verdicts.values()) == {"pass"} and len(second.verdicts) == 4


class LaunchFallsOver(FakeBackend):
    """A launch that raises on the cells' second server start: the fault of one start, mid-cell."""

    def __init__(self, root, **kw):
        super().__init__(root, **kw)
        self.launched = 0

    def launch(self, built, argv, env, port, *, model_dir):
        self.launched += 1
        if self.launched > 2:  # the two modes' first starts pass; every second start falls over
            raise RuntimeError("the launcher fell over")
        return super().launch(built, argv, env, port, model_dir=model_dir)


def test_an_exception_in_a_later_server_start_ends_that_cell_as_a_harness_error(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(server="").replace("[bench]", "[bench]\nstarts = 2"))
    first, _ = _run(path, tmp_path, LaunchFallsOver(tmp_path), select=["transformers=5.24.0"])
    assert set(first.verdicts.values()) == {"error:harness"} and len(first.verdicts) == 2
    with Store(tmp_path / "s.sqlite") as store:
        rows = store.all_rows()
    assert {r["status"] for r in rows} == {"finished"}  # no row left running
    assert all("the launcher fell over" in r["excerpt"] for r in rows)
    assert all(any("failed at start 2" in e for e in r["evidence"]) for r in rows)


def _rows_excerpts(tmp_path) -> str:
    with Store(tmp_path / "s.sqlite") as store:
        return "\n".join(r["excerpt"] or "" for r in store.all_rows())


UNREACHABLE_INDEX = """\
$ uv pip install --python /env/bin/python transformers[serving]==5.24.0
error: Failed to fetch: `https://index.example/simple/transformers/`
  Caused by: Request failed after 3 retries
  Caused by: error sending request for url (https://index.example/simple/transformers/)
  Caused by: client error (Connect)
  Caused by: dns error: failed to lookup address information: Temporary failure in name resolution
"""

UNREACHABLE_REGISTRY = """\
$ podman build --tag servematrix-env:abc
STEP 1/9: FROM debian:bookworm-slim
Error: creating build container: initializing source docker://debian:bookworm-slim: pinging container registry registry-1.docker.io: Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host
"""

NO_WHEEL = """\
$ uv pip install --python /env/bin/python torch==2.9.1
  x No solution found when resolving dependencies:
  `-> Because torch==2.9.1 has no wheels with a matching platform tag, we can conclude that your requirements are unsatisfiable.
"""


@pytest.mark.parametrize("log", [UNREACHABLE_INDEX, UNREACHABLE_REGISTRY], ids=["index", "registry"])
def test_an_unreachable_index_or_registry_is_an_error_and_runs_again(tmp_path, matrix, log):
    first, _ = _run(matrix, tmp_path, FakeBackend(tmp_path, build_log=log))
    assert set(first.verdicts.values()) == {"error:build-network"}
    second, _ = _run(matrix, tmp_path, FakeBackend(tmp_path))
    assert set(second.verdicts.values()) == {"pass"} and len(second.verdicts) == 4


def test_a_build_the_stack_cannot_do_stays_a_failure(tmp_path, matrix):
    first, _ = _run(matrix, tmp_path, FakeBackend(tmp_path, build_log=NO_WHEEL))
    assert set(first.verdicts.values()) == {"fail:build"}
    second, _ = _run(matrix, tmp_path, FakeBackend(tmp_path))
    assert second.verdicts == {} and second.skipped_unchanged == 4


def test_an_interrupted_cell_is_not_unchanged(tmp_path, matrix):
    """A harness killed mid-cell: the reaper marks the row interrupted, and the next run runs the cell."""
    first, _ = _run(matrix, tmp_path, FakeBackend(tmp_path), select=["mode=static"])
    cell_id = next(iter(first.verdicts))
    with Store(tmp_path / "s.sqlite") as store:
        store.start(
            run_id="killed-run", cell_id=cell_id, env_id="e", engine="transformers", mode="static",
            matrix=str(matrix), axes={}, inputs_hash=store.all_rows()[0]["inputs_hash"], harness_pid=2**22 + 1,
        )  # fmt: skip
    second, out = _run(matrix, tmp_path, FakeBackend(tmp_path), select=["mode=static"])
    assert cell_id in second.verdicts, out
    assert ("killed-run", "interrupted") in {(r, v) for r, v in _run_ids(tmp_path)}


def _run_ids(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        return [(r["run_id"], r["verdict"]) for r in store.all_rows()]


def test_a_model_path_outside_the_workdir_is_bad_input(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(server="").replace('path = "m"', 'path = "../../elsewhere"\nbuild = "tiny-llama"'))
    with pytest.raises(InputError) as caught:
        _run(path, tmp_path, FakeBackend(tmp_path))
    assert str(caught.value).startswith(f"{path}:5: model.path: ../../elsewhere is outside")
    assert not (tmp_path / "s.sqlite").exists()  # nothing ran, nothing was written
