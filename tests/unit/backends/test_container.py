"""The podman/docker backend without a container engine: the exact argv of builds and runs for each GPU kind,
the image cache and build failures against a fake `podman`, and `--backend` selection."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.backends import BuildInput, Built, LaunchSpec, container
from servematrix.backends.container import (
    DEFAULT_BASE,
    INSTALL_LAYERS,
    ContainerBackend,
    EnvTarget,
    build_excerpt,
    container_name,
    default_dockerfile,
    targets_from_plan,
)
from servematrix.backends.registry import select_backend
from servematrix.backends.tools import probe_tool
from servematrix.backends.venv import VenvBackend
from servematrix.errors import InputError
from servematrix.formats.lockfile import parse_pins
from servematrix.planning.plan import make_plan
from tests.conftest import MATRIX, REPO, SMALL_SGLANG, installed_tool

DIGEST = "sha256:" + "ab" * 32
LOCK = """\
# servematrix-lock: 1
# inputs-hash: 0123456789abcdef0123456789abcdef
# env-id: e1
# index-url: https://index.example.invalid/simple
# extra-index-url: https://extra-a.example.invalid/simple
# extra-index-url: https://extra-b.example.invalid/simple
idna==3.10 \\
    --hash=sha256:12f65c9b470abda6dc35cf8e63cc574b1c52b11df2c86030af0ac09b01b13ea9
    # via -r requirements.in
