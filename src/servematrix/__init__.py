"""servematrix: a reproducible build-and-test matrix for LLM serving stacks.

Data flows one way: a matrix file (`spec.py`) expands to cells (`cells.py`, `plan.py`), the runner
(`pipeline.py`) takes each through the stages (`stages/`) on a backend (`backends/`), the store keeps the rows
(`store.py`), and `report/` turns them into tables, pages and the published record. Engines are plugins
described by data (`engines/`, `data/engines/`). `docs/architecture.md` says which module owns what.
"""
