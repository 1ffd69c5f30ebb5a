"""ci/gpu/make_bundle.py for real: a bundle made with uv from a one-package lock (the path sglang's takes, in
seconds), unpacked as the GPU node unpacks it."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.unit.test_make_bundle import REPO, make_bundle

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
    # parts sized to what this working tree leaves of a device call, and the manifest says from what
    assert re.search(r"each at most [\d,]+ \(the working tree was [\d,]+ bytes\)", manifest)
    assert "six==1.17.0" in (out / "requirements.txt").read_text()
    assert tarfile.is_tarfile(parts[0])


def _fake_bundle(parts: Path, *, with_cutlass: bool) -> None:
    """A bundle part holding FAKE sglang, transformers and torch packages (named as fakes): what
    h200-bundle.sh imports. The fake sglang registers GLM-5's class only when `cutlass` imports, as the real
    one's GLM-5 module needs nvidia-cutlass-dsl, whose `cutlass` is reached through a .pth file only."""
    site = parts / "site"
    files = {
        "sglang/__init__.py": "__version__ = 'fake'\n",
        "sglang/srt/__init__.py": "",
        "sglang/srt/models/__init__.py": "",
        "sglang/srt/models/registry.py": (
            "try:\n    import cutlass\n    _GLM5 = ('GlmMoeDsaForCausalLM',)\nexcept ImportError:\n    _GLM5 = ()\n"
            "class _Registry:\n    models = dict.fromkeys(('LlamaForCausalLM', *_GLM5))\n\nModelRegistry = _Registry()\n"
        ),
        "transformers/__init__.py": "__version__ = 'fake'\n",
        "torch/__init__.py": "__version__ = 'fake'\n",
    }
    if with_cutlass:  # nvidia-cutlass-dsl's layout
        files["nvidia_cutlass_dsl/python_packages/cutlass/__init__.py"] = ""
        # as nvidia-cutlass-dsl 4.5.2 ships it: one line, no newline at its end (a shell `read` loop that
        # needs one skipped it, and GLM-5 fell back on the device node again)
        files["nvidia_cutlass_dsl.pth"] = "nvidia_cutlass_dsl/python_packages"
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    with tarfile.open(parts / "site.tar.xz.00", "w:xz") as tar:
        for name in sorted({name.split("/")[0] for name in files}):
            tar.add(site / name, arcname=name)


@pytest.mark.parametrize("knows_glm5", [True, False])
def test_the_node_s_unpacking_refuses_a_bundle_whose_sglang_lacks_a_lane_s_model_class(tmp_path, knows_glm5):
    """A bundle missing a package one of sglang's model modules imports loses that module's classes, and sglang
    serves those models through its Transformers fallback (GLM-5's failed so on the H200): the unpacking says so
    before any GPU time is spent. A package reached through a .pth file is on the wrappers' path (PYTHONPATH
    does not read .pth files: GLM-5 fell back so on a device node while nvidia-cutlass-dsl was in the bundle)."""
    _fake_bundle(tmp_path, with_cutlass=knows_glm5)
    release = f"test-{tmp_path.name}"  # its own /tmp/site-* and /tmp/py-*, not a real release's
    try:
        done = subprocess.run(
            ["bash", str(REPO / "ci" / "gpu" / "h200-bundle.sh"), release, str(tmp_path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    finally:
        subprocess.run(["rm", "-rf", f"/tmp/site-{release}", f"/tmp/py-{release}"], check=False)
    assert (done.returncode == 0) is knows_glm5, done.stderr
    if knows_glm5:
        assert "sglang serves LlamaForCausalLM, GlmMoeDsaForCausalLM with its own classes" in done.stdout
    else:
        assert "sglang has no class of its own for ['GlmMoeDsaForCausalLM']" in done.stderr
