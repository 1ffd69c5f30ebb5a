"""Conventions of a command-line tool, checked on the real `servematrix` entry point: --version, help text for
every option, a closed pipe, and the wheel carrying the files its backends read."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from servematrix.cli import build_parser
from tests.conftest import REPO


def _servematrix(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servematrix", *args], capture_output=True, text=True, **kwargs)


def test_version():
    done = _servematrix("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("servematrix ") and done.stdout.split()[1][0].isdigit()


def _every_action(parser: argparse.ArgumentParser, name: str = "servematrix"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _every_action(subparser, f"{name} {sub}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield name, action


def test_every_option_and_argument_has_help():
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, action in _every_action(build_parser())
        if not action.help
    ]
    assert missing == []


def test_a_closed_pipe_is_not_a_traceback():
    # `servematrix plan | head -1`: the reader goes away after one line of a long output.
    with subprocess.Popen(
        [sys.executable, "-m", "servematrix", "plan", "--format", "json", str(REPO / "matrix" / "glm5-nvfp4.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.readline()
        process.stdout.close()
        stderr = process.stderr.read()
        code = process.wait(timeout=60)
    assert "Traceback" not in stderr
    assert code == 0


@pytest.mark.integration
def test_the_wheel_carries_the_backends_files_and_nothing_stray(tmp_path):
    done = subprocess.run(
        ["uv", "build", "--wheel", "--out-dir", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("servematrix-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        packaged = {
            "servematrix/_resources/containers/Dockerfile": REPO / "containers" / "Dockerfile",
            "servematrix/_resources/flake/flake.nix": REPO / "flake.nix",
            "servematrix/_resources/flake/flake.lock": REPO / "flake.lock",
            "servematrix/_resources/flake/nix/envs.json": REPO / "nix" / "envs.json",
            "servematrix/_resources/flake/nix/image.nix": REPO / "nix" / "image.nix",
        }
        for name, source in packaged.items():
            assert hashlib.sha256(archive.read(name)).digest() == hashlib.sha256(source.read_bytes()).digest(), name
    assert not [n for n in names if n.endswith((".orig", ".rej", "~"))]


def test_resources_resolve_in_this_install():
    from servematrix.backends.resources import resource

    dockerfile = resource("dockerfile")
    assert dockerfile.read_bytes() == (REPO / "containers" / "Dockerfile").read_bytes()
    assert (resource("flake") / "flake.nix").read_bytes() == (REPO / "flake.nix").read_bytes()
    assert (resource("flake") / "nix" / "envs.json").is_file()


def test_tiny_model_without_torch_here_goes_through_uv(monkeypatch):
    import importlib.util

    from servematrix import cli

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    argv = cli._tiny_model_python()
    assert Path(argv[0]).name == "uv" and argv[1:3] == ["run", "--no-project"]
    assert "--with" in argv and "torch" in argv and argv[-1] == "python"
    monkeypatch.setenv("PATH", "")
    with pytest.raises(cli.InputError, match="servematrix\\[tiny-model\\]"):
        cli._tiny_model_python()
