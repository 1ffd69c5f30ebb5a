"""Import-time dependency conflicts read from real tracebacks (the H200's sglang 0.5.12 logs)."""

from __future__ import annotations

from pathlib import Path

from servematrix.classify.tracebacks import import_conflict, packages_in_order

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def test_the_kernels_break_names_both_packages():
    found = import_conflict((LOGS / "h200-sglang-0.5.12-kernels-0.17.2-break.log").read_text())
    assert found is not None
    assert (found.imported_by, found.raised_in) == ("transformers", "kernels")
    assert found.chain == ("sglang", "transformers", "kernels")
    assert found.exception == "ValueError: Either a revision or a version must be specified."
    assert found.line == 31


def test_the_same_in_a_site_packages_venv_with_log_prefixes(tmp_path):
    text = (
        (LOGS / "h200-sglang-0.5.12-kernels-0.17.2-break.log")
        .read_text()
        .replace("/tmp/site/", "/opt/env/lib/python3.12/site-packages/")
    )
    text = "[2026-12-03 06:00:00] starting\n" + text
    found = import_conflict(text)
    assert found is not None and (found.imported_by, found.raised_in) == ("transformers", "kernels")


def test_a_missing_module_or_a_runtime_error_is_not_an_import_conflict():
    assert import_conflict((LOGS / "h200-sglang-0.5.12-ipython-missing.log").read_text()) is None
    assert (
        import_conflict((LOGS / "h200-sglang-0.5.12-grpc-port-break.log").read_text()) is None
    )  # one package, at run time
    assert import_conflict("no traceback here\n") is None


def test_stdlib_frames_do_not_count_as_packages():
    frames = [
        "/tmp/site/sglang/__init__.py",
        "/usr/lib/python3.12/importlib/__init__.py",
        "/tmp/site/transformers/activations.py",
        "/tmp/site/transformers/integrations/hub_kernels.py",
        "/tmp/site/kernels/layer/layer.py",
    ]
    assert packages_in_order(frames) == ["sglang", "transformers", "kernels"]


def test_classify_names_the_import_conflict_in_a_served_log():
    from servematrix.classify import classify_file, classify_text

    result = classify_file(LOGS / "h200-sglang-0.5.12-kernels-0.17.2-break.log", engine="sglang")
    assert (result["class"], result["line"]) == ("import-dependency-conflict", 31)
    assert "kernels/layer/layer.py" in result["excerpt"]
    match = classify_text((LOGS / "h200-sglang-0.5.12-kernels-0.17.2-break.log").read_text(), "sglang")
    assert match is not None and match.evidence == ("kernels (imported by transformers)",)
    # A missing module stays a missing module.
    assert classify_file(LOGS / "h200-sglang-0.5.12-ipython-missing.log", engine="sglang")["class"] == "missing-module"
