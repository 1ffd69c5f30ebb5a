"""Flag axes, recipes by release and resolving as released: new axes that leave every existing id as it was."""

from __future__ import annotations

import dataclasses
import json

import pytest

from servematrix.config.spec import load_spec
from servematrix.engines import load_engine
from servematrix.engines.hooks import PreflightInput
from servematrix.engines.sglang import flags as flags_preflight
from servematrix.errors import InputError
from servematrix.planning.cells import expand, recipe_args, with_flag
from servematrix.planning.plan import make_plan
from servematrix.stages.locking import resolve_request
from tests.conftest import MATRIX, SMALL_SGLANG
from tests.unit.engines.test_probe import fixture_surface  # noqa: F401  (a fixture)

TWO_KINDS = (
    SMALL_SGLANG.replace('gpu = ["b200"]', 'gpu = ["b200", "rtx"]')
    + """
[gpu.rtx]
arch = "sm_120"
count = 8
args = ["--tp", "8", "--moe-runner-backend", "cutlass", "--kv-cache-dtype", "bf16"]
"""
)
SWEPT = (
    TWO_KINDS.replace(
        'mode = ["baseline", "piecewise"]',
        'mode = ["baseline", "piecewise"]\nmoe_runner = ["cutlass", "flashinfer_cutlass"]',
    )
    + """
[flag_axes.moe_runner]
flag = "--moe-runner-backend"
gpu = ["rtx"]
"""
)


def _by_id(path):
    return {c.id: c for c in expand(load_spec(path))}


def test_a_flag_axis_keeps_the_recipe_cells_ids_and_sweeps_only_its_kinds(write_matrix):
    before = _by_id(write_matrix(TWO_KINDS, "before.toml"))
    after = _by_id(write_matrix(SWEPT, "after.toml"))
    assert set(before) <= set(after)  # every cell that was there keeps its id
    new = [c for i, c in after.items() if i not in before]
    # Only the swept kind gets the second value: one new cell per rtx cell, none for b200.
    assert len(new) == sum(1 for c in before.values() if c.env.axes["gpu"] == "rtx")
    for cell in new:
        assert cell.env.axes["gpu"] == "rtx" and cell.env.axes["moe_runner"] == "flashinfer_cutlass"
        i = cell.command.index("--moe-runner-backend")
        assert cell.command[i + 1] == "flashinfer_cutlass"  # in place of the recipe's value, not appended
        assert cell.command.count("--moe-runner-backend") == 1
        assert cell.swept_flags == {"--moe-runner-backend": "flashinfer_cutlass"}
    b200 = [c for c in after.values() if c.env.axes["gpu"] == "b200"]
    assert {c.env.axes["moe_runner"] for c in b200} == {"default"}  # its recipe gives no MoE runner
    assert all(not c.swept_flags for c in b200)


def test_the_product_matrix_keeps_every_published_cell_id():
    cells = expand(load_spec(MATRIX / "glm5-nvfp4.toml"))
    rtx = [c for c in cells if c.env.axes["gpu"] == "rtx-pro-6000" and c.env.axes["resolution"] == "today"]
    assert {c.env.axes["moe_runner"] for c in rtx} == {"cutlass", "flashinfer_cutlass"}
    released = {c.env.axes["sglang"] for c in cells if c.env.axes["resolution"] == "as-released"}
    assert released == {"0.5.12"}
    # The ids of the published record (before these axes) are all still planned.
    record = json.loads((MATRIX.parent / "docs/results/latest.json").read_text())["cells"]
    published = {r["cell_id"] for r in record.values() if r["matrix"] == "matrix/glm5-nvfp4.toml"}
    assert len(published) >= 104 and published <= {c.id for c in cells}


def _without_axis(cell):
    return (*(v for k, v in sorted(cell.env.axes.items()) if k != "moe_runner"), cell.mode, cell.command)


