"""What the config pre-flight (`configcheck`) reads from an sglang release's wheel, without installing it: the
model registry (each `EntryClass` of `sglang/srt/models/*.py`, which `sglang/srt/models/registry.py` registers),
sglang's own config classes (`model_type` of `sglang/srt/configs/*.py`), and every `SGL(ANG)_*` environment
variable its server's sources name, where and how (read, `is_set()`, a deprecated alias of another name). Read
with `ast` and a scan of the source text; nothing is imported. Cached per release (`wheel_facts`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servematrix.engines.sglang.wheels import IndexUnreachable, WheelUnavailable, download_target, download_wheel
from servematrix.formats.lockfile import DEFAULT_PLATFORM, DEFAULT_PYTHON_VERSION
from servematrix.util import atomic_write

SCHEMA = 1  # of the cached wheel facts: bump when the reading changes
ENV_NAME = re.compile(r"^SGL(?:ANG)?_[A-Z0-9_]+$")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_])(SGL(?:ANG)?_[A-Z0-9_]*[A-Z0-9])(?![A-Za-z0-9_])")
# Where a release copies every SGL_* variable to its SGLANG_* name (`key.replace("SGL_", "SGLANG_", 1)`).
_SGL_PREFIX = re.compile(r"""replace\(\s*["']SGL_["']\s*,\s*["']SGLANG_["']""")
MODELS = "sglang/srt/models/"
REGISTRY = "sglang/srt/models/registry.py"
CONFIGS = "sglang/srt/configs/"
NOT_SERVED = ("sglang/test/",)  # the server never imports these
MAX_REFS = 3  # kept per variable and role: enough to cite


class ConfigCheckError(RuntimeError):
    """The check could not run here (no wheel, no interpreter, an install that failed): it predicts nothing."""


# ------------------------------------------------------------------------------------- the wheel's facts


@dataclass(frozen=True, kw_only=True)
class EnvRef:
    """One place a source file names an environment variable."""

    file: str
    line: int
    # read: named where the server reads it (a field of `envs`, `os.environ[...]`, `get_bool_env_var(...)`);
    # is_set: `envs.NAME.is_set()`; alias: the deprecated name of `target` (`deprecated_name=`), read only
    # while `target` is unset; deprecated: named by a deprecation helper (copied to `target` if it has one);
    # mention: the new name in such a helper's call (not a read of its own)
    role: str
    target: str = ""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, kw_only=True)
class WheelFacts:
    """What the config check reads from one release's wheel."""

    version: str
    wheel: str
    archs: Mapping[str, str]  # architecture -> where an EntryClass names it ("sglang/srt/models/x.py:12")
    config_types: Mapping[str, str]  # model_type -> where sglang defines its own config class for it
    env: Mapping[str, tuple[EnvRef, ...]] = field(default_factory=dict)
    sgl_prefix: str = ""  # where the release copies every SGL_* variable to SGLANG_*, if it does

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": self.version,
            "wheel": self.wheel,
            "archs": dict(sorted(self.archs.items())),
            "config_types": dict(sorted(self.config_types.items())),
            "env": {name: [dataclasses.asdict(r) for r in refs] for name, refs in sorted(self.env.items())},
            "sgl_prefix": self.sgl_prefix,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WheelFacts:
        return cls(
            version=data["version"],
            wheel=data["wheel"],
            archs=dict(data["archs"]),
            config_types=dict(data["config_types"]),
            env={name: tuple(EnvRef(**r) for r in refs) for name, refs in data["env"].items()},
            sgl_prefix=data.get("sgl_prefix", ""),
        )


_facts: dict[tuple[str, str], WheelFacts] = {}  # per process: (cache folder, version)


def wheel_facts(
    sglang_version: str,
    *,
    cache_dir: Path,
    python_version: str = DEFAULT_PYTHON_VERSION,
    platform: str = DEFAULT_PLATFORM,
) -> WheelFacts:
    """The facts of one release, from the cache or from its wheel (downloaded once, shared with the flags
    pre-flight under `cache_dir/wheels`)."""
    key = (str(cache_dir), sglang_version)
    if key in _facts:
        return _facts[key]
    cached = Path(cache_dir) / "configcheck" / f"sglang-{sglang_version}.json"
    facts = _read_facts(cached, sglang_version)
    if facts is None:
        try:
            wheel = download_wheel(
                sglang_version, dest=Path(cache_dir) / "wheels", target=download_target(python_version, platform)
            )
        except IndexUnreachable:
            # Said once for the run by the pre-flight that found it (flags): this one only says it has no wheel.
            raise ConfigCheckError(f"no sglang {sglang_version} wheel to read: no index answers this host") from None
        except WheelUnavailable as exc:
            raise ConfigCheckError(str(exc)) from exc
        facts = facts_from_wheel(wheel, version=sglang_version)
        atomic_write(cached, json.dumps(facts.to_json(), indent=1, sort_keys=True) + "\n")
    _facts[key] = facts
    return facts


