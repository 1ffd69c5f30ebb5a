"""Build a small, deterministic GLM-5-shaped model (MoE + MLA + DeepSeek sparse-attention indexer), random bf16
weights and the tiny Llama's byte-level tokenizer, for serving tests on a GPU and load tests on a CPU.

Like the tiny Llama builder beside it (``tinymodel.py``), this file imports only the standard library at module
level and runs as a script with a cell environment's interpreter::

    ENV/bin/python /path/to/tinymoe.py OUT_DIR [--size glm5-tiny|glm5-gpu|dsv3-tiny|dsv3-gpu] [--seed N] [--force]

A size names the architecture and the shapes (the harness passes one ``--size``; engine data names it:
``model_builders``). Two architectures, the same shapes:

* ``glm5``: ``GlmMoeDsaForCausalLM`` (GLM-5's architecture: MLA, the DSA indexer, MoE with a shared expert,
  sigmoid routing with a correction bias);
* ``dsv3``: ``DeepseekV3ForCausalLM`` with the same shapes and no indexer: the nearest architecture that an
  engine can serve without the sparse-attention kernels (MLA + MoE, dense attention).

The attention and indexer head dimensions are GLM-5's own (transformers' ``GlmMoeDsaConfig`` defaults, which
are the published GLM-5 config's): :data:`GLM5_REFERENCE` holds them, and :data:`CHANGES` lists every field
that differs from it, per size, with the reason. Nothing else differs.

Determinism: every tensor (parameters and the router's correction bias) is filled from its own
``torch.Generator`` seeded from ``(seed, tensor name)``; the tokenizer is the tiny Llama's (its own LCG corpus).
The same seed, torch and transformers give the same ``model.safetensors`` bytes (tests prove it twice).
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

try:  # imported as servematrix.<package>.tinymoe
    from . import tinymodel
except ImportError:  # run as a script: tinymodel.py is beside this file, on sys.path[0]
    import tinymodel  # type: ignore[no-redef]

BUILDER_VERSION = "2"  # 2: config.json without the per-layer type lists (`_portable_config`)
MARKER_NAME = "servematrix-tiny-model.json"
STACK_IMPORT_EXIT = tinymodel.STACK_IMPORT_EXIT
DEFAULT_SEED = 0

# GLM-5's shapes (transformers' GlmMoeDsaConfig defaults, the published GLM-5 config.json's values; the
# routing fields below come from that config.json, which transformers keeps as extra attributes).
GLM5_REFERENCE: dict[str, Any] = {
    "vocab_size": 154880,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_topk": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "max_position_embeddings": 202752,
    "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

# Every change from GLM5_REFERENCE, per size: (value, reason). Fields not named here are GLM-5's.
_COMMON_CHANGES: dict[str, tuple[Any, str]] = {
    "vocab_size": (None, "the tiny Llama's byte-level BPE tokenizer (about 1,500 tokens), not GLM-5's 154,880"),
    "n_routed_experts": (16, "few experts (GLM-5: 256)"),
    "num_experts_per_tok": (4, "top-4 of 16 (GLM-5: top-8 of 256)"),
    "max_position_embeddings": (8192, "short contexts only (GLM-5: 202,752)"),
    "num_nextn_predict_layers": (0, "no MTP (next-token prediction) layer: speculative decoding is not tested"),
    "moe_layer_freq": (1, "added: sglang's DeepSeek loader reads it; 1 is what GLM-5's layer pattern means"),
}
SHAPES: dict[str, dict[str, Any]] = {
    # For serving on one GPU: GLM-5's attention (64 heads, q_lora 2048) on a narrower residual stream, one dense
    # layer and two MoE layers. About 0.42 B parameters, 0.84 GB in bf16.
    "gpu": {
        "changes": {
            **_COMMON_CHANGES,
            "hidden_size": (2048, "narrower residual stream (GLM-5: 6144)"),
            "intermediate_size": (4096, "smaller dense MLP (GLM-5: 12288)"),
            "moe_intermediate_size": (512, "small experts (GLM-5: 2048)"),
            "num_hidden_layers": (3, "1 dense + 2 MoE layers (GLM-5: 3 dense + 75 MoE)"),
            "first_k_dense_replace": (1, "1 dense layer first (GLM-5: 3)"),
        },
        "dtype": "bfloat16",
        "weight_std": 0.02,
    },
    # For CPU tests (load, forward, determinism): a few MB.
    "tiny": {
        "changes": {
            **_COMMON_CHANGES,
            "hidden_size": (256, "tiny residual stream (GLM-5: 6144)"),
            "intermediate_size": (512, "tiny dense MLP (GLM-5: 12288)"),
            "moe_intermediate_size": (64, "tiny experts (GLM-5: 2048)"),
            "num_hidden_layers": (2, "1 dense + 1 MoE layer (GLM-5: 3 dense + 75 MoE)"),
            "first_k_dense_replace": (1, "1 dense layer first (GLM-5: 3)"),
            "num_attention_heads": (4, "4 heads (GLM-5: 64); the head dimensions stay GLM-5's"),
            "num_key_value_heads": (4, "as num_attention_heads (MLA)"),
            "q_lora_rank": (128, "tiny query LoRA (GLM-5: 2048)"),
            "n_routed_experts": (4, "few experts (GLM-5: 256)"),
            "num_experts_per_tok": (2, "top-2 of 4 (GLM-5: top-8 of 256)"),
        },
        "dtype": "bfloat16",
        "weight_std": 0.02,
    },
}
ARCHS = {"glm5": "GlmMoeDsaForCausalLM", "dsv3": "DeepseekV3ForCausalLM"}
# Every size: ARCH-SHAPE.
SIZES: dict[str, dict[str, Any]] = {f"{arch}-{shape}": SHAPES[shape] for arch in ARCHS for shape in SHAPES}
DEFAULT_SIZE = "glm5-tiny"
# Fields that only GLM-5's indexer has: the dsv3 build drops them.
INDEXER_FIELDS = ("index_head_dim", "index_n_heads", "index_topk")


def arch_of(size: str) -> str:
    """The architecture key of a size (``glm5`` or ``dsv3``)."""
    return size.split("-", 1)[0]


def model_fields(size: str = DEFAULT_SIZE, vocab_size: int | None = None) -> dict:
    """The config fields of a build: GLM5_REFERENCE with the size's changes applied (and no indexer for dsv3)."""
    arch = arch_of(size)
    fields = dict(GLM5_REFERENCE)
    for key, (value, _reason) in SIZES[size]["changes"].items():
        fields[key] = value
    fields["vocab_size"] = vocab_size
    if arch == "dsv3":
        for key in INDEXER_FIELDS:
            fields.pop(key)
    return fields


