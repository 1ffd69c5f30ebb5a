"""flake.nix with the real Nix, offline: parse it, evaluate every output against nix/stub-nixpkgs, build its
input-less part for real, and load a Nix-built image into podman through the nix backend.

nixpkgs itself cannot be fetched here (no GitHub, no binary cache), so the image derivations are evaluated,
never built: the stub has nixpkgs' attribute names and argument names and refuses to build. Each test works
on a copy of the flake in its own git repository (nix sees only files git knows), never on the main index.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from servematrix.backends import BuildInput
from servematrix.backends.container import ContainerBackend
from servematrix.backends.nix import IMAGE_REPOSITORY, NixBackend
from servematrix.formats.lockfile import parse_lock
from servematrix.scaleout.nixexport import locked_environments, render
from tests.conftest import MATRIX, REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nix") is None, reason="nix is not installed (CI sources ci/services/nix.sh)"),
]

SYSTEM = "x86_64-linux"
# A reserved name (RFC 2606): the wheels are only evaluated here, never fetched.
BASES = json.dumps({"default": "https://wheels.invalid/"})
NIX_CONFIG = "experimental-features = nix-command flakes\nsubstituters ="


def nix_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SERVEMATRIX_WHEEL_BASES"}
    env["NIX_CONFIG"] = NIX_CONFIG
    return {**env, **extra}


def run(argv: list[str], cwd: Path, *, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300):
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, env=env or nix_env(), timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> exit {done.returncode}\n{done.stderr[-4000:]}")
    return done


def git_repo(path: Path) -> Path:
    run(["git", "init", "-q", str(path)], cwd=path)
    run(["git", "add", "-A"], cwd=path)
    return path


@pytest.fixture
def flake_copy(tmp_path: Path) -> Path:
    """flake.nix, flake.lock and nix/ in a fresh git repository, all files added."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(REPO / "flake.nix", repo)
    shutil.copy(REPO / "flake.lock", repo)
    shutil.copytree(REPO / "nix", repo / "nix")
    return git_repo(repo)


def stub_args(repo: Path) -> list[str]:
    return ["--no-write-lock-file", "--override-input", "nixpkgs", f"path:{repo / 'nix' / 'stub-nixpkgs'}"]


def nix_eval_json(repo: Path, attr: str, apply: str | None = None, *, impure: bool = True):
    argv = ["nix", "eval", "--json", *stub_args(repo)]
    if impure:
        argv.append("--impure")
    argv.append(f".#{attr}")
    if apply:
        argv += ["--apply", apply]
    return json.loads(run(argv, cwd=repo, env=nix_env(SERVEMATRIX_WHEEL_BASES=BASES)).stdout)


def test_every_nix_file_parses():
    files = [REPO / "flake.nix", *sorted((REPO / "nix").rglob("*.nix"))]
    assert len(files) > 5
    for path in files:
        run(["nix-instantiate", "--parse", str(path)], cwd=REPO)


def test_flake_check_against_the_stub_evaluates_every_output(flake_copy):
    done = run(
        ["nix", "flake", "check", "--no-build", "--impure", *stub_args(flake_copy)],
        cwd=flake_copy,
        env=nix_env(SERVEMATRIX_WHEEL_BASES=BASES),
    )
    assert "error" not in done.stderr.lower()


def test_exactly_one_image_per_locked_environment_of_the_product_matrix(flake_copy):
    """Must show (issue 10): evaluated against the stub, the flake gives exactly one image output per
    environment in matrix/glm5-nvfp4.toml's locks, named image-<env_id>, tagged with the env id."""
    locked, _ = locked_environments([MATRIX / "glm5-nvfp4.toml"], root=REPO)
    # The committed export covers every matrix; keep the product matrix's environments only. An environment
    # whose lock pins a package the index has as an sdist only is listed as not exported (no image).
    envs_json = flake_copy / "nix" / "envs.json"
    document = json.loads(envs_json.read_text())
    expected = {e.env_id for e in locked} - set(document.get("not_exported", {}))
    assert len(expected) >= 10
    document["environments"] = {
        k: v for k, v in document["environments"].items() if "matrix/glm5-nvfp4.toml" in v["matrices"]
    }
    envs_json.write_text(render(document))
    run(["git", "add", "-A"], cwd=flake_copy)

    images = nix_eval_json(
        flake_copy,
        f"packages.{SYSTEM}",
        "ps: builtins.listToAttrs (map (n: { name = n; value = { inherit (ps.${n}) imageName imageTag; "
        "config = (builtins.fromJSON (builtins.unsafeDiscardStringContext ps.${n}.conf)).config; drv = ps.${n}.drvPath; }; }) "
        '(builtins.filter (n: builtins.substring 0 6 n == "image-") (builtins.attrNames ps)))',
    )
    assert set(images) == {f"image-{env_id}" for env_id in expected}
    by_env = {e.env_id: e for e in locked}
    for name, image in images.items():
        env_id = name.removeprefix("image-")
        assert image["imageName"] == IMAGE_REPOSITORY and image["imageTag"] == env_id
        labels = image["config"]["Labels"]
        assert labels["org.servematrix.env-id"] == env_id
        assert labels["org.servematrix.lock-hash"] == by_env[env_id].inputs_hash
        assert labels["org.servematrix.axes"] == ",".join(f"{k}={v}" for k, v in sorted(by_env[env_id].axes.items()))
        env = dict(item.split("=", 1) for item in image["config"]["Env"])
        assert env["PATH"].startswith("/opt/servematrix/env/bin:")
        assert "CUDA_HOME" in env  # every product environment has a CUDA axis: nvcc for JIT kernels
        assert image["config"]["User"] == "10001:10001"
    assert len({image["drv"] for image in images.values()}) == len(images)