def test_a_default_value_beside_the_recipes_value_is_planned_once(write_matrix, capsys):
    """L6: `default` keeps the recipe's value, so beside that value it was the same argv under a second id,
    built, served, benchmarked and published twice. It is planned once, as the recipe's value (whose id is the
    one without the axis), with a warning that says so; where the recipe gives another value it stays."""
    text = SWEPT.replace('["cutlass", "flashinfer_cutlass"]', '["default", "cutlass", "flashinfer_cutlass"]')
    cells = expand(load_spec(write_matrix(text)))
    commands = [_without_axis(c) for c in cells]
    assert len(commands) == len(set(commands))  # no argv twice
    assert {c.id for c in cells} == set(_by_id(write_matrix(SWEPT, "swept.toml")))
    err = capsys.readouterr().err
    assert "flag axis 'moe_runner': 'default' on GPU kind 'rtx' is its recipe's --moe-runner-backend cutlass" in err
    assert "planned once, as 'cutlass'" in err
    # An include that names `default` is the recipe's cell too, not a second copy of it.
    included = text + (
        '\n[[include]]\nsglang = "0.5.9"\ntorch = "pinned"\nflashinfer = "pinned"\ncuda = "13.0"\ngpu = "rtx"\n'
        'moe_runner = "default"\nmode = "piecewise"\n'
    )
    cells = expand(load_spec(write_matrix(included, "included.toml")))
    commands = [_without_axis(c) for c in cells]
    assert len(commands) == len(set(commands))
    # Where the recipe gives a value the axis does not list, `default` is a cell of its own, as before.
    other = SWEPT.replace('["cutlass", "flashinfer_cutlass"]', '["default", "flashinfer_cutlass"]')
    rtx = [c for c in expand(load_spec(write_matrix(other, "other.toml"))) if c.env.axes["gpu"] == "rtx"]
    assert {c.env.axes["moe_runner"] for c in rtx} == {"default", "flashinfer_cutlass"}


def test_args_by_release_set_a_flag_in_place_for_the_releases_in_range(write_matrix):
    text = (
        TWO_KINDS
        + """
[[gpu.rtx.args_by_release]]
versions = ">=0.5.12"
args = ["--moe-runner-backend", "flashinfer_cutlass", "--disable-shared-experts-fusion"]
source = "a test"
"""
    )
    spec = load_spec(write_matrix(text))
    kind = spec.file.gpu["rtx"]
    assert recipe_args(kind, "0.5.9") == tuple(kind.args)
    assert recipe_args(kind, "0.5.12") == (
        "--tp",
        "8",
        "--moe-runner-backend",
        "flashinfer_cutlass",
        "--kv-cache-dtype",
        "bf16",
        "--disable-shared-experts-fusion",
    )
    cells = expand(spec)
    new = next(c for c in cells if c.env.axes["sglang"] == "0.5.12" and c.env.axes["gpu"] == "rtx")
    assert "flashinfer_cutlass" in new.command
    old = next(c for c in cells if c.env.axes["sglang"] == "0.5.9" and c.env.axes["gpu"] == "rtx")
    assert "cutlass" in old.command and "flashinfer_cutlass" not in old.command


def test_args_by_release_replace_a_flag_of_several_values_whole(write_matrix):
    """M3: sglang's `--cuda-graph-bs` takes several values; a release's row replaces all of them, in place, and
    leaves no stray value behind (a bare argument repeated as a flag's value is kept too: L4)."""
    text = TWO_KINDS.replace(
        'args = ["--tp", "8", "--moe-runner-backend", "cutlass", "--kv-cache-dtype", "bf16"]',
        'args = ["--cuda-graph-bs", "8", "16", "--mem-fraction-static", "0.8", "--tag", "a", "a"]',
    ) + (
        """
[[gpu.rtx.args_by_release]]
versions = ">=0.5.12"
args = ["--cuda-graph-bs", "1", "2", "4", "--enable-x", "--mem-fraction-static=0.7"]
source = "a test"
"""
    )
    spec = load_spec(write_matrix(text))
    kind = spec.file.gpu["rtx"]
    assert recipe_args(kind, "0.5.9") == tuple(kind.args)
    assert recipe_args(kind, "0.5.12") == (
        *("--cuda-graph-bs", "1", "2", "4"),
        "--mem-fraction-static=0.7",
        *("--tag", "a", "a"),
        "--enable-x",
    )
    new = next(c for c in expand(spec) if c.env.axes["sglang"] == "0.5.12" and c.env.axes["gpu"] == "rtx")
    at = new.command.index("--cuda-graph-bs")
    assert new.command[at : at + 5] == ("--cuda-graph-bs", "1", "2", "4", "--mem-fraction-static=0.7")
    assert "16" not in new.command


