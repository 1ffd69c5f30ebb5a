"""The README's first command on a CPU host, as far as servematrix is concerned: `servematrix run` of the product
matrix (what `nox -s matrix` runs) from an empty uv cache and an empty workdir, reusing the published CPU
verdicts of docs/results/latest.json whose inputs are unchanged (reuse.py).

Target: <= 2 minutes and <= 2 GB downloaded on a 2-core host. It prints the time and how much uv's cache
grew, against the first run the issue reported before reuse (20 min 17 s, 45 GB in uv's cache, on this kind
of host); it asserts only that every applicable cell got a verdict and says whether it was reused.

The record has hashes only once a fresh pre-flight (the nightly, `--fresh`) has published them; until then
there is nothing to reuse and this benchmark says so and skips, rather than measure a 20-minute run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servematrix.plan import make_plan
from servematrix.report.publish import store_rows
from servematrix.reuse import PUBLISHED, REUSED_PREFIX

ROOT = Path(__file__).resolve().parents[2]
MATRIX = "matrix/glm5-nvfp4.toml"
BEFORE_S, BEFORE_GB = 20 * 60 + 17, 45.0  # the measurement of the same command before reuse
TARGET_S, TARGET_GB = 120.0, 2.0

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_first_run_of_the_product_matrix_reuses_the_published_verdicts(tmp_path):
    plan = make_plan(ROOT / MATRIX)
    applicable = {c.id for c in plan.cells if c.applicable}
    record = json.loads((ROOT / PUBLISHED).read_text())["cells"]
    hashed = {cell for cell in applicable if (record.get(cell) or {}).get("preflight_hash")}
    if not hashed:
        pytest.skip(f"{PUBLISHED} holds no preflight hashes yet: the first fresh pre-flight publishes them")

    clone = tmp_path / "clone"  # what a fresh clone holds: the matrix, its locks and the published record
    for part in ("matrix", "docs/results"):
        shutil.copytree(ROOT / part, clone / part)
    cache = tmp_path / "uv-cache"
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "run", MATRIX, "--store", "s.sqlite", "--workdir", "wd"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-3000:]
    grew = (_tree_bytes(cache) if cache.exists() else 0) / 1e9
    rows = {r["cell_id"]: r for r in store_rows(clone / "s.sqlite")}
    reused = {c for c, r in rows.items() if (r["evidence"] or [""])[0].startswith(REUSED_PREFIX)}
    print(
        f"\nservematrix run {MATRIX}, empty uv cache: {seconds:.1f} s, uv's cache grew {grew:.2f} GB; "
        f"{len(reused)} of {len(applicable)} applicable cells reused. Before reuse: {BEFORE_S} s, {BEFORE_GB:.0f} GB "
        f"({BEFORE_S / seconds:.1f}x faster; target {TARGET_S:.0f} s: {seconds / TARGET_S:.2f} of it, "
        f"{TARGET_GB:.0f} GB: {grew / TARGET_GB:.2f} of it)"
    )
    assert applicable <= set(rows) and all(rows[c]["verdict"] for c in applicable)
    assert reused <= hashed
