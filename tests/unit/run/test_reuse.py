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

from servematrix.engines import ENGINES_PATH_ENV
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

FIXTURES = Path(__file__).parents[2] / "fixtures"

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


def _own_hooks(engines: Path, tmp_path: Path, monkeypatch, *, extra: str = "") -> Path:
    """The toy engine's hooks as a module of the test's own (`toy_hooks_<n>`), so its bytes can change."""
    import sys

    source = Path(__import__("tests.fakes.toy_engine", fromlist=["x"]).__file__).read_text()
    name = f"toy_hooks_{abs(hash(str(tmp_path))) % 10**8}"
    module = tmp_path / "hooks" / f"{name}.py"
    module.parent.mkdir(exist_ok=True)
    module.write_text(source + extra)
    monkeypatch.syspath_prepend(str(module.parent))
    sys.modules.pop(name, None)
    data = engines / "toyserve.toml"
    data.write_text(data.read_text().replace('hooks = "tests.fakes.toy_engine"', f'hooks = "{name}"'))
    return module


def _replanned(plan):
    """The plan made again from engine data a test changed (engine data is read once per file and process)."""
    from servematrix import engines as engine_data

    engine_data._load.cache_clear()
    return make_plan(plan.spec.path)


def _changed_line(lines) -> str | None:
    return next((line for line in lines if "pre-flight changed" in line), None)


def test_a_change_to_one_stage_reruns_that_stage_alone(toy, tmp_path, monkeypatch):
    """Issue 48: each stage keyed by what it reads. A byte of the engine data no pre-flight reads, or of hooks
    code no pre-flight runs, leaves every verdict reused; a byte of the pre-flight's own function re-runs that
    stage alone (resolve's stored outcome replayed), and says so up front; the verdicts are today's."""
    plan, locks, engines = toy
    module = _own_hooks(engines, tmp_path, monkeypatch, extra="\n\ndef unused():\n    return 1\n")
    plan = _replanned(plan)
    record = tmp_path / "latest.json"
    first, rows, _ = _run(plan, tmp_path, "first", locks, record)
    assert all(set(row["preflight"]) == {"resolve", "context-limit"} for row in rows.values())
    _publish(rows, record)

    data = engines / "toyserve.toml"
    data.write_text(data.read_text().replace("a test-defined engine", "a test-defined toy") + "\n# a comment\n")
    module.write_text(module.read_text().replace("return 1", "return 2"))  # code no pre-flight runs
    _, rows2, lines = _run(_replanned(plan), tmp_path, "unrelated", locks, record)
    assert _reused(rows2) == set(rows) and _changed_line(lines) is None

    # The pre-flight's own function: a comment inside it is a new check.
    module.write_text(module.read_text().replace("    argv = list(", "    # checked again\n    argv = list("))
    changed = _replanned(plan)
    again, rows3, lines = _run(changed, tmp_path, "hook", locks, record)
    assert _changed_line(lines) == (
        "context-limit pre-flight changed: 4 cell(s) re-run; 0 reused (each re-run cell runs its changed stages alone)"
    )
    assert not _reused(rows3) and again.verdicts == first.verdicts
    for cell_id, row in rows3.items():
        assert row["preflight"]["resolve"] == rows[cell_id]["preflight"]["resolve"]
        assert row["preflight"]["context-limit"]["key"] != rows[cell_id]["preflight"]["context-limit"]["key"]


def test_a_new_preflight_runs_alone_after_an_unchanged_one_that_decided(toy, tmp_path, monkeypatch):
    """A pre-flight added to the engine's list (sglang's `config`, say) runs for the cells it can still decide;
    a cell an earlier, unchanged pre-flight ended keeps its verdict (first verdict wins)."""
    plan, locks, engines = toy
    extra = "\n\ndef always_fine(inp):\n    return None\n\n\nPREFLIGHTS = {**PREFLIGHTS, 'fine': always_fine}\n"
    _own_hooks(engines, tmp_path, monkeypatch, extra=extra)
    plan = _replanned(plan)
    record = tmp_path / "latest.json"
    first, rows, _ = _run(plan, tmp_path, "first", locks, record)
    _publish(rows, record)
    data = engines / "toyserve.toml"
    data.write_text(data.read_text().replace('preflight = ["context-limit"]', 'preflight = ["context-limit", "fine"]'))
    second, rows2, lines = _run(_replanned(plan), tmp_path, "added", locks, record)
    assert _changed_line(lines) == (
        "fine pre-flight changed: 3 cell(s) re-run; 1 reused (each re-run cell runs its changed stages alone)"
    )
    assert second.verdicts == first.verdicts
    failed = {c for c, v in first.verdicts.items() if v.startswith("fail:")}
    assert _reused(rows2) == failed
    assert all("fine" in row["preflight"] for c, row in rows2.items() if c not in failed)


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
    cells[error_cell]["preflight"] = None  # a row published before per-stage keys (preflight_hash alone)
    write_export(export, record)
    _, rows2, lines = _run(plan, tmp_path, "second", locks, record)
    assert not _reused(rows2)
    assert any(line.startswith("0 reused") for line in lines)


