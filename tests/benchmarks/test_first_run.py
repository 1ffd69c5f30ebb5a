"""The README's first command on a CPU host, as far as servematrix is concerned: `servematrix run` of the product
matrix (what `nox -s matrix` runs) reusing published CPU verdicts whose inputs are unchanged (run/reuse.py), against
the same command deciding them from nothing, both measured in this run.

To stay inside a CI job it runs one release of the product matrix (`--select sglang=0.5.23`, every GPU kind and
mode) at the resolve and probe stages: first `--fresh` from an empty uv cache and workdir, whose rows are then
published into the clone's record, then again from another empty uv cache and workdir, as a fresh clone of a
project with that record would. It prints both times, how much each grew uv's cache, and the ratio; it asserts
that the second run decided every applicable cell, and all of them by reuse, with the same verdicts.
(The issue's figure for the whole product matrix before reuse: 20 min 17 s and 45 GB, on this kind of host.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servematrix.report.publish import merge_published, store_rows
from servematrix.report.regressions import export_results, load_export, write_export
from servematrix.run.reuse import PUBLISHED, REUSED_PREFIX

ROOT = Path(__file__).resolve().parents[2]
MATRIX = "matrix/glm5-nvfp4.toml"
SELECT = "sglang=0.5.23"

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _run(clone: Path, name: str, *extra: str) -> tuple[float, float, dict]:
    cache = clone.parent / f"uv-cache-{name}"
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
    argv = [sys.executable, "-m", "servematrix", "run", MATRIX, "--select", SELECT, "--stages", "resolve,probe"]
    started = time.perf_counter()
    done = subprocess.run(
        [*argv, "--store", f"{name}.sqlite", "--workdir", f"wd-{name}", *extra],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["cell_id"]: r for r in store_rows(clone / f"{name}.sqlite")}
    return seconds, (_tree_bytes(cache) if cache.exists() else 0) / 1e9, rows


def test_a_first_run_reuses_the_published_verdicts_against_deciding_them_fresh(tmp_path):
    clone = tmp_path / "clone"  # what a fresh clone holds: the matrix, its locks and the published record
    shutil.copytree(ROOT / "matrix", clone / "matrix")
    (clone / PUBLISHED).parent.mkdir(parents=True)
    fresh_s, fresh_gb, fresh = _run(clone, "fresh", "--fresh")
    publication = merge_published(load_export(clone / PUBLISHED), list(fresh.values()))
    write_export(export_results(publication.rows, root=clone), clone / PUBLISHED)

    reused_s, reused_gb, again = _run(clone, "reused")
    decided = {c for c, r in fresh.items() if r["verdict"] != "skipped:not-applicable"}
    reused = {c for c, r in again.items() if (r["evidence"] or [""])[0].startswith(REUSED_PREFIX)}
    print(
        f"\nservematrix run {MATRIX} --select {SELECT} --stages resolve,probe, empty uv caches: fresh {fresh_s:.1f} s "
        f"(uv's cache grew {fresh_gb:.2f} GB), reusing the published verdicts {reused_s:.1f} s ({reused_gb:.2f} GB); "
        f"{fresh_s / reused_s:.1f}x faster, {len(reused)} of {len(decided)} decided cells reused"
    )
    assert decided and reused == decided
    assert {c: r["verdict"] for c, r in again.items()} == {c: r["verdict"] for c, r in fresh.items()}