"""


def _glm5(gpu: str):
    plan = make_plan(MATRIX / "glm5-nvfp4.toml", [f"gpu={gpu}"])
    return plan, plan.cells[0].env


def _built(env_id: str) -> Built:
    return Built(ok=True, env_id=env_id, image_digest=DIGEST, lock_hash="0123456789abcdef")


def _launch(backend: ContainerBackend, env_id: str, tmp_path: Path, env: dict[str, str] | None = None) -> LaunchSpec:
    model = tmp_path / "tiny-llama"
    model.mkdir(exist_ok=True)
    return backend.launch(
        _built(env_id), ("serve", "/models/tiny-llama", "--port", "8123"), env or {}, 8123, model_dir=model
    )


def _normalised(argv: tuple[str, ...]) -> list[str]:
    text = [re.sub(r"^servematrix-(\w+)-[0-9a-f]{8}$", r"servematrix-\1-NAME", a) for a in argv]
    return [a.replace(f"harness-pid={os.getpid()}", "harness-pid=PID") for a in text]


# -- launch: the exact argv per tool and GPU kind -------------------------------------------------------


def test_podman_launch_on_a_gpu_kind_uses_cdi_devices_shm_ulimits_and_readonly_mounts(tmp_path):
    plan, env = _glm5("b200")
    backend = ContainerBackend("podman", tmp_path, targets=targets_from_plan(plan))
    launch = _launch(backend, env.env_id, tmp_path)
    assert _normalised(launch.argv) == [
        "podman", "run", "--rm", "--init", "--name", f"servematrix-{env.env_id}-NAME",
        "--label", f"org.servematrix.env-id={env.env_id}",
        "--label", "org.servematrix.harness-pid=PID",
        "--publish", "127.0.0.1:8123:8123",
        "--volume", f"{tmp_path}/tiny-llama:/models/tiny-llama:ro",
        "--device", "nvidia.com/gpu=all",
        "--shm-size", "64g",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "--volume", "/srv/hf-cache:/hf-cache:ro",
        DIGEST, "serve", "/models/tiny-llama", "--port", "8123",
    ]  # fmt: skip
    assert launch.owns_listener is False  # the runtime's port forwarder holds the listener
    assert backend.bind_host == "0.0.0.0"
    assert backend.name == "podman"


def test_docker_launch_on_a_gpu_kind_uses_gpus_not_cdi(tmp_path):
    plan, env = _glm5("rtx-pro-6000")
    backend = ContainerBackend("docker", tmp_path, targets=targets_from_plan(plan))
    argv = _normalised(_launch(backend, env.env_id, tmp_path).argv)
    assert argv[:2] == ["docker", "run"]
    assert "--device" not in argv
    gpu = argv.index("--gpus")
    assert argv[gpu : gpu + 4] == ["--gpus", "all", "--shm-size", "64g"]
    assert backend.name == "docker"


def test_gpu_kind_without_container_options_gets_all_gpus_and_cpu_gets_none(tmp_path, write_matrix):
    plan = make_plan(write_matrix(SMALL_SGLANG))
    env = plan.cells[0].env
    targets = targets_from_plan(plan)
    assert ContainerBackend("podman", tmp_path, targets=targets).gpu_options(env.env_id) == [
        "--device",
        "nvidia.com/gpu=all",
    ]
    assert ContainerBackend("docker", tmp_path, targets=targets).gpu_options(env.env_id) == ["--gpus", "all"]
    smoke = make_plan(MATRIX / "cpu-smoke.toml")
    cpu = ContainerBackend("podman", tmp_path, targets=targets_from_plan(smoke))
    assert cpu.gpu_options(smoke.cells[0].env_id) == []
    assert ContainerBackend("podman", tmp_path).gpu_options("unknown-env") == []


def test_launch_passes_env_by_name_and_mounts_named_host_directories(tmp_path):
    hf_home = tmp_path / "hf-home"
    hf_home.mkdir()
    env = {"HF_HOME": str(hf_home), "HF_TOKEN": "s3cret", "CACHE": "/no/such/dir", "HF_HUB_OFFLINE": "1"}
    launch = _launch(ContainerBackend("podman", tmp_path), "e1", tmp_path, env)
    argv = list(launch.argv)
    assert "s3cret" not in " ".join(argv)  # values ride in the client's environment, not in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--env"] == sorted(env)
    assert launch.env["HF_TOKEN"] == "s3cret" and launch.env["PATH"] == os.environ["PATH"]
    assert f"{hf_home}:{hf_home}" in argv
    assert not any(a.startswith("/no/such/dir") for a in argv)
    assert container_name(launch.argv) and container_name(launch.argv).startswith("servematrix-e1-")


def test_env_path_that_is_a_mount_destination_is_not_mounted_from_the_host(tmp_path):
    plan, env = _glm5("b200")
    backend = ContainerBackend("podman", tmp_path, targets=targets_from_plan(plan))
    argv = _launch(backend, env.env_id, tmp_path, {"HF_HOME": "/hf-cache", "TMP": "/tmp"}).argv
    assert "/hf-cache:/hf-cache" not in argv and "/srv/hf-cache:/hf-cache:ro" in argv
    assert "/tmp:/tmp" in argv  # an ordinary host directory


def test_model_location_is_a_readonly_mount_point():
    assert ContainerBackend("podman", Path("r")).model_location(Path("/x/y/tiny-llama")) == "/models/tiny-llama"


@pytest.mark.parametrize(
    ("tool", "uid", "expected"),
    [
        ("podman", 0, ["--user", "0:0"]),
        ("podman", 1000, ["--userns", "keep-id", "--user", "1000:1000"]),
        ("docker", 1000, ["--user", "1000:1000"]),
    ],
)
def test_python_runs_the_image_python_as_the_host_user_with_dirs_at_the_same_paths(
    tmp_path, monkeypatch, tool, uid, expected
):
    monkeypatch.setattr(os, "getuid", lambda: uid)
    monkeypatch.setattr(os, "getgid", lambda: uid)
    prefix = ContainerBackend(tool, tmp_path).python(_built("e1"), visible=(tmp_path, tmp_path / "models", tmp_path))
    argv = _normalised(prefix)
    assert argv[:5] == [tool, "run", "--rm", "--network", "none"]
    assert argv[-2:] == [DIGEST, "/opt/servematrix/env/bin/python"]
    user = argv.index("--userns") if "--userns" in argv else argv.index("--user")
    assert argv[user : user + len(expected)] == expected
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert volumes == [f"{tmp_path}:{tmp_path}", f"{tmp_path}/models:{tmp_path}/models"]


# -- build: argv, base image, labels --------------------------------------------------------------------


def _request(tmp_path: Path, env_id: str = "e1", lock: str = LOCK) -> BuildInput:
    lockfile = tmp_path / f"{env_id}.lock.txt"
    lockfile.write_text(lock)
    return BuildInput(
        env_id=env_id, python="3.12", requirements=("idna",), lockfile=lockfile, lock_hash="0123456789abcdef0123"
    )


def _build_args(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")


def test_build_argv_takes_the_base_image_from_the_cuda_kind_and_labels_the_axes(tmp_path):
    plan, env = _glm5("b200")
    backend = ContainerBackend("podman", tmp_path, targets=targets_from_plan(plan))
    request = _request(tmp_path, env.env_id)
    argv = backend.build_argv(request, tmp_path / "ctx")
    assert argv[:4] == ["podman", "build", "--force-rm", "--file"]
    assert argv[argv.index("--tag") + 1] == f"localhost/servematrix-env:{env.env_id}-0123456789ab"
    assert argv[-1] == str(tmp_path / "ctx")
    args = _build_args(argv)
    cuda = env.axes["cuda"]
    assert args["BASE_IMAGE"] == plan.spec.file.cuda[cuda].base_image
    assert args["PYTHON_VERSION"] == "3.12"
    assert args["ENV_ID"] == env.env_id and args["LOCK_HASH"] == "0123456789abcdef0123"
    assert args["AXES"] == ",".join(f"{k}={v}" for k, v in env.axes.items())
    assert args["INDEX_URL"] == "https://index.example.invalid/simple"
    assert args["EXTRA_INDEX_URLS"] == "https://extra-a.example.invalid/simple https://extra-b.example.invalid/simple"
    assert re.fullmatch(r"[0-9a-f]{12}", args["RECIPE"])


def test_base_image_override_default_cuda_template_and_cpu_default(tmp_path):
    assert ContainerBackend("podman", tmp_path, base_image="localhost/b").base_for("any") == "localhost/b"
    cuda_only = ContainerBackend("podman", tmp_path, targets={"e": EnvTarget(cuda="13.0")})
    assert cuda_only.base_for("e") == "nvidia/cuda:13.0.0-devel-ubuntu24.04"
    assert ContainerBackend("podman", tmp_path).base_for("e") == DEFAULT_BASE
    # The recipe follows the base: another base means another image, not a stale cached one.
    a, b = ContainerBackend("podman", tmp_path, base_image="a"), ContainerBackend("podman", tmp_path, base_image="b")
    assert a.recipe(_request(tmp_path)) != b.recipe(_request(tmp_path))


def test_dockerfile_declares_every_build_arg_the_backend_passes(tmp_path):
    declared = set(re.findall(r"^ARG (\w+)", default_dockerfile().read_text(), re.MULTILINE))
    passed = set(_build_args(ContainerBackend("podman", tmp_path).build_argv(_request(tmp_path), tmp_path)))
    assert passed <= declared, passed - declared
    text = default_dockerfile().read_text()
    assert "--require-hashes" in text and re.search(r"^USER 10001", text, re.MULTILINE)
    for label in ("env-id", "lock-hash", "axes"):
        assert f"org.servematrix.{label}=" in text


def test_dockerfile_copies_every_file_of_the_build_context(tmp_path):
    """The context the backend writes and the files the Dockerfile copies are the same set: a layer file the
    Dockerfile forgot would never be installed apart, one it copies that the context lacks fails every build."""
    lock = next(p for p in sorted((REPO / "matrix" / "locks").glob("*.lock.txt")) if "\ntorch==" in p.read_text())
    backend = ContainerBackend("podman", tmp_path)
    context = backend._context(_request(tmp_path, lock=lock.read_text()), lock.read_text())
    copied = set(re.findall(r"^COPY (\S+) ", default_dockerfile().read_text(), re.MULTILINE))
    assert {p.name for p in context.iterdir()} == copied
    layers = {name: parse_pins((context / name).read_text()) for _, name, _ in INSTALL_LAYERS}
    stages = re.findall(r"^FROM \S+ AS (\S+)", default_dockerfile().read_text(), re.MULTILINE)
    assert stages == [stage for stage, _, _ in INSTALL_LAYERS] + ["env"]  # the backend builds each in turn
    # CUDA 12 wheels carry a -cu12 suffix (nvidia-cublas-cu12), CUDA 13 ones none (nvidia-cublas)
    assert {re.sub(r"-cu\d+$", "", n) for n in layers["layer-cudnn-cublas.txt"]} == {"nvidia-cudnn", "nvidia-cublas"}
    assert layers["layer-cuda-libs.txt"] and all(n.startswith("nvidia-") for n in layers["layer-cuda-libs.txt"])
    assert set(layers["layer-torch.txt"]) == {"torch", "triton"}
    layered = {name: version for layer in layers.values() for name, version in layer.items()}
    assert len(layered) == sum(map(len, layers.values()))  # no entry in two layers
    assert parse_pins(lock.read_text()).items() >= layered.items()


def test_dockerfile_is_hadolint_clean():
    done = subprocess.run(
        [installed_tool("hadolint"), str(default_dockerfile())], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- build against a fake engine: cache, failure, teardown -----------------------------------------------

FAKE_TOOL = r"""
import json, os, sys
from pathlib import Path

