"""`--backend image` for real, with podman (runc): matrix/cpu-smoke.toml served end to end from images, the
refusal of a cell whose axis versions an image does not hold, and a missing image as a retried error.

This host reaches no container registry, so no engine's published image can be pulled here. The images stand in
for upstream ones: they are built locally on the cpu-smoke transformers 5.24.0 environment's image (the podman
backend's, from its real lock: the `smoke_image` fixture) and tagged as transformers.toml's `[[images]]` names a
release's image. Like an upstream image, each was installed by its own recipe rather than from the cell's lock:
the 5.24.0 stand-in pins idna 3.7 (a difference from its lock the evidence must name), and the 5.5.4 one is that
release installed by pip over the 5.24.0 environment (whatever pip resolves). The evidence is checked against
`pip list` run in the image and the cell's lock file, not against what the backend computed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from servematrix.cli import main
from servematrix.formats.lockfile import parse_pins
from servematrix.report.rows import tok_s
from servematrix.store.store import Store
from tests.integration.images import BUILT_ON_SMOKE_IMAGE, SmokeImage

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

TORCH = "2.9.1"  # cpu-smoke's torch axis
# What each stand-in adds to the smoke image, run as root in its build, as an upstream image's recipe might.
STANDINS = {
    "5.24.0": "pip install --no-cache-dir --progress-bar off --no-deps idna==3.7",
    "5.5.4": "pip install --no-cache-dir --progress-bar off 'transformers[serving]==5.5.4' requests",
}


def _tag(version: str) -> str:
    """The image transformers.toml names for a release (written out here: the data must say this)."""
    return f"localhost/transformers-serve:{version}-torch{TORCH}"


@pytest.fixture(scope="session")
def standins(smoke_image: SmokeImage, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """transformers version -> the image ID of its stand-in (podman's layer cache makes a rebuild quick)."""
    podman, ids = smoke_image.podman, {}
    for version, step in STANDINS.items():
        context = tmp_path_factory.mktemp(f"standin-{version}")
        (context / "Containerfile").write_text(
            f"FROM {smoke_image.built.image_digest}\nUSER 0\nRUN {step}\nUSER 10001:10001\n", encoding="utf-8"
        )
        done = subprocess.run(
            [podman, "build", "--file", str(context / "Containerfile"), "--tag", _tag(version), str(context)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ids[version] = "sha256:" + _podman(podman, "image", "inspect", "--format", "{{.Id}}", _tag(version)).strip()
        BUILT_ON_SMOKE_IMAGE.append(ids[version])
    return ids


def _podman(podman: str, *args: str) -> str:
    return subprocess.run([podman, *args], capture_output=True, text=True, check=True).stdout


def _pip_list(podman: str, image: str) -> dict[str, str]:
    """What the image has installed, as pip (not servematrix) lists it."""
    listed = json.loads(_podman(podman, "run", "--rm", "--network", "none", image, "python", "-m", "pip", "list",
                                "--format", "json"))  # fmt: skip
    return {canonicalize_name(d["name"]): d["version"] for d in listed}


def _run(project: Path, *args: str) -> list[dict]:
    store = project / "results.sqlite"
    assert (
        main(["run", "matrix/cpu-smoke.toml", "--backend", "image", "--store", str(store), "--no-report", *args]) == 0
    )
    with Store(store) as opened:
        return opened.all_rows()


def _differences(row: dict) -> list[str]:
    return [e.removeprefix("differs from the lock: ") for e in row["evidence"] if e.startswith("differs from the lock")]


def test_cpu_smoke_is_served_from_each_releases_image_with_its_provenance(smoke_image, standins, smoke_project):
    rows = _run(smoke_project)
    assert len(rows) == 4
    assert {r["verdict"] for r in rows} == {"pass"}, [(r["cell_id"], r["verdict"], r["excerpt"]) for r in rows]
    for row in rows:
        version = row["axes"]["transformers"]
        assert row["backend"] == "image"
        assert row["image_digest"] == standins[version]  # the container ran from the image's ID
        [summary] = [e for e in row["evidence"] if e.startswith(f"image {_tag(version)}: ")]
        assert summary.startswith(f"image {_tag(version)}: id {standins[version]}, repo digest ")
        # The installed set, checked against pip's own listing of the image.
        pip = _pip_list(smoke_image.podman, standins[version])
        assert f"installed set {row['lock_hash']} ({len(pip)} distributions" in summary
        assert f"torch {pip['torch']}, transformers {version}" in summary
        lock = parse_pins(Path(row["lock_file"]).read_text(encoding="utf-8"))
        expected = [
            f"{name}: {pip[name]} installed (lock {pinned})" if name in pip else f"{name}: missing (lock {pinned})"
            for name, pinned in sorted(lock.items())
            if pip.get(name) != pinned
        ]
        assert f"{len(expected)} difference(s) from the lock" in summary
        shown = _differences(row)
        assert shown[:20] == expected[:20] and len(shown) == min(len(expected), 20) + (len(expected) > 20)
        assert tok_s(row)[1] > 0 and tok_s(row)[16] > 0, row["metrics"]
    by_version = {r["axes"]["transformers"]: r for r in rows}
    assert _differences(by_version["5.24.0"]) == [
        f"idna: 3.7 installed (lock {_lock_pin(by_version['5.24.0'], 'idna')})"
    ]
    assert by_version["5.24.0"]["lock_hash"] != by_version["5.5.4"]["lock_hash"]
    for row in sorted(rows, key=lambda r: (r["axes"]["transformers"], r["mode"])):
        print(f"image {row['axes']['transformers']} {row['mode']}: {tok_s(row)} tok/s (CPU), "
              f"{len(_differences(row))} difference(s) from the lock shown")  # fmt: skip
    # No container outlives its cell.
    assert _podman(smoke_image.podman, "ps", "--all", "--filter", "label=org.servematrix.harness-pid", "-q") == ""


def _lock_pin(row: dict, name: str) -> str:
    return parse_pins(Path(row["lock_file"]).read_text(encoding="utf-8"))[name]


def test_an_axis_version_the_image_lacks_is_refused_before_its_cell_runs(standins, smoke_project):
    """--image names one image for every cell: 5.5.4's cells cannot be served from the 5.24.0 image under
    their label. A skip, not the stack's failure: nothing of that cell ran."""
    rows = _run(smoke_project, "--image", _tag("5.24.0"), "--select", "mode=static", "--stages", "resolve,build,serve")
    by_version = {r["axes"]["transformers"]: r for r in rows}
    refused, served = by_version["5.5.4"], by_version["5.24.0"]
    assert refused["verdict"] == "skipped:not-in-image"
    assert refused["excerpt"] == (
        f"{_tag('5.24.0')} cannot serve it: the cell asks transformers 5.5.4, the image has 5.24.0"
    )
    assert "serve" not in refused["stages"] and refused["log_path"] is None  # no server started for it
    assert refused["image_digest"] == standins["5.24.0"]  # the refusal names the image that decided it
    assert any(e.startswith(f"image {_tag('5.24.0')}: id {standins['5.24.0']}") for e in refused["evidence"])
    assert served["verdict"] == "pass", served["excerpt"]


def test_a_missing_image_is_an_error_retried_by_the_next_run(podman, smoke_project):
    """No registry serves `localhost/`, as none is reachable from this host: the pull fails, and the cell is
    `error:image-pull`, which the next run runs again (a `fail:` would stand, and be published)."""
    missing = "localhost/transformers-serve:never-built"
    args = ("--image", missing, "--select", "transformers=5.24.0,mode=static", "--stages", "resolve,build,serve")
    [row] = _run(smoke_project, *args)
    assert row["verdict"] == "error:image-pull"
    assert row["excerpt"].startswith(f"podman pull {missing} failed (exit ")
    assert row["image_digest"] is None
    rows = _run(smoke_project, *args)
    assert [r["verdict"] for r in rows] == ["error:image-pull", "error:image-pull"]  # run again, not unchanged
