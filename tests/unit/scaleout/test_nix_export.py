"""The Nix path's Python side, offline: the export of locked environments (servematrix.scaleout.nixexport) and the nix
backend's build step with fake `nix` and `podman` executables. The flake itself is evaluated for real in
tests/integration/test_flake_eval.py."""

from __future__ import annotations

import hashlib
import json
import stat
import textwrap
from pathlib import Path

import pytest

from servematrix.backends import BuildInput
from servematrix.backends.container import ContainerBackend
from servematrix.backends.nix import IMAGE_REPOSITORY, WHEEL_BASES_ENV, NixBackend, nix_backend
from servematrix.errors import InputError
from servematrix.formats.lockfile import LockedPackage, parse_lock
from servematrix.scaleout import nixexport as nx
from tests.conftest import MATRIX, REPO

GLM5 = MATRIX / "glm5-nvfp4.toml"
LOCKS = MATRIX / "locks"
FILES = "https://files.example"  # an example origin: tests never reach a network

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64


def wheel(name: str, sha: str, origin: str = FILES) -> dict:
    return {"url": f"{origin}/packages/xx/{name}", "hashes": {"sha256": sha}}


# ------------------------------------------------------------------------------------------- the target


def test_nix_system_maps_manylinux_platforms():
    assert nx.nix_system("x86_64-manylinux_2_34") == "x86_64-linux"
    assert nx.nix_system("aarch64-manylinux_2_28") == "aarch64-linux"
    with pytest.raises(nx.ExportError, match="manylinux"):
        nx.nix_system("x86_64-unknown-linux-gnu")


# --------------------------------------------------------------------------------------------- the lock


# ------------------------------------------------------------------------------------------- the wheels


def pins(**entries: tuple[str, set[str]]) -> dict[str, LockedPackage]:
    return {
        name.replace("_", "-"): LockedPackage(version=version, hashes=frozenset(hashes))
        for name, (version, hashes) in entries.items()
    }


def test_select_wheels_takes_the_best_compatible_wheel_whose_hash_is_locked():
    pylock = {
        "packages": [
            {
                "name": "cryptography",
                "version": "50.0.2",
                "wheels": [
                    wheel("cryptography-50.0.2-cp39-abi3-manylinux_2_34_x86_64.whl", SHA_A),
                    wheel("cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl", SHA_B),
                    wheel("cryptography-50.0.2-cp311-abi3-manylinux_2_28_x86_64.whl", SHA_C),
                ],
            },
            {"name": "six", "version": "1.17.0", "wheels": [wheel("six-1.17.0-py2.py3-none-any.whl", SHA_C)]},
        ]
    }
    chosen = nx.select_wheels(
        pylock,
        pins(cryptography=("50.0.2", {SHA_A, SHA_B, SHA_C}), six=("1.17.0", {SHA_C})),
        python_version="3.12",
        platform="x86_64-manylinux_2_34",
    )
    assert [(w.name, w.filename, w.sha256) for w in chosen] == [
        ("cryptography", "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl", SHA_B),
        ("six", "six-1.17.0-py2.py3-none-any.whl", SHA_C),
    ]


def test_select_wheels_refuses_a_file_the_lock_does_not_list():
    pylock = {
        "packages": [{"name": "six", "version": "1.17.0", "wheels": [wheel("six-1.17.0-py3-none-any.whl", SHA_A)]}]
    }
    with pytest.raises(nx.ExportError, match="which the lock does not list"):
        nx.select_wheels(pylock, pins(six=("1.17.0", {SHA_B})), python_version="3.12", platform="x86_64-manylinux_2_34")


