"""The command-line flags an sglang release declares, read with `ast` from its sources (never imported).

sglang has declared its server flags three ways, and a release may mix them:

1. `parser.add_argument("--flag", "--alias", ...)` calls in `ServerArgs.add_cli_args`
   (`sglang/srt/server_args.py`; every flag up to 0.5.13, the deprecated and dynamic ones after).
2. From 0.5.14, `add_cli_args_from_dataclass(parser, ServerArgs)`: every field annotated
   `A[T, "help"]` or `A[T, Arg(...)]` becomes `--field-name` (or `Arg(cli_name=...)`), plus
   `Arg(aliases=[...])`, unless `Arg(no_cli=True)`. `Literal[...]` annotations give the choices when
   `Arg(choices=...)` does not.
3. From 0.5.20 the fields live in namespace classes under `sglang/srt/arg_groups/fields/*.py`, which
   `server_args.py` gathers with `collect_input_fields([...])` into `ServerArgs`.

`action=argparse.BooleanOptionalAction` adds a `--no-...` form; `action=Deprecated...Action` flags are
accepted (with a warning) and reported as deprecated. `choices=` is resolved when it is statically
closed: a literal, a module constant (followed through imports inside the wheel) that nothing in the
wheel mutates, a class constant such as `Backend.ALL`, or concatenations of those. Choices computed at
run time (plugin-extendable lists, parser registries) are left out, meaning "not checked".
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

SERVER_ARGS = "sglang/srt/server_args.py"
ENTRY_CLASS = "ServerArgs"
ENTRY_METHOD = "add_cli_args"
DATACLASS_HELPER = "add_cli_args_from_dataclass"
NAMESPACE_COLLECTOR = "collect_input_fields"
ANNOTATED = frozenset({"A", "Annotated"})
META_SKIP = frozenset({"NS", "Derived"})  # Annotated metadata that is not CLI metadata
MUTATORS = ("append", "extend", "add", "insert", "update")


class UnreadableSource(RuntimeError):
    """The sources do not look like an sglang server (no server_args.py, or no parser in it)."""


class _Unresolvable(Exception):
    pass


@dataclass
class _Module:
    path: str
    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    constants: dict[str, ast.expr] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)


class SourceReader:
    def __init__(self, sources: Mapping[str, str]):
        self.sources = sources
        self.modules: dict[str, _Module | None] = {}
        self.flags: set[str] = set()
        self.deprecated: set[str] = set()
        self.choices: dict[str, tuple[str, ...]] = {}
        self.multi_value: set[str] = set()
        self.extendable: set[str] = set()
        self._mutated: dict[str, bool] = {}

    # -- modules ------------------------------------------------------------------------------------

    def module(self, dotted: str) -> _Module | None:
        if dotted in self.modules:
            return self.modules[dotted]
        base = dotted.replace(".", "/")
        path = next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.sources), None)
        mod = self._parse(path, dotted) if path else None
        self.modules[dotted] = mod
        return mod

    def _parse(self, path: str, dotted: str) -> _Module | None:
        try:
            tree = ast.parse(self.sources[path], filename=path)
        except (SyntaxError, RecursionError, MemoryError):  # a crafted expression of 200k terms: RecursionError
            return None
        mod = _Module(path=path, name=dotted, tree=tree)
        package = dotted if path.endswith("__init__.py") else dotted.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                mod.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        mod.constants[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                mod.constants[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, package)
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = (source, alias.name)
        return mod

    # -- collection ---------------------------------------------------------------------------------

    def collect(self) -> None:
        mod = self.module(SERVER_ARGS[:-3].replace("/", "."))
        if mod is None:
            raise UnreadableSource(f"{SERVER_ARGS} does not parse")
        cls = mod.classes.get(ENTRY_CLASS)
        method = _method(cls, ENTRY_METHOD) if cls else None
        if method is None:
            raise UnreadableSource(f"{ENTRY_CLASS}.{ENTRY_METHOD} not found in {SERVER_ARGS}")
        self._walk_function(method, mod, cls, seen=set())

    def _walk_function(self, fn: ast.FunctionDef, mod: _Module, cls: ast.ClassDef | None, seen: set) -> None:
        key = (mod.name, cls.name if cls else "", fn.name)
        if key in seen:
            return
        seen.add(key)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "add_argument":
                self._add_argument(node, mod)
            elif _callee_name(func) == DATACLASS_HELPER and len(node.args) >= 2:
                self._add_dataclass(node, mod)
            else:
                # Helpers that receive the parser (e.g. `_add_foo_args(parser)`), defined in this module.
                target = self._local_callee(func, mod, cls)
                if target is not None and _passes_parser(node):
                    self._walk_function(target[0], mod, target[1], seen)

    def _local_callee(
        self, func: ast.expr, mod: _Module, cls: ast.ClassDef | None
    ) -> tuple[ast.FunctionDef, ast.ClassDef | None] | None:
        if isinstance(func, ast.Name) and func.id in mod.functions:
            return mod.functions[func.id], None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = mod.classes.get(func.value.id) if func.value.id not in ("cls", "self") else cls
            method = _method(owner, func.attr) if owner else None
            if method is not None:
                return method, owner
        return None

    def _add_argument(self, call: ast.Call, mod: _Module) -> None:
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        options = [n for n in names if n.startswith("-")]
        if not options:
            return
        kwargs = {kw.arg: kw.value for kw in call.keywords if kw.arg}
        self._register(options, kwargs, mod, literal_choices=None, many=_nargs_many(kwargs.get("nargs")))

    def _register(
        self,
        options: list[str],
        kwargs: Mapping[str, ast.expr],
        mod: _Module,
        *,
        literal_choices: tuple[str, ...] | None,
        many: bool,
    ) -> None:
        action = kwargs.get("action")
        action_name = _last_name(action) if action is not None else ""
        flags = list(options)
        if action_name == "BooleanOptionalAction":
            flags += ["--no-" + o[2:] for o in options if o.startswith("--")]
        self.flags.update(flags)
        if action_name.startswith("Deprecated"):
            self.deprecated.update(flags)
        values, notes = literal_choices, set[str]()
        if "choices" in kwargs:
            try:
                values = _as_choices(self.resolve(kwargs["choices"], mod, scope=None, notes=notes))
            except _Unresolvable:
                values = None
        if values is not None and action_name not in ("store_true", "store_false", "BooleanOptionalAction"):
            for option in options:
                self.choices[option] = values
                if "extendable" in notes:
                    self.extendable.add(option)
        if many:
            self.multi_value.update(options)

    # -- dataclass fields (0.5.14+) -----------------------------------------------------------------

    def _add_dataclass(self, call: ast.Call, mod: _Module) -> None:
        only = None
        for kw in call.keywords:
            if kw.arg == "fields":
                try:
                    only = {str(v) for v in self.resolve(kw.value, mod, scope=None)}
                except _Unresolvable:
                    only = None
        found = self.find_class(call.args[1], mod)
        if found is None:
            return
        for field_node, field_mod in self._record_fields(*found, depth=0):
            name = field_node.target.id  # type: ignore[union-attr]
            if only is not None and name not in only:
                continue
            self._add_field(name, field_node.annotation, field_mod)

    def _record_fields(
        self, cls: ast.ClassDef, mod: _Module, *, depth: int, seen: set[tuple[str, str]] | None = None
    ) -> Iterator[tuple[ast.AnnAssign, _Module]]:
        # Each class once: a base named twice, at every level, made this walk exponential (10 bases: hours).
        seen = set() if seen is None else seen
        if depth > 8 or (mod.name, cls.name) in seen:
            return
        seen.add((mod.name, cls.name))
        for base in cls.bases:  # inherited fields first, as dataclasses and msgspec order them
            found = self.find_class(base, mod)
            if found is not None:
                yield from self._record_fields(*found, depth=depth + 1, seen=seen)
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                yield node, mod
        if cls.name == ENTRY_CLASS:
            # 0.5.20+: ServerArgs is assembled from namespace classes passed to collect_input_fields(...).
            for source_cls, source_mod in self._namespace_classes(mod):
                yield from self._record_fields(source_cls, source_mod, depth=depth + 1, seen=seen)

    def _namespace_classes(self, mod: _Module) -> Iterator[tuple[ast.ClassDef, _Module]]:
        for node in mod.tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
            for call in ast.walk(value) if value is not None else ():
                if isinstance(call, ast.Call) and _callee_name(call.func) == NAMESPACE_COLLECTOR and call.args:
                    arg = call.args[0]
                    if isinstance(arg, ast.Name) and arg.id in mod.constants:
                        arg = mod.constants[arg.id]
                    for elt in arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else ():
                        found = self.find_class(elt, mod)
                        if found is not None:
                            yield found

    def _add_field(self, name: str, annotation: ast.expr, mod: _Module) -> None:
        if not (isinstance(annotation, ast.Subscript) and _last_name(annotation.value) in ANNOTATED):
            return
        parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if len(parts) < 2:
            return
        inner, meta = parts[0], None
        for item in parts[1:]:
            if isinstance(item, ast.Call) and _last_name(item.func) == "Arg":
                meta = {kw.arg: kw.value for kw in item.keywords if kw.arg}
                break
            if isinstance(item, ast.Call) and _last_name(item.func) in META_SKIP:
                continue
            if _is_string_expr(item):
                meta = {}
                break
        if meta is None:
            return
        if _is_true(meta.get("no_cli")):
            return
        cli_name = meta.get("cli_name")
        primary = cli_name.value if _is_string_constant(cli_name) else "--" + name.replace("_", "-")  # type: ignore[union-attr]
        options: list[str] = [str(primary)]
        if "aliases" in meta:
            with contextlib.suppress(_Unresolvable):
                options += [str(a) for a in self.resolve(meta["aliases"], mod, scope=None)]
        kwargs = {k: v for k, v in meta.items() if k in ("action", "choices", "nargs")}
        if "action" in kwargs:
            self._register(options, {"action": kwargs["action"]}, mod, literal_choices=None, many=False)
            return
        inner = _unwrap_optional(inner)
        literal = _literal_values(inner)
        if literal is not None:
            self._register(options, {k: v for k, v in kwargs.items() if k == "choices"}, mod,
                           literal_choices=literal, many=False)  # fmt: skip
            return
        if _last_name(getattr(inner, "value", None)) in ("List", "list") and "type_parser" not in meta:
            self._register(options, kwargs, mod, literal_choices=None, many=True)
            return
        if isinstance(inner, ast.Name) and inner.id == "bool":
            self._register(options, {"action": ast.Constant("store_true")}, mod, literal_choices=None, many=False)
            return
        self._register(options, kwargs, mod, literal_choices=None, many=_nargs_many(kwargs.get("nargs")))

    # -- constants ----------------------------------------------------------------------------------

    def find_class(self, expr: ast.expr, mod: _Module, depth: int = 0) -> tuple[ast.ClassDef, _Module] | None:
        if depth > 8 or not isinstance(expr, ast.Name):
            return None
        if expr.id in mod.classes:
            return mod.classes[expr.id], mod
        if expr.id in mod.imports:
            source, name = mod.imports[expr.id]
            other = self.module(source)
            if other is not None:
                return self.find_class(ast.Name(name), other, depth + 1)
        return None

    def resolve(
        self, expr: ast.expr, mod: _Module, *, scope: ast.ClassDef | None, notes: set | None = None, depth: int = 0
    ) -> list:
        """The values of a statically known expression, or _Unresolvable.

        A module constant that some module of the wheel mutates in place adds "extendable" to `notes`.
        """
        notes = notes if notes is not None else set()
        if depth > 12:
            raise _Unresolvable
        if isinstance(expr, ast.Constant):
            return [expr.value]
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            out: list = []
            for elt in expr.elts:
                value = elt.value if isinstance(elt, ast.Starred) else elt
                out += self.resolve(value, mod, scope=scope, notes=notes, depth=depth + 1)
            return sorted(out, key=str) if isinstance(expr, ast.Set) else out
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self.resolve(expr.left, mod, scope=scope, notes=notes, depth=depth + 1)
            return left + self.resolve(expr.right, mod, scope=scope, notes=notes, depth=depth + 1)
        if isinstance(expr, ast.Name):
            if scope is not None:
                bound = _class_constant(scope, expr.id)
                if bound is not None:
                    return self.resolve(bound, mod, scope=scope, notes=notes, depth=depth + 1)
            if expr.id in mod.constants:
                if self._is_mutated(expr.id, mod):
                    notes.add("extendable")
                return self.resolve(mod.constants[expr.id], mod, scope=None, notes=notes, depth=depth + 1)
            if expr.id in mod.imports:
                source, name = mod.imports[expr.id]
                other = self.module(source)
                if other is not None:
                    return self.resolve(ast.Name(name), other, scope=None, notes=notes, depth=depth + 1)
            raise _Unresolvable
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            found = self.find_class(expr.value, mod)
            if found is not None:
                bound = _class_constant(found[0], expr.attr)
                if bound is not None:
                    return self.resolve(bound, found[1], scope=found[0], notes=notes, depth=depth + 1)
        raise _Unresolvable

    def _is_mutated(self, name: str, mod: _Module) -> bool:
        """Whether any module of the wheel mutates this constant in place (plugin hooks extend choices)."""
        key = f"{mod.name}:{name}"
        if key not in self._mutated:
            # `NAME.extend(...)`, `add_x = NAME.extend` (0.5.20+), `NAME += [...]`, `NAME |= {...}`.
            pattern = re.compile(rf"\b{re.escape(name)}\s*(\.\s*(?:{'|'.join(MUTATORS)})\b|\+=|\|=)")
            self._mutated[key] = any(pattern.search(text) for text in self.sources.values() if name in text)
        return self._mutated[key]


# --------------------------------------------------------------------------------------------------
# AST helpers
# --------------------------------------------------------------------------------------------------


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".") if package else []
    base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join([*base, node.module] if node.module else base)


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    for node in cls.body if cls else ():
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _class_constant(cls: ast.ClassDef, name: str) -> ast.expr | None:
    """The last value bound to `name` in the class body (`ALL = (...)` or `ALL: tuple = (...)`)."""
    value = None
    for node in cls.body:
        if isinstance(node, ast.Assign):
            targets, bound = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, bound = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = bound
    return value


def _callee_name(func: ast.expr) -> str:
    return _last_name(func)


def _last_name(expr: ast.expr | None) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    return ""


def _passes_parser(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Name) and "parser" in a.id for a in call.args)


def _is_string_constant(expr: ast.expr | None) -> bool:
    return isinstance(expr, ast.Constant) and isinstance(expr.value, str)


def _is_true(expr: ast.expr | None) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is True


def _is_string_expr(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str)
    if isinstance(expr, ast.JoinedStr):
        return True
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Mod)):
        return _is_string_expr(expr.left)
    return False


def _unwrap_optional(expr: ast.expr) -> ast.expr:
    if isinstance(expr, ast.Subscript) and _last_name(expr.value) == "Optional":
        return expr.slice
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        sides = [s for s in (expr.left, expr.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(sides) == 1:
            return sides[0]
    if isinstance(expr, ast.Subscript) and _last_name(expr.value) == "Union":
        elts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        rest = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(rest) == 1:
            return rest[0]
    return expr


def _literal_values(expr: ast.expr) -> tuple[str, ...] | None:
    if not (isinstance(expr, ast.Subscript) and _last_name(expr.value) == "Literal"):
        return None
    elts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
    if not all(isinstance(e, ast.Constant) for e in elts):
        return None
    return _as_choices([e.value for e in elts])  # type: ignore[attr-defined]


def _as_choices(values: Iterable) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        text = str(value)
        if text not in out:
            out.append(text)
    return tuple(out)


def _nargs_many(expr: ast.expr | None) -> bool:
    if not isinstance(expr, ast.Constant):
        return False
    return expr.value in ("+", "*") or (isinstance(expr.value, int) and expr.value > 1)
