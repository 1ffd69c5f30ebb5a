"""The package's shape: no module imports another that imports it back, by any import that runs: at module
level, inside a function, in the `else` of `if TYPE_CHECKING:`, relative, a package's `__init__` run by
importing one of its modules, or `importlib.import_module`/`__import__` of a literal name or of a module
that engine data names. Only `if TYPE_CHECKING:` bodies are left out (they never run). So each module can be
read, tested and replaced alone, and reading engine data loads no engine code.

And imports run one way: the packages form layers (`LAYERS`, lowest first, said once here and in
docs/architecture.md), and no module imports one of a higher layer."""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "src" / "servematrix"


def _engine_data_modules(package: Path) -> dict[str, set[str]]:
    """The modules engine data names, by what imports them: hooks modules and model builder modules."""
    hooks: set[str] = set()
    builders: set[str] = set()
    for path in sorted((package / "data" / "engines").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if data.get("hooks"):
            hooks.add(data["hooks"])
        builders |= {entry.partition(":")[0] for entry in data.get("model_builders", {}).values()}
    return {"hooks": hooks, "builders": builders}


def dynamic_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """What each module that imports a computed name can import. A computed import anywhere else fails the
    test: its targets must be said here, or the graph would not see them."""
    named = _engine_data_modules(package)
    return {
        "servematrix.engines.plugins": named["hooks"],  # engine data's `hooks`
        "servematrix.run.models": named["builders"],  # engine data's `model_builders`
        # Runs as a script in a cell's environment and imports flashinfer's modules, never servematrix.
        "servematrix.engines.sglang.probe_script": set(),
    }


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: an `if TYPE_CHECKING:` body is skipped, its `else` is not."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:
                yield branch
                yield from _runtime_nodes(branch)
            continue
        yield child
        yield from _runtime_nodes(child)


def _importlib_call(node: ast.Call, aliases: set[str]) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module" and ast.unparse(func.value) in ("importlib", "importlib.util")
    return isinstance(func, ast.Name) and (func.id == "__import__" or func.id in aliases)


def _absolute(name: str, level: int, importer: str, is_package: bool) -> str:
    """`name` imported with `level` leading dots from `importer`, as an absolute module name."""
    if level == 0:
        return name
    base = importer.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join([*base, name] if name else base)


@functools.cache
def _parse(text: str) -> ast.Module:  # a planted copy differs from the package in one file
    return ast.parse(text)


class UndeclaredDynamicImport(AssertionError):
    pass


def import_graph(package: Path = PACKAGE, dynamic: Mapping[str, set[str]] | None = None) -> dict[str, set[str]]:
    dynamic = dynamic_imports(package) if dynamic is None else dynamic
    paths = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        tree = _parse(path.read_text(encoding="utf-8"))
        # `from importlib import import_module [as x]`: calls of x are importlib calls.
        aliases = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "importlib"
            for alias in node.names
            if alias.name == "import_module"
        }
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node.module or "", node.level, name, is_package)
                for alias in node.names:
                    child = f"{module}.{alias.name}"
                    targets.add(child if child in paths else module)
            elif isinstance(node, ast.Call) and _importlib_call(node, aliases) and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    package_kw = next((k.value for k in node.keywords if k.arg == "package"), None)
                    package_kw = node.args[1] if len(node.args) > 1 else package_kw
                    level = len(arg.value) - len(arg.value.lstrip("."))
                    anchor = package_kw.value if isinstance(package_kw, ast.Constant) and level else name
                    targets.add(_absolute(arg.value.lstrip("."), level, anchor, is_package or anchor != name))
                elif name in dynamic:
                    targets |= dynamic[name]
                else:
                    raise UndeclaredDynamicImport(
                        f"{path}:{node.lineno}: {name} imports a computed name ({ast.unparse(arg)}); say in "
                        "dynamic_imports what it can import"
                    )
        deps: set[str] = set()
        for target in targets:
            parts = target.split(".")
            # The deepest known module the name reaches, and the packages above it, whose __init__ runs
            # first, unless the importer is inside that package (it already ran).
            for i in range(len(parts), 0, -1):
                module = ".".join(parts[:i])
                if module in paths and (i == len(parts) or not name.startswith(module + ".")):
                    deps.add(module)
        graph[name] = {d for d in deps if d != name and d in paths}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The layers, lowest first: a module may import its own layer's modules and those of lower layers, never a
