"""The GLM-5-shaped builder's declarations, without torch: every change from GLM-5 is listed with its reason,
the attention and indexer head dimensions are GLM-5's in every size, the dsv3 sizes drop only the indexer, and
engine data names sizes the builder has."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from servematrix.engines.transformers import tinymoe
from tests.conftest import REPO

HEAD_DIMS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
INDEXER = ("index_head_dim", "index_n_heads", "index_topk")


@pytest.mark.parametrize("size", sorted(tinymoe.SIZES))
def test_every_field_that_differs_from_glm5_is_a_listed_change(size):
    fields = tinymoe.model_fields(size, vocab_size=1536)
    listed = {field for field, _glm5, _here, _why in tinymoe.changes(size)}
    differs = {k for k, v in fields.items() if tinymoe.GLM5_REFERENCE.get(k, "absent") != v}
    assert differs <= listed, f"changed but not listed: {differs - listed}"
    for field, _glm5, _here, why in tinymoe.changes(size):
        assert why.strip(), field
    for key in HEAD_DIMS:
        assert fields[key] == tinymoe.GLM5_REFERENCE[key]
    if tinymoe.arch_of(size) == "glm5":
        assert all(fields[k] == tinymoe.GLM5_REFERENCE[k] for k in INDEXER)
    else:
        assert not set(INDEXER) & set(fields)
        assert set(tinymoe.GLM5_REFERENCE) - set(fields) == set(INDEXER)
    assert 1 <= fields["first_k_dense_replace"] < fields["num_hidden_layers"]  # >= 1 dense and >= 1 MoE layer


def test_the_gpu_size_keeps_glm5_attention_heads_which_flashmla_pads_on_hopper():
    # FlashMLA's sparse kernel needs the head count to divide 64 on Hopper (sglang pads up to 64).
    fields = tinymoe.model_fields("glm5-gpu")
    assert 64 % fields["num_attention_heads"] == 0
    assert fields["num_attention_heads"] == tinymoe.GLM5_REFERENCE["num_attention_heads"]


def test_the_hash_names_size_and_seed():
    hashes = {tinymoe.input_hash(seed, size) for seed in (0, 1) for size in tinymoe.SIZES}
    assert len(hashes) == 2 * len(tinymoe.SIZES)
    assert tinymoe.input_hash(0, "glm5-gpu") == tinymoe.input_hash(0, "glm5-gpu")


def test_engine_data_names_sizes_the_builder_has():
    data = tomllib.loads((REPO / "src/servematrix/data/engines/sglang.toml").read_text())
    entries = [e for e in data["model_builders"].values() if e.startswith("servematrix.engines.transformers.tinymoe")]
    assert {e.partition(":")[2] for e in entries} == {"glm5-gpu", "dsv3-gpu"}


def test_the_script_imports_only_the_standard_library_at_load():
    code = (
        f"import sys; sys.path.insert(0, {str(tinymoe.builder_path().parent)!r}); import tinymoe; "
        "heavy = {'torch', 'transformers', 'tokenizers', 'servematrix'} & set(sys.modules); print(sorted(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_saved_config_loses_only_the_uniform_per_layer_type_lists(tmp_path):
    # transformers 5.12.1 writes layer_types "deepseek_sparse_attention", which 5.6.0 (sglang 0.5.12) rejects: a model
    # one environment built must load in another's transformers. A list with a pattern in it stays.
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "glm_moe_dsa", "layer_types": ["deepseek_sparse_attention", "deepseek_sparse_attention"],'
        ' "indexer_types": ["full", "shared"], "mlp_layer_types": ["dense", "sparse"]}'
    )
    tinymoe._portable_config(path)
    config = __import__("json").loads(path.read_text())
    assert "layer_types" not in config
    assert config["indexer_types"] == ["full", "shared"] and config["mlp_layer_types"] == ["dense", "sparse"]
