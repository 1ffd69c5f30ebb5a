"""Published CPU verdicts are reused only while their inputs are unchanged (reuse.py): the test-defined engine
runs its pre-flight through the real pipeline on a GPU kind this host lacks, the rows are published as
`report --publish` does, and a second run takes them from the record; one byte of a lock, of the engine
data or of a check's code makes the affected cells run again. The sglang product matrix's own inputs are
hashed from the committed locks, engine data and probe script."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from servematrix.engines import ENGINES_PATH_ENV, load_engine
from servematrix.formats.lockfile import render_header
from servematrix.planning.plan import make_plan
from servematrix.report.publish import merge_published, store_rows
from servematrix.report.regressions import export_results, load_export, write_export
from servematrix.run import reuse
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions, preamble
from servematrix.stages.locking import resolve_request
from servematrix.stages.resolve import lock_header
from tests.fakes.fake_backend import FakeBackend

ROOT = Path(__file__).resolve().parents[3]
TOY_ENGINES = ROOT / "tests" / "fakes" / "engines"

# The toy engine on a GPU kind no test host has: its cells end with the CPU pre-flight's verdict.
TOY_MATRIX = """
engine = "toyserve"
[model]
name = "m"
path = "m"
[axes]
toyserve = ["1.4", "2.1"]
gpu = ["b200"]
mode = ["short", "long"]
[gpu.b200]
arch = "sm_100"
count = 1
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""
STAGES = ("resolve", "probe", "serve")


@pytest.fixture
def toy(monkeypatch, tmp_path):
    engines = tmp_path / "engines"
    shutil.copytree(TOY_ENGINES, engines)
    monkeypatch.setenv(ENGINES_PATH_ENV, str(engines))
    matrix = tmp_path / "toy.toml"
    matrix.write_text(TOY_MATRIX)
    plan = make_plan(matrix)
    # Locks written as `servematrix lock` writes them (header for the request, a hashed body), so that resolve
    # takes them as they are: toyserve is on no index.
    locks = tmp_path / "locks"
    for env_id in plan.environments:
        request = resolve_request(plan, env_id)
        version = request.axes["toyserve"]
        body = f"toyserve=={version} \\\n    --hash=sha256:{'0' * 64}\n"
        header = render_header(lock_header(request, crossed={}, resolver="uv (written by the test)"))
        (locks / f"{env_id}.lock.txt").parent.mkdir(exist_ok=True)
        (locks / f"{env_id}.lock.txt").write_text(header + body)
    return plan, locks, engines


def _run(plan, tmp_path, name, locks, record, *, fresh=False):
    store = tmp_path / f"{name}.sqlite"
    options = RunOptions(
        stages=STAGES, store=store, workdir=tmp_path / "work", lock_dir=locks, published=record, fresh=fresh
    )
    summary = run_plan(plan, FakeBackend(tmp_path), options, console=Console(file=io.StringIO()))
    rows = {r["cell_id"]: r for r in store_rows(store)}
    return summary, rows, preamble(plan, options)


def _publish(rows, record: Path) -> None:
    publication = merge_published(load_export(record), list(rows.values()))
    write_export(export_results(publication.rows), record)


def _reused(rows) -> set[str]:
    return {cell for cell, row in rows.items() if (row["evidence"] or [""])[0].startswith(reuse.REUSED_PREFIX)}