# higher one. Each is a top-level module or a package (with everything under it); docs/architecture.md has
# one section per entry, in this order. A new package or top-level module must be placed here.
LAYERS = (
    "servematrix.errors",  # and the root package's __init__ (its version), under everything
    "servematrix.util",
    "servematrix.data",  # packaged data files, no code
    "servematrix.records",  # cells, typed rows, history entries and the published cell: pure data, no engine
    "servematrix.formats",
    "servematrix.engines",
    "servematrix.config",
    "servematrix.store",
    "servematrix.planning",
    "servematrix.classify",
    "servematrix.advisories",  # reads plans, locks and the model config; report/ and the pre-flight read it
    "servematrix.backends",
    "servematrix.stages",
    "servematrix.options",  # the command line's declarations: imports nothing above the stages' names
    "servematrix.evidence",  # what sibling GPUs and advisories say of a cell: report/ shows it, recommend ranks by it
    "servematrix.report",
    "servematrix.run",
    "servematrix.bisection",
    "servematrix.releases",  # the release watcher: reads the index as bisection does, writes matrix files
    "servematrix.scaleout",
    "servematrix.cli",
    "servematrix.__main__",
)


def layer_of(module: str) -> int:
    if module == "servematrix":
        return 0
    for index, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    raise AssertionError(f"{module} is in no layer: place its package or module in LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of a module of a higher layer than the importer's, as (importer, imported); every module
    must have a layer."""
    layer = {module: layer_of(module) for module in graph}
    return sorted((a, b) for a, deps in graph.items() for b in deps if layer[b] > layer[a])


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_servematrix_imports_itself_back():
    graph = import_graph()
    assert "servematrix.run.pipeline" in graph and "servematrix.engines.sglang" in graph
    # The graph sees the run-time imports of plugins: the engine data's hooks module.
    assert "servematrix.engines.sglang" in graph["servematrix.engines.plugins"]
    assert cycles(graph) == []


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for module in graph[todo.pop()] - seen:
            seen.add(module)
            todo.append(module)
    return seen


def test_the_engine_contract_and_data_load_no_engine_code():
    graph = import_graph()
    assert graph["servematrix.engines.hooks"] == set()  # types only (TYPE_CHECKING)
    assert graph["servematrix.engines"] <= {
        "servematrix.errors",
        "servematrix.formats",
        "servematrix.formats.tomlsource",
    }
    assert "servematrix.planning.cells" not in graph["servematrix.engines.sglang"]
    # Whatever runs, a spec, a store and the report's inputs reach no hooks module, nor the module that loads one.
    engine_code = {"servematrix.engines.plugins", *dynamic_imports()["servematrix.engines.plugins"]}
    for reader in ("servematrix.config.spec", "servematrix.store.store", "servematrix.report.publish"):
        assert not _reachable(graph, reader) & engine_code, reader


@pytest.fixture
def package_copy(tmp_path) -> Path:
    copy = tmp_path / "servematrix"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _plant(package: Path, module: str, text: str) -> None:
    path = package / module
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + text, encoding="utf-8")


@pytest.mark.parametrize(
    ("module", "planted", "circle"),
    [
        pytest.param(
            "store/store.py",
            "def _planted():\n    from servematrix.run.pipeline import run_plan\n",
            {"servematrix.store.store", "servematrix.run.pipeline"},
            id="inside-a-function",
        ),
        pytest.param(
            "engines/__init__.py",
            "def _planted():\n    import importlib\n    return importlib.import_module('servematrix.planning.cells')\n",
            {"servematrix.engines", "servematrix.planning.cells"},
            id="importlib-literal",
        ),
        pytest.param(
            "engines/__init__.py",
            "from importlib import import_module as _im\n\n\ndef _planted():\n    return _im('.spec', 'servematrix.config')\n",
            {"servematrix.engines", "servematrix.config.spec"},
            id="import-module-alias-relative",
        ),
        pytest.param(
            "errors.py",
            "if TYPE_CHECKING:\n    pass\nelse:\n    from .planning.cells import Cell\n",
            {"servematrix.errors", "servematrix.planning.cells"},
            id="type-checking-else-relative",
        ),
        pytest.param(
            "formats/tomlsource.py",
            "def _planted():\n    import servematrix.config.spec.x\n",
            {"servematrix.formats.tomlsource", "servematrix.config.spec"},
            id="dotted-import",
        ),
    ],
)
def test_a_planted_run_time_circle_is_found(package_copy, module, planted, circle):
    # The copy is the package, which has no circle (test_no_module_of_servematrix_imports_itself_back).
    _plant(package_copy, module, planted)
    found = cycles(import_graph(package_copy))
    assert any(circle <= set(component) for component in found), found


def test_the_circle_of_a_data_named_hooks_module_is_found(package_copy):
    # The circle this test missed: the loader imported the hooks module its data names (importlib, a
    # computed name), and sglang's hooks imported the cells, which import the spec, which loads engines.
    _plant(
        package_copy,
        "engines/__init__.py",
        "def _planted(name):\n    import importlib\n    return importlib.import_module(name)\n",
    )
    _plant(package_copy, "engines/sglang/__init__.py", "from servematrix.planning.cells import Cell\n")
    with pytest.raises(UndeclaredDynamicImport, match=r"servematrix\.engines imports a computed name"):
        import_graph(package_copy)
    dynamic = {**dynamic_imports(package_copy), "servematrix.engines": {"servematrix.engines.sglang"}}
    found = cycles(import_graph(package_copy, dynamic))
    assert any(
        {"servematrix.engines", "servematrix.engines.sglang", "servematrix.planning.cells"} <= set(c) for c in found
    )


def test_a_package_init_counts_as_imported_by_its_modules_importers(package_copy):
    # Importing servematrix.engines.sglang.flagsurface runs engines/sglang/__init__.py (sglang's hooks) first.
    _plant(
        package_copy,
        "store/store.py",
        "def _planted():\n    from servematrix.engines.sglang.flagsurface import flag_check\n",
    )
    graph = import_graph(package_copy)
    assert {"servematrix.engines.sglang", "servematrix.engines.sglang.flagsurface"} <= graph["servematrix.store.store"]


def test_every_module_has_a_layer_and_none_imports_a_higher_one():
    graph = import_graph()
    assert {layer_of(module) for module in graph} == set(range(len(LAYERS)))  # each layer holds a module
    assert upward_imports(graph) == []


@pytest.mark.parametrize(
    ("module", "planted", "upward"),
    [
        pytest.param(
            "formats/lockfile.py",
            "from servematrix.report.rows import version_key\n",
            ("servematrix.formats.lockfile", "servematrix.report.rows"),
            id="module-level",
        ),
        pytest.param(
            "store/store.py",
            "def _planted():\n    from servematrix.planning import schedule\n",
            ("servematrix.store.store", "servematrix.planning.schedule"),
            id="inside-a-function",
        ),
        pytest.param(
            "stages/build.py",
            "def _planted():\n    import importlib\n    return importlib.import_module('servematrix.run.hostinfo')\n",
            ("servematrix.stages.build", "servematrix.run.hostinfo"),
            id="importlib-literal",
        ),
    ],
)
def test_a_planted_upward_import_is_found(package_copy, module, planted, upward):
    # The copy is the package, which has no upward import (the test above); the planted one makes no circle.
    _plant(package_copy, module, planted)
    graph = import_graph(package_copy)
    found = upward_imports(graph)
    assert upward in found and {importer for importer, _ in found} == {upward[0]}, found
    assert not any(set(upward) <= set(component) for component in cycles(graph))


def test_a_module_outside_every_layer_is_refused(package_copy):
    (package_copy / "newpart").mkdir()
    (package_copy / "newpart" / "__init__.py").write_text('"""A package nobody placed."""\n', encoding="utf-8")
    with pytest.raises(AssertionError, match=r"servematrix\.newpart is in no layer"):
        upward_imports(import_graph(package_copy))


SPEC_AND_STORE_ONLY = """
import sys
from servematrix.config.spec import load_spec
from servematrix.store.store import Store
load_spec(sys.argv[1])
with Store(sys.argv[2]) as store:
    store.record(
        run_id="r", cell_id="c", env_id="e", engine="sglang", mode="static", matrix="m", axes={}, inputs_hash="h",
        status="finished", verdict="pass", started_at="2026-01-01T00:00:00Z", argv=["x", "--api-key", "k"],
    )
    assert store.all_rows()[0]["argv"] == ["x", "--api-key", "***"], store.all_rows()[0]["argv"]
print(" ".join(sorted(m for m in sys.modules if m.startswith("servematrix"))))
"""


def test_loading_a_spec_or_opening_a_store_imports_no_engine_code(tmp_path):
    loaded = subprocess.run(
        [sys.executable, "-c", SPEC_AND_STORE_ONLY, str(REPO / "matrix" / "glm5-nvfp4.toml"), str(tmp_path / "s.db")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "servematrix.engines" in loaded and "servematrix.store.store" in loaded
    assert not [m for m in loaded if m.startswith("servematrix.engines.") or m == "servematrix.planning.cells"], loaded


# Modules that are declarations or data, allowed past the size rule: the run's options, declared once each.
DECLARATIONS = {"options.py"}
LINES_AT_MOST = 700


def test_no_module_holds_several_jobs_by_size():
    """A module over ~700 lines holds several jobs (issue 23): split it, or say here why it is declarations."""
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")
    }
    large = {name: n for name, n in sizes.items() if n > LINES_AT_MOST and Path(name).name not in DECLARATIONS}
    assert not large, f"modules over {LINES_AT_MOST} lines: {large}"


def test_every_package_says_what_it_owns():
    packages = sorted(p for p in PACKAGE.rglob("__init__.py") if "templates" not in p.parts)
    assert len(packages) >= 8
    silent = [str(p.relative_to(PACKAGE)) for p in packages if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not silent, f"package __init__ without a docstring saying what it owns: {silent}"