state_path = Path(os.environ["FAKE_TOOL_STATE"])
state = json.loads(state_path.read_text()) if state_path.exists() else {"images": {}, "containers": [], "calls": []}
args = sys.argv[1:]
state["calls"].append(args)
rc = 0
if args[:2] == ["image", "inspect"]:
    image = state["images"].get(args[2])
    if image:
        print(json.dumps([image]))
    else:
        print(f"Error: {args[2]}: image not known", file=sys.stderr)
        rc = 125
elif args[0] == "build" and "--target" in args:  # an install stage alone: its layers go to the build cache
    state["stages"] = state.get("stages", []) + [args[args.index("--target") + 1]]
    if os.environ.get("FAKE_TOOL_FAIL"):
        print("STEP 1/3: FROM localhost/base AS cuda-libs")
        print("STEP 3/3: RUN pip install --require-hashes -r /opt/servematrix/layers/cuda-libs.txt")
        print("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.")
        print("    nvidia-nccl-cu12==2.27.5 from https://files.example.invalid/nvidia_nccl.whl:")
        print("Error: building at STEP \"RUN pip install\": exit status 1")
        rc = 1
elif args[0] == "build":
    tag = args[args.index("--tag") + 1]
    build_args = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--build-arg")
    context = Path(args[-1])
    state["context"] = {p.name: p.read_text() for p in context.iterdir()}
    if os.environ.get("FAKE_TOOL_FAIL"):
        print("STEP 1/3: FROM localhost/base")
        print("STEP 2/3: RUN pip install --require-hashes -r /opt/servematrix/lock.txt")
        print("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.")
        print("    idna==3.10 from https://files.example.invalid/idna-3.10.whl:")
        print("Error: building at STEP \"RUN pip install\": exit status 1")
        rc = 1
    else:
        print("STEP 1/1: FROM localhost/base")
        labels = {"org.servematrix." + k.lower().replace("_", "-"): v for k, v in build_args.items()}
        state["images"][tag] = {"Id": "ab" * 32, "Config": {"Labels": labels}}
