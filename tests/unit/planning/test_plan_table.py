"""`plan`'s table at 80 columns: one line per cell, nothing cut off with "…", every id whole."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from rich.console import Console

from servematrix.planning.plan import make_plan, narrow_table, print_table
from tests.conftest import MATRIX, REPO, SMALL_SGLANG

GLM5 = MATRIX / "glm5-nvfp4.toml"


def _plan_at_80_columns(*args: str, columns: int = 80) -> str:
    """The table as a user's 80-column terminal or a CI log (no terminal, COLUMNS=80) gets it."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": str(columns)}
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "plan", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout


def _cells(*args: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "plan", *args, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout)


# The product matrix's post releases (sglang 0.5.10.post1, 0.5.12.post1) are six characters wider than any other
# release: with them a row needs 86 columns. Without them it fits 80.
NO_POST = ("--select", "sglang!=0.5.10.post1", "--select", "sglang!=0.5.12.post1")


@pytest.mark.parametrize(("select", "columns"), [(NO_POST, 80), ((), 88)], ids=["without-post-releases", "whole"])
def test_the_product_matrix_is_one_line_per_cell_at_80_columns(select, columns):
    out = _plan_at_80_columns(str(GLM5), *select, columns=columns)
    cells = _cells(str(GLM5), *select)
    lines = out.splitlines()
    assert "…" not in out
    assert max(len(line) for line in lines) <= columns
    row_lines = [line for line in lines if line[:12] in {c["id"] for c in cells}]
    assert len(row_lines) == len(cells)
    # Rows are consecutive: no row folded onto a second line.
    first = lines.index(row_lines[0])
    assert lines[first : first + len(cells)] == row_lines
    for cell, line in zip(cells, row_lines, strict=True):
        words = line.split()
        assert words[0] == cell["id"]
        assert cell["mode"] in words and cell["axes"]["gpu"] in words and cell["axes"]["sglang"] in words
        assert words[-1] == "yes" if cell["applicable"] else re.fullmatch(r"\[\d\]", words[-1])
    # Fewer lines than the old table's 2,911 by far: the rows, a title, a header, a rule and the notes.
    assert len(lines) <= len(cells) + 16


def test_reasons_and_pins_are_notes_not_columns():
    out = _plan_at_80_columns(str(GLM5), *NO_POST)
    reasons = sorted({c["reason"] for c in _cells(str(GLM5)) if not c["applicable"]})
    assert len(reasons) == 3  # breakable before 0.5.11, full before 0.5.15, piecewise from 0.5.22
    assert "no [1]" in out
    # A note may fold at 80 columns but keeps every word.
    notes = " ".join(out.split("[1] not applicable: ", 1)[1].split())
    for reason in reasons:
        assert reason in notes
    assert "* pinned by the sglang release" in out


def test_commands_are_printed_below_the_table_only_when_asked():
    plan = make_plan(MATRIX / "cpu-smoke.toml")
    plain, with_commands = io.StringIO(), io.StringIO()
    print_table(plan, Console(file=plain, width=80))
    print_table(plan, Console(file=with_commands, width=80), commands=True)
    assert "--host" not in plain.getvalue()
    text = " ".join(with_commands.getvalue().split())
    for cell in plan.cells:
        assert f"{cell.id}: {shlex.join(cell.command)}" in text


def test_narrow_table_folds_long_values_and_never_adds_an_ellipsis():
    long_value = "v" * 150 + "-end"
    table = narrow_table("t", ("id", "verdict", "detail"), min_widths={"id": 12, "verdict": 24})
    table.add_row("0123456789ab", "fail:dynamo-untraceable", long_value)
    out = io.StringIO()
    Console(file=out, width=80).print(table)
    text = out.getvalue()
    assert "…" not in text
    assert "0123456789ab" in text and "fail:dynamo-untraceable" in text
    assert "".join(text.split()).count("v" * 150 + "-end") == 1
    assert max(len(line) for line in text.splitlines()) <= 80


def test_markup_in_a_matrix_name_is_shown_not_interpreted(write_matrix):
    path = write_matrix(SMALL_SGLANG, name="[red]x.toml")
    out = io.StringIO()
    print_table(make_plan(path), Console(file=out, width=200))
    assert "[red]x.toml: 8 cells" in out.getvalue()
