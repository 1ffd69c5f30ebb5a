"""`--backend image` without a container engine: the image each release and CUDA version derives from the engine
data, the data's checks, the refusal of an axis version an image does not hold, the lock-vs-image differences as
evidence, and what such verdicts may replace. The real pulls and runs: tests/integration/test_image_backend.py."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from servematrix.backends.image import ImageBackend, NoImage, describe, image_reference, served_from
from servematrix.backends.inventory import Installed, lock_differences, not_held
from servematrix.backends.registry import select_backend
from servematrix.cli import main
from servematrix.engines import _load, load_engine
from servematrix.errors import InputError
from servematrix.formats.verdict import unavailable
from servematrix.planning.plan import make_plan
from tests.conftest import MATRIX

SGLANG = load_engine("sglang")
ID = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("version", "cuda", "reference"),
    [
        # 0.5.7-0.5.10: CUDA 12.9 is the plain tag, CUDA 13 has its suffix
        ("0.5.7", "12.9", "docker.io/lmsysorg/sglang:v0.5.7"),
        ("0.5.10", "13.0", "docker.io/lmsysorg/sglang:v0.5.10-cu130"),
        # 0.5.11-0.5.19: CUDA 13 the default, both suffixed
        ("0.5.11", "12.9", "docker.io/lmsysorg/sglang:v0.5.11-cu129"),
        ("0.5.12", "13.0", "docker.io/lmsysorg/sglang:v0.5.12-cu130"),
        ("0.5.19", "12.9", "docker.io/lmsysorg/sglang:v0.5.19-cu129"),
        # 0.5.20 on: CUDA 13 only
        ("0.5.23", "13.0", "docker.io/lmsysorg/sglang:v0.5.23-cu130"),
    ],
)
def test_sglang_image_per_release_and_cuda(version, cuda, reference):
    assert image_reference(SGLANG, {"sglang": version, "torch": "pinned", "cuda": cuda, "gpu": "h200"}) == reference


@pytest.mark.parametrize(
    ("version", "cuda", "why"),
    [
        ("0.5.23", "12.9", r"sglang 0\.5\.23 is published for CUDA 13\.0, not for CUDA 12\.9"),
        ("0.5.12", "12.8", r"published for CUDA 12\.9, 13\.0, not for CUDA 12\.8"),
        ("0.5.6", "12.9", r"sglang's data names no published image of 0\.5\.6 \(pass --image REF"),
        ("0.5.12", None, r"not for an environment without a cuda axis"),
    ],
)
def test_a_release_or_cuda_without_a_published_image_says_why(version, cuda, why):
    axes = {"sglang": version, **({"cuda": cuda} if cuda else {})}
    with pytest.raises(NoImage, match=why):
        image_reference(SGLANG, axes)


def test_the_cpu_engine_names_its_local_images_by_release_and_torch():
    engine = load_engine("transformers")
    axes = {"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"}
    assert image_reference(engine, axes) == "localhost/transformers-serve:5.24.0-torch2.9.1"


def _engine_file(tmp_path: Path, image_rows: str) -> Path:
    """transformers.toml with other [[images]] rows."""
    text = (Path(__file__).parents[3] / "src/servematrix/data/engines/transformers.toml").read_text()
    start = text.index("[[images]]")
    end = text.index("[[mode_flags]]")
    path = tmp_path / "transformers.toml"
    path.write_text(text[:start] + image_rows + "\n" + text[end:])
    return path


def test_an_image_reference_naming_no_axis_is_bad_input_at_its_line(tmp_path):
    path = _engine_file(tmp_path, '[[images]]\nversions = ">=5"\nreference = "x/y:{version}-{cuda}"\nsource = "s"\n')
    with pytest.raises(InputError) as raised:
        _load(path)
    line = path.read_text().splitlines().index('reference = "x/y:{version}-{cuda}"') + 1
    assert f"{path}:{line}" in str(raised.value) and "names ['cuda']" in str(raised.value)


def test_an_image_row_names_cuda_references_or_one_reference(tmp_path):
    rows = '[[images]]\nversions = ">=5"\nreference = "x/y:{version}"\nsource = "s"\n[images.cuda]\n"13.0" = "x/y"\n'
    with pytest.raises(InputError, match="either `cuda`"):
        _load(_engine_file(tmp_path, rows))


def _installed(**versions: str) -> Installed:
    return Installed(python="3.12.3", versions=versions, hashes={name: "0" * 64 for name in versions})


INSPECTED = {"Id": "ab" * 32, "RepoDigests": ["docker.io/lmsysorg/sglang@sha256:" + "cd" * 32]}
REFERENCE = "docker.io/lmsysorg/sglang:v0.5.12-cu130"


def test_an_axis_version_the_image_does_not_hold_is_refused_not_failed():
    image = _installed(sglang="0.5.12", torch="2.11.0+cu130", **{"flashinfer-python": "0.6.11.post1"})
    wanted = [("flashinfer-python", "0.6.11.post1"), ("sglang", "0.5.12"), ("torch", "2.9.1")]
    built = served_from("e1", reference=REFERENCE, inspected=INSPECTED, installed=image, wanted=wanted, differences=[])
    assert not built.ok and built.unavailable == "skipped:not-in-image"
    assert built.excerpt == f"{REFERENCE} cannot serve it: the cell asks torch 2.9.1, the image has 2.11.0+cu130"
    assert built.image_digest == ID and built.lock_hash == image.digest  # the refusal names what decided it
    result = unavailable(built.unavailable, built.excerpt, built.notes)
    assert (result.kind, result.detail, result.final) == ("skipped", "not-in-image", True)
    assert result.evidence == built.notes
    # The same release under its local version (+cu130) is held; a package the image lacks is not.
    wanted[2] = ("torch", "2.11.0")
    assert served_from(
        "e1", reference=REFERENCE, inspected=INSPECTED, installed=image, wanted=wanted, differences=[]
    ).ok
    assert not_held([("kernels", "0.14.1")], image.versions) == [("kernels", "0.14.1", None)]


def test_differences_from_the_lock_are_evidence_beside_the_provenance():
    image = _installed(sglang="0.5.12", torch="2.11.0+cu130", kernels="0.17.2")
    lock = {"sglang": "0.5.12", "torch": "2.11.0", "kernels": "0.14.1", "ipython": "9.18.1"}
    differences = lock_differences(lock, image.versions)
    wanted = [("sglang", "0.5.12"), ("torch", "2.11.0")]
    built = served_from(
        "e1", reference=REFERENCE, inspected=INSPECTED, installed=image, wanted=wanted, differences=differences
    )
    assert built.ok and built.installed == image.versions
    assert built.notes == (
        f"image {REFERENCE}: id {ID}, repo digest docker.io/lmsysorg/sglang@sha256:{'cd' * 32}; installed set "
        f"{image.digest} (3 distributions, Python 3.12.3; sglang 0.5.12, torch 2.11.0+cu130), "
        "2 difference(s) from the lock",
        "differs from the lock: ipython: missing (lock 9.18.1)",
        "differs from the lock: kernels: 0.17.2 installed (lock 0.14.1)",
    )
    without_lock = served_from(
        "e1", reference=REFERENCE, inspected=INSPECTED, installed=image, wanted=(), differences=None
    )
    assert without_lock.notes[0].endswith("no lock to compare")


def test_the_repo_digest_of_the_images_own_repository_is_named():
    inspected = {
        "Id": "ab" * 32,
        "RepoDigests": ["mirror.invalid/x@sha256:" + "00" * 32, f"localhost/t@sha256:{'11' * 32}"],
    }
    assert (
        describe(inspected, "localhost/t:5.24.0-torch2.9.1") == f"id {ID}, repo digest localhost/t@sha256:{'11' * 32}"
    )
    assert describe({"Id": ID}, "localhost/t:1") == f"id {ID}, no repo digest"  # docker's local builds


def test_an_image_verdict_never_replaces_nor_regresses_what_serving_observed():
    from servematrix.records.row import Row
    from servematrix.report.publish import merge_published
    from servematrix.report.regressions import detect_regressions

    observed = {"cell_id": "c", "run_id": "venv", "env_id": "e", "mode": "baseline", "matrix": "m.toml",
                "axes": {"gpu": "h200"}, "verdict": "pass", "finished_at": "2026-12-01T00:00:00+00:00"}  # fmt: skip
    for text in ("skipped:not-in-image", "skipped:no-image"):
        refused = {**observed, "run_id": "image", "verdict": text, "finished_at": "2026-12-03T00:00:00+00:00"}
        merged = merge_published({"cells": {"c": observed}}, [Row.of(refused)])
        assert merged.kept_observed == 1 and merged.rows[0].verdict == "pass"
        assert detect_regressions([Row.of(refused)], {"cells": {"c": observed}}) == []


def test_only_errors_and_skips_say_an_environment_was_unavailable():
    assert unavailable("error:image-pull", "podman pull x failed").final is False  # retried
    with pytest.raises(ValueError, match="not 'fail:build'"):
        unavailable("fail:build", "")


def test_backend_image_takes_the_first_container_engine_that_answers(tmp_path):
    plan = make_plan(MATRIX / "h200-smoke.toml")
    backend = select_backend(
        "image", workdir=tmp_path, plan=plan, probe=lambda tool: None if tool == "docker" else "no"
    )
    assert isinstance(backend, ImageBackend) and backend.name == "image" and backend.tool == "docker"
    env = plan.cells[0].env
    assert backend.reference(env.env_id) == f"docker.io/lmsysorg/sglang:v{env.axes['sglang']}-cu130"
    assert dict(backend.wanted[env.env_id])["sglang"] == env.axes["sglang"]
    assert backend.gpu_options(env.env_id) == ["--gpus", "all"]  # the GPU kind's container options (docker)
    chosen = select_backend("image", workdir=tmp_path, plan=plan, probe=lambda tool: None, image="localhost/mine:1")
    assert isinstance(chosen, ImageBackend) and chosen.reference(env.env_id) == "localhost/mine:1"
    with pytest.raises(InputError, match="--backend image needs podman or docker: podman gone; docker gone"):
        select_backend("image", workdir=tmp_path, plan=plan, probe=lambda tool: f"{tool} gone")


def test_image_without_backend_image_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(MATRIX, tmp_path / "matrix")
    assert main(["run", "matrix/cpu-smoke.toml", "--image", "x/y:1", "--backend", "venv"]) == 2
    assert "--image is for --backend image" in capsys.readouterr().err
    assert main(["run", "matrix/cpu-smoke.toml", "--python", sys.executable]) == 2
    assert "--python is for --backend existing" in capsys.readouterr().err
    assert not (tmp_path / ".servematrix" / "results.sqlite").exists()