@pytest.mark.parametrize(
    ("package", "message"),
    [
        ({"name": "six", "version": "1.16.0", "wheels": []}, "the lock pins 1.17.0"),
        ({"name": "six", "version": "1.17.0", "sdist": {"url": "x"}}, "an sdist only"),
        (
            {
                "name": "six",
                "version": "1.17.0",
                "wheels": [wheel("six-1.17.0-cp313-cp313-manylinux_2_34_x86_64.whl", SHA_A)],
            },
            "no compatible wheel",
        ),
        ({"name": "other", "version": "1.0", "wheels": []}, "not in the lock"),
    ],
)
def test_select_wheels_names_what_cannot_be_installed(package, message):
    with pytest.raises(nx.ExportError, match=message):
        nx.select_wheels(
            {"packages": [package]},
            pins(six=("1.17.0", {SHA_A})),
            python_version="3.12",
            platform="x86_64-manylinux_2_34",
        )


def test_select_wheels_reports_locked_packages_uv_did_not_list():
    with pytest.raises(nx.ExportError, match=r"six==1.17.0: locked, but uv listed no files"):
        nx.select_wheels(
            {"packages": []}, pins(six=("1.17.0", {SHA_A})), python_version="3.12", platform="x86_64-manylinux_2_34"
        )


def test_select_wheels_skips_packages_whose_marker_excludes_the_target():
    pylock = {
        "packages": [
            {"name": "pywin32", "version": "311", "marker": "sys_platform == 'win32'", "wheels": []},
            {"name": "six", "version": "1.17.0", "wheels": [wheel("six-1.17.0-py3-none-any.whl", SHA_A)]},
        ]
    }
    chosen = nx.select_wheels(
        pylock, pins(six=("1.17.0", {SHA_A})), python_version="3.12", platform="x86_64-manylinux_2_34"
    )
    assert [w.name for w in chosen] == ["six"]


def test_assign_bases_names_the_single_origin_default_and_keeps_only_the_path():
    urls = [f"{FILES}/packages/aa/x.whl", f"{FILES}/packages/bb/y.whl"]
    assert nx.assign_bases(urls, {}) == {
        urls[0]: ("default", "packages/aa/x.whl"),
        urls[1]: ("default", "packages/bb/y.whl"),
    }


def test_assign_bases_needs_names_for_several_origins():
    urls = [f"{FILES}/packages/x.whl", "https://other.example/whl/cu128/torch.whl"]
    with pytest.raises(nx.ExportError, match="--wheel-base"):
        nx.assign_bases(urls, {})
    placed = nx.assign_bases(urls, {"cu128": "https://other.example/whl/cu128/"})
    assert placed[urls[1]] == ("cu128", "torch.whl")
    assert placed[urls[0]] == ("default", "packages/x.whl")
    with pytest.raises(nx.ExportError, match="must match"):
        nx.assign_bases(urls, {"Bad Name": FILES})


# ------------------------------------------------------------------------------------- whole exports


def fake_query(env, *, uv, timeout_s):
    """uv's answer as it would be: every locked package with one py3 wheel whose hash the lock lists."""
    packages = []
    for name, locked in parse_lock(env.lockfile.read_text()).items():
        sha, version = min(locked.hashes), locked.version
        packages.append(
            {
                "name": name,
                "version": version,
                "wheels": [wheel(f"{name.replace('-', '_')}-{version}-py3-none-any.whl", sha)],
            }
        )
    return {"lock-version": "1.0", "packages": packages}


def test_export_of_the_product_matrix_is_host_free_and_checks_clean():
    result = nx.export([GLM5], root=REPO, query=fake_query)
    document = result.document
    locked, skipped = nx.locked_environments([GLM5], root=REPO)
    assert sorted(document["environments"]) == [e.env_id for e in locked]
    assert set(skipped).isdisjoint(document["environments"])
    text = result.text
    assert "://" not in text and str(REPO) not in text
    assert text == nx.render(json.loads(text))  # deterministic form
    entry = document["environments"][locked[0].env_id]
    assert entry["system"] == "x86_64-linux"
    assert entry["lock"].startswith("matrix/locks/")
    assert document["wheel_bases"] == ["default"]
    assert nx.check(json.loads(text), [GLM5], root=REPO) == []


