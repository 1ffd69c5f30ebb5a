from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import MATRIX, REPO
from tests.integration.images import SmokeImage, build_smoke_image, ready_podman


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Environments and models shared by every integration test (and kept between local runs)."""
    path = Path(os.environ.get("SERVEMATRIX_TEST_CACHE", REPO / ".servematrix" / "test-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def smoke_project(tmp_path: Path, test_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory holding matrix/cpu-smoke.toml, with the shared model cache linked in."""
    (tmp_path / "matrix").mkdir()
    shutil.copy(MATRIX / "cpu-smoke.toml", tmp_path / "matrix" / "cpu-smoke.toml")
    models = test_cache / "models"
    models.mkdir(exist_ok=True)
    (tmp_path / ".servematrix").mkdir()
    (tmp_path / ".servematrix" / "models").symlink_to(models)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def podman() -> str:
    """podman, able to run a container (ci/services/podman.sh prepares it)."""
    return ready_podman()


@pytest.fixture(scope="session")
def smoke_image(podman: str, test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> SmokeImage:
    """The cpu-smoke transformers 5.24.0 environment's image, built from its real lock (once per session): the
    podman backend's tests run it, and the image backend's stand-ins are built on it."""
    return build_smoke_image(
        podman, test_cache / "container", tmp_path_factory.mktemp("locks"), tmp_path_factory.mktemp("build")
    )