elif args[:2] == ["container", "inspect"]:
    rc = 0 if args[-1] in state["containers"] else 125
elif args[0] == "rm":
    state["containers"] = [c for c in state["containers"] if c != args[-1]]
state_path.write_text(json.dumps(state))
sys.exit(rc)
"""


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    script = tmp_path / "fake-podman"
    script.write_text(f"#!{sys.executable}\n{FAKE_TOOL}")
    script.chmod(0o755)
    state = tmp_path / "fake-state.json"
    monkeypatch.setenv("FAKE_TOOL_STATE", str(state))

    class Fake:
        executable = str(script)

        @staticmethod
        def state() -> dict:
            return json.loads(state.read_text()) if state.exists() else {}

        @staticmethod
        def builds() -> int:
            """Builds of a whole image (each comes after one build per install stage)."""
            return sum(1 for call in Fake.state().get("calls", []) if call[0] == "build" and "--tag" in call)

    return Fake


def test_build_once_then_reuse_the_image_without_building(tmp_path, fake_tool):
    ca = tmp_path / "proxy-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
    backend = ContainerBackend(
        "podman", tmp_path / "root", executable=fake_tool.executable, extra_ca_bundle=ca, base_image="localhost/b"
    )
    request = _request(tmp_path)
    first = backend.build(request, tmp_path / "logs" / "e1.build.log")
    assert first.ok and not first.cached
    assert first.image_digest == DIGEST
    assert first.lock_hash == request.lock_hash and first.installed == {"idna": "3.10"}
    layers = {name: "" for _, name, _ in INSTALL_LAYERS}
    context = {"lock.txt": LOCK, **layers, "extra-ca.crt": ca.read_text()}
    assert fake_tool.state()["context"] == context  # idna is in neither install layer: the lock installs it
    assert fake_tool.state()["stages"] == ["cudnn-cublas", "cuda-libs", "torch"]  # each alone, before the image
    assert (tmp_path / "logs" / "e1.build.log").read_text().startswith("$ ")
    assert not list((tmp_path / "root").iterdir())  # the build context is removed

    again = backend.build(request, tmp_path / "logs" / "e1.build.log")
    assert again.ok and again.cached and again.image_digest == DIGEST
    assert fake_tool.builds() == 1

    # Another recipe (here, another base image) under the same tag is rebuilt, not trusted.
    other = ContainerBackend("podman", tmp_path / "root", executable=fake_tool.executable, base_image="localhost/c")
    rebuilt = other.build(request, tmp_path / "logs" / "e1.build.log")
    assert rebuilt.ok and not rebuilt.cached and fake_tool.builds() == 2
    assert fake_tool.state()["context"]["extra-ca.crt"] == ""  # no extra CA: an empty file


def test_failing_build_returns_the_failing_steps_lines(tmp_path, fake_tool, monkeypatch):
    monkeypatch.setenv("FAKE_TOOL_FAIL", "1")
    backend = ContainerBackend("podman", tmp_path / "root", executable=fake_tool.executable)
    built = backend.build(_request(tmp_path), tmp_path / "e1.build.log")
    assert not built.ok
    lines = built.excerpt.splitlines()
    assert lines[0] == "STEP 3/3: RUN pip install --require-hashes -r /opt/servematrix/layers/cuda-libs.txt"
    assert "DO NOT MATCH THE HASHES" in built.excerpt and "STEP 1/3" not in built.excerpt
    assert fake_tool.state()["stages"] == ["cudnn-cublas"] and fake_tool.builds() == 0  # nothing after the failure


def test_build_without_a_lock_fails_with_a_reason(tmp_path, fake_tool):
    backend = ContainerBackend("podman", tmp_path, executable=fake_tool.executable)
    request = BuildInput(env_id="e1", python="3.12", requirements=("idna",))
    built = backend.build(request, tmp_path / "log")
    assert not built.ok and "hashed lock" in built.excerpt and fake_tool.builds() == 0


def test_stop_removes_a_container_that_outlived_its_client(tmp_path, fake_tool):
    backend = ContainerBackend("podman", tmp_path, executable=fake_tool.executable)
    launch = _launch(backend, "e1", tmp_path)
    name = container_name(launch.argv)
    state = {"images": {}, "containers": [name], "calls": []}
    Path(os.environ["FAKE_TOOL_STATE"]).write_text(json.dumps(state))
    assert backend.stop(launch, grace_s=3)
    calls = fake_tool.state()["calls"]
    assert ["stop", "--time", "3", name] in calls and ["rm", "--force", name] in calls
    assert backend.stop(launch)  # already gone: nothing to do


def test_build_excerpt_reads_podman_and_docker_step_headers():
    podman = 'STEP 1/2: FROM x\nok\nSTEP 2/2: RUN false\nboom\nError: building at STEP "RUN false"'
    assert build_excerpt(podman).splitlines()[:2] == ["STEP 2/2: RUN false", "boom"]
    stages = "[3/4] STEP 5/5: RUN pip install -r torch.txt\n--> abc\n[4/4] STEP 1/17: FROM abc AS env\n"
    stages += "[4/4] STEP 7/17: RUN pip install -r lock.txt\nERROR: THESE PACKAGES DO NOT MATCH THE HASHES"
    assert build_excerpt(stages).splitlines()[0] == "[4/4] STEP 7/17: RUN pip install -r lock.txt"
    docker = "Step 1/2 : FROM x\n ---> 1\nStep 2/2 : RUN false\n ---> Running in 3\nThe command returned 1"
    assert build_excerpt(docker).startswith("Step 2/2 : RUN false")
    long = "STEP 3/3: RUN pip install\n" + "\n".join(f"Collecting p{i}" for i in range(200)) + "\nERROR: hash"
    excerpt = build_excerpt(long).splitlines()
    assert len(excerpt) == 40 and excerpt[0] == "STEP 3/3: RUN pip install" and excerpt[-1] == "ERROR: hash"
    assert "lines elided" in excerpt[1]


# -- --backend selection -----------------------------------------------------------------------------------


def _probe(working: set[str]):
    return lambda tool: None if tool in working else f"{tool}: cannot connect to the daemon"


@pytest.mark.parametrize(
    ("working", "expected"), [({"podman", "docker"}, "podman"), ({"docker"}, "docker"), (set(), "venv")]
)
def test_auto_prefers_podman_then_docker_then_venv(tmp_path, working, expected):
    backend = select_backend("auto", workdir=tmp_path, probe=_probe(working))
    assert backend.name == expected
    if expected == "venv":
        assert isinstance(backend, VenvBackend)


def test_an_explicit_backend_that_does_not_work_is_bad_input(tmp_path):
    with pytest.raises(InputError, match=r"--backend docker: docker is not usable here: docker: cannot connect"):
        select_backend("docker", workdir=tmp_path, probe=_probe({"podman"}))
    with pytest.raises(InputError, match="unknown backend"):
        select_backend("kubernetes", workdir=tmp_path, probe=_probe(set()))
    assert select_backend("venv", workdir=tmp_path, probe=_probe(set())).name == "venv"


def test_container_backend_gets_plan_targets_and_the_extra_ca_from_the_environment(tmp_path, monkeypatch):
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    monkeypatch.setenv("SERVEMATRIX_EXTRA_CA_BUNDLE", str(ca))
    monkeypatch.setenv("SERVEMATRIX_BASE_IMAGE", "localhost/bookworm-base")
    plan, env = _glm5("b200")
    backend = select_backend("podman", workdir=tmp_path, plan=plan, probe=_probe({"podman"}))
    assert isinstance(backend, ContainerBackend)
    assert backend.extra_ca_bundle == ca and backend.base_image == "localhost/bookworm-base"
    assert backend.root == tmp_path / "images"
    assert backend.target(env.env_id).gpu == env.gpu
    monkeypatch.setenv("SERVEMATRIX_EXTRA_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(InputError, match=r"missing\.pem is not a file"):
        select_backend("podman", workdir=tmp_path, probe=_probe({"podman"}))


def test_probe_reports_a_missing_tool():
    assert "not installed" in (probe_tool("servematrix-no-such-engine") or "")


def _bases(available: set[str]):
    return lambda tool, image: None if image in available else f"cannot pull {image}: no such host"


def test_auto_passes_over_an_engine_that_cannot_get_the_base_image(tmp_path):
    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    builds = list(dict.fromkeys(c.env_id for c in plan.cells))
    said: list[str] = []
    backend = select_backend(
        "auto", workdir=tmp_path, plan=plan, builds=builds, probe=_probe({"podman"}), base_check=_bases(set()),
        notice=said.append,
    )  # fmt: skip
    assert isinstance(backend, VenvBackend)
    assert len(said) == 1
    assert "podman works but cannot pull debian:bookworm-slim" in said[0] and "SERVEMATRIX_BASE_IMAGE" in said[0]
    # The same base, present: podman it is.
    backend = select_backend(
        "auto", workdir=tmp_path, plan=plan, builds=builds, probe=_probe({"podman"}),
        base_check=_bases({"debian:bookworm-slim"}),
    )  # fmt: skip
    assert backend.name == "podman"


def test_auto_checks_no_base_when_nothing_will_be_built(tmp_path):
    def refuse(tool: str, image: str) -> str:
        raise AssertionError("no base image should be looked up")

    backend = select_backend("auto", workdir=tmp_path, builds=(), probe=_probe({"podman"}), base_check=refuse)
    assert backend.name == "podman"


def test_an_explicit_engine_without_its_base_image_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEMATRIX_BASE_IMAGE", "localhost/my-base")
    plan = make_plan(MATRIX / "cpu-smoke.toml", [], None)
    builds = [plan.cells[0].env_id]
    with pytest.raises(InputError) as raised:
        select_backend(
            "podman", workdir=tmp_path, plan=plan, builds=builds, probe=_probe({"podman"}), base_check=_bases(set())
        )
    message = str(raised.value)
    assert "\n" not in message
    assert "--backend podman" in message and "localhost/my-base" in message and "SERVEMATRIX_BASE_IMAGE" in message


def test_nix_is_a_backend_choice_of_select(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nix here: the nix backend's own one-line error
    with pytest.raises(InputError, match="--backend nix: nix is not installed"):
        select_backend("nix", workdir=tmp_path, probe=_probe({"podman"}))


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_base_image_problem_asks_the_real_engine(tmp_path):
    from servematrix.backends.tools import base_image_problem

    why = base_image_problem("podman", "localhost/servematrix-no-such-base:never")
    assert why is not None and why.startswith("cannot pull localhost/servematrix-no-such-base:never")


def test_the_gpus_a_packed_job_was_given_replace_the_kinds_gpu_devices(tmp_path, write_matrix, monkeypatch):
    """A packed job runs with CUDA_VISIBLE_DEVICES naming its GPUs: its container gets those alone (and sees
    them as 0..k-1), even where the kind names all GPUs; a CPU kind still gets none."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    plan = make_plan(write_matrix(SMALL_SGLANG))
    targets = targets_from_plan(plan)
    env_id = plan.cells[0].env_id
    podman = ContainerBackend("podman", tmp_path, targets=targets).gpu_options(env_id)
    assert podman == ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"]
    assert ContainerBackend("docker", tmp_path, targets=targets).gpu_options(env_id) == ["--gpus", '"device=2,3"']
    glm5, env = _glm5("b200")  # podman_devices = ["nvidia.com/gpu=all"] in the matrix
    options = ContainerBackend("podman", tmp_path, targets=targets_from_plan(glm5)).gpu_options(env.env_id)
    assert options[:4] == ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"]
    assert "nvidia.com/gpu=all" not in options and "--shm-size" in options
    smoke = make_plan(MATRIX / "cpu-smoke.toml")
    assert (
        ContainerBackend("podman", tmp_path, targets=targets_from_plan(smoke)).gpu_options(smoke.cells[0].env_id) == []
    )


def test_a_harness_pinned_to_some_cpus_pins_its_containers_to_them(monkeypatch):
    monkeypatch.setattr(container.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(container.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7})
    assert container.cpuset_options() == ["--cpuset-cpus", "4,5,6,7"]
    monkeypatch.setattr(container.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert container.cpuset_options() == []