def test_check_finds_a_stale_export():
    document = json.loads(nx.export([GLM5], root=REPO, query=fake_query).text)
    env_id = sorted(document["environments"])[0]
    sha = document["environments"][env_id]["wheels"][0]
    document["wheels"][sha]["version"] = "0.0.0"
    document["environments"][env_id]["lock_sha256"] = "0" * 64
    document["environments"]["feedfacecafe"] = document["environments"][env_id]
    problems = nx.check(document, [GLM5], root=REPO)
    assert any("feedfacecafe: exported, but no current lock" in p for p in problems)
    assert any(f"{env_id}: lock_sha256" in p for p in problems)
    assert any("does not match the lock" in p for p in problems)


def test_committed_envs_json_is_in_step_with_the_locks():
    """nix/envs.json is generated: after `servematrix lock` changes a lock, run `python -m servematrix.scaleout.nixexport`."""
    document = json.loads((REPO / "nix" / "envs.json").read_text())
    matrices = sorted(MATRIX.glob("*.toml"))
    assert nx.check(document, matrices, root=REPO) == []
    text = (REPO / "nix" / "envs.json").read_text()
    assert "://" not in text, "no URL (and so no host) may be committed"
    assert text == nx.render(document)


def test_committed_envs_json_has_every_locked_environment_of_the_product_matrix():
    document = json.loads((REPO / "nix" / "envs.json").read_text())
    locked, _ = nx.locked_environments([GLM5], root=REPO)
    assert locked, "the product matrix has locks"
    not_exported = document.get("not_exported", {})
    for env in locked:
        if env.env_id in not_exported:  # a package the index has as an sdist only: no image, with the reason
            assert "an sdist only" in not_exported[env.env_id]
            continue
        assert "matrix/glm5-nvfp4.toml" in document["environments"][env.env_id]["matrices"]
    assert len(not_exported) < len(locked)


def test_main_check_reports_stale_and_fresh(tmp_path, capsys):
    fresh = tmp_path / "envs.json"
    fresh.write_text(nx.export([GLM5], root=REPO, query=fake_query).text)
    assert nx.main(["--check", "--out", str(fresh), "--root", str(REPO), str(GLM5)]) == 0
    stale = json.loads(fresh.read_text())
    stale["environments"].popitem()
    fresh.write_text(nx.render(stale))
    assert nx.main(["--check", "--out", str(fresh), "--root", str(REPO), str(GLM5)]) == 1
    assert "locked, but not exported" in capsys.readouterr().err


def test_export_refuses_paths_outside_the_root(tmp_path):
    with pytest.raises(nx.ExportError, match="outside"):
        nx.export([GLM5], root=tmp_path, query=fake_query)


# ---------------------------------------------------------------------------------------- nix backend