def _read_facts(path: Path, version: str) -> WheelFacts | None:
    try:
        data = json.loads(path.read_text())
        if data.get("schema") == SCHEMA and data.get("version") == version:
            return WheelFacts.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, torn or stale: read the wheel again
    return None


def facts_from_wheel(wheel: Path, *, version: str = "") -> WheelFacts:
    with zipfile.ZipFile(wheel) as zf:
        sources = {
            name: zf.read(name).decode("utf-8", errors="replace")
            for name in zf.namelist()
            if name.startswith("sglang/") and name.endswith(".py")
        }
    return dataclasses.replace(facts_from_sources(sources, version=version), wheel=Path(wheel).name)


def facts_from_sources(sources: Mapping[str, str], *, version: str = "") -> WheelFacts:
    """The facts from wheel-relative paths to source text (`sglang/srt/models/glm4_moe.py`, ...)."""
    registry = sources.get(REGISTRY, "")
    if "EntryClass" not in registry:
        raise ConfigCheckError(f"{REGISTRY} is not in the sources, or no longer reads EntryClass: the registry changed")
    archs: dict[str, str] = {}
    config_types: dict[str, str] = {}
    for path, text in sorted(sources.items()):
        folder, _, name = path.rpartition("/")
        if f"{folder}/" == MODELS and name != "registry.py" and "EntryClass" in text:
            for arch, line in _entry_classes(text).items():
                archs.setdefault(arch, f"{path}:{line}")
        elif path.startswith(CONFIGS) and "model_type" in text:
            for model_type, line in _config_types(text).items():
                config_types.setdefault(model_type, f"{path}:{line}")
    env, sgl_prefix = _env_index(sources)
    return WheelFacts(version=version, wheel="", archs=archs, config_types=config_types, env=env, sgl_prefix=sgl_prefix)


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None  # a file the server could not import either: it registers nothing