def changes(size: str = DEFAULT_SIZE) -> list[tuple[str, Any, Any, str]]:
    """``(field, GLM-5's value, this build's value, reason)`` for every field this size changes."""
    return [
        (key, GLM5_REFERENCE.get(key), value, reason) for key, (value, reason) in sorted(SIZES[size]["changes"].items())
    ]


def builder_path() -> Path:
    return Path(__file__).resolve()


def input_hash(seed: int = DEFAULT_SEED, size: str = DEFAULT_SIZE) -> str:
    """sha256 over every builder input: this file, the tiny Llama builder (the tokenizer), seed and size."""
    h = hashlib.sha256()
    payload = {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "size": size,
        "arch": ARCHS[arch_of(size)],
        "fields": model_fields(size),
        "preset": {k: v for k, v in SIZES[size].items() if k != "changes"},
    }
    h.update(json.dumps(payload, sort_keys=True, default=str).encode())
    h.update(builder_path().read_bytes())
    h.update(tinymodel.builder_path().read_bytes())
    return h.hexdigest()


def is_built(out_dir, seed: int = DEFAULT_SEED, size: str = DEFAULT_SIZE) -> bool:
    """True if ``out_dir`` holds a model built from the current builder inputs."""
    marker = tinymodel.read_marker(out_dir)
    return marker is not None and marker.get("input_hash") == input_hash(seed, size)


not_replaceable = tinymodel.not_replaceable  # the same rule: only what a servematrix builder built, or empty


def _config(size: str, ids: dict[str, int], vocab_size: int):
    from transformers import DeepseekV3Config, GlmMoeDsaConfig

    arch = arch_of(size)
    fields = model_fields(size, vocab_size)
    n_layers, n_dense = fields["num_hidden_layers"], fields["first_k_dense_replace"]
    common = dict(
        pad_token_id=ids[tinymodel.PAD_TOKEN],
        bos_token_id=ids[tinymodel.BOS_TOKEN],
        eos_token_id=ids[tinymodel.EOS_TOKEN],
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        attention_bias=False,
        initializer_range=0.02,
    )
    if arch == "glm5":
        return GlmMoeDsaConfig(
            **fields, **common, mlp_layer_types=["dense"] * n_dense + ["sparse"] * (n_layers - n_dense)
        )
    return DeepseekV3Config(**fields, **common)


