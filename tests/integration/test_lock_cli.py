"""`servematrix lock` against the real package index: the contract shape, crossings, unresolvable."""

from __future__ import annotations

import json

import pytest

from servematrix.cli import main
from tests.conftest import MATRIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_lock_json_contract_and_crossings(tmp_path, capsys):
    code = main(
        [
            "lock",
            str(MATRIX / "glm5-nvfp4.toml"),
            "--select",
            "sglang=0.5.9|0.5.12",
            "--select",
            "gpu=b200",
            "--select",
            "resolution=today",
            "--out",
            str(tmp_path),
            "--format",
            "json",
        ]
    )
    assert code == 0
    outcomes = json.loads(capsys.readouterr().out)
    assert len(outcomes) == 4
    for outcome in outcomes:
        assert {"env_id", "axes", "status", "reason", "pins", "lockfile"} <= set(outcome)
        assert set(outcome["axes"]) == {"sglang", "torch", "flashinfer", "cuda", "gpu"}
    by = {(o["axes"]["sglang"], o["axes"]["flashinfer"]): o for o in outcomes}
    pinned = by[("0.5.9", "pinned")]
    assert pinned["status"] == "resolved"
    assert pinned["pins"]["torch"] == "2.9.1" and pinned["pins"]["flashinfer-python"] == "0.6.3"
    assert pinned["pins"]["sgl-kernel"] == "0.3.21"
    crossed = by[("0.5.12", "0.6.12")]
    assert crossed["status"] == "resolved" and crossed["pins"]["torch"] == "2.11.0"
    assert crossed["crossed"]["flashinfer-python"] == {"release_pin": "0.6.11.post1", "used": "0.6.12"}
    bad = by[("0.5.9", "0.6.12")]
    assert bad["status"] == "unresolvable" and "nvidia-cutlass-dsl" in bad["reason"]
    assert bad["lockfile"] is None
    lock_text = (tmp_path / f"{crossed['env_id']}.lock.txt").read_text()
    assert "--hash=sha256:" in lock_text and "# crossed: flashinfer-python" in lock_text


def test_run_resolve_stage_records_unresolvable_without_further_stages(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    code = main(
        [
            "run",
            str(MATRIX / "glm5-nvfp4.toml"),
            "--select",
            "sglang=0.5.9",
            "--select",
            "flashinfer=0.6.12",
            "--select",
            "gpu=b200",
            "--lock-dir",
            str(tmp_path / "locks"),
            "--store",
            str(store),
            "--workdir",
            str(tmp_path / "work"),
            "--report",
            str(tmp_path / "compat.md"),
        ]
    )
    assert code == 0
    from servematrix.store.store import Store

    with Store(store) as s:
        rows = s.all_rows()
    # The modes 0.5.9 has are unresolvable; those it lacks (breakable, full) are not applicable before resolving.
    by_mode = {r["mode"]: r for r in rows}
    assert {m: r["verdict"] for m, r in by_mode.items()} == {
        "baseline": "unresolvable",
        "piecewise": "unresolvable",
        "breakable": "skipped:not-applicable",
        "full": "skipped:not-applicable",
    }
    assert "nvidia-cutlass-dsl" in by_mode["baseline"]["excerpt"]
    assert not (tmp_path / "work" / "envs").exists()  # nothing was built
    table = (tmp_path / "compat.md").read_text()
    assert "unresolvable" in table and "crosses pin" in table
