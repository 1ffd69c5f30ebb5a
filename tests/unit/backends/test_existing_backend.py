"""The existing-environment backend's pure parts: lock differences and the refusal of mislabelled cells,
against this very interpreter's installed set."""

from __future__ import annotations

import sys

import pytest

from servematrix.backends.existing import ExistingBackend, lock_differences
from servematrix.errors import InputError


def test_differences_from_the_lock_name_each_package():
    lock = {"kernels": "0.17.2", "torch": "2.11.0", "ipython": "9.18.1", "same": "1.0"}
    installed = {"kernels": "0.14.1", "torch": "2.11.0+cu130", "same": "1.0"}
    assert lock_differences(lock, installed) == [
        "ipython: missing (lock 9.18.1)",
        "kernels: 0.14.1 installed (lock 0.17.2)",
    ]


def test_this_interpreters_installed_set():
    backend = ExistingBackend(sys.executable)
    installed = backend.installed
    assert installed.versions["pydantic"]  # a dependency of servematrix itself
    assert len(installed.digest) == 16
    import pydantic

    backend.refuse_mislabelled([("env a", "pydantic", pydantic.VERSION)])
    with pytest.raises(InputError, match=r"env a wants pydantic 0\.0\.1, but .* has pydantic .*refusing"):
        backend.refuse_mislabelled([("env a", "pydantic", "0.0.1")])
    with pytest.raises(InputError, match="has no sglang"):
        backend.refuse_mislabelled([("env b", "sglang", "0.5.12")])


def test_an_interpreter_that_does_not_run_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="cannot run it"):
        _ = ExistingBackend(str(tmp_path / "no-python")).installed


def test_launch_swaps_in_the_interpreter():
    backend = ExistingBackend("/opt/env/bin/python")
    from servematrix.backends import Built

    spec = backend.launch(
        Built(ok=True, env_id="e"),
        ("python", "-m", "sglang.launch_server", "--port", "1"),
        {"A": "1"},
        1,
        model_dir=None,
    )
    assert spec.argv == ("/opt/env/bin/python", "-m", "sglang.launch_server", "--port", "1")
    assert spec.env["A"] == "1" and spec.owns_listener