# Per-layer type lists that newer transformers write and older ones reject: 5.12.1 (sglang 0.5.15's lock) writes
# layer_types "deepseek_sparse_attention", which 5.6.0 (0.5.12's) refuses at ServerArgs ("The `layer_types` entries
# must be in ..."; the load pre-flight found it). Every layer here is the same, which each version derives itself.
VERSION_SPECIFIC_LISTS = ("layer_types", "indexer_types")


def _portable_config(path: Path) -> None:
    """Drop the per-layer type lists from a saved config when each holds one value for every layer, so the model
    that one environment of a matrix built loads in another environment's transformers."""
    config = json.loads(path.read_text(encoding="utf-8"))
    uniform = [k for k in VERSION_SPECIFIC_LISTS if isinstance(config.get(k), list) and len(set(config[k])) <= 1]
    if uniform:
        path.write_text(
            json.dumps({k: v for k, v in config.items() if k not in uniform}, indent=2, sort_keys=True) + "\n"
        )


def build(out_dir, seed: int = DEFAULT_SEED, *, force: bool = False, size: str = DEFAULT_SIZE) -> Path:
    """Build into ``out_dir`` atomically (a temporary sibling, then a rename); skip when the marker matches."""
    out = Path(out_dir).resolve()
    if not force and is_built(out, seed, size):
        return out
    problem = tinymodel.not_replaceable(out)
    if problem:
        raise tinymodel.NotReplaceableError(problem)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import tokenizers
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, GenerationConfig
    except Exception as exc:
        raise tinymodel.StackImportError(f"{type(exc).__name__}: {exc}") from exc

    preset = SIZES[size]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer = tinymodel._build_tokenizer()
        ids = {
            t: tokenizer.convert_tokens_to_ids(t)
            for t in (tinymodel.PAD_TOKEN, tinymodel.BOS_TOKEN, tinymodel.EOS_TOKEN)
        }
        config = _config(size, ids, len(tokenizer))
        dtype = getattr(torch, preset["dtype"])
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(dtype).eval()
        with torch.no_grad():
            tensors = sorted([*model.named_parameters(), *model.named_buffers()])
            for name, tensor in tensors:
                if "rotary_emb" in name:
                    continue  # computed by the module itself, not saved
                digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
                gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") >> 1)
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    tensor.fill_(1.0)
                elif name.endswith(".bias"):  # the indexer's k_norm bias, the router's correction bias
                    tensor.zero_()
                else:
                    tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * preset["weight_std"])
            # The EOS logit is exactly 0, so greedy decoding practically never stops (as the tiny Llama).
            model.lm_head.weight[ids[tinymodel.EOS_TOKEN]].zero_()
        model.generation_config = GenerationConfig(
            bos_token_id=ids[tinymodel.BOS_TOKEN],
            eos_token_id=ids[tinymodel.EOS_TOKEN],
            pad_token_id=ids[tinymodel.PAD_TOKEN],
            do_sample=False,
        )
        model.save_pretrained(tmp, safe_serialization=True)
        _portable_config(tmp / "config.json")
        tokenizer.save_pretrained(tmp)
        files = {p.name: tinymodel._sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        marker = {
            "builder": "servematrix.tinymoe",
            "builder_version": BUILDER_VERSION,
            "arch": ARCHS[arch_of(size)],
            "seed": seed,
            "size": size,
            "input_hash": input_hash(seed, size),
            "parameters": sum(p.numel() for p in model.parameters()),
            "changes_from_glm5": [
                {"field": f, "glm5": g, "here": v if f != "vocab_size" else len(tokenizer), "why": why}
                for f, g, v, why in changes(size)
            ],
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "python": sys.version.split()[0],
            },
            "vocab_size": len(tokenizer),
            "special_token_ids": ids,
            "files": files,
        }
        tinymodel.put_in_place(tmp, out, marker, built=lambda: is_built(out, seed, size))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tinymoe.py", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=sorted(SIZES), default=DEFAULT_SIZE)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = build(args.out_dir, args.seed, force=args.force, size=args.size)
    except tinymodel.NotReplaceableError as exc:
        print(f"tinymoe.py: error: {exc}", file=sys.stderr)
        return 2
    except tinymodel.StackImportError as exc:
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        return STACK_IMPORT_EXIT
    print(
        json.dumps(
            {
                "out_dir": str(out),
                "arch": ARCHS[arch_of(args.size)],
                "size": args.size,
                "input_hash": input_hash(args.seed, args.size),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
