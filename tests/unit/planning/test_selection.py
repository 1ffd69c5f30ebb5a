"""--select never silently selects nothing: a typo'd value or key, an id prefix that names no cell, or a
selection with no cells is bad input (exit 2) with a suggestion, so a CI dispatch with a typo cannot go
green having run nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servematrix.cli import main
from servematrix.errors import InputError
from servematrix.planning.plan import make_plan
from tests.conftest import MATRIX, REPO

GLM5 = MATRIX / "glm5-nvfp4.toml"


def _error(*select: str) -> str:
    with pytest.raises(InputError) as info:
        make_plan(GLM5, list(select))
    return str(info.value)


@pytest.mark.parametrize(
    ("select", "typo", "suggested", "known"),
    [
        ("mode=piecewize", "'piecewize'", "'piecewise'", "baseline, breakable, full, piecewise"),
        ("gpu=b300", "'b300'", "'b200'", "b200, rtx-pro-6000"),
        ("gpu=b200|rtx-pro-600", "'rtx-pro-600'", "'rtx-pro-6000'", "b200, rtx-pro-6000"),
        ("mode!=basline", "'basline'", "'baseline'", "baseline, breakable, full, piecewise"),
        (
            "sglang=0.5.24",
            "'0.5.24'",
            "'0.5.23'",
            "0.5.6, 0.5.9, 0.5.10, 0.5.10.post1, 0.5.11, 0.5.12, 0.5.12.post1, 0.5.13, 0.5.14, 0.5.15",
        ),
    ],
)
def test_an_unknown_value_lists_the_known_ones_and_suggests_the_closest(select, typo, suggested, known):
    message = _error(select)
    assert f"--select {select!r}" in message
    assert typo in message
    assert f"did you mean {suggested}?" in message
    assert known in message


def test_an_unknown_key_suggests_the_closest():
    message = _error("sglnag>=0.5.10")
    assert "unknown key 'sglnag'" in message and "did you mean 'sglang'?" in message


def test_values_that_a_pinned_axis_stands_for_are_known():
    # 0.5.9 pins flashinfer 0.6.3: the value appears in no axis list, but it names the pinned cells.
    plan = make_plan(GLM5, ["flashinfer=0.6.3"])
    assert {c.env.axes["sglang"] for c in plan.cells} == {"0.5.9"}
    assert {c.env.axes["flashinfer"] for c in plan.cells} == {"pinned"}


@pytest.mark.parametrize(
    "select",
    [
        "sglang>=0.5.99",  # a range beyond every version
        "cuda=13.0,sglang=0.5.9",  # known values, but the matrix excludes that environment
        "gpu=b200,sglang=0.5.23,cuda=12.8",  # the same, by another rule
    ],
)
def test_a_selection_of_no_cells_is_an_error(select):
    message = _error(select)
    assert "selects no cells" in message
    assert repr(select) in message


def test_a_selection_of_no_cells_names_every_select_option():
    message = _error("mode=piecewise", "sglang>=0.5.99")
    assert "--select 'mode=piecewise' --select 'sglang>=0.5.99' selects no cells" in message


@pytest.mark.parametrize(("select", "what"), [("env=zz", "environment id"), ("id=xyz", "cell id")])
def test_an_id_prefix_that_names_nothing_is_an_error(select, what):
    assert f"no {what} starts with {select.split('=')[1]!r}" in _error(select)


def test_an_id_prefix_among_options_that_names_nothing_is_an_error():
    env = make_plan(GLM5).cells[0].env_id
    assert len(make_plan(GLM5, [f"env={env[:8]}"]).cells) == 4  # the four modes of one environment
    assert "no environment id starts with 'zz'" in _error(f"env={env[:8]}|zz")


def test_only_version_axes_take_comparisons():
    assert "mode is not a version" in _error("mode>=baseline")


def test_an_empty_option_is_an_error():
    assert "empty value" in _error("gpu=b200|")


def test_shards_may_be_empty_but_selections_may_not():
    """An empty shard is a fact of dealing environments; only the selection must not be empty."""
    plan = make_plan(GLM5, ["sglang=0.5.23", "gpu=b200", "flashinfer=pinned"], shard_text="2/2")
    assert plan.cells == ()


def test_the_command_line_exits_2_with_one_line_and_no_traceback():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "plan", str(GLM5), "--select", "mode=piecewize"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("servematrix: error: --select 'mode=piecewize'") and "did you mean 'piecewise'?" in line


def test_lock_and_run_reject_a_typo_too(capsys):
    for command in ("lock", "run"):
        assert main([command, str(GLM5), "--select", "gpu=b300"]) == 2
        assert "did you mean 'b200'?" in capsys.readouterr().err


def test_starts_from_the_command_line_replace_the_matrixs_and_make_a_new_workload():
    from servematrix.planning.plan import make_plan, with_starts
    from servematrix.run.runplan import inputs_hash
    from tests.conftest import MATRIX

    plan = make_plan(MATRIX / "cpu-smoke.toml")
    more = with_starts(plan, 3)
    assert (plan.spec.file.bench.starts, more.spec.file.bench.starts) == (1, 3)
    assert more.cells == plan.cells  # the same cells, ids unchanged
    cell = plan.cells[0]
    # a finished one-start result does not stand for a three-start run
    assert inputs_hash(more, cell, ("serve", "bench")) != inputs_hash(plan, cell, ("serve", "bench"))
    assert with_starts(plan, 1).spec.file == plan.spec.file
