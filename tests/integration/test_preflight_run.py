"""`run --stages resolve,probe` on a CPU host: the pre-flight verdicts for real sglang cells, no GPU."""

from __future__ import annotations

import pytest

from servematrix.cli import main
from servematrix.store.store import Store
from tests.conftest import MATRIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_piecewise_on_sm120_with_plain_fp4_is_predicted_to_fail(tmp_path, test_cache):
    store = tmp_path / "s.sqlite"
    code = main(
        [
            "run",
            str(MATRIX / "glm5-nvfp4.toml"),
            "--select",
            "sglang=0.5.10",  # 0.5.9 cannot read GLM-5's config: the config pre-flight ends it first
            "--select",
            "gpu=rtx-pro-6000",
            "--select",
            "flashinfer=pinned",
            "--stages",
            "resolve,probe",
            "--store",
            str(store),
            "--workdir",
            str(test_cache / "work"),
            "--lock-dir",
            str(tmp_path / "locks"),
            "--no-report",
        ]
    )
    assert code == 0
    with Store(store) as s:
        by_mode = {r["mode"]: r for r in s.all_rows()}
    assert by_mode["piecewise"]["verdict"] == "predicted-fail:dynamo-untraceable"
    assert "Attempted to call function marked as skipped" in by_mode["piecewise"]["excerpt"]
    assert by_mode["baseline"]["verdict"] == "skipped:no-gpu"
