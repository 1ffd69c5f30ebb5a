"""From engine data to its hooks: the one place that imports an engine's hooks module.

`hooks_of` imports the module the data's `hooks` names, reads it against the contract (`engines/hooks.py`):
each hook's shape and its signature, parameter by parameter, against its spec's `protocol` (as pluggy's
`_verify_hook`), and checks every name in the data's `preflight` against it. The plan calls it (`plan.plan_spec`), so a
mistake is bad input at the data's line before anything runs, while reading engine data (loading a spec,
opening a store, rendering a report) imports no engine code.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from importlib import resources
from types import ModuleType
from typing import Any

from servematrix.engines import Engine, engine_file
from servematrix.engines.hooks import GENERIC_PREFLIGHTS, HOOKSPECS, Hooks, HookSpec
from servematrix.errors import InputError
from servematrix.formats import tomlsource


def hooks_of(engine: Engine) -> Hooks:
    """The engine's hooks, checked against the contract and its data; an InputError at the data's line."""
    try:
        hooks = _module_hooks(engine.hooks)
    except (ImportError, _NotAHook) as exc:
        raise _data_error(engine, ("hooks",), f"cannot use the hooks module {engine.hooks!r}: {exc}") from None
    except _WrongSignature as exc:
        message = f"engine {engine.name}: the hooks module {engine.hooks!r}: {exc}"
        raise _data_error(engine, ("hooks",), message) from None
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


class _WrongSignature(Exception):
    """A hook whose parameters are not its spec's: the runner's call would fail, or pass the wrong thing."""


def _module_hooks(module_name: str) -> Hooks:  # not cached: sys.modules is, and a test may swap a hook
    if not module_name:
        return Hooks()
    module = importlib.import_module(module_name)
    found = {spec.attribute: _read(module, spec.attribute, mapping=spec.mapping) for spec in HOOKSPECS}
    for spec in HOOKSPECS:
        value = found[spec.attribute]
        named = value.items() if spec.mapping and value else [(None, value)] if value else []
        for key, hook in named:
            problem = signature_problem(spec, hook)
            if problem is not None:
                where = spec.attribute if key is None else f"{spec.attribute}[{key!r}]"
                raise _WrongSignature(f"hook {where} ({_qualname(hook)}): {problem}")
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


def signature_problem(spec: HookSpec, hook: Any) -> str | None:
    """What in `hook`'s parameters differs from its spec's `protocol`, naming the parameter; None when it can be
    called as the runner calls it, with the spec's names. Checked by name (pluggy's `_verify_hook`): the i-th
    positional parameter is the spec's i-th, each keyword parameter of the spec is one of the hook's, and the
    hook requires nothing more. A callable whose signature cannot be read (a builtin) is not checked."""
    wanted = list(inspect.signature(spec.protocol.__call__).parameters.values())[1:]  # less `self`
    try:
        params = list(inspect.signature(hook).parameters.values())
    except (TypeError, ValueError):
        return None
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in positional_kinds]
    keywords = {p.name: p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    any_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    spec_positional = [p.name for p in wanted if p.kind in positional_kinds]
    spec_keywords = [p.name for p in wanted if p.kind is p.KEYWORD_ONLY]
    shape = f"{spec.protocol.__name__}({_parameters(wanted)})"
    for i, name in enumerate(spec_positional):
        if i < len(positional) and positional[i].name != name:
            return f"parameter {positional[i].name!r} is not the spec's {name!r} (position {i + 1} of {shape})"
        if i >= len(positional) and not any_args:
            return f"parameter {name!r} of {shape} is missing"
    for param in positional[len(spec_positional) :]:
        if param.default is param.empty and param.name not in spec_keywords:
            return f"parameter {param.name!r} is not in {shape}"
    for name in spec_keywords:
        if name not in keywords and not any_kwargs:
            return f"keyword parameter {name!r} of {shape} is missing"
    for param in params:
        if param.kind is param.KEYWORD_ONLY and param.default is param.empty and param.name not in spec_keywords:
            return f"parameter {param.name!r} is not in {shape}"
    return None


def _parameters(params: list[inspect.Parameter]) -> str:
    shown: list[str] = []
    for param in params:
        if param.kind is param.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        shown.append(param.name)
    return ", ".join(shown)


def _qualname(hook: Any) -> str:
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


def _data_error(engine: Engine, where: tomlsource.KeyPath, message: str) -> InputError:
    """`message` at the line of the engine's data file that wrote `where` (the file is read again only here)."""
    found = engine_file(engine.name)
    if found is None:
        return InputError(f"engine {engine.name}: {message}")
    with resources.as_file(found) as path:
        return tomlsource.load(path, what="engine data").error(where, message)