def test_published_cpu_verdicts_are_reused_until_a_lock_byte_changes(toy, tmp_path):
    plan, locks, _ = toy
    record = tmp_path / "docs" / "results" / "latest.json"
    first, rows, lines = _run(plan, tmp_path, "first", locks, record)
    long_old = next(c for c in plan.cells if c.mode == "long" and c.env.version == "1.4")
    assert first.verdicts == {c.id: "fail:context-too-long" if c is long_old else "skipped:no-gpu" for c in plan.cells}
    assert all(row["preflight_hash"] for row in rows.values()) and not _reused(rows)
    _publish(rows, record)

    # A host with the cell's GPUs serves it: a CPU verdict is never reused there.
    known = reuse.Reuse(plan=plan, stages=STAGES, lock_dir=locks, record=record)
    assert known.lookup(long_old, this_host_lacks_gpus=True) is not None
    assert known.lookup(long_old, this_host_lacks_gpus=False) is None

    second, again, lines = _run(plan, tmp_path, "second", locks, record)
    assert second.verdicts == first.verdicts
    assert _reused(again) == set(first.verdicts)
    assert (first.reused, second.reused) == (0, len(first.verdicts))
    assert again[long_old.id]["excerpt"] == rows[long_old.id]["excerpt"]
    day = rows[long_old.id]["finished_at"][:10]
    assert again[long_old.id]["evidence"][0].startswith(f"reused: published {day}, decided on a CPU")
    assert any(line.startswith(f"4 reused (published {day}") and line.endswith(", 0 to check") for line in lines)

    # One byte of the body of 1.4's lock: its two cells are decided again, 2.1's are still reused.
    lock = locks / f"{long_old.env_id}.lock.txt"
    lock.write_text(lock.read_text().replace("sha256:0000", "sha256:0001"))
    third, rows3, lines = _run(plan, tmp_path, "third", locks, record)
    assert third.verdicts == first.verdicts
    assert _reused(rows3) == {c.id for c in plan.cells if c.env_id != long_old.env_id}
    assert third.reused == 2
    assert any(line.startswith("2 reused") and line.endswith(", 2 to check") for line in lines)

    fresh, rows4, lines = _run(plan, tmp_path, "fresh", locks, record, fresh=True)
    assert fresh.verdicts == first.verdicts and not _reused(rows4) and fresh.reused == 0
    assert any(line.startswith("--fresh: nothing reused") for line in lines)


def test_fresh_after_a_run_that_reused_decides_every_cell(toy, tmp_path):
    """Issue 38: `--fresh` on the store a default run filled with reused verdicts ran nothing ("unchanged")."""
    plan, locks, _ = toy
    record = tmp_path / "docs" / "results" / "latest.json"
    _publish(_run(plan, tmp_path, "first", locks, record)[1], record)
    second, rows, _ = _run(plan, tmp_path, "same", locks, record)
    assert _reused(rows) == set(second.verdicts)
    fresh, rows, _ = _run(plan, tmp_path, "same", locks, record, fresh=True)
    assert fresh.skipped_unchanged == 0 and set(fresh.verdicts) == {c.id for c in plan.cells} and not _reused(rows)
    again, _, _ = _run(plan, tmp_path, "same", locks, record, fresh=True)
    assert again.skipped_unchanged == len(plan.cells)  # what --fresh decided is a finished run


def test_one_byte_of_the_engine_data_or_of_its_hooks_code_decides_every_cell_again(toy, tmp_path, monkeypatch):
    plan, locks, engines = toy
    record = tmp_path / "latest.json"
    _, rows, _ = _run(plan, tmp_path, "first", locks, record)
    _publish(rows, record)

    # A comment byte: the parsed engine is the same, its data file is not.
    data = engines / "toyserve.toml"
    data.write_bytes(data.read_bytes() + b"#")
    changed = make_plan(plan.spec.path)
    _, rows2, _ = _run(changed, tmp_path, "engine", locks, record)
    assert not _reused(rows2)

    data.write_bytes(data.read_bytes()[:-1])
    _, rows3, _ = _run(make_plan(plan.spec.path), tmp_path, "restored", locks, record)
    assert _reused(rows3) == set(rows)

    # The hooks module's own bytes are part of the check (a copy of it, so the real one stays as it is).
    hooks = Path(__import__("tests.fakes.toy_engine", fromlist=["x"]).__file__)
    assert hooks in reuse.check_sources(load_engine("toyserve"))
    copy = tmp_path / "toy_engine.py"
    copy.write_bytes(hooks.read_bytes())
    before = reuse.files_digest([copy])
    copy.write_bytes(hooks.read_bytes() + b"\n")
    assert reuse.files_digest([copy]) != before


