from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import MATRIX, REPO
from tests.integration.images import BUILT_ON_SMOKE_IMAGE, SmokeImage, build_smoke_image, ready_podman


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
    podman backend's tests run it, and the image backend's stand-ins are built on it. It is removed after the
    last test that uses it (`pytest_runtest_teardown`), not at the session's end."""
    image = build_smoke_image(
        podman, test_cache / "container", tmp_path_factory.mktemp("locks"), tmp_path_factory.mktemp("build")
    )
    _SMOKE_IMAGES.append(image)
    return image


# The smoke image holds 7 GB of torch's CUDA wheels. Kept to the session's end, it would take that much disk
# from every test that runs after the last one using it (their environments fill uv's cache), and machines of
# CI's kind have had 14 GB free. So the images built on it (`BUILT_ON_SMOKE_IMAGE`) and it go after that test;
# SERVEMATRIX_KEEP_TEST_IMAGES=1 keeps them for the next local run.
_SMOKE_IMAGES: list[SmokeImage] = []
KEEP_IMAGES_ENV = "SERVEMATRIX_KEEP_TEST_IMAGES"


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if not _SMOKE_IMAGES or any("smoke_image" in later.fixturenames for later in _later_items(item)):
        return
    image = _SMOKE_IMAGES.pop()
    if os.environ.get(KEEP_IMAGES_ENV) == "1":
        return
    built = [*BUILT_ON_SMOKE_IMAGE, image.built.image_digest or ""]
    BUILT_ON_SMOKE_IMAGE.clear()
    subprocess.run([image.podman, "rmi", "--force", *built], capture_output=True, check=False)
    subprocess.run([image.podman, "image", "prune", "--force"], capture_output=True, check=False)


def _later_items(item: pytest.Item) -> list[pytest.Item]:
    items = item.session.items
    return items[items.index(item) + 1 :]