def _module_statements(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
    """A module's statements, those under a top-level `if`/`try` too (not inside functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _module_statements(node.body)
            yield from _module_statements(node.orelse)
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    yield from _module_statements(handler.body)
                yield from _module_statements(node.finalbody)


def _entry_classes(text: str) -> dict[str, int]:
    """{class `__name__`: line} of what a model module's `EntryClass` names (a class, or a list of them), its
    names followed through module-level aliases and `import ... as`."""
    tree = _parse(text)
    if tree is None:
        return {}
    renamed: dict[str, str] = {}  # a name in this module -> the name of the class it is
    for node in _module_statements(tree.body):
        if isinstance(node, ast.ImportFrom):
            renamed.update({alias.asname: alias.name for alias in node.names if alias.asname})
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _dotted_last(node.value)
            if value is not None and node.targets[0].id != "EntryClass":
                renamed[node.targets[0].id] = value
    found: dict[str, int] = {}
    for node in _module_statements(tree.body):
        entry: ast.expr | None = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            entry = node.value
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and isinstance(node.target, ast.Name):
            entry = node.value if node.target.id == "EntryClass" else None
        for name in _named(entry):
            for _ in range(8):  # an alias of an alias
                if name not in renamed:
                    break
                name = renamed[name]
            found.setdefault(name, node.lineno)
    return found


def _dotted_last(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _named(value: ast.expr | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return [name for item in value.elts for name in _named(item)]
    if isinstance(value, ast.BinOp):
        return _named(value.left) + _named(value.right)
    if isinstance(value, ast.Starred):
        return _named(value.value)
    name = _dotted_last(value)
    return [name] if name else []


def _config_types(text: str) -> dict[str, int]:
    """{model_type: line} of the config classes a module defines (`model_type = "x"` in a class body)."""
    tree = _parse(text)
    found: dict[str, int] = {}
    for node in ast.walk(tree) if tree else ():
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "model_type" for t in statement.targets)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.setdefault(statement.value.value, statement.lineno)
    return found


def _env_index(sources: Mapping[str, str]) -> tuple[dict[str, tuple[EnvRef, ...]], str]:
    """Every SGL(ANG)_* name the server's sources name, where and how; and where SGL_* is copied to SGLANG_*."""
    refs: dict[str, list[EnvRef]] = {}
    sgl_prefix = ""
    for path, text in sorted(sources.items()):
        if path.startswith(NOT_SERVED) or "SGL" not in text:
            continue
        special = _deprecation_sites(path, text) if "deprecat" in text else {}
        for lineno, line in enumerate(text.splitlines(), 1):
            if "SGL" not in line:
                continue
            code = _without_comment(line)
            if not sgl_prefix and _SGL_PREFIX.search(code):
                sgl_prefix = f"{path}:{lineno}"
            for match in _TOKEN.finditer(code):
                name = match.group(1)
                ref = special.get((lineno, name))
                if ref is None:
                    role = "is_set" if code[match.end() :].startswith(".is_set(") else "read"
                    ref = EnvRef(file=path, line=lineno, role=role)
                kept = refs.setdefault(name, [])
                if sum(r.role == ref.role for r in kept) < MAX_REFS:
                    kept.append(ref)
    return {name: tuple(kept) for name, kept in refs.items()}, sgl_prefix


def _deprecation_sites(path: str, text: str) -> dict[tuple[int, str], EnvRef]:
    """{(line, name): ref} of the names a module declares deprecated: `deprecated_name="OLD"` of a field
    assigned to NEW (0.5.15+ `EnvIntWithAlias`), and the arguments of its own deprecation helpers
    (`_print_deprecated_env`, whose parameters say which is old and which new: 0.5.6 takes (new, old), 0.5.17
    (old, new))."""
    tree = _parse(text)
    if tree is None:
        return {}
    helpers = {
        node.name: [a.arg for a in node.args.args]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and "deprecat" in node.name.lower()
    }
    sites: dict[tuple[int, str], EnvRef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            target = node.targets[0]
            for keyword in node.value.keywords:
                old = _env_constant(keyword.value)
                if keyword.arg == "deprecated_name" and old and isinstance(target, ast.Name):
                    sites[(keyword.value.lineno, old)] = EnvRef(
                        file=path, line=keyword.value.lineno, role="alias", target=target.id
                    )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers:
            params = helpers[node.func.id]
            bound: dict[str, ast.expr] = dict(zip(params, node.args, strict=False))
            bound.update({k.arg: k.value for k in node.keywords if k.arg})
            old_param = next((p for p in params if p.startswith("old")), params[0] if params else "")
            new_param = next((p for p in params if p.startswith("new")), "")
            old, new = _env_constant(bound.get(old_param)), _env_constant(bound.get(new_param))
            if old:
                line = bound[old_param].lineno
                sites[(line, old)] = EnvRef(file=path, line=line, role="deprecated", target=new or "")
            if new:
                line = bound[new_param].lineno
                sites[(line, new)] = EnvRef(file=path, line=line, role="mention", target=old or "")
    return sites


def _env_constant(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_NAME.match(node.value):
        return node.value
    return None


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a comment (not one inside a string literal)."""
    quote = ""
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:i]
    return line


# ------------------------------------------------------------------------------ environment variables


def env_warnings(facts: WheelFacts, server_env: Mapping[str, str]) -> list[str]:
    """A warning for each SGL(ANG)_* variable of the server's environment that this release never reads, or
    reads only under another name; variables of other programs (HF_*, CUDA_*, NCCL_*) are not sglang's."""
    release = f"sglang {facts.version}"
    warnings = []
    for name in sorted(server_env):
        if not ENV_NAME.match(name):
            continue
        refs = facts.env.get(name, ())
        if any(r.role in ("read", "is_set") for r in refs):
            continue
        alias = next((r for r in refs if r.role == "alias"), None)
        deprecated = next((r for r in refs if r.role == "deprecated"), None)
        if alias is not None:
            new = alias.target
            message = f"{name} is read by {release} only as the deprecated alias of {new} ({alias.where})"
            is_set = next((r for r in facts.env.get(new, ()) if r.role == "is_set"), None)
            if is_set is not None:
                message += f": `get()` falls back to it, but `is_set()` asks the new name only ({is_set.where})"
            warnings.append(f"{message}; set {new}")
        elif deprecated is not None and deprecated.target:
            warnings.append(
                f"{name} is deprecated in {release} ({deprecated.where}): read only to be copied to "
                f"{deprecated.target} when sglang starts; set {deprecated.target}"
            )
        elif deprecated is not None:
            warnings.append(f"{name} is deprecated in {release} ({deprecated.where}): it only warns")
        elif name.startswith("SGL_") and facts.sgl_prefix and _reads(facts, "SGLANG_" + name.removeprefix("SGL_")):
            new = "SGLANG_" + name.removeprefix("SGL_")
            warnings.append(f"{name} is read by {release} only as {new} ({facts.sgl_prefix} copies SGL_* over)")
        else:
            warnings.append(
                f"{release} never reads {name}: no source file of {facts.wheel or 'its wheel'} names it "
                f"(outside {', '.join(NOT_SERVED)})"
            )
    return warnings


def _reads(facts: WheelFacts, name: str) -> bool:
    return any(r.role in ("read", "is_set") for r in facts.env.get(name, ()))
