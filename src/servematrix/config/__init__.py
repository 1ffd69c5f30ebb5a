"""The configuration a person writes: a matrix file, its schema and the checks that need the engine's data
(`spec.py`), and `servematrix schema`.

It reads TOML through `formats/tomlsource.py` and the engine's facts through `engines/`; expanding a matrix
into cells and choosing among them is planning's (`planning/`).
"""
