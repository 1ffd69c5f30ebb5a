"""The config pre-flight: does this sglang release know the model at all, and does it read the server's
environment variables? A CPU check that needs neither sglang started nor its lock installed (issue 46).

Three questions, each answered from the release's own files:

- **Can the lock's transformers read the model's config?** `AutoConfig.from_pretrained(config_dir)` with the
  lock's own transformers version, in a small cached venv holding only transformers and its dependencies at the
  lock's versions (resolved with the lock's pins as constraints: no torch, no sglang). A transformers that does
  not know the config's `model_type` (transformers 4.57.1 and `glm_moe_dsa`) fails, unless the release
  registers its own config class for that type (`sglang/srt/configs/*.py`, which sglang registers with
  AutoConfig itself).
- **Does the release define a class for the config's `architectures`?** Read from its wheel without installing
  it: the registry (`sglang/srt/models/registry.py`) imports each module of `sglang/srt/models/` and registers
  the classes its `EntryClass` names; the `EntryClass` assignments are read with `ast`. A release without one
  would fall back to its Transformers backend (`TransformersForCausalLM`), which is not sglang's own model.
- **Does the release read each `SGLANG_*` variable the matrix gives the server** (`[server] env`, the GPU
  kind's `env`)? Every source file of the wheel that the server can import is scanned for the name (comments
  and `sglang/test/` left out). A variable no file names is never read; one that is only a deprecated alias
  (`EnvIntWithAlias(..., deprecated_name=OLD)` from 0.5.15, `_print_deprecated_env`) is read only under
  another name. Both are warnings in the cell's evidence, never a verdict, each citing file:line.

Either of the first two failing ends the cell `predicted-fail:model-unsupported` with evidence that names which
(and the wheel). Otherwise the check passes with what it found as evidence, and the heavier pre-flights (load,
trace) decide. The wheel's facts are cached per release, the transformers answer per (its dependency set, the
config files), so a matrix pays for each once. What is read from the wheel is `wheelfacts`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servematrix.engines.hooks import PreflightInput, PreflightUnavailable
from servematrix.engines.sglang import traceprobe
from servematrix.engines.sglang.wheelfacts import MODELS, REGISTRY, ConfigCheckError, env_warnings, wheel_facts
from servematrix.formats.lockfile import DEFAULT_PLATFORM, DEFAULT_PYTHON_VERSION
from servematrix.formats.verdict import Verdict
from servematrix.util import atomic_write, find_python, python_version_of, run_captured, uv_env

SCRIPT_VERSION = 1  # of the transformers answer: bump when the script or its reading changes
CLASS = "model-unsupported"
EXTERNAL_MODELS = "SGLANG_EXTERNAL_MODEL_PACKAGE"  # a registry extended at run time: not read from the wheel
INSTALL_TIMEOUT_S = 600.0
SCRIPT_TIMEOUT_S = 300.0
# Messages of a transformers that does not know the config's model_type (4.x and 5.x word it alike).
UNKNOWN_TYPE = re.compile(r"does not recognize this architecture|Unrecognized model in|KeyError: '[^']+'")
_SCRIPT = """
import json, sys, traceback
out = {}
try:
    import transformers
    out["transformers"] = transformers.__version__
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=sys.argv[2] == "1")
    out.update(ok=True, config_class=type(config).__name__, model_type=getattr(config, "model_type", None))
except Exception as exc:
    out.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
