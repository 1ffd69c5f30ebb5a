"""A mode cell passes only with its engine's proof in the log that the mode ran: real sglang 0.5.12 logs
from the H200 (baseline and piecewise), and the same logs with the proof removed or misplaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from servematrix.engines import load_engine
from servematrix.planning.plan import make_plan
from servematrix.run.serving import mode_check

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
SGLANG = load_engine("sglang")

MATRIX = """
engine = "sglang"
[model]
name = "m"
path = "/models/m"
[axes]
sglang = ["0.5.12", "0.5.23"]
torch = ["pinned"]
flashinfer = ["pinned"]
cuda = ["13.0"]
gpu = ["h200"]
mode = ["baseline", "piecewise"]
[gpu.h200]
arch = "sm_90"
count = 1
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


@pytest.fixture
def cells(write_matrix):
    plan = make_plan(write_matrix(MATRIX))
    return {(c.env.version, c.mode): c for c in plan.cells}


def test_the_real_piecewise_log_proves_piecewise(cells):
    result = mode_check(SGLANG, cells["0.5.12", "piecewise"], LOGS / "h200-sglang-0.5.12-piecewise-server.log")
    assert str(result) == "pass"
    assert result.evidence[0].startswith("piecewise applied: [2026-12-03 06:27:30] Capture piecewise CUDA graph end")


def test_the_real_baseline_log_proves_baseline(cells):
    result = mode_check(SGLANG, cells["0.5.12", "baseline"], LOGS / "h200-sglang-0.5.12-baseline-server.log")
    assert str(result) == "pass"


def test_a_piecewise_cell_whose_server_silently_dropped_piecewise_does_not_pass(cells, tmp_path):
    # What GLM-5 on sglang 0.5.10-0.5.12 does without --enforce: the server serves, piecewise never ran.
    silent = tmp_path / "silent.log"
    silent.write_text((LOGS / "h200-sglang-0.5.12-baseline-server.log").read_text())
    result = mode_check(SGLANG, cells["0.5.12", "piecewise"], silent)
    assert str(result) == "fail:mode-not-applied"
    assert "Capture piecewise CUDA graph end" in result.excerpt


def test_a_baseline_cell_that_captured_piecewise_does_not_pass(cells):
    result = mode_check(SGLANG, cells["0.5.12", "baseline"], LOGS / "h200-sglang-0.5.12-piecewise-server.log")
    assert str(result) == "fail:mode-not-applied"


def test_where_the_data_has_no_evidence_rule_nothing_is_claimed(cells, tmp_path):
    # 0.5.23 has no piecewise (not applicable); a transformers mode has no evidence rule at all.
    assert SGLANG.evidence_for("piecewise", "0.5.23") is None
    assert load_engine("transformers").evidence_for("static", "5.24.0") is None


def test_a_baseline_must_say_that_prefill_graphs_are_off(cells, tmp_path):
    # From 0.5.14 no release prints "Capture piecewise CUDA graph end", so its absence proved nothing: the
    # baseline needs its own "disabled" line, and no prefill capture line.
    empty = tmp_path / "empty.log"
    empty.write_text("")
    result = mode_check(SGLANG, cells["0.5.23", "baseline"], empty)
    assert str(result) == "fail:mode-not-applied" and "prefill.backend='disabled'" in result.excerpt


# Fixtures formatted from each release's own log calls (their `# fixture:` header lines name the call and
# quote it, so they are dropped before matching): sglang-<release>-<backend>-capture.log.
BACKEND_MODE = {"tc_piecewise": "piecewise", "piecewise": "piecewise", "breakable": "breakable", "full": "full",
                "disabled": "baseline"}  # fmt: skip
WHEEL_FIXTURES = sorted(LOGS.glob("sglang-*-capture.log"))
# The real H200 logs of sglang 0.5.12 (piecewise and baseline), as (release, mode, log).
REAL_LOGS = [("0.5.12", "piecewise", LOGS / "h200-sglang-0.5.12-piecewise-server.log"),
             ("0.5.12", "baseline", LOGS / "h200-sglang-0.5.12-baseline-server.log")]  # fmt: skip
CASES = [(p.name.split("-")[1], BACKEND_MODE[p.name.split("-")[2]], p) for p in WHEEL_FIXTURES] + REAL_LOGS
ALL_MODES = ("baseline", "piecewise", "breakable", "full")


def _release_cells(write_matrix, version):
    plan = make_plan(write_matrix(MATRIX.replace('["0.5.12", "0.5.23"]', f'["{version}"]').replace(
        'mode = ["baseline", "piecewise"]', f"mode = {list(ALL_MODES)!r}")))  # fmt: skip
    return {c.mode: c for c in plan.cells if c.applicable}


def test_every_release_range_has_a_wheel_fixture_for_each_of_its_modes():
    covered = {(version, mode) for version, mode, _ in CASES}
    for version, mode in covered:
        assert SGLANG.mode_flags_for(mode, version).applicable, (version, mode)
    # each evidence rule of the data is exercised by at least one fixture in its range
    from packaging.version import Version

    for rule in SGLANG.mode_evidence:
        if rule.mode == "baseline" and rule.versions == ">=0.5.4,<0.5.10":
            continue  # nothing is logged then: absence is the proof, covered by the piecewise fixtures
        assert any(m == rule.mode and rule.contains(Version(v)) for v, m in covered), rule


@pytest.mark.parametrize(("version", "expected", "fixture"), CASES, ids=[p.name for _, _, p in CASES])
def test_a_log_proves_its_own_mode_and_no_other(write_matrix, tmp_path, version, expected, fixture):
    log = tmp_path / "server.log"
    log.write_text("".join(line for line in fixture.open() if not line.startswith("# fixture:")))
    cells = _release_cells(write_matrix, version)
    assert expected in cells
    for mode, cell in cells.items():
        result = mode_check(SGLANG, cell, log)
        if mode == expected:
            assert str(result) == "pass", (mode, result.excerpt)
        else:
            assert str(result) == "fail:mode-not-applied", (mode, version)


def test_a_breakable_cell_that_fell_back_to_eager_does_not_pass(write_matrix, tmp_path):
    # 0.5.12 BCG may fall back to eager after the gate and still print the piecewise end line.
    fixture = LOGS / "sglang-0.5.11-breakable-capture.log"
    text = "".join(line for line in fixture.open() if not line.startswith("# fixture:"))
    log = tmp_path / "server.log"
    log.write_text(text + "[BCG] Could not resolve inner layer_model on LlamaForCausalLM. BCG is disabled\n")
    result = mode_check(SGLANG, _release_cells(write_matrix, "0.5.12")["breakable"], log)
    assert str(result) == "fail:mode-not-applied" and "Could not resolve" in result.excerpt
