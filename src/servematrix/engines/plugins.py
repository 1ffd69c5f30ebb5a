"""From engine data to its hooks: the one place that imports an engine's hooks module.

`hooks_of` imports the module the data's `hooks` names, reads it against the contract (`engines/hooks.py`)
and checks every name in the data's `preflight` against it. The plan calls it (`plan.plan_spec`), so a
mistake is bad input at the data's line before anything runs, while reading engine data (loading a spec,
opening a store, rendering a report) imports no engine code.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib import resources
from types import ModuleType
from typing import Any

from servematrix.engines import Engine, engine_file
from servematrix.engines.hooks import GENERIC_PREFLIGHTS, HOOKSPECS, Hooks
from servematrix.errors import InputError
from servematrix.formats import tomlsource


def hooks_of(engine: Engine) -> Hooks:
    """The engine's hooks, checked against the contract and its data; an InputError at the data's line."""
    try:
        hooks = _module_hooks(engine.hooks)
    except (ImportError, _NotAHook) as exc:
        raise _data_error(engine, ("hooks",), f"cannot use the hooks module {engine.hooks!r}: {exc}") from None
    for i, name in enumerate(engine.preflight):
        if name not in GENERIC_PREFLIGHTS and name not in hooks.preflights:
            known = ", ".join((*GENERIC_PREFLIGHTS, *hooks.preflights))
            raise _data_error(
                engine,
                ("preflight", i),
                f"pre-flight {name!r} is neither generic nor one of {engine.hooks or 'the (absent) hooks module'}'s "
                f"PREFLIGHTS (known: {known})",
            )
    return hooks


class _NotAHook(Exception):
    """A hooks module attribute of the wrong shape for its HookSpec."""


def _module_hooks(module_name: str) -> Hooks:  # not cached: sys.modules is, and a test may swap a hook
    if not module_name:
        return Hooks()
    module = importlib.import_module(module_name)
    found = {spec.attribute: _read(module, spec.attribute, mapping=spec.mapping) for spec in HOOKSPECS}
    return Hooks(preflights=found["PREFLIGHTS"] or {}, preamble=found["preamble"], probe_entry=found["probe_entry"])


def _read(module: ModuleType, attribute: str, *, mapping: bool) -> Any:
    value = getattr(module, attribute, None)
    if value is None:
        return None
    if mapping:
        if not (isinstance(value, Mapping) and all(isinstance(k, str) and callable(v) for k, v in value.items())):
            raise _NotAHook(f"{attribute} must map names to functions")
        return value
    if not callable(value):
        raise _NotAHook(f"{attribute} must be a function")
    return value


def _data_error(engine: Engine, where: tomlsource.KeyPath, message: str) -> InputError:
    """`message` at the line of the engine's data file that wrote `where` (the file is read again only here)."""
    found = engine_file(engine.name)
    if found is None:
        return InputError(f"engine {engine.name}: {message}")
    with resources.as_file(found) as path:
        return tomlsource.load(path, what="engine data").error(where, message)