def test_the_product_matrix_stage_keys_follow_each_stage_s_own_code_and_data(tmp_path, monkeypatch):
    monkeypatch.delenv(ENGINES_PATH_ENV, raising=False)
    plan = make_plan(ROOT / "matrix" / "glm5-nvfp4.toml")
    cell = next(
        c for c in plan.cells if c.applicable and (ROOT / "matrix" / "locks" / f"{c.env_id}.lock.txt").is_file()
    )
    stages = ("resolve", "import", "probe")
    base = reuse.stage_keys(plan, cell, stages, ROOT / "matrix" / "locks")
    assert list(base)[:2] == ["resolve", "import"] and {"flags", "load", "trace"} <= set(base)

    locks = tmp_path / "locks"
    shutil.copytree(ROOT / "matrix" / "locks", locks)
    assert reuse.stage_keys(plan, cell, stages, locks) == base
    lock = locks / f"{cell.env_id}.lock.txt"
    text = lock.read_bytes()
    at = text.rindex(b"sha256:") + 7
    lock.write_bytes(text[:at] + (b"0" if text[at : at + 1] != b"0" else b"1") + text[at + 1 :])
    assert all(a != b for a, b in zip(reuse.stage_keys(plan, cell, stages, locks).values(), base.values(), strict=True))
    assert "import" not in reuse.stage_keys(plan, cell, ("resolve", "probe"), ROOT / "matrix" / "locks")

    # Each hook's own code: the probe script is the trace pre-flight's, the load script the load pre-flight's;
    # the classifier is nobody's.
    code = reuse.hook_code(plan.spec.engine)
    assert "probe_script.py" in code["trace"].sources and "probe_script.py" not in code["flags"].sources
    assert "load_script.py" in code["load"].sources and "load_script.py" not in code["trace"].sources
    assert not any("classify" in label for hook in code.values() for label in hook.sources)
    assert "trace_modes" in code["trace"].engine_fields and "trace_modes" not in code["flags"].engine_fields
    assert code["load"].model_config and not code["trace"].model_config

    # A byte of the engine data that no pre-flight reads (a trailing newline): every key as it was.
    engines = tmp_path / "engines"
    engines.mkdir()
    data = reuse.engine_data_path(plan.spec.engine)
    (engines / "sglang.toml").write_bytes(data.read_bytes() + b"\n")
    monkeypatch.setenv(ENGINES_PATH_ENV, str(engines))
    changed = make_plan(ROOT / "matrix" / "glm5-nvfp4.toml")
    assert reuse.stage_keys(changed, cell, stages, ROOT / "matrix" / "locks") == base


def test_record_check_a_reused_verdict_is_what_today_s_code_gives_on_the_published_evidence():
    """The published record: every pre-flight failure's class is what today's signatures name from its
    published excerpt (stages/naming.py), and every row with stage outcomes replays, under the keys today's
    code gives it, to its own verdict: the README's first command reuses every published CPU verdict."""
    from servematrix.planning.plan import make_plan as plan_of
    from servematrix.stages import STAGES, naming

    record = load_export(ROOT / "docs" / "results" / "latest.json")
    assert record is not None
    named = 0
    plans: dict[str, object] = {}
    for cell_id, row in record["cells"].items():
        assert naming.named_now(row) == row["verdict"], (cell_id, row["verdict"])
        named += naming.deciding_stage(row) == naming.IMPORT
        if not row.get("preflight") or not str(row["matrix"]).startswith("matrix/"):
            continue
        plan = plans.setdefault(row["matrix"], plan_of(ROOT / row["matrix"]))
        cell = next((c for c in plan.cells if c.id == cell_id), None)  # type: ignore[attr-defined]
        if cell is None or not cell.applicable or not reuse.decided_on_a_cpu(row, cell.env):
            continue
        keys = reuse.Reuse(plan=plan, stages=STAGES, lock_dir=ROOT / "matrix" / "locks").keys_for(cell)  # type: ignore[arg-type]
        found = reuse.replay(row, keys, cell)
        assert found.verdict is not None and str(found.verdict) == row["verdict"], (cell_id, found.changed)
    assert named >= 18  # the import check's dependency conflicts, named again from their excerpts


