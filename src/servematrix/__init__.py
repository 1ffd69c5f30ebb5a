"""servematrix: a reproducible build-and-test matrix for LLM serving stacks.

Data flows one way: a matrix file (`config/spec.py`) expands to cells (`planning/`), the runner (`run/`) takes
each through the stages (`stages/`) on a backend (`backends/`), the store keeps the rows (`store/`), and
`report/` turns them into tables, pages and the published record. Engines are plugins described by data
(`engines/`, `data/engines/`). The top level holds only the command line (`cli.py`, `options.py`,
`__main__.py`) and what every layer uses (`errors.py`, `util.py`); `docs/architecture.md` says which package
owns what, in layer order.
"""