def test_a_gpu_observed_row_or_one_from_a_gpu_host_is_never_reused(toy, tmp_path):
    plan, locks, _ = toy
    record = tmp_path / "latest.json"
    _, rows, _ = _run(plan, tmp_path, "first", locks, record)
    _publish(rows, record)
    export = load_export(record)
    assert export is not None
    short_new, long_new, short_old, error_cell = (
        next(c.id for c in plan.cells if (c.mode, c.env.version) == pair)
        for pair in (("short", "2.1"), ("long", "2.1"), ("short", "1.4"), ("long", "1.4"))
    )
    cells = export["cells"]
    cells[short_new].update(verdict="pass", stages={"serve": 3.0, "bench": 5.0}, metrics={"levels": []})
    cells[long_new]["host"] = {**cells[long_new]["host"], "gpus": [{"arch": "sm_100", "name": "NVIDIA B200"}]}
    cells[short_old]["verdict"] = "error:resolve"
    cells[error_cell]["preflight_hash"] = None  # a row published before hashes
    write_export(export, record)
    _, rows2, lines = _run(plan, tmp_path, "second", locks, record)
    assert not _reused(rows2)
    assert any(line.startswith("0 reused") for line in lines)


def test_the_product_matrix_is_hashed_from_its_committed_lock_engine_data_and_probe_script(tmp_path, monkeypatch):
    monkeypatch.delenv(ENGINES_PATH_ENV, raising=False)
    plan = make_plan(ROOT / "matrix" / "glm5-nvfp4.toml")
    cell = next(
        c for c in plan.cells if c.applicable and (ROOT / "matrix" / "locks" / f"{c.env_id}.lock.txt").is_file()
    )
    stages = ("resolve", "import", "probe")
    inputs = reuse.preflight_inputs(plan, cell, stages, ROOT / "matrix" / "locks")
    assert inputs["lock"] and inputs["platform"] == cell.env.gpu.platform
    base = reuse.preflight_hash(plan, cell, stages, ROOT / "matrix" / "locks")

    locks = tmp_path / "locks"
    shutil.copytree(ROOT / "matrix" / "locks", locks)
    assert reuse.preflight_hash(plan, cell, stages, locks) == base
    lock = locks / f"{cell.env_id}.lock.txt"
    text = lock.read_bytes()
    at = text.rindex(b"sha256:") + 7
    lock.write_bytes(text[:at] + (b"0" if text[at : at + 1] != b"0" else b"1") + text[at + 1 :])
    assert reuse.preflight_hash(plan, cell, stages, locks) != base
    assert reuse.preflight_hash(plan, cell, ("resolve", "probe"), ROOT / "matrix" / "locks") != base

    sources = reuse.check_sources(plan.spec.engine)
    probe_script = next(p for p in sources if p.name == "probe_script.py")
    assert {"traceprobe.py", "flagsurface.py", "probe.toml", "importcheck.py"} <= {p.name for p in sources}
    copies = []
    for index, source in enumerate(sources):  # one folder each: two packages each have an __init__.py
        copies.append(tmp_path / "src" / str(index) / source.name)
        copies[-1].parent.mkdir(parents=True)
        copies[-1].write_bytes(source.read_bytes())
    same = reuse.files_digest(copies)
    assert same == reuse.files_digest(sources)
    copy = copies[sources.index(probe_script)]
    copy.write_bytes(copy.read_bytes().replace(b"import", b"import ", 1))
    assert reuse.files_digest(copies) != same

    engines = tmp_path / "engines"
    engines.mkdir()
    data = reuse.engine_data_path(plan.spec.engine)
    (engines / "sglang.toml").write_bytes(data.read_bytes() + b"\n")
    monkeypatch.setenv(ENGINES_PATH_ENV, str(engines))
    changed = make_plan(ROOT / "matrix" / "glm5-nvfp4.toml")
    assert reuse.preflight_hash(changed, cell, stages, ROOT / "matrix" / "locks") != base