print(json.dumps(out))
"""


# ------------------------------------------------------------------------------------ the model's config


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    folder: Path
    model_type: str
    architectures: tuple[str, ...]
    digest: str  # of the folder's JSON files: the transformers answer is cached by it


def read_model_config(folder: Path) -> ModelConfig | None:
    """The model type and architectures of a config folder; None without a readable config.json."""
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    architectures = data.get("architectures") or []
    entries = sorted((p.name, p.read_bytes()) for p in folder.iterdir() if p.is_file() and p.suffix == ".json")
    digest = hashlib.sha256(b"".join(name.encode() + b"\0" + body + b"\0" for name, body in entries)).hexdigest()
    return ModelConfig(
        folder=folder,
        model_type=str(data.get("model_type") or ""),
        architectures=tuple(str(a) for a in architectures) if isinstance(architectures, list) else (),
        digest=digest,
    )


@dataclass(frozen=True, kw_only=True)
class TransformersAnswer:
    version: str
    ok: bool
    error: str = ""
    config_class: str = ""
    python: str = ""  # X.Y of the interpreter that ran it
    seconds: float = 0.0
    cached: bool = False

    @property
    def unknown_type(self) -> bool:
        """The failure is transformers not knowing the model type (not another fault of the config)."""
        return not self.ok and bool(UNKNOWN_TYPE.search(self.error))


def transformers_reads(
    model: ModelConfig,
    *,
    transformers_version: str,
    pins: Mapping[str, str],
    python_version: str,
    cache_dir: Path,
    trust_remote_code: bool = False,
) -> TransformersAnswer:
    """`AutoConfig.from_pretrained(folder)` with this transformers, its dependencies at the lock's versions,
    in a small venv (built once per dependency set under `cache_dir/configcheck/venvs`)."""
    started = time.monotonic()
    root = Path(cache_dir) / "configcheck"
    python = find_interpreter(python_version)
    closure = _closure(transformers_version, pins, python=python, root=root)
    venv_key = _digest([python_version_of(python), *closure])
    result_key = _digest([venv_key, model.digest, str(trust_remote_code), str(SCRIPT_VERSION)])
    result_path = root / "transformers" / f"{result_key}.json"
    try:
        known = json.loads(result_path.read_text())
        return dataclasses.replace(TransformersAnswer(**known), cached=True)
    except (OSError, ValueError, TypeError):
        pass
    try:
        venv_python = traceprobe.ensure_venv(
            root / "venvs" / venv_key,
            ["--no-deps", *closure],
            timeout_s=INSTALL_TIMEOUT_S,
            python=python,
            what=f"transformers {transformers_version} venv",
        )
    except traceprobe.VenvError as exc:
        raise ConfigCheckError(str(exc)) from None
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        PYTHONNOUSERSITE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(root / "hf-home"),  # remote code it may load stays in the cache folder
        PYTHONWARNINGS="ignore",
    )
    run = run_captured(
        [str(venv_python), "-c", _SCRIPT, str(model.folder), "1" if trust_remote_code else "0"],
        env=env,
        timeout_s=SCRIPT_TIMEOUT_S,
    )
    answer = _last_json(run.stdout)
    if answer is None or "transformers" not in answer:
        tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-5:])
        raise ConfigCheckError(f"transformers {transformers_version} did not run: {tail or run.problem}")
    result = TransformersAnswer(
        version=answer["transformers"],
        ok=bool(answer.get("ok")),
        error=str(answer.get("error") or ""),
        config_class=str(answer.get("config_class") or ""),
        python=python_version_of(python),
        seconds=round(time.monotonic() - started, 3),
    )
    atomic_write(result_path, json.dumps(dataclasses.asdict(result), indent=1) + "\n")
    return result


def _closure(transformers_version: str, pins: Mapping[str, str], *, python: str, root: Path) -> list[str]:
    """transformers and its dependencies as `name==version`, resolved with the lock's pins as constraints:
    the lock's own versions of what transformers needs, and nothing else (no torch)."""
    constraints = sorted(f"{name}=={version}" for name, version in pins.items() if name != "transformers")
    key = _digest([transformers_version, python_version_of(python), *constraints])
    cached = root / "closures" / f"{key}.txt"
    if cached.is_file():
        return cached.read_text().split()
    uv = shutil.which("uv")
    if uv is None:
        raise ConfigCheckError("uv not found: the transformers venv cannot be resolved")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".resolve-") as tmp:
        request, constraint_file = Path(tmp) / "requirements.in", Path(tmp) / "constraints.txt"
        request.write_text(f"transformers=={transformers_version}\n")
        constraint_file.write_text("\n".join(constraints) + "\n")
        argv = [uv, "pip", "compile", str(request), "--constraint", str(constraint_file), "--python", python]
        run = run_captured(
            [*argv, "--no-header", "--no-annotate", "--quiet"], env=uv_env(NO_COLOR="1"), timeout_s=INSTALL_TIMEOUT_S
        )
    lines = [line.strip() for line in run.stdout.splitlines() if "==" in line and not line.startswith("#")]
    if run.returncode != 0 or not any(line.startswith("transformers==") for line in lines):
        tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-3:])
        raise ConfigCheckError(
            f"transformers {transformers_version} with the lock's pins: uv could not resolve: {tail}"
        )
    atomic_write(cached, "\n".join(lines) + "\n")
    return lines


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()[:16]


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


_interpreters: dict[str, str] = {}


def find_interpreter(version: str) -> str:
    """An interpreter of the cell's Python X.Y (`util.find_python`, as the import check finds one), else this
    one: transformers reads a config alike on any Python it installs on."""
    if version not in _interpreters:
        _interpreters[version] = find_python(version, timeout_s=60) or sys.executable
    return _interpreters[version]


