"""A mode cell passes only with its engine's proof in the log that the mode ran: real sglang 0.5.12 logs
from the H200 (baseline and piecewise), and the same logs with the proof removed or misplaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from servematrix.engines import load_engine
from servematrix.pipeline import mode_check
from servematrix.plan import make_plan

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
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
    # 0.5.23 has no piecewise (not applicable); its baseline still must not capture piecewise.
    assert SGLANG.evidence_for("piecewise", "0.5.23") is None
    assert load_engine("transformers").evidence_for("static", "5.24.0") is None
    empty = tmp_path / "empty.log"
    empty.write_text("")
    result = mode_check(SGLANG, cells["0.5.23", "baseline"], empty)
    assert str(result) == "pass" and "no 'Capture piecewise CUDA graph end' line" in result.evidence[0]
