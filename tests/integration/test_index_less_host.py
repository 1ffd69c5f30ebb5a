"""A host that reaches no package index (a GPU node) finds that out once per run, says it in one line, and
no later cell waits for pip: real pip, pointed at a closed local port, over the cells of the H200 smoke
matrix at the probe stage (the flags pre-flight downloads each release's wheel: two releases, every cell of the matrix,
the tensor-parallel kinds' included)."""

from __future__ import annotations

import shutil
import socket

import pytest

from servematrix.cli import main
from servematrix.planning.plan import make_plan
from servematrix.store.store import Store
from tests.conftest import MATRIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the socket is


def test_an_index_less_host_is_found_once_and_said_once(tmp_path, monkeypatch, capsys):
    shutil.copy(MATRIX / "h200-smoke.toml", tmp_path / "h200-smoke.toml")
    monkeypatch.chdir(tmp_path)
    for name in [k for k in __import__("os").environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no configured indexes or wheel folders
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("PIP_LOG", str(tmp_path / "pip.log"))  # pip appends one block per invocation
    args = ["run", "h200-smoke.toml", "--stages", "probe", "--workdir", "work", "--store", "results.sqlite"]
    assert main(args) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "no package index is reachable" in line]
    assert len(said) == 1, err
    assert "flags pre-flight could not run" in said[0] and "connection refused" in said[0].lower()
    assert (tmp_path / "pip.log").read_text().count("Looking in indexes:") == 1  # one attempt for all cells
    with Store(tmp_path / "results.sqlite") as store:
        verdicts = [r["verdict"] for r in store.all_rows()]
    cells = make_plan(MATRIX / "h200-smoke.toml").cells
    assert len(cells) == 28  # 16 one-GPU cells (12 on the H200, 4 on the H100) and 12 on the tensor-parallel kinds
    # Predicts nothing: the GPU stages decide, but for 0.5.12's full cells (no such backend before 0.5.15).
    expected = [
        "skipped:not-applicable" if (c.mode, c.env.axes["sglang"]) == ("full", "0.5.12") else "skipped:no-gpu"
        for c in cells
    ]
    assert sorted(verdicts) == sorted(expected) and expected.count("skipped:not-applicable") == 2
