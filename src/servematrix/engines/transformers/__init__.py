"""The transformers engine's own code: the deterministic tiny Llama it serves on a CPU, and the `gpu-1b`
preset (`tinymodel.py`), a builder module named by engine data (`model_builders`), run as a script inside a
cell's environment. Beside it, `tinymoe.py`: GLM-5-shaped models (GlmMoeDsaForCausalLM, and the same shapes as
DeepseekV3ForCausalLM without the indexer) with the tiny Llama's tokenizer, for sglang on a GPU.

Its facts are data (`data/engines/transformers.toml`); it has no hooks module (no pre-flights of its own).
Running a builder, and refusing to build over what servematrix did not build, is `run/models.py`'s.
"""
