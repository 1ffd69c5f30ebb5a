"""`servematrix reclassify`: a store's failures named again from their stored server logs, against a real
SQLite store and the real H200 log of GLM-5's breakable cell on sglang 0.5.12, which the run named
`scheduler-died` before the signatures learned the breakable runner's frames."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.store.store import Store

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
BREAKABLE = LOGS / "h200-sglang-0.5.12-glm5-breakable-warmup.log"
ENVIRONMENT = "existing environment .../py-0.5.12: installed set a0c221e208e6f622"


def _row(cell: str, verdict: str, log: str | None, *, stages: dict | None = None, **extra) -> dict:
    return {
        "run_id": "r1",
        "cell_id": cell,
        "env_id": "e1",
        "engine": "sglang",
        "mode": "breakable",
        "matrix": "matrix/h200-glm5.toml",
        "axes": {"sglang": "0.5.12", "gpu": "h200"},
        "inputs_hash": "h1",
        "verdict": verdict,
        "excerpt": "Scheduler hit an exception: Traceback (most recent call last):",
        "evidence": [ENVIRONMENT],
        "log_path": log,
        "stages": {"build": 0.01, "serve": 60.4} if stages is None else stages,
        **extra,
    }


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    """A device's store copied off its host with its logs beside it, read from another folder."""
    logs = tmp_path / "gpu" / ".servematrix" / "logs" / "r1"
    logs.mkdir(parents=True)
    for cell in ("c-died", "c-timeout", "c-notapplied", "c-import", "c-pass", "c-same"):
        shutil.copy(BREAKABLE, logs / f"{cell}.log")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return tmp_path / "gpu"


def _log(cell: str) -> str:
    return f".servematrix/logs/r1/{cell}.log"


def _fill(path: Path) -> None:
    with Store(path) as store:
        store.record(**_row("c-died", "fail:scheduler-died", _log("c-died")))
        # Decided by time, by the mode's evidence and by the pre-flight: none is the log's to rename.
        store.record(**_row("c-timeout", "fail:server-timeout", _log("c-timeout")))
        store.record(**_row("c-notapplied", "fail:mode-not-applied", _log("c-notapplied")))
        store.record(**_row("c-import", "fail:scheduler-died", _log("c-import"), stages={"resolve": 0.1}))
        store.record(**_row("c-pass", "pass", _log("c-pass")))
        store.record(**_row("c-same", "fail:graph-capture-failed", _log("c-same")))
        store.record(**_row("c-gone", "fail:scheduler-died", _log("c-gone")))


def _verdicts(path: Path) -> dict[str, str]:
    with Store(path, read_only=True) as store:
        return {row["cell_id"]: row["verdict"] for row in store.latest()}


def test_a_stored_gpu_failure_is_named_again_from_its_log(store_dir, capsys):
    path = store_dir / "results.sqlite"
    _fill(path)
    before = _verdicts(path)
    assert main(["reclassify", "--store", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"c-died matrix/h200-glm5.toml mode=breakable: scheduler-died -> graph-capture-failed "
        f"({path.parent / _log('c-died')}, line 120)"
    ]
    assert "1 failure cause(s) named again" in err
    after = _verdicts(path)
    assert after == {**before, "c-died": "fail:graph-capture-failed"}
    with Store(path, read_only=True) as store:
        row = next(r for r in store.latest() if r["cell_id"] == "c-died")
    evidence = row["evidence"]
    assert evidence[0] == "frames: model_executor/breakable_cuda_graph_runner.py:307 _warmup"
    assert evidence[1].startswith("cause named again from the stored server log on ")
    assert evidence[1].endswith("the run had named it scheduler-died")
    assert evidence[2:] == [ENVIRONMENT]  # what the run said of its environment stays
    assert "Unknown keyword argument 'topk_indices'" in row["excerpt"]
    assert row["stages"] == {"build": 0.01, "serve": 60.4} and row["run_id"] == "r1"

    # Named again, a second pass finds nothing, and the note is not doubled.
    assert main(["reclassify", "--store", str(path)]) == 0
    assert capsys.readouterr().out == ""
    assert _verdicts(path) == after


def test_a_dry_run_writes_nothing(store_dir, capsys):
    path = store_dir / "results.sqlite"
    _fill(path)
    before = path.read_bytes()
    assert main(["reclassify", "--store", str(path), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "scheduler-died -> graph-capture-failed" in out and "nothing written" in err
    assert path.read_bytes() == before


def test_a_missing_store_is_an_input_error(tmp_path, capsys):
    assert main(["reclassify", "--store", str(tmp_path / "absent.sqlite")]) == 2
    assert "absent.sqlite: no such store" in capsys.readouterr().err
    assert not (tmp_path / "absent.sqlite").exists()


def test_a_log_path_leaving_this_hosts_log_folders_is_never_read(store_dir, tmp_path, capsys):
    """H1: a merged row names a private file of this host (absolute, `../` relative, or a link planted in
    the log folder that points out of it): none is read, so none of its lines reaches an excerpt."""
    private = tmp_path / "victim" / "notes.log"
    private.parent.mkdir()
    shutil.copy(BREAKABLE, private)
    private.chmod(0o600)
    logs = store_dir / ".servematrix" / "logs" / "r1"
    (logs / "c-link.log").symlink_to(private)
    (logs / "c-dirlink").symlink_to(private.parent, target_is_directory=True)
    escape = "/".join([".."] * len(store_dir.resolve().parts)) + str(private)
    path = store_dir / "results.sqlite"
    with Store(path) as store:
        store.record(**_row("c-abs", "fail:scheduler-died", str(private), host={"hostname": "elsewhere"}))
        store.record(**_row("c-rel", "fail:scheduler-died", escape))
        store.record(**_row("c-dots", "fail:scheduler-died", ".servematrix/logs/r1/../../../victim/notes.log"))
        store.record(**_row("c-link", "fail:scheduler-died", _log("c-link")))
        store.record(**_row("c-dirlink", "fail:scheduler-died", ".servematrix/logs/r1/c-dirlink/notes.log"))
        store.record(**_row("c-dev", "fail:scheduler-died", "/dev/zero"))
    before = _verdicts(path)
    assert main(["reclassify", "--store", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "0 failure cause(s) named again" in err
    assert _verdicts(path) == before


def test_a_log_inside_the_log_folder_reached_through_a_link_inside_it_is_read(store_dir, capsys):
    """The containment check is on real paths: a link that stays inside the log folder is a log."""
    logs = store_dir / ".servematrix" / "logs" / "r1"
    (logs / "c-alias.log").symlink_to(logs / "c-died.log")
    path = store_dir / "results.sqlite"
    with Store(path) as store:
        store.record(**_row("c-alias", "fail:scheduler-died", _log("c-alias")))
    assert main(["reclassify", "--store", str(path)]) == 0
    assert (
        "c-alias matrix/h200-glm5.toml mode=breakable: scheduler-died -> graph-capture-failed"
        in capsys.readouterr().out
    )
