"""Engines are plugins: a third engine, defined only by the tests (a data file and a hooks module), plans and
runs through the real pipeline with its own CPU pre-flight; engine data that names a pre-flight nobody
implements is bad input at its line."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
from importlib import resources
from pathlib import Path

import pytest
from rich.console import Console

from servematrix.cli import main
from servematrix.engines import ENGINES_PATH_ENV, available_engines, load_engine
from servematrix.engines.hooks import HOOKSPECS, HookSpec, hookspec, multicall
from servematrix.engines.plugins import hooks_of, signature_problem
from servematrix.errors import InputError
from servematrix.planning.plan import make_plan
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.store.store import Store
from tests.fakes.fake_backend import FakeBackend

TOY_ENGINES = Path(__file__).resolve().parents[2] / "fakes" / "engines"

TOY_MATRIX = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = ["1.4", "2.1"]
gpu = ["cpu"]
mode = ["short", "long"]
[gpu.cpu]
arch = "cpu"
count = 0
[server]
ready_timeout_s = 30
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


def _matrix(folder: Path, *, engine: str) -> Path:
    matrix = folder / f"{engine}-matrix.toml"
    matrix.write_text(TOY_MATRIX.replace('engine = "toyserve"', f'engine = "{engine}"'))
    return matrix


@pytest.fixture
def toy_engines(monkeypatch):
    monkeypatch.setenv(ENGINES_PATH_ENV, str(TOY_ENGINES))


def test_a_third_engine_runs_its_own_preflight_through_the_real_pipeline(toy_engines, tmp_path):
    matrix = tmp_path / "toy.toml"
    matrix.write_text(TOY_MATRIX)
    plan = make_plan(matrix)
    assert {c.env.engine for c in plan.cells} == {"toyserve"} and len(plan.cells) == 4
    long_old = next(c for c in plan.cells if c.mode == "long" and c.env.version == "1.4")
    assert long_old.command[-2:] == ("--max-len", "4096")

    store = tmp_path / "s.sqlite"
    options = RunOptions(stages=("probe", "build", "serve"), store=store, workdir=tmp_path / "work")
    summary = run_plan(plan, FakeBackend(tmp_path), options, console=Console(file=io.StringIO()))

    # The hook decided one cell before anything was built; the fake backend served the other three.
    assert summary.verdicts == {c.id: "fail:context-too-long" if c is long_old else "pass" for c in plan.cells}, (
        summary.verdicts
    )
    with Store(store) as opened:
        row = next(r for r in opened.all_rows() if r["cell_id"] == long_old.id)
    assert "accepts --max-len up to 2048" in row["excerpt"]


def test_the_third_engine_is_listed_and_its_hooks_are_its_own(toy_engines, monkeypatch, tmp_path):
    assert "toyserve" in available_engines()
    (tmp_path / "README.md").write_text("not an engine")
    monkeypatch.setenv(ENGINES_PATH_ENV, os.pathsep.join((str(TOY_ENGINES), str(tmp_path))))
    assert "README.md" not in available_engines() and "toyserve" in available_engines()
    assert set(hooks_of(load_engine("toyserve")).preflights) == {"context-limit"}
    assert set(hooks_of(load_engine("sglang")).preflights) == {"flags", "config", "load", "trace"}
    assert hooks_of(load_engine("transformers")).preflights == {}


def test_a_preflight_no_hook_implements_is_bad_input_at_its_line(monkeypatch, tmp_path):
    # Before engines had hooks, an engine declaring "flags" would have run sglang's wheel reader.
    text = (TOY_ENGINES / "toyserve.toml").read_text()
    text = text.replace('preflight = ["context-limit"]\nhooks = "tests.fakes.toy_engine"', 'preflight = ["flags"]')
    (tmp_path / "noflags.toml").write_text(text.replace('name = "toyserve"', 'name = "noflags"'))
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    assert load_engine("noflags").preflight == ("flags",)  # data alone reads; the plan checks the contract
    with pytest.raises(InputError) as caught:
        make_plan(_matrix(tmp_path, engine="noflags"))
    assert caught.value.location.line == text.splitlines().index('preflight = ["flags"]') + 1
    assert "'flags'" in str(caught.value)


def test_engine_data_with_an_unknown_key_names_its_line(monkeypatch, tmp_path):
    text = (
        (TOY_ENGINES / "toyserve.toml").read_text().replace("default_port = 8000", "default_port = 8000\nreadyness = 1")
    )
    (tmp_path / "typo.toml").write_text(text.replace('name = "toyserve"', 'name = "typo"'))
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    with pytest.raises(InputError) as caught:
        load_engine("typo")
    assert caught.value.location.key == "readyness" and "unknown key" in str(caught.value)
    assert caught.value.location.line == text.splitlines().index("readyness = 1") + 1


def test_a_hooks_module_that_does_not_import_is_bad_input_at_its_line(monkeypatch, tmp_path):
    text = (TOY_ENGINES / "toyserve.toml").read_text().replace("tests.fakes.toy_engine", "tests.fakes.no_such_hooks")
    (tmp_path / "nohooks.toml").write_text(text.replace('name = "toyserve"', 'name = "nohooks"'))
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    engine = load_engine("nohooks")
    with pytest.raises(InputError) as caught:
        hooks_of(engine)
    assert caught.value.location.key == "hooks" and "tests.fakes.no_such_hooks" in str(caught.value)
    assert caught.value.location.line == text.splitlines().index('hooks = "tests.fakes.no_such_hooks"') + 1


def test_a_hooks_module_against_the_contract_is_bad_input_at_its_hooks_line(monkeypatch, tmp_path):
    # `PREFLIGHTS` must map names to functions (engines/hooks.py); a list of them is a mistake in the module.
    (tmp_path / "wrong_shape_hooks.py").write_text("PREFLIGHTS = [print]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (TOY_ENGINES / "toyserve.toml").read_text().replace("tests.fakes.toy_engine", "wrong_shape_hooks")
    (tmp_path / "shape.toml").write_text(text.replace('name = "toyserve"', 'name = "shape"'))
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    with pytest.raises(InputError) as caught:
        make_plan(_matrix(tmp_path, engine="shape"))
    assert caught.value.location.key == "hooks" and "PREFLIGHTS must map names to functions" in str(caught.value)


@pytest.mark.parametrize(
    ("module", "problem"),
    [
        # The runner passes the cell's PreflightInput: a hook written for a cell would be handed the wrong thing.
        (
            "def limit(cell):\n    return None\nPREFLIGHTS = {'context-limit': limit}\n",
            "hook PREFLIGHTS['context-limit']",
        ),
        ("def limit(inp, budget):\n    return None\nPREFLIGHTS = {'context-limit': limit}\n", "'budget' is not in"),
        ("def probe_entry(inp, entry):\n    return None\nPREFLIGHTS = {}\n", "keyword parameter 'needs_gpu'"),
        ("def preamble(cells, engine):\n    return []\nPREFLIGHTS = {}\n", "parameter 'cache_dir' of Preamble"),
    ],
)
def test_a_hook_whose_signature_is_not_its_specs_is_bad_input_naming_engine_hook_and_parameter(
    monkeypatch, tmp_path, module, problem
):
    (tmp_path / "planted_hooks.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "planted_hooks", raising=False)
    text = (TOY_ENGINES / "toyserve.toml").read_text().replace("tests.fakes.toy_engine", "planted_hooks")
    text = text.replace('preflight = ["context-limit"]', "preflight = []")
    (tmp_path / "planted.toml").write_text(text.replace('name = "toyserve"', 'name = "planted"'))
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    with pytest.raises(InputError) as caught:
        hooks_of(load_engine("planted"))
    message = str(caught.value)
    assert caught.value.location.key == "hooks" and "engine planted" in message and problem in message, message


def test_hooks_with_the_specs_names_pass_the_check():
    def preflight(inp, extra=None): ...
    def entry(inp, entry, needs_gpu): ...  # a keyword parameter may also be positional
    def anything(*args, **kwargs): ...

    spec = {s.attribute: s for s in HOOKSPECS}
    assert signature_problem(spec["PREFLIGHTS"], preflight) is None
    assert signature_problem(spec["probe_entry"], entry) is None
    assert all(signature_problem(s, anything) is None for s in HOOKSPECS)
    assert "'inp'" in (signature_problem(spec["PREFLIGHTS"], lambda: None) or "")


def test_firstresult_decides_how_answers_combine():
    called: list[int] = []

    def answer(n: int, value: str | None):
        return lambda: called.append(n) or value

    calls = [answer(1, None), answer(2, "b"), answer(3, "c")]
    first = HookSpec(attribute="x", firstresult=True, mapping=False, protocol=object, doc="")
    assert multicall(first, calls) == ["b"] and called == [1, 2]  # the third is not called
    called.clear()
    assert multicall(dataclasses.replace(first, firstresult=False), calls) == ["b", "c"] and called == [1, 2, 3]
    assert hookspec("PREFLIGHTS").firstresult  # the runner's pre-flights: the first verdict ends the cell


def test_engine_data_must_be_named_for_its_file(monkeypatch, tmp_path):
    (tmp_path / "alias.toml").write_text((TOY_ENGINES / "toyserve.toml").read_text())
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    with pytest.raises(InputError) as caught:
        load_engine("alias")
    assert caught.value.location.key == "name" and "names itself 'toyserve'" in str(caught.value)


def test_a_store_masks_an_engines_secret_flags_from_its_data_alone(monkeypatch, tmp_path):
    # The engine's hooks module does not even import: masking must not need it.
    text = (TOY_ENGINES / "toyserve.toml").read_text().replace("tests.fakes.toy_engine", "tests.fakes.no_such_hooks")
    text = text.replace("default_port = 8000", 'default_port = 8000\nsecret_flags = ["--vault"]')
    (tmp_path / "vaulted.toml").write_text(text.replace('name = "toyserve"', 'name = "vaulted"'))
    monkeypatch.setenv(ENGINES_PATH_ENV, str(tmp_path))
    row = {
        "env_id": "e",
        "engine": "vaulted",
        "mode": "short",
        "matrix": "m",
        "axes": {},
        "inputs_hash": "h",
        "verdict": "pass",
    }
    with Store(tmp_path / "s.sqlite") as store:
        store.record(run_id="r", cell_id="c", argv=["serve", "--vault", "s3cr3t-value"], **row)
        assert store.all_rows()[0]["argv"] == ["serve", "--vault", "***"]


# ---- engine names come from the registry only ------------------------------------------------------------


@pytest.fixture
def planted(tmp_path, monkeypatch) -> tuple[str, Path]:
    """An engine data file outside every engine folder, whose hooks module leaves a mark when imported, and
    the name that reaches it from the packaged engine folder by `..` (what a crafted row writes)."""
    (tmp_path / "evil").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "evil_hooks.py").write_text(f"open({str(marker)!r}, 'w').close()\nPREFLIGHTS = {{}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (TOY_ENGINES / "toyserve.toml").read_text().replace("tests.fakes.toy_engine", "evil_hooks")
    (tmp_path / "evil" / "e.toml").write_text(text.replace('name = "toyserve"', 'name = "e"'))
    packaged = Path(str(resources.files("servematrix.data").joinpath("engines")))
    name = os.path.relpath(tmp_path / "evil" / "e", packaged)
    assert name.startswith("../") and (packaged / f"{name}.toml").is_file()
    return name, marker


def _nothing_imported(marker: Path) -> bool:
    return not marker.exists() and "evil_hooks" not in sys.modules


def test_a_name_that_is_not_a_registered_engine_is_never_joined_into_a_path(planted):
    name, marker = planted
    with pytest.raises(InputError, match="unknown engine"):
        load_engine(name)
    for odd in ("Sglang", "sglang.toml", "/etc/passwd", "sglang/../sglang", "", "toyserve"):
        with pytest.raises(InputError):
            load_engine(odd)
    assert _nothing_imported(marker)


def _store_row(store: Store, cell: str, engine: str) -> None:
    store.record(
        run_id="r1",
        cell_id=cell,
        env_id=f"env-{cell}",
        engine=engine,
        mode="static",
        matrix="matrix/cpu-smoke.toml",
        axes={"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"},
        inputs_hash="h",
        verdict="fail:server-crash",
        backend="venv",
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:00:00+00:00",
    )


def test_a_store_row_naming_an_unregistered_engine_is_refused_at_its_row(planted, tmp_path, capsys):
    name, marker = planted
    with Store(tmp_path / "s.sqlite") as store:
        _store_row(store, "good", "transformers")
        _store_row(store, "crafted", name)
    out = tmp_path / "out"
    assert main(["report", "--store", str(tmp_path / "s.sqlite"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the row of cell 'crafted'" in err[0] and "not a registered engine" in err[0], err
    assert _nothing_imported(marker) and not out.exists()


def test_a_published_record_naming_an_unregistered_engine_is_refused_at_its_cell(planted, tmp_path, capsys):
    name, marker = planted
    with Store(tmp_path / "s.sqlite") as store:
        _store_row(store, "good", "transformers")
        _store_row(store, "other", "transformers")
    site = tmp_path / "site"
    assert main(["report", "--publish", "--store", str(tmp_path / "s.sqlite"), "--out", str(site)]) == 0
    latest = site / "results" / "latest.json"
    record = json.loads(latest.read_text())
    record["cells"]["other"]["engine"] = name
    latest.write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["report", "--publish", "--from-published", "--out", str(site)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cell 'other'" in err[0] and "not a registered engine" in err[0], err
    assert _nothing_imported(marker)
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before


def test_a_matrix_naming_an_unregistered_engine_is_refused_at_its_line(planted, tmp_path):
    name, marker = planted
    for engine in (name, "evil.e"):
        matrix = tmp_path / "m.toml"
        matrix.write_text(TOY_MATRIX.replace('engine = "toyserve"', f'engine = "{engine}"'))
        with pytest.raises(InputError) as caught:
            make_plan(matrix)
        assert caught.value.location.key == "engine" and caught.value.location.line == 2
    assert _nothing_imported(marker)