def test_with_flag_handles_both_spellings():
    assert with_flag(("--a=1", "--b", "2"), "--a", "3") == ("--a=3", "--b", "2")
    assert with_flag(("--b", "2"), "--a", "3") == ("--b", "2", "--a", "3")


def test_resolution_as_released_is_a_new_environment_and_today_keeps_its_id_and_lock(write_matrix):
    before = make_plan(write_matrix(SMALL_SGLANG, "before.toml"))
    text = SMALL_SGLANG.replace(
        'mode = ["baseline", "piecewise"]', 'mode = ["baseline", "piecewise"]\nresolution = ["today", "as-released"]'
    )
    after = make_plan(write_matrix(text, "after.toml"))
    assert {c.id for c in before.cells} < {c.id for c in after.cells}
    assert len(after.cells) == 2 * len(before.cells)
    for env_id in before.environments:
        # The lock request is the same one: no committed lock goes stale for adding the axis.
        assert resolve_request(before, env_id) == resolve_request(after, env_id)
    released = next(c for c in after.cells if c.env.axes["resolution"] == "as-released")
    assert resolve_request(after, released.env_id).axes["resolution"] == "as-released"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('gpu = ["rtx"]\n', 'gpu = ["nope"]\n'), "unknown GPU kind 'nope'"),
        (lambda t: t.replace('moe_runner = ["cutlass", "flashinfer_cutlass"]\n', ""), "has no values"),
        (
            lambda t: t.replace('moe_runner = ["cutlass", "flashinfer_cutlass"]', 'moe_runner = ["a;b"]'),
            "not a flag value",
        ),
        (
            lambda t: t.replace(
                'mode = ["baseline", "piecewise"]', 'mode = ["baseline", "piecewise"]\nresolution = ["yesterday"]'
            ),
            "unknown resolution",
        ),
    ],
)
def test_bad_new_axes_are_refused_at_their_line(write_matrix, edit, message):
    with pytest.raises(InputError, match=message) as info:
        load_spec(write_matrix(edit(SWEPT)))
    assert info.value.location is not None and info.value.location.line


def test_a_swept_value_the_release_lacks_is_not_applicable_not_a_failure(write_matrix, tmp_path, fixture_surface):  # noqa: F811
    text = (
        SMALL_SGLANG.replace('sglang = ["0.5.9", "0.5.12"]', 'sglang = ["0.5.23"]')
        .replace('flashinfer = ["pinned", "0.6.12"]', 'flashinfer = ["pinned"]')
        .replace('mode = ["baseline", "piecewise"]', 'mode = ["baseline"]\nkv = ["bf16", "fp8_e5m2"]')
        + """
[flag_axes.kv]
flag = "--kv-cache-dtype"
"""
    )
    spec = load_spec(write_matrix(text))
    engine = load_engine("sglang")
    verdicts = {}
    for cell in expand(spec):
        # The fixture's flag surface is a few of the release's fields: the launch's --host/--port are not among them.
        argv = cell.command[: cell.command.index("--host")] + cell.command[cell.command.index("--port") + 2 :]
        cell = dataclasses.replace(cell, command=argv)
        got = flags_preflight(PreflightInput(cell=cell, engine=engine, pins={}, cache_dir=tmp_path))
        verdicts[cell.env.axes["kv"]] = got
    assert verdicts["fp8_e5m2"] is not None
    assert (verdicts["fp8_e5m2"].kind, verdicts["fp8_e5m2"].detail) == ("skipped", "not-applicable"), verdicts
    assert "fp8_e5m2" in verdicts["fp8_e5m2"].excerpt
    assert verdicts["bf16"] is None
