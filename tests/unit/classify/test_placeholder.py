"""A lock pin the index serves only as a placeholder sdist, read from uv's real output (sglang 0.5.18-0.5.22's
cuda-tile 1.6.0rc5, stored by the product matrix's run)."""

from __future__ import annotations

from pathlib import Path

from servematrix.classify.placeholder import placeholder_fault

LOG = Path(__file__).parents[2] / "fixtures" / "logs" / "uv-install-wheel-stub-cuda-tile.txt"


def test_the_placeholder_and_where_its_wheel_lives_are_read_from_uvs_output():
    found = placeholder_fault(LOG.read_text(encoding="utf-8"))
    assert found is not None
    assert (found.name, found.version) == ("cuda-tile", "1.6.0rc5")
    assert found.index.startswith("https://") and not found.index.endswith(".")
    assert "cuda-tile 1.6.0rc5" in found.note() and "--fresh" in found.note()


def test_other_install_faults_are_not_placeholders():
    assert placeholder_fault("error: Failed to download `torch==2.13.0`: No space left on device") is None
    assert placeholder_fault("hint: Build failures usually indicate a problem with the package") is None
