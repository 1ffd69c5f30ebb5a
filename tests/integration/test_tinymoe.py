"""The GLM-5-shaped builder with a real transformers on the CPU: the same bytes twice, GLM-5's head dimensions
in the written config, the checkpoint's per-expert names (what sglang's DeepSeek loader reads), and a load and a
greedy generation with transformers' own GlmMoeDsa / DeepseekV3 classes.

Uses the cached venv of tests/integration/test_tinymodel_and_bench.py (the newest transformers it tests)."""

from __future__ import annotations

import json
import subprocess

import pytest

from servematrix.engines.transformers import tinymoe
from tests.integration.test_tinymodel_and_bench import VERSIONS, _sha256, ensure_venv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOAD = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, GlmMoeDsaConfig
from safetensors import safe_open
path = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
cfg = AutoConfig.from_pretrained(path)
ids = torch.tensor([[1, 200, 300, 400, 500, 600]])
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
keys = list(safe_open(f"{path}/model.safetensors", "pt").keys())
defaults = GlmMoeDsaConfig().to_dict()
print(json.dumps({
    "class": type(model).__name__,
    "config": cfg.to_dict(),
    "defaults": {k: defaults.get(k) for k in defaults},
    "new_tokens": out[0, ids.shape[1]:].tolist(),
    "finite": bool(torch.isfinite(model(ids).logits).all()),
    "keys": keys,
}))
"""


@pytest.mark.parametrize("size", ["glm5-tiny", "dsv3-tiny"])
def test_builds_the_same_bytes_twice_and_loads_on_the_cpu(size, tmp_path):
    python = ensure_venv(VERSIONS[-1])
    for name in ("a", "b"):
        done = subprocess.run(
            [str(python), str(tinymoe.builder_path()), str(tmp_path / name), "--size", size],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert _sha256(tmp_path / "a" / "model.safetensors") == _sha256(tmp_path / "b" / "model.safetensors")
    assert tinymoe.is_built(tmp_path / "a", size=size)

    done = subprocess.run([str(python), "-c", LOAD, str(tmp_path / "a")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["class"] == tinymoe.ARCHS[tinymoe.arch_of(size)]
    assert got["finite"] and len(got["new_tokens"]) == 8
    config = got["config"]
    for key, value in tinymoe.model_fields(size).items():
        if key != "vocab_size":
            assert config[key] == value, key
    # GLM5_REFERENCE is transformers' own GlmMoeDsaConfig defaults, wherever transformers has the field.
    for key, value in tinymoe.GLM5_REFERENCE.items():
        if key in got["defaults"]:
            assert got["defaults"][key] == value, key
    # One tensor per expert, as sglang's DeepSeek weight loader reads them (not transformers' fused layout).
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in got["keys"]
    assert ("model.layers.0.self_attn.indexer.wk.weight" in got["keys"]) == (tinymoe.arch_of(size) == "glm5")
