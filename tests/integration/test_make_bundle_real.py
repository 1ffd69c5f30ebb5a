"""ci/gpu/make_bundle.py for real: a bundle made with uv from a one-package lock (the path sglang's takes, in
seconds), unpacked as the GPU node unpacks it."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.unit.test_make_bundle import make_bundle

pytestmark = [pytest.mark.integration]


def test_a_bundle_made_with_uv_unpacks_to_the_lock_s_packages_and_says_what_it_left_out(tmp_path: Path):
    lock = tmp_path / "x.lock.txt"
    lock.write_text(
        "# servematrix-lock: 1\n"
        "six==1.17.0 \\\n"
        "    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274 \\\n"
        "    --hash=sha256:ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81\n"
        "    # via sglang\n"
        "torch==2.11.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    )
    base = tmp_path / "base.txt"
    base.write_text("")
    out = tmp_path / "out"
    assert make_bundle.main([str(lock), str(base), str(out)]) == 0
    parts = sorted(out.glob("site.tar.xz.*"))
    assert [p.name for p in parts] == ["site.tar.xz.00"]
    site = tmp_path / "site"
    site.mkdir()
    unpacked = subprocess.run(["tar", "-xJ", "-C", str(site), "-f", str(parts[0])], check=False)
    assert unpacked.returncode == 0
    assert (site / "six.py").is_file() and not any(site.glob("torch*"))
    manifest = (out / "MANIFEST.txt").read_text()
    assert "carried: 1 packages" in manifest and "not carried: torch==2.11.0: the node's CUDA stack" in manifest
    assert "six==1.17.0" in (out / "requirements.txt").read_text()
    assert tarfile.is_tarfile(parts[0])