def test_each_image_installs_exactly_the_locked_wheels(flake_copy):
    env_id = sorted(json.loads((REPO / "nix" / "envs.json").read_text())["environments"])[0]
    python_drv = nix_eval_json(flake_copy, f"packages.{SYSTEM}.python-{env_id}.drvPath")
    shown = json.loads(run(["nix", "show-derivation", "--recursive", python_drv], cwd=flake_copy).stdout)
    direct = set(shown[python_drv]["inputDrvs"])
    fetches = {
        drv["env"]["outputHash"]: drv["env"]["url"]
        for path, drv in shown.items()
        if path in direct and "outputHash" in drv["env"]  # the fixed-output downloads
    }
    document = json.loads((REPO / "nix" / "envs.json").read_text())
    entry = document["environments"][env_id]
    lock = parse_lock((REPO / entry["lock"]).read_text())
    assert set(fetches) == set(entry["wheels"])
    for sha, url in fetches.items():
        wheel = document["wheels"][sha]
        assert url == f"https://wheels.invalid/{wheel['path']}"
        assert sha in lock[wheel["name"]].hashes
    assert {document["wheels"][sha]["name"] for sha in fetches} == set(lock)


def test_outputs_function_evaluates_with_a_plain_stub_path():
    """The other offline route: call the flake's outputs function directly, no flake machinery."""
    expr = textwrap.dedent(
        f"""\
        let
          flake = import {REPO}/flake.nix;
          out = flake.outputs {{ self = {{ }}; nixpkgs = {REPO}/nix/stub-nixpkgs; }};
        in {{
          app = out.apps.{SYSTEM}.matrix.type;
          program = out.apps.{SYSTEM}.default.program;
          shell = out.devShells.{SYSTEM}.default.type;
          checks = builtins.length (builtins.attrNames out.checks.{SYSTEM});
          images = builtins.length (builtins.filter (n: builtins.substring 0 6 n == "image-")
            (builtins.attrNames out.packages.{SYSTEM}));
          inputs = builtins.attrNames flake.inputs;
        }}
        """
    )
    got = json.loads(run(["nix", "eval", "--json", "--impure", "--expr", expr], cwd=REPO).stdout)
    environments = json.loads((REPO / "nix" / "envs.json").read_text())["environments"]
    assert got["app"] == "app" and got["program"].endswith("/bin/servematrix-matrix")
    assert got["shell"] == "derivation"
    assert got["checks"] == got["images"] == len(environments)
    assert got["inputs"] == ["nixpkgs"]


def test_a_missing_wheel_base_is_explained(flake_copy):
    env_id = sorted(json.loads((REPO / "nix" / "envs.json").read_text())["environments"])[0]
    done = run(
        ["nix", "eval", "--raw", *stub_args(flake_copy), f".#packages.{SYSTEM}.image-{env_id}.drvPath"],
        cwd=flake_copy,
        check=False,
    )
    assert done.returncode != 0
    assert "wheel base 'default' has no URL" in done.stderr


def test_flake_lock_pins_nixpkgs_by_revision_and_hash():
    lock = json.loads((REPO / "flake.lock").read_text())
    node = lock["nodes"][lock["nodes"]["root"]["inputs"]["nixpkgs"]]
    assert len(node["locked"]["rev"]) == 40 and node["locked"]["narHash"].startswith("sha256-")
    assert node["original"]["ref"] in (REPO / "flake.nix").read_text()


