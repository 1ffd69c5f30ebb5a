"""`servematrix report` on 1500 environments (issue 38: 1468 s and 1 GB; `matrix.yml`'s aggregate job has 30 min).

A store of sglang rows, two modes per environment, a third of them failing, is reported twice in one process:
with 100 environments and with 1500. Prints both times and the ratio of the second to 15 times the first
(1.0: linear in environments; the target is 1500 under 60 s). A benchmark, not a timed assertion: the
assertions check the answer.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from servematrix.cli import main
from servematrix.store.store import Store

pytestmark = pytest.mark.slow

SMALL, LARGE = 100, 1500


def _metrics(tok_s: float) -> dict[str, Any]:
    levels = [
        {
            "concurrency": c,
            "completion_tokens": 100,
            "error_count": 0,
            "output_tok_s": {"min": tok_s * c, "median": tok_s * c * 1.1, "max": tok_s * c * 1.2},
            "runs": [],
        }
        for c in (1, 8)
    ]
    return {"completion_tokens": 200, "levels": levels}


def _store(path: Path, environments: int) -> Path:
    combos = itertools.product(
        [f"0.5.{v}" for v in range(25)], ["2.9.1", "2.10.0", "2.11.0"], ["0.6.1", "0.6.12"],
        ["12.6", "12.8", "12.9", "13.0", "13.1"], ["b200", "h200"],
    )  # fmt: skip
    with Store(path) as store:
        for index, (sglang, torch, flashinfer, cuda, gpu) in enumerate(itertools.islice(combos, environments)):
            axes = {"sglang": sglang, "torch": torch, "flashinfer": flashinfer, "cuda": cuda, "gpu": gpu}
            for mode in ("baseline", "piecewise"):
                failing = index % 3 == 0 and mode == "piecewise"
                store.record(
                    run_id="r1", cell_id=f"c{index}-{mode}", env_id=f"e{index}", engine="sglang", mode=mode,
                    matrix="matrix/scale.toml", axes=axes, inputs_hash="h", backend="venv",
                    verdict="fail:dynamo-untraceable" if failing else "pass",
                    metrics=None if failing else _metrics(10.0 + index % 7 + (mode == "piecewise")),
                    excerpt="torch._dynamo.exc.Unsupported: x" if failing else None,
                )  # fmt: skip
    return path


def _report(tmp_path: Path, environments: int) -> float:
    store = _store(tmp_path / f"s{environments}.sqlite", environments)
    started = time.perf_counter()
    assert main(["report", "--store", str(store), "--out", str(tmp_path / f"out{environments}")]) == 0
    seconds = time.perf_counter() - started
    table = (tmp_path / f"out{environments}" / "compatibility.md").read_text()
    assert table.count("dynamo-untraceable") >= -(-environments // 3)
    return seconds


def test_report_is_linear_in_environments(tmp_path: Path):
    _report(tmp_path / "warm", 10)  # imports, fonts: not the report's
    small = _report(tmp_path, SMALL)
    large = _report(tmp_path, LARGE)
    ratio = large / (small * LARGE / SMALL)
    print(f"\nreport: {SMALL} environments {small:.1f} s, {LARGE} environments {large:.1f} s "
          f"(target < 60 s); {LARGE} against {LARGE // SMALL} x {SMALL}: {ratio:.2f} (1.0 is linear)")  # fmt: skip
