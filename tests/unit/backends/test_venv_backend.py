"""The venv backend's builds when several harnesses share one workdir (H2 of the fourth attack run): builds
of one environment are serialised, a second harness finds the first one's venv, and a rebuild never removes a
venv a live server runs from. `uv` is a stand-in that behaves as uv does where it matters here: `uv venv`
refuses a folder that already holds a venv, and each step takes long enough for two builds to overlap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from servematrix.backends import BuildInput
from servematrix.backends.venv import MARKER, VenvBackend

FAKE_UV = textwrap.dedent(
    """\
    #!{python}
    import os, sys, time
    from pathlib import Path
    args = sys.argv[1:]
    if args[0] == "venv":
        folder = Path(args[-1])
        if (folder / "pyvenv.cfg").exists():
            sys.exit(f"error: Failed to create virtual environment: A virtual environment already exists at {{folder}}")
        (folder / "bin").mkdir(parents=True)
        (folder / "pyvenv.cfg").write_text("home = x\\n")
        (folder / "bin" / "python").symlink_to(sys.executable)
        time.sleep(0.5)
    elif args[:2] == ["pip", "install"]:
        python = Path(args[args.index("--python") + 1])
        time.sleep(0.5)
        if not python.parent.is_dir():
            sys.exit(f"error: {{python}} was removed while installing")
        (python.parent.parent / "installed.txt").write_text(" ".join(args[4:]))
    elif args[:2] == ["pip", "freeze"]:
        python = Path(args[args.index("--python") + 1])
        if not python.parent.is_dir():
            sys.exit("error: no virtual environment found")
        print("httpx==0.28.1")
    """
)


@pytest.fixture
def uv(tmp_path: Path) -> Path:
    path = tmp_path / "uv"
    path.write_text(FAKE_UV.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _request(*requirements: str) -> BuildInput:
    return BuildInput(env_id="e1", python=sys.executable, requirements=requirements or ("httpx==0.28.1",))


BUILD = """
import json, sys
from pathlib import Path
from servematrix.backends import BuildInput
from servematrix.backends.venv import VenvBackend
root, uv, log = map(Path, sys.argv[1:4])
built = VenvBackend(root, str(uv)).build(
    BuildInput(env_id="e1", python=sys.executable, requirements=("httpx==0.28.1",)), log)
print(json.dumps({"ok": built.ok, "cached": built.cached, "prefix": str(built.prefix), "excerpt": built.excerpt}))
"""


def test_two_harnesses_building_one_environment_at_once_both_get_it(tmp_path, uv):
    """Two processes build one environment in one workdir at once: one builds, the other waits for it and
    finds it built; neither is a `fail:build`."""
    root = tmp_path / "envs"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(root), str(uv), str(tmp_path / f"build{i}.log")],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(r["ok"] for r in results), results
    assert sorted(r["cached"] for r in results) == [False, True, True]
    assert {r["prefix"] for r in results} == {str(root / "e1")}
    assert (root / "e1" / MARKER).is_file() and not (root / "e1.building").exists()


def test_a_rebuild_never_removes_a_venv_a_live_server_runs_from(tmp_path, uv):
    root = tmp_path / "envs"
    backend = VenvBackend(root, str(uv))
    first = backend.build(_request("httpx==0.28.1"), tmp_path / "b1.log")
    assert first.ok and first.prefix == root / "e1"
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "VIRTUAL_ENV": str(first.prefix)}
    )
    try:
        time.sleep(0.2)
        second = backend.build(_request("httpx==0.28.0"), tmp_path / "b2.log")
        assert second.ok and not second.cached
        assert second.prefix is not None and second.prefix != first.prefix
        # The live server's venv is as it was.
        assert (
            json.loads((root / "e1" / MARKER).read_text())["input_hash"]
            != json.loads((second.prefix / MARKER).read_text())["input_hash"]
        )
        assert (root / "e1" / "installed.txt").read_text() == "httpx==0.28.1"
        # Asked again, the second inputs' venv is found where it was built.
        assert backend.build(_request("httpx==0.28.0"), tmp_path / "b3.log").prefix == second.prefix
    finally:
        server.kill()
        server.wait()
    # Nothing runs from either any more: a third build removes both, and builds in the usual place.
    third = backend.build(_request("httpx==0.27.0"), tmp_path / "b4.log")
    assert third.ok and third.prefix == root / "e1"
    assert sorted(p.name for p in root.iterdir()) == ["e1", "e1.lock"]