def test_a_gpu_run_pre_flights_itself_and_the_track_record_scores_a_planted_contradiction(toy, tmp_path, monkeypatch):
    """Issue 47: a cell served on (stand-in) GPUs first runs its CPU pre-flights there and stores that
    prediction beside what it observed; the track record scores each pair, per engine and per pre-flight."""
    from servematrix.formats.verdict import Verdict
    from servematrix.report.history import track
    from servematrix.run import hostinfo

    plan, locks, engines = toy
    planted = (
        "\n\ndef planted(inp):\n    if inp.cell.mode == 'short' and inp.cell.env.version == '2.1':\n"
        "        return Verdict(kind='predicted-fail', detail='planted')\n    return None\n\n\n"
        "PREFLIGHTS = {**PREFLIGHTS, 'planted': planted}\n"
    )
    _own_hooks(engines, tmp_path, monkeypatch, extra=planted)
    data = engines / "toyserve.toml"
    data.write_text(
        data.read_text().replace('preflight = ["context-limit"]', 'preflight = ["context-limit", "planted"]')
    )
    plan = _replanned(plan)
    monkeypatch.setenv(hostinfo.STANDIN_GPUS_ENV, "1")
    hostinfo.host.cache_clear()
    try:
        store = tmp_path / "gpu.sqlite"
        options = RunOptions(
            stages=("resolve", "build", "probe", "serve"), store=store, workdir=tmp_path / "work", lock_dir=locks
        )
        summary = run_plan(plan, FakeBackend(tmp_path), options, console=Console(file=io.StringIO()))
    finally:
        hostinfo.host.cache_clear()
    rows = {r["cell_id"]: r for r in store_rows(store)}
    served = {c: r for c, r in rows.items() if r["prediction"] is not None}
    short_new = next(c.id for c in plan.cells if (c.mode, c.env.version) == ("short", "2.1"))
    assert served[short_new]["prediction"] == "predicted-fail:planted"
    assert summary.verdicts[short_new] == "pass"
    assert any(
        "predicted predicted-fail:planted on this interpreter: contradicted" in e for e in rows[short_new]["evidence"]
    )
    scores = track.scored(served.values())
    assert scores.by_engine["toyserve"][track.CONTRADICTED] == 1
    assert scores.by_engine["toyserve"][track.CONFIRMED] == len(served) - 1
    assert scores.by_preflight[("toyserve", "planted")][track.CONTRADICTED] == 1
    assert any(line.startswith("GPU runs' own CPU predictions, toyserve:") for line in scores.lines())
    assert Verdict  # the planted hook's verdict type, imported by the copied module


def test_a_stage_that_could_not_run_for_a_reason_of_its_inputs_is_replayed_one_of_the_host_runs_again(toy):
    """The load probe that ran in the lock's environment and found the stack refusing to prepare (flashinfer-cubin
    beside another flashinfer) would find the same on any CPU: replayed, with its reason kept and no verdict. A
    host's reason (no index reachable) is not a fact of the inputs: that stage runs again."""
    plan, _locks, _engines = toy
    cell = next(c for c in plan.cells if c.applicable)
    keys = {"resolve": "r", "load": "l"}

    def row(reason: str) -> dict:
        load = {"key": "l", "outcome": "unavailable", "evidence": [reason]}
        return {
            "verdict": "skipped:no-gpu",
            "preflight": {"resolve": {"key": "r", "outcome": "resolved"}, "load": load},
        }

    inputs = reuse.replay(
        row("the load probe could not prepare: flashinfer-cubin 0.6.7.post2 is not 0.6.12"), keys, cell
    )
    assert inputs.changed is None and inputs.verdict is not None and str(inputs.verdict) == "skipped:no-gpu"
    assert inputs.kept["load"].state == "unavailable" and inputs.kept["load"].verdict is None
    assert not any("could not prepare" in e for e in inputs.verdict.evidence)  # not shown as a passing check's
    host = reuse.replay(row("no package index is reachable from this host"), keys, cell)
    assert host.changed == "load" and host.verdict is None


def test_an_install_that_erred_on_a_placeholder_pin_is_replayed_a_host_install_fault_runs_again(toy):
    """sglang 0.5.18's lock pins cuda-tile 1.6.0rc5, a wheel-stub sdist on PyPI that fetches its wheel from NVIDIA's
    index when built (the real uv output, stored by the product matrix's run): every host that reaches only the
    index ends the same, so the error is replayed, named, instead of downloading the lock again on every fresh
    clone; an install that failed for the host (a timeout, a full disk) runs again."""
    plan, _locks, _engines = toy
    cell = next(c for c in plan.cells if c.applicable)
    keys = {"resolve": "r", "import": "i", "load": "l"}
    stub = (FIXTURES / "logs" / "uv-install-wheel-stub-cuda-tile.txt").read_text(encoding="utf-8")

    def row(excerpt: str) -> dict:
        failed = "import check: error install: `uv pip install` failed: hint: Build failures usually indicate ..."
        imported = {"key": "i", "outcome": "error", "evidence": [failed]}
        return {
            "verdict": "error:import-check",
            "excerpt": excerpt,
            "evidence": [failed],
            "stages": {"resolve": 0.5, "import": 12.1},
            "host": {"gpus": []},
            "preflight": {"resolve": {"key": "r", "outcome": "resolved"}, "import": imported},
        }

    placeholder = reuse.replay(row(stub), keys, cell)
    assert placeholder.changed is None and placeholder.verdict is not None
    assert str(placeholder.verdict) == "error:import-check"
    assert any("cuda-tile 1.6.0rc5" in e and "placeholder" in e for e in placeholder.verdict.evidence)
    assert reuse.decided_on_a_cpu(row(stub), cell.env)
    host = row("error: Failed to download `torch==2.13.0`: No space left on device (os error 28)")
    assert reuse.replay(host, keys, cell).changed == "import" and reuse.replay(host, keys, cell).verdict is None
    assert not reuse.decided_on_a_cpu(host, cell.env)
