"""Packaged data, read through importlib.resources: engine data (`engines/<name>.toml`), failure signatures
(`signatures/<engine>.toml`) and the harness's own faults (`harness_faults.toml`). No code lives here."""
