"""The code and data one pre-flight stage runs, found by reading its sources (`ast`), never by a list kept by
hand: a new pre-flight in an engine's hooks module is covered by what it reads, and a change to one stage's
code leaves the other stages' keys as they were (`run/reuse.py`).

- a hook defined in a submodule of the engine's hooks package: that module, every module of the package it
  imports (followed through those too), and every file of the package a module names by a string literal
  (`probe.toml`, a script run in another interpreter);
- a hook defined in the hooks module itself (sglang's `flags` and `trace` in its `__init__`): that
  function's own source and, followed the same way, the module-level functions, classes and constants it
  names, and the package's modules it names (not the whole `__init__`, which holds every hook);
- the engine data fields the stage's sources read (`engine.trace_modes`, `inp.package(...)` reads the pins
  and the requirements), so a data field only another stage reads leaves its key alone;
- whether it reads the model's config files (`model_config`) or runs in the installed lock (`.python`).

Code outside the engine's package (the harness's plumbing, the verdict format, the classifier) is in no
stage's key: a verdict's class is named again at reuse (`stages/naming.py`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from servematrix.engines import Engine

# Methods and helpers that read engine data fields by other names.
_READS = {
    "axis_package": ("requirements",),
    "version_axis": ("axes",),
    "launch_argv": ("launch",),
    "package": ("requirements", "pins"),  # PreflightInput.package: the lock's version, else the axis or pin
}
_ATTRIBUTE = re.compile(r"\.(\w+)\b")


@dataclass(frozen=True, kw_only=True)
class StageCode:
    """What one hook stage runs: its sources by label (module or module:function) and their digest, the
    engine data fields it reads, and whether it reads the model config or the installed lock."""

    sources: dict[str, str]  # label -> sha256 of its bytes
    engine_fields: tuple[str, ...]
    model_config: bool
    environment: bool

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(sorted(self.sources.items())).encode()).hexdigest()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Reader:
    """Follows one hook's references through its engine's hooks package."""

    def __init__(self, root: str) -> None:
        self.root = root  # the hooks module (a package or a single module)
        spec = importlib.util.find_spec(root)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        self.package = origin is not None and origin.name == "__init__.py"
        self.folder = origin.parent if origin is not None else None
        self.sources: dict[str, str] = {}
        self.texts: list[str] = []
        self._trees: dict[str, tuple[ast.Module, str, Path]] = {}

    def within(self, module: str) -> bool:
        return module == self.root or (self.package and module.startswith(self.root + "."))

    def _tree(self, module: str) -> tuple[ast.Module, str, Path] | None:
        if module not in self._trees:
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):  # `from module import name`: not a module
                spec = None
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                return None
            path = Path(spec.origin)
            text = path.read_text(encoding="utf-8")
            self._trees[module] = (ast.parse(text), text, path)
        return self._trees[module]

    def _bindings(self, module: str) -> dict[str, tuple[str, str | None] | ast.AST]:
        """Module-level names: an import (module, attribute or None) or the defining node."""
        found = self._tree(module)
        if found is None:
            return {}
        tree, _, path = found
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: dict[str, tuple[str, str | None] | ast.AST] = {}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.partition(".")[0]] = (alias.name, None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    names[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
        return names

    def module(self, module: str) -> None:
        """A whole module of the package, and what it imports of the package and names of its files."""
        if module in self.sources or not self.within(module):
            return
        found = self._tree(module)
        if found is None:
            return
        tree, text, _ = found
        self.sources[module] = _digest(text.encode())
        self.texts.append(text)
        self._files(tree)
        for bound in self._bindings(module).values():
            if isinstance(bound, tuple):
                self._import(*bound)

    def _import(self, base: str, name: str | None) -> None:
        if name is not None and self.within(f"{base}.{name}") and self._tree(f"{base}.{name}") is not None:
            self.module(f"{base}.{name}")  # `from package import submodule`
        elif self.within(base):
            self.module(base)

    def definition(self, module: str, name: str) -> None:
        """One module-level definition, and what it names, followed (a hook in the hooks module itself)."""
        label = f"{module}:{name}"
        if label in self.sources:
            return
        found = self._tree(module)
        bindings = self._bindings(module)
        node = bindings.get(name)
        if found is None or not isinstance(node, ast.AST):
            self.module(module)
            return
        segment = ast.get_source_segment(found[1], node) or ""
        self.sources[label] = _digest(segment.encode())
        self.texts.append(segment)
        self._files(node)
        for used in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
            bound = bindings.get(used)
            if isinstance(bound, tuple):
                self._import(*bound)
            elif isinstance(bound, ast.AST) and used != name:
                self.definition(module, used)

    def _files(self, node: ast.AST) -> None:
        """Files of the package a string literal names (its data, a script it runs elsewhere)."""
        if self.folder is None:
            return
        for literal in (n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)):
            if "/" in literal or not literal or len(literal) > 200 or literal == "__init__.py":
                continue
            candidate = self.folder / literal
            if candidate.is_file() and literal not in self.sources:
                self.sources[literal] = _digest(candidate.read_bytes())
                if candidate.suffix == ".py":
                    self.texts.append(candidate.read_text(encoding="utf-8"))


def _engine_fields(texts: Iterator[str] | list[str]) -> tuple[str, ...]:
    fields = set(Engine.model_fields)
    found: set[str] = {"name"}
    for text in texts:
        for word in _ATTRIBUTE.findall(text):
            if word in fields and re.search(rf"engine\.{word}\b", text):
                found.add(word)
            found.update(_READS.get(word, ()) if word in _READS else ())
    return tuple(sorted(found))


def stage_code(engine: Engine, hook: Callable[..., Any]) -> StageCode:
    """What the hook `hook` of `engine`'s hooks module runs (see the module doc)."""
    reader = _Reader(engine.hooks)
    module_name = getattr(hook, "__module__", "") or ""
    name = getattr(hook, "__name__", "")
    if module_name == engine.hooks and name and _is_defined(module_name, name):
        reader.definition(module_name, name)
    elif reader.within(module_name):
        reader.module(module_name)
    else:  # defined elsewhere (a partial, a lambda's module): the whole hooks module, as before
        reader.module(engine.hooks)
    text = "\n".join(reader.texts)
    return StageCode(
        sources=reader.sources,
        engine_fields=_engine_fields(reader.texts),
        model_config="model_config" in text,
        environment=re.search(r"\.python\b", text) is not None,
    )


def _is_defined(module_name: str, name: str) -> bool:
    module: ModuleType | None = sys.modules.get(module_name)  # the hook's module: imported already
    value = getattr(module, name, None)
    return module is not None and value is not None and inspect.getmodule(value) is module