def executable(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def nix_world(tmp_path: Path):
    """A flake directory with nix/envs.json for one environment, a fake `nix` that 'builds' a stream script,
    and a fake `podman` that loads it and answers `image inspect`. Calls are logged to calls.txt."""
    env_id = "0123456789ab"
    lock = tmp_path / f"{env_id}.lock.txt"
    lock.write_text(f"six==1.17.0 \\\n    --hash=sha256:{SHA_A}\n")
    flake = tmp_path / "flake"
    (flake / "nix").mkdir(parents=True)
    (flake / "flake.nix").write_text("{ outputs = _: { }; }\n")
    envs = {
        "environments": {
            env_id: {"lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(), "inputs_hash": "f" * 64}
        }
    }
    (flake / "nix" / "envs.json").write_text(json.dumps(envs))
    calls = tmp_path / "calls.txt"
    stream = executable(tmp_path / "stream", "#!/bin/sh\necho IMAGE-TAR\n")
    nix = executable(
        tmp_path / "nix",
        f"""\
        #!/bin/sh
        echo "nix $* bases=${{{WHEEL_BASES_ENV}:-}}" >> {calls}
        echo '[{{"drvPath": "/nix/store/x.drv", "outputs": {{"out": "{stream}"}}}}]'
        """,
    )
    podman = executable(
        tmp_path / "podman",
        f"""\
        #!/bin/sh
        echo "podman $*" >> {calls}
        case "$1" in
          load) read -r what; [ "$what" = IMAGE-TAR ] || exit 3; echo "Loaded image: {IMAGE_REPOSITORY}:{env_id}";;
          image) echo '[{{"Id": "{"d" * 64}", "Config": {{"Labels": {{}}}}}}]';;
          *) exit 1;;
        esac
        """,
    )
    return {
        "env_id": env_id,
        "lock": lock,
        "flake": flake,
        "calls": calls,
        "nix": nix,
        "podman": podman,
        "root": tmp_path,
    }


def backend_for(world, **kw) -> NixBackend:
    runner = ContainerBackend("podman", world["root"] / "images", executable=str(world["podman"]))
    return NixBackend(
        "podman", world["root"] / "state", flake=world["flake"], nix=str(world["nix"]), runner=runner, **kw
    )


def request_for(world, lockfile: Path | None = None) -> BuildInput:
    return BuildInput(
        env_id=world["env_id"], python="3.12", requirements=(), lockfile=lockfile or world["lock"], lock_hash="e" * 64
    )


def test_nix_backend_builds_loads_and_then_reuses(nix_world, monkeypatch):
    monkeypatch.delenv(WHEEL_BASES_ENV, raising=False)
    backend = backend_for(nix_world)
    log = nix_world["root"] / "build.log"
    built = backend.build(request_for(nix_world), log)
    assert built.ok, built.excerpt
    assert built.image_digest == "sha256:" + "d" * 64
    assert built.installed == {"six": "1.17.0"}
    assert built.lock_hash == "e" * 64
    calls = nix_world["calls"].read_text().splitlines()
    assert calls[0].startswith("nix --extra-experimental-features nix-command flakes build --no-link --json")
    assert calls[0].split(" bases=")[0].endswith(f"{nix_world['flake']}#image-{nix_world['env_id']}")
    assert "--impure" not in calls[0]
    assert any(c == "podman load" for c in calls)

    again = backend.build(request_for(nix_world), log)
    assert again.ok and again.cached and again.image_digest == built.image_digest
    assert nix_world["calls"].read_text().count("podman load") == 1


def test_nix_backend_passes_wheel_bases_impurely(nix_world):
    backend = backend_for(nix_world, wheel_bases={"default": FILES})
    assert backend.build(request_for(nix_world), nix_world["root"] / "build.log").ok
    first = nix_world["calls"].read_text().splitlines()[0]
    assert "--impure" in first
    assert first.endswith('bases={"default": "' + FILES + '"}')


def test_nix_backend_refuses_an_environment_exported_from_another_lock(nix_world):
    other = nix_world["root"] / "other.lock.txt"
    other.write_text(f"six==1.16.0 \\\n    --hash=sha256:{SHA_B}\n")
    built = backend_for(nix_world).build(request_for(nix_world, other), nix_world["root"] / "build.log")
    assert not built.ok
    assert "exported from another version" in built.excerpt
    assert not nix_world["calls"].exists()


def test_nix_backend_refuses_an_environment_not_exported(nix_world):
    request = BuildInput(env_id="ffffffffffff", python="3.12", requirements=(), lockfile=nix_world["lock"])
    built = backend_for(nix_world).build(request, nix_world["root"] / "build.log")
    assert not built.ok and "nixexport" in built.excerpt


def test_nix_backend_needs_a_lock(nix_world):
    request = BuildInput(env_id=nix_world["env_id"], python="3.12", requirements=("six",))
    built = backend_for(nix_world).build(request, nix_world["root"] / "build.log")
    assert not built.ok and "hashed lock" in built.excerpt


def test_nix_backend_reports_a_failed_nix_build(nix_world):
    executable(nix_world["nix"], "#!/bin/sh\necho 'error: wheel base default has no URL' >&2\nexit 1\n")
    built = backend_for(nix_world).build(request_for(nix_world), nix_world["root"] / "build.log")
    assert not built.ok
    assert "wheel base default has no URL" in built.excerpt


def test_nix_backend_runs_like_the_container_backend(nix_world):
    backend = backend_for(nix_world)
    built = backend.build(request_for(nix_world), nix_world["root"] / "build.log")
    spec = backend.launch(built, ("python", "-m", "server"), {"A": "1"}, 8123, model_dir=None)
    runner_spec = backend.runner.launch(built, ("python", "-m", "server"), {"A": "1"}, 8123, model_dir=None)
    strip = [a for a in spec.argv if not a.startswith("servematrix-")]
    assert strip == [a for a in runner_spec.argv if not a.startswith("servematrix-")]
    assert spec.argv[-4:] == (built.image_digest, "python", "-m", "server")
    assert backend.bind_host == "0.0.0.0"
    assert backend.python(built)[-1] == "/opt/servematrix/env/bin/python"


def test_nix_backend_factory_checks_its_tools(monkeypatch, tmp_path):
    import servematrix.backends.nix as nix_module

    monkeypatch.setattr(nix_module.shutil, "which", lambda name: None)
    with pytest.raises(InputError, match="nix is not installed"):
        nix_backend(tmp_path, probe=lambda tool: None)
    monkeypatch.setattr(nix_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(InputError, match="neither podman nor docker"):
        nix_backend(tmp_path, probe=lambda tool: "not here")
    backend = nix_backend(tmp_path, probe=lambda tool: None if tool == "docker" else "no", flake=REPO)
    assert backend.tool == "docker" and backend.name == "nix"
    assert backend.root == tmp_path / "nix"
    with pytest.raises(InputError, match="unknown container engine"):
        nix_backend(tmp_path, tool="lxc", probe=lambda tool: None, flake=REPO)


def test_wheel_base_urls_never_reach_the_committed_flake_files():
    for path in [REPO / "flake.nix", *sorted((REPO / "nix").rglob("*"))]:
        if path.is_file():
            text = path.read_text()
            for line in text.splitlines():
                if "://" in line:
                    assert "https://..." in line, f"{path}: only a placeholder URL may be committed: {line}"
    assert json.loads((REPO / "nix" / "wheel-bases.json").read_text()) == {}


def test_a_lock_with_an_sdist_only_package_is_listed_not_exported_and_checks_clean():
    """sglang 0.5.18-0.5.22 pin cuda-tile 1.6.0rc5, which the index has as a placeholder sdist only: the Nix path
    (wheels only) has no image for those environments; the export lists them with the reason instead of failing,
    and the check accepts them. Any other problem of a lock still fails the export."""
    locked, _ = nx.locked_environments([GLM5], root=REPO)
    placeholder = locked[0].env_id

    def sdist_for_one(env, *, uv, timeout_s):
        answer = fake_query(env, uv=uv, timeout_s=timeout_s)
        if env.env_id == placeholder:
            first = answer["packages"][0]
            answer["packages"][0] = {"name": first["name"], "version": first["version"], "sdist": {"url": "x"}}
        return answer

    document = nx.export([GLM5], root=REPO, query=sdist_for_one).document
    assert placeholder not in document["environments"]
    assert "an sdist only" in document["not_exported"][placeholder]
    assert nx.check(document, [GLM5], root=REPO) == []
    del document["not_exported"]
    assert f"{placeholder}: locked, but not exported" in nx.check(document, [GLM5], root=REPO)

    def wrong_version(env, *, uv, timeout_s):
        answer = fake_query(env, uv=uv, timeout_s=timeout_s)
        answer["packages"][0]["version"] = "0.0.0"
        return answer

    with pytest.raises(nx.ExportError, match=r"uv answered 0\.0\.0"):
        nx.export([GLM5], root=REPO, query=wrong_version)