def test_the_input_less_manifests_build_for_real(flake_copy):
    """Builds with /bin/sh only: no nixpkgs, no network. Each manifest is the lock's content, as Nix sees it."""
    document = json.loads((REPO / "nix" / "envs.json").read_text())
    env_ids = sorted(document["environments"])[:3]
    done = run(
        ["nix", "build", "--no-link", "--json", *stub_args(flake_copy)] + [f".#manifest-{e}" for e in env_ids],
        cwd=flake_copy,
    )
    outputs = [item["outputs"]["out"] for item in json.loads(done.stdout)]
    assert len(outputs) == len(env_ids)
    for out in outputs:
        manifest = json.loads(Path(out).read_text())
        entry = document["environments"][manifest["env_id"]]
        lock = parse_lock((REPO / entry["lock"]).read_text())
        assert {w["name"]: w["version"] for w in manifest["wheels"]} == {
            k: locked.version for k, locked in lock.items()
        }
        assert manifest["lock_sha256"] == hashlib.sha256((REPO / entry["lock"]).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- nix backend, real podman


def podman_usable() -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "info"], capture_output=True, check=False, timeout=60).returncode == 0


def docker_archive(reference: str, labels: dict[str, str]) -> bytes:
    """A minimal docker-archive (what streamLayeredImage streams): one layer holding one file."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = b"built by nix\n"
        info = tarfile.TarInfo("servematrix.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": labels, "Env": ["PATH=/opt/servematrix/env/bin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_bytes).hexdigest()}"]},
        }
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": ["layer.tar"]}]).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in (("layer.tar", layer_bytes), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the fixture flake is for x86_64-linux")
def test_nix_backend_builds_with_nix_and_loads_into_podman(tmp_path):
    if not podman_usable():
        pytest.skip("podman is not usable here (CI sources ci/services/podman.sh)")
    env_id = "feed00c0ffee"
    reference = f"{IMAGE_REPOSITORY}:{env_id}"
    lock = tmp_path / f"{env_id}.lock.txt"
    lock.write_text("six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    flake = tmp_path / "flake"
    (flake / "nix").mkdir(parents=True)
    (flake / "image.tar").write_bytes(docker_archive(reference, {"org.servematrix.env-id": env_id}))
    # The stream script the backend runs, like streamLayeredImage's: an executable that writes the archive.
    # (/bin/chmod: this fixture's builder has no coreutils; the machines it runs on build unsandboxed.)
    (flake / "flake.nix").write_text(
        textwrap.dedent(
            f"""\
            {{
              outputs = {{ self }}: {{
                packages.{SYSTEM}."image-{env_id}" = builtins.derivation {{
                  name = "stream-{env_id}";
                  system = "{SYSTEM}";
                  builder = "/bin/sh";
                  archive = ./image.tar;
                  args = [ "-c" "printf '#!/bin/sh\\\\nexec cat %s\\\\n' \\"$archive\\" > \\"$out\\" && /bin/chmod +x \\"$out\\"" ];
                }};
              }};
            }}
            """
        )
    )
    envs = {
        "format": 1,
        "environments": {env_id: {"lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(), "inputs_hash": ""}},
    }
    (flake / "nix" / "envs.json").write_text(json.dumps(envs))
    git_repo(flake)

    subprocess.run(["podman", "rmi", "--force", reference], capture_output=True, check=False)
    backend = NixBackend(
        "podman",
        tmp_path / "state",
        flake=flake,
        runner=ContainerBackend("podman", tmp_path / "images"),
    )
    request = BuildInput(env_id=env_id, python="3.12", requirements=(), lockfile=lock, lock_hash="1" * 64)
    old = os.environ.get("NIX_CONFIG")
    os.environ["NIX_CONFIG"] = NIX_CONFIG
    try:
        built = backend.build(request, tmp_path / "build.log")
        assert built.ok, built.excerpt
        again = backend.build(request, tmp_path / "build.log")
    finally:
        if old is None:
            os.environ.pop("NIX_CONFIG", None)
        else:
            os.environ["NIX_CONFIG"] = old
    try:
        inspected = json.loads(run(["podman", "image", "inspect", reference], cwd=tmp_path).stdout)[0]
        assert built.image_digest.removeprefix("sha256:") == inspected["Id"].removeprefix("sha256:")
        assert inspected["Config"]["Labels"]["org.servematrix.env-id"] == env_id
        assert built.installed == {"six": "1.17.0"}
        assert again.cached and again.image_digest == built.image_digest
    finally:
        subprocess.run(["podman", "rmi", "--force", reference], capture_output=True, check=False)
