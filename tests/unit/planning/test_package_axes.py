"""Package axes: a matrix pins any package (kernels 0.14.1), not only the engine's axes, as an override
recorded as a crossed pin; `locked` leaves it to the resolver."""

from __future__ import annotations

import pytest

from servematrix.errors import InputError
from servematrix.formats.lockfile import read_lock_header
from servematrix.planning.cells import axis_packages, requirements
from servematrix.planning.plan import make_plan
from servematrix.stages.locking import resolve_request
from tests.conftest import MATRIX, SMALL_SGLANG

WITH_KERNELS = SMALL_SGLANG.replace('engine = "sglang"', 'engine = "sglang"\npackages = ["kernels"]').replace(
    'cuda = ["13.0"]', 'cuda = ["13.0"]\nkernels = ["locked", "0.14.1"]'
)


def test_a_package_axis_doubles_the_environments_and_overrides_the_resolver(write_matrix):
    plain = make_plan(write_matrix(SMALL_SGLANG, "plain.toml"))
    plan = make_plan(write_matrix(WITH_KERNELS))
    assert len(plan.cells) == 2 * len(plain.cells)
    by_kernels = {c.env.axes["kernels"]: c.env for c in plan.cells}
    _, overrides = requirements(by_kernels["0.14.1"], plan.spec.engine, plan.spec.file.packages)
    assert "kernels==0.14.1" in overrides
    _, overrides = requirements(by_kernels["locked"], plan.spec.engine, plan.spec.file.packages)
    assert not any(o.startswith("kernels") for o in overrides)
    request = resolve_request(plan, by_kernels["0.14.1"].env_id)
    assert "kernels==0.14.1" in request.overrides
    assert ("kernels", "0.14.1") in axis_packages(by_kernels["0.14.1"], plan.spec.engine, plan.spec.file.packages)


def test_matrices_without_packages_keep_their_ids(write_matrix):
    # No package axis: the same cells and ids as before the feature.
    plan = make_plan(MATRIX / "glm5-nvfp4.toml")
    assert "kernels" not in plan.cells[0].env.axes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('packages = ["kernels"]', 'packages = ["Kernels"]'), "not a package name"),
        (('packages = ["kernels"]', 'packages = ["torch"]'), "already an axis"),
        (('kernels = ["locked", "0.14.1"]', 'kernels = ["locked", "newest"]'), "not a valid version"),
        (('kernels = ["locked", "0.14.1"]\n', ""), "axis 'kernels' is missing"),
    ],
)
def test_bad_package_axes_are_input_errors(write_matrix, change, message):
    with pytest.raises(InputError, match=message):
        make_plan(write_matrix(WITH_KERNELS.replace(*change)))


def test_the_h200_smoke_locks_record_the_kernels_override():
    plan = make_plan(MATRIX / "h200-smoke.toml")
    headers = {}
    for env_id in {c.env_id for c in plan.cells}:
        header = read_lock_header(MATRIX / "locks" / f"{env_id}.lock.txt")
        assert header is not None
        headers[header.axes["kernels"]] = header
    assert headers["0.14.1"].crossed == {"kernels": {"release_pin": "unpinned", "used": "0.14.1"}}
    assert headers["locked"].crossed == {}
