"""A stack that dies at import is the stack's failure, even when the first thing to import it is the model
builder: a real lock (transformers 5.6.0 with kernels 0.17.2, which breaks transformers' hub_kernels at
import on a CPU too), a real uv venv, a fresh workdir where no model is built yet. Before, the cell ended
`error:model-build` and was retried on every run.

Install cost: the lock holds torch 2.9.1, the CPU smoke test's, so uv's cache serves it (about 1 s per venv
when warm; the first run ever downloads torch)."""

from __future__ import annotations

import pytest

from servematrix.cli import main
from servematrix.engines import ENGINES_PATH_ENV
from servematrix.store.store import Store
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MATRIX = """
engine = "transformers"
python = "3.11"
packages = ["kernels"]

[model]
name = "tiny-llama"
path = "work/models/tiny-llama"
build = "tiny-llama"

[axes]
transformers = ["5.6.0"]
torch = ["2.9.1"]
kernels = ["0.17.2"]
gpu = ["cpu"]
mode = ["static", "continuous-batching"]

[gpu.cpu]
arch = "cpu"
count = 0

[server]
ready_timeout_s = 60

[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


def _engine_installing_kernels(folder):
    """The packaged transformers engine, with kernels added to what it installs: transformers does not
    require kernels (sglang's stack brings it), and a package axis only overrides what the lock holds."""
    packaged = (REPO / "src/servematrix/data/engines/transformers.toml").read_text()
    assert 'extra = ["requests"]' in packaged
    folder.mkdir()
    (folder / "transformers.toml").write_text(
        packaged.replace('extra = ["requests"]', 'extra = ["requests", "kernels"]')
    )
    return folder


def test_a_stack_that_dies_at_import_in_the_model_build_gets_its_class(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENGINES_PATH_ENV, str(_engine_installing_kernels(tmp_path / "engines")))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.toml").write_text(MATRIX)
    args = ["run", "broken.toml", "--backend", "venv", "--workdir", "work", "--store", "results.sqlite"]
    args += ["--stages", "resolve,build,serve"]
    assert main(args) == 0
    with Store(tmp_path / "results.sqlite") as store:
        rows = store.all_rows()
    assert [r["verdict"] for r in rows] == ["fail:import-dependency-conflict"] * 2, [r["excerpt"] for r in rows]
    for row in rows:
        assert "Either a revision or a version must be specified." in row["excerpt"]
        assert any("kernels (imported by transformers)" in note for note in row["evidence"]), row["evidence"]
    assert not (tmp_path / "work" / "models" / "tiny-llama").exists()

    # A verdict about the stack is final: the next run does not try again.
    capsys.readouterr()
    assert main(args) == 0
    assert "2 unchanged" in capsys.readouterr().err