# ----------------------------------------------------------------------------------------- the pre-flight


@dataclass(frozen=True, kw_only=True)
class ConfigCheck:
    """What the check found for one cell: failures (each a reason the release cannot load the model), what it
    found fine, and the environment warnings."""

    failures: tuple[str, ...] = ()
    excerpts: tuple[str, ...] = ()
    found: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def verdict(self) -> Verdict | None:
        warnings = tuple(f"config: warning: {w}" for w in self.warnings)
        if self.failures:
            evidence = (*(f"config: {f}" for f in self.failures), *warnings)
            return Verdict(kind="predicted-fail", detail=CLASS, excerpt="\n".join(self.excerpts), evidence=evidence)
        if not (self.found or warnings):
            return None
        return Verdict(kind="pass", evidence=((f"config: {'; '.join(self.found)}",) if self.found else ()) + warnings)


def check(
    *,
    sglang_version: str,
    model: ModelConfig | None,
    server_env: Mapping[str, str],
    transformers_version: str | None,
    pins: Mapping[str, str],
    cache_dir: Path,
    python_version: str = DEFAULT_PYTHON_VERSION,
    platform: str = DEFAULT_PLATFORM,
    trust_remote_code: bool = False,
) -> ConfigCheck:
    facts = wheel_facts(sglang_version, cache_dir=cache_dir, python_version=python_version, platform=platform)
    release = f"sglang {sglang_version}"
    failures: list[str] = []
    excerpts: list[str] = []
    found: list[str] = []
    known: list[tuple[str, str]] = []
    if model is not None and model.architectures and EXTERNAL_MODELS not in server_env:
        known = [(arch, facts.archs[arch]) for arch in model.architectures if arch in facts.archs]
        if known:
            found.append(f"{release} defines {known[0][0]} ({known[0][1]} in {facts.wheel})")
        else:
            names = ", ".join(model.architectures)
            failures.append(
                f"{release} has no class for {names}: no EntryClass of {MODELS}*.py in {facts.wheel} names it "
                f"({len(facts.archs)} classes registered)"
            )
            excerpts.append(
                f"{release} ({facts.wheel}) registers no model class for architectures {list(model.architectures)}: "
                f"its registry ({REGISTRY}) would fall back to TransformersForCausalLM, not sglang's own model"
            )
    if model is not None and model.model_type:
        own = facts.config_types.get(model.model_type)
        if own:
            found.append(f"{release} has its own config class for {model.model_type} ({own})")
        elif not transformers_version:
            found.append(f"the model type {model.model_type} was not read: no lock here to say which transformers")
        else:
            try:
                answer = transformers_reads(
                    model,
                    transformers_version=transformers_version,
                    pins=pins,
                    python_version=python_version,
                    cache_dir=cache_dir,
                    trust_remote_code=trust_remote_code,
                )
            except ConfigCheckError as exc:
                if not (failures or known):
                    raise  # nothing decided: the check could not run here
                found.append(f"transformers {transformers_version} could not be run here ({exc})")
            else:
                on = f"Python {answer.python}" + (", cached" if answer.cached else "")
                if answer.ok:
                    found.append(f"transformers {answer.version} (the lock's) reads {model.model_type} ({on})")
                elif answer.unknown_type:
                    failures.insert(
                        0,
                        f"transformers {answer.version} (the lock's) cannot read model_type {model.model_type} ({on})",
                    )
                    excerpts.insert(0, answer.error)
                else:  # another fault of the config: sglang's own loader (the load pre-flight) says what it means
                    found.append(f"transformers {answer.version} read the config with an error: {answer.error[:300]}")
    return ConfigCheck(
        failures=tuple(failures),
        excerpts=tuple(excerpts),
        found=tuple(found),
        warnings=tuple(env_warnings(facts, server_env)),
    )


def config(inp: PreflightInput) -> Verdict | None:
    """The `config` pre-flight of one cell (see the module doc)."""
    cell = inp.cell
    model = read_model_config(inp.model_config) if inp.model_config is not None else None
    try:
        result = check(
            sglang_version=cell.env.version,
            model=model,
            server_env=cell.server_env,
            transformers_version=inp.pins.get("transformers"),
            pins=inp.pins,
            cache_dir=inp.cache_dir,
            python_version=cell.env.python,
            platform=cell.env.gpu.platform,
            trust_remote_code="--trust-remote-code" in cell.command,
        )
    except ConfigCheckError as exc:
        raise PreflightUnavailable(str(exc)) from None
    return result.verdict()
