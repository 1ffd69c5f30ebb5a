"""Fixes that are packages (issue 34, part 4): a failing cell's failure page names the pin the matrix can
express and gives the command."""

from __future__ import annotations

from pathlib import Path

from servematrix.classify.fixes import package_fixes
from servematrix.report.site import failure_classes, write_failure_pages
from servematrix.store.rowschema import Row

EVIDENCE = "kernels (imported by transformers), ValueError: Either a revision or a version must be specified."


def row(sglang: str = "0.5.12", matrix: str = "matrix/glm5-nvfp4.toml", **axes: str) -> Row:
    return Row.of(
        {
            "run_id": "r1",
            "cell_id": f"c{sglang.replace('.', '')}{''.join(axes.values()).replace('.', '')}",
            "env_id": "e1",
            "engine": "sglang",
            "mode": "baseline",
            "matrix": matrix,
            "axes": {"sglang": sglang, "torch": "pinned", "gpu": "b200", **axes},
            "verdict": "predicted-fail:import-dependency-conflict",
            "evidence": [f"import check: fail import-dependency-conflict: {EVIDENCE}"],
            "excerpt": "ValueError: Either a revision or a version must be specified.",
            "finished_at": "2026-12-04T00:00:00+00:00",
        }
    )


def test_sglang_0512_import_break_is_fixed_by_kernels_0141():
    (fix,) = package_fixes(row())
    assert (fix.package, fix.version) == ("kernels", "0.14.1")
    assert "0.5.13 and later pin `kernels<0.15`" in fix.why
    assert fix.command == "servematrix run matrix/glm5-nvfp4.toml --select sglang=0.5.12 --select kernels=0.14.1"
    assert 'packages = ["kernels"]' in fix.edit and 'kernels = ["locked", "0.14.1"]' in fix.edit


def test_no_pin_where_the_release_pins_it_or_the_cell_already_has_it():
    assert package_fixes(row(sglang="0.5.14")) == []  # pins kernels<0.15 itself
    assert package_fixes(row(kernels="0.14.1")) == []
    assert package_fixes(row().replace(verdict="pass")) == []
    assert package_fixes(row().replace(evidence=[], excerpt="ValueError: something else")) == []


def test_a_matrix_with_the_package_axis_needs_only_the_version(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.toml").write_text('packages = ["kernels"]\n[axes]\nkernels = ["locked"]\n')
    (fix,) = package_fixes(row(matrix="m.toml", kernels="locked"))
    assert fix.edit == 'add "0.14.1" to the `kernels` axis under `[axes]`'
    (tmp_path / "m.toml").write_text('packages = ["kernels"]\n[axes]\nkernels = ["locked", "0.14.1"]\n')
    assert (
        package_fixes(row(matrix="m.toml", kernels="locked"))[0].edit == "nothing to change (it lists kernels 0.14.1)"
    )


def test_the_failure_page_names_the_pin_and_the_command(tmp_path: Path):
    rows = [row(), row(sglang="0.5.14")]
    write_failure_pages(failure_classes(rows), rows, tmp_path)
    page = (tmp_path / "import-dependency-conflict.md").read_text(encoding="utf-8")
    fixes = page[page.index("## Fixes that are packages") : page.index("## Cells that failed with it")]
    assert "pin **kernels 0.14.1**" in fixes
    assert "`servematrix run matrix/glm5-nvfp4.toml --select sglang=0.5.12 --select kernels=0.14.1`" in fixes
    assert "c0512" in fixes and "c0514" not in fixes


def test_the_failure_page_shows_the_frames_that_decide_a_class(tmp_path: Path):
    write_failure_pages(failure_classes([]), [], tmp_path)
    page = (tmp_path / "graph-capture-failed.md").read_text(encoding="utf-8")
    assert "Decided by a traceback's frames too" in page
    assert "tc_piecewise_cuda_graph_backend" in page and "_run_compile_pass" in page
    assert "sglang issue #26541" in (tmp_path / "kernel-fault.md").read_text(encoding="utf-8")
