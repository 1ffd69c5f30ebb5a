"""`servematrix bisect`: the search, the releases it searches, a bisection over a real store, the note it leaves
for the failure pages, and the command line's bad input.

The bisections here run through the real Checker and a real SQLite store; only the pipeline's run is stood in
for (FakePipeline writes each cell's row as run_plan does, with the verdict a made-up history gives a release),
so a history can have any shape: gaps, releases that cannot be installed, a kill half-way.
"""

from __future__ import annotations

import http.server
import json
import math
import subprocess
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from servematrix.backends.venv import VenvBackend
from servematrix.bisection import checks as checks_module
from servematrix.bisection.checks import UNDECIDED_KINDS, Checker, CheckOptions, derived_plan, find_target
from servematrix.bisection.releases import Release, between, fetch_releases, releases_from_files
from servematrix.bisection.runner import Bisection, Undecided, bisect, record_note
from servematrix.bisection.search import max_steps, search
from servematrix.config.spec import load_spec
from servematrix.errors import InputError
from servematrix.planning.plan import plan_spec
from servematrix.report.bisectnote import NOTE_PREFIX, notes
from servematrix.run.runplan import Summary, inputs_hash
from servematrix.stages.importcheck import ImportCheck
from servematrix.store.store import Store
from tests.conftest import REPO

KERNELS = ["0.14.1", "0.15.1", "0.15.2", "0.16.0", "0.16.1", "0.16.2", "0.17.0", "0.17.1", "0.17.2"]
CONFLICT = "ValueError: Either a revision or a version must be specified."
# sglang with kernels as a package axis, on a GPU kind no host has: the CPU stages (probe, import) decide.
MATRIX_TEXT = """
engine = "sglang"
packages = ["kernels"]
[model]
name = "m"
path = "org/model"
[axes]
sglang = ["0.5.12"]
torch = ["pinned"]
flashinfer = ["pinned"]
kernels = ["locked", "0.14.1"]
cuda = ["13.0"]
gpu = ["nowhere"]
mode = ["baseline", "piecewise"]
[gpu.nowhere]
arch = "sm_999"
count = 1
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 1
"""


# ------------------------------------------------------------------------------------------------- search


def _history(first_new: int, skip: frozenset[int] = frozenset()) -> Callable[[int], str]:
    return lambda i: "skip" if i in skip else "new" if i >= first_new else "old"


def _run(n: int, history: Callable[[int], str]):
    versions = [f"1.{i}" for i in range(n)]
    seen: list[str] = []

    def decide(version: str):
        seen.append(version)
        return history(versions.index(version))

    return versions, search(versions, decide), seen


@pytest.mark.parametrize("n", range(2, 41))
def test_the_search_finds_every_boundary_within_ceil_log2_steps(n):
    bound = math.ceil(math.log2(n - 1)) if n > 2 else 0
    assert max_steps(n) == bound
    for boundary in range(1, n):
        versions, found, seen = _run(n, _history(boundary))
        assert (found.last_old, found.first_new) == (versions[boundary - 1], versions[boundary])
        assert len(seen) <= bound
        assert versions[0] not in seen and versions[-1] not in seen  # the ends are the caller's


def test_a_tie_for_the_middle_goes_to_the_older_release():
    # Four releases leave two between the ends, equally near the middle: the older one is tried first.
    _, _, seen = _run(4, _history(3))
    assert seen[0] == "1.1"
    # A skipped middle: its two neighbours are equally near, and the older is tried next.
    _, found, seen = _run(7, _history(4, skip=frozenset({3})))
    assert seen[:2] == ["1.3", "1.2"]
    # 1.2 is old and 1.4 new; 1.3 is undecided, so the change may be 1.3's.
    assert (found.last_old, found.first_new, found.ambiguous) == ("1.2", "1.4", ("1.3",))


def test_a_gap_of_skipped_releases_at_the_boundary_is_reported_as_ambiguous():
    _, found, _ = _run(9, _history(4, skip=frozenset({3, 4, 5})))
    # The change is at 1.4, but 1.3-1.5 cannot be decided: the first decidable release after it is 1.6.
    assert (found.last_old, found.first_new) == ("1.2", "1.6")
    assert found.ambiguous == ("1.3", "1.4", "1.5")
    assert set(found.skipped) == {"1.3", "1.4", "1.5"}


def test_the_search_refuses_what_it_cannot_search():
    with pytest.raises(ValueError):
        search(["1.0"], lambda v: "old")
    with pytest.raises(ValueError):
        search(["1.0", "1.1", "1.0"], lambda v: "old")
    with pytest.raises(ValueError):
        search(["1.0", "1.1", "1.2"], lambda v: "maybe")  # type: ignore[arg-type,return-value]


# ----------------------------------------------------------------------------------------------- releases


def test_a_release_is_yanked_only_when_every_file_is():
    found = releases_from_files(
        "packaging",
        [
            ("packaging-20.5-py2.py3-none-any.whl", False),
            ("packaging-20.6-py2.py3-none-any.whl", True),
            ("packaging-20.6.tar.gz", True),
            ("packaging-20.7-py2.py3-none-any.whl", True),
            ("packaging-20.7.tar.gz", False),
            ("packaging-20.8.win32.exe", False),  # no installer picks it: not a release
            ("other-20.9.tar.gz", False),
        ],
    )
    assert [(r.version, r.yanked) for r in found] == [("20.5", False), ("20.6", True), ("20.7", False)]


def test_pre_releases_and_yanked_releases_are_left_out_unless_asked_for():
    releases = [
        Release(version=v, yanked=y)
        for v, y in [("1.0", False), ("1.1rc1", False), ("1.1", True), ("1.2.dev0", False), ("1.2", False)]
    ]
    assert between(releases, "1.0", "1.2") == ["1.0", "1.2"]
    assert between(releases, "1.0", "1.2", pre=True) == ["1.0", "1.1rc1", "1.2.dev0", "1.2"]
    assert between(releases, "1.2", "1.0", yanked=True) == ["1.0", "1.1", "1.2"]  # oldest first either way
    assert between(releases, "1.1rc1", "1.1") == ["1.1rc1", "1.1"]  # ends named by the user are kept
    with pytest.raises(InputError, match=r"--bad 1.3: kernels has no such release on the index \(nearest: 1.2\)"):
        between(releases, "1.0", "1.3", package="kernels")
    with pytest.raises(InputError, match="same version"):
        between(releases, "1.0", "1.0.0")
    with pytest.raises(InputError, match="--good 'one' is not a version"):
        between(releases, "one", "1.0")


@pytest.fixture
def index() -> Iterator[str]:
    """A real HTTP index on localhost: kernels as PEP 691 JSON, six as a PEP 503 HTML page, nothing else."""
    pages = {
        "/simple/kernels/": (
            "application/vnd.pypi.simple.v1+json",
            json.dumps(
                {
                    "meta": {"api-version": "1.1"},
                    "files": [
                        {"filename": "kernels-0.14.1-py3-none-any.whl", "yanked": False},
                        {"filename": "kernels-0.15.0-py3-none-any.whl", "yanked": "broken"},
                        {"filename": "kernels-0.15.1-py3-none-any.whl", "yanked": False},
                    ],
                }
            ),
        ),
        "/simple/six/": (
            "text/html",
            '<html><body><a href="six-1.15.0.tar.gz#sha256=0">six-1.15.0.tar.gz</a>'
            '<a href="six-1.16.0.tar.gz#sha256=1" data-yanked="">six-1.16.0.tar.gz</a>'
            '<a href="six-1.17.0-py2.py3-none-any.whl">six-1.17.0-py2.py3-none-any.whl</a></body></html>',
        ),
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = pages.get(self.path)
            self.send_response(200 if page else 404)
            self.send_header("Content-Type", page[0] if page else "text/plain")
            self.end_headers()
            self.wfile.write((page[1] if page else "not found").encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def test_releases_come_from_the_index_json_or_html(index):
    assert [(r.version, r.yanked) for r in fetch_releases("kernels", index)] == [
        ("0.14.1", False),
        ("0.15.0", True),
        ("0.15.1", False),
    ]
    assert [(r.version, r.yanked) for r in fetch_releases("Six", index)] == [
        ("1.15.0", False),
        ("1.16.0", True),
        ("1.17.0", False),
    ]
    with pytest.raises(InputError, match="nothing-here: no such project on the index"):
        fetch_releases("nothing_here", index)


# ---------------------------------------------------------------------------------------- bisections


class FakePipeline:
    """Stands in for pipeline.run_plan: records every cell of the plan as the pipeline does (its inputs hash for
    the stages run), with the verdict `history(version, stage)` gives; raises KeyboardInterrupt (a kill) once it
    has run `kill_after` checks."""

    def __init__(
        self,
        history: Callable[[str, str], tuple[str, ...]],
        kill_after: int | None = None,
        no_import_result: Collection[str] = (),
    ) -> None:
        self.history = history
        self.kill_after = kill_after
        self.no_import_result = no_import_result  # versions whose import check leaves no result for the lock
        self.calls: list[tuple[str, str]] = []
        self.reruns: list[bool] = []

    def __call__(self, plan, backend, options, console=None) -> Summary:
        if self.kill_after is not None and len(self.calls) >= self.kill_after:
            raise KeyboardInterrupt
        version = plan.cells[0].env.axes["kernels"]
        stage = "import" if "import" in options.stages else "probe"
        self.calls.append((version, stage))
        result, excerpt, *notes = self.history(version, stage)
        self.reruns.append(options.rerun)
        # What resolve and the import check leave behind: the lock, and the check's record of it.
        lock = Path(options.lock_dir) / f"{plan.cells[0].env_id}.lock.txt"
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text(f"kernels=={version}\n")
        if stage == "import" and version not in self.no_import_result and not result.startswith(UNDECIDED_KINDS):
            outcome = "pass" if result.startswith("skipped:") else "fail"
            records = _fake_import_records(options.workdir / "cache")
            records.write_text(json.dumps({**_read_records(records), str(lock): outcome}))
        with Store(options.store) as store:
            for cell in plan.cells:
                store.record(
                    run_id=options.run_id,
                    cell_id=cell.id,
                    env_id=cell.env_id,
                    engine=cell.env.engine,
                    mode=cell.mode,
                    matrix=str(plan.spec.path),
                    axes=dict(cell.env.axes),
                    inputs_hash=inputs_hash(plan, cell, options.stages),
                    verdict=result,
                    excerpt=excerpt,
                    evidence=notes or (["import check: pass: imported sglang"] if result == "skipped:no-gpu" else []),
                    lock_file=str(lock),
                )
        return Summary(run_id=options.run_id)

    @staticmethod
    def recorded(lockfile: Path, engine, *, cache_dir: Path) -> ImportCheck | None:
        """Stands in for importcheck.recorded: the fake import check's record of a lock."""
        outcome = _read_records(_fake_import_records(cache_dir)).get(str(lockfile))
        return ImportCheck(outcome=outcome, cached=True) if outcome else None


def _fake_import_records(cache_dir: Path) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    return cache_dir / "fake-import-records.json"


def _read_records(path: Path) -> dict[str, str]:
    return json.loads(path.read_text()) if path.is_file() else {}


def kernels_history(
    first_bad: str, unresolvable: tuple[str, ...] = (), errors: tuple[str, ...] = ()
) -> Callable[[str, str], tuple[str, str]]:
    """The probe passes everywhere; the import check fails from `first_bad` on (kernels' ValueError)."""

    def history(version: str, stage: str) -> tuple[str, str]:
        if version in unresolvable:
            return "unresolvable", f"No solution found when resolving: kernels=={version} needs huggingface-hub<0.1"
        if version in errors:
            return "error:resolve", "Failed to fetch: connection reset"
        if stage == "import" and Version(version) >= Version(first_bad):
            return "predicted-fail:import-dependency-conflict", f"Traceback ...\n{CONFLICT}"
        return "skipped:no-gpu", "needs 1x sm_999"

    return history


@pytest.fixture
def matrix(write_matrix) -> Path:
    return write_matrix(MATRIX_TEXT)


def run_bisection(
    matrix: Path, tmp_path: Path, monkeypatch, pipeline: FakePipeline, *, good: str = "0.14.1", bad: str = "0.17.2"
) -> Bisection:
    monkeypatch.setattr(checks_module, "run_plan", pipeline)
    monkeypatch.setattr(checks_module.importcheck, "recorded", pipeline.recorded)
    target = find_target(load_spec(matrix), [], "kernels")
    options = CheckOptions(store=tmp_path / "results.sqlite", workdir=tmp_path / "work", lock_dir=tmp_path / "locks")
    checker = Checker(target, options, lambda plan, stages: VenvBackend(tmp_path / "envs"))
    found = bisect(target, KERNELS, good=good, bad=bad, checker=checker)
    record_note(found, options.store, options.run_id)
    return found


def test_the_ends_agree_at_the_probe_so_the_import_check_decides(matrix, tmp_path, monkeypatch):
    pipeline = FakePipeline(kernels_history("0.15.2"))
    found = run_bisection(matrix, tmp_path, monkeypatch, pipeline)
    assert found.stage == "import"
    assert (found.last_good, found.first_bad) == ("0.15.1", "0.15.2")
    # Both ends at the probe (a tie), both at import, then at most ceil(log2 8) = 3 releases between them.
    assert pipeline.calls[:4] == [("0.14.1", "probe"), ("0.17.2", "probe"), ("0.14.1", "import"), ("0.17.2", "import")]
    between_ends = pipeline.calls[4:]
    assert len(between_ends) <= 3 and all(stage == "import" for _, stage in between_ends)
    report = found.to_dict()
    assert report["first_bad"] == {
        "version": "0.15.2",
        "evidence": f"predicted-fail:import-dependency-conflict: {CONFLICT}",
    }
    assert report["last_good"]["evidence"] == "skipped:no-gpu: import check: pass: imported sglang"
    assert report["checks"]["at_stage"] == {"run": 2 + len(between_ends), "reused": 0}
    assert report["checks"]["at_most"] == len(KERNELS) - 4  # 2 ends + ceil(log2 8)


def test_an_unresolvable_release_is_skipped_a_neighbour_tried_and_both_reported(matrix, tmp_path, monkeypatch):
    pipeline = FakePipeline(kernels_history("0.16.0", unresolvable=("0.16.1",)))
    found = run_bisection(matrix, tmp_path, monkeypatch, pipeline)
    assert (found.last_good, found.first_bad) == ("0.15.2", "0.16.0")
    assert found.found.skipped == ("0.16.1",) and found.found.ambiguous == ()
    assert found.labels["0.16.1"] == "skip"
    # The middle of 0.14.1..0.17.2 is 0.16.1; of its two neighbours, equally near, the older is tried next.
    assert [v for v, s in pipeline.calls[4:6]] == ["0.16.1", "0.16.0"]
    assert found.to_dict()["skipped"] == ["0.16.1"]


def test_a_gap_of_uninstallable_releases_at_the_change_is_named_in_the_result_and_the_note(
    matrix, tmp_path, monkeypatch
):
    pipeline = FakePipeline(kernels_history("0.16.0", unresolvable=("0.15.2", "0.16.0"), errors=("0.16.1",)))
    found = run_bisection(matrix, tmp_path, monkeypatch, pipeline)
    assert (found.last_good, found.first_bad) == ("0.15.1", "0.16.2")
    assert found.found.ambiguous == ("0.15.2", "0.16.0", "0.16.1")
    assert "skipped between them, so maybe theirs: 0.15.2, 0.16.0, 0.16.1" in found.note


def test_a_killed_bisection_resumes_with_the_verdicts_it_stored(matrix, tmp_path, monkeypatch):
    history = kernels_history("0.16.2")
    killed = FakePipeline(history, kill_after=5)
    with pytest.raises(KeyboardInterrupt):
        run_bisection(matrix, tmp_path, monkeypatch, killed)
    assert len(killed.calls) == 5
    resumed = FakePipeline(history)
    found = run_bisection(matrix, tmp_path, monkeypatch, resumed)
    assert found.first_bad == "0.16.2"
    assert not set(resumed.calls) & set(killed.calls)  # nothing checked before the kill runs again
    assert sum(c.reused for c in found.checks) == 5
    # And once more: every check is in the store, nothing runs, and the result is not noted twice.
    with Store(tmp_path / "results.sqlite") as store:
        noted = len([r for r in store.all_rows() if notes([r])])
    again = FakePipeline(history)
    assert run_bisection(matrix, tmp_path, monkeypatch, again).first_bad == "0.16.2"
    assert again.calls == []
    with Store(tmp_path / "results.sqlite") as store:
        assert len([r for r in store.all_rows() if notes([r])]) == noted == 2


def test_an_import_check_that_failed_to_install_is_skipped_then_run_again_on_resume(matrix, tmp_path, monkeypatch):
    # The pipeline stores a cell whose import check hit an install fault as error:import-check (retried).
    faults = {"0.16.1"}
    works = kernels_history("0.16.0")

    def history(version: str, stage: str) -> tuple[str, ...]:
        if stage == "import" and version in faults:
            return "error:import-check", "`uv pip install` failed: reset"
        return works(version, stage)

    first = run_bisection(matrix, tmp_path, monkeypatch, FakePipeline(history))
    assert first.labels["0.16.1"] == "skip" and first.first_bad == "0.16.0"
    assert "`uv pip install` failed: reset" in first.at_stage("0.16.1").undecided
    faults.clear()  # the index answers again
    resumed = FakePipeline(history)
    again = run_bisection(matrix, tmp_path, monkeypatch, resumed)
    assert resumed.calls == [("0.16.1", "import")]  # an error is not final: the pipeline runs it again
    assert again.labels["0.16.1"] == "bad" and again.first_bad == "0.16.0"


def test_a_stored_skip_whose_lock_has_no_import_result_is_run_again(matrix, tmp_path, monkeypatch):
    # A store written before import faults became errors: skipped:no-gpu, final, and the import check has no
    # record of the lock. Asked of the import check itself, the cell decided nothing; it runs again.
    history = kernels_history("0.16.2")
    first = run_bisection(matrix, tmp_path, monkeypatch, FakePipeline(history, no_import_result={"0.16.1"}))
    assert first.labels["0.16.1"] == "skip" and first.first_bad == "0.16.2"
    assert first.at_stage("0.16.1").undecided.startswith(checks_module.NO_IMPORT_RESULT)
    resumed = FakePipeline(history)
    again = run_bisection(matrix, tmp_path, monkeypatch, resumed)
    assert resumed.calls[0] == ("0.16.1", "import") and resumed.reruns[0] is True
    assert again.labels["0.16.1"] == "good" and again.first_bad == "0.16.2"


def test_a_newer_good_release_finds_the_fix(matrix, tmp_path, monkeypatch):
    found = run_bisection(
        matrix, tmp_path, monkeypatch, FakePipeline(kernels_history("0.16.1")), good="0.14.1", bad="0.17.2"
    )
    assert found.regression

    def fixed(version: str, stage: str) -> tuple[str, str]:
        failing = stage == "import" and Version(version) < Version("0.16.1")
        return ("predicted-fail:missing-module", "ModuleNotFoundError: x") if failing else ("skipped:no-gpu", "")

    fix = run_bisection(matrix, tmp_path / "fix", monkeypatch, FakePipeline(fixed), good="0.17.2", bad="0.14.1")
    assert not fix.regression
    assert (fix.first_bad, fix.last_good) == ("0.16.0", "0.16.1")  # the last bad and the first good
    assert fix.note.startswith("kernels 0.16.1 fixed it in ")


def test_ends_that_cannot_be_judged_stop_the_bisection(matrix, tmp_path, monkeypatch):
    with pytest.raises(InputError, match=r"--bad 0\.17\.2 cannot be installed in this environment"):
        run_bisection(matrix, tmp_path, monkeypatch, FakePipeline(kernels_history("0.15.1", unresolvable=("0.17.2",))))
    with pytest.raises(Undecided, match=r"--good 0\.14\.1 could not be checked at probe: error:resolve"):
        run_bisection(matrix, tmp_path / "2", monkeypatch, FakePipeline(kernels_history("0.15.1", errors=("0.14.1",))))
    with pytest.raises(InputError, match="same verdicts at every stage this host decides"):
        run_bisection(matrix, tmp_path / "3", monkeypatch, FakePipeline(kernels_history("9.0")))


def test_the_bisected_environment_is_the_matrix_one_with_the_axis_replaced(matrix):
    spec = load_spec(matrix)
    # kernels has two values in the matrix; apart from it, one environment is left: no --select needed.
    target = find_target(spec, [], "kernels")
    plan = derived_plan(target, "0.14.1")
    matrix_env = next(c.env_id for c in plan_spec(spec).cells if c.env.axes["kernels"] == "0.14.1")
    assert plan.environments == [matrix_env]  # the same ids as the matrix's own: its stored runs are reused
    assert [c.mode for c in plan.cells] == ["baseline", "piecewise"]
    # A package the matrix does not name becomes a package axis; an engine axis is found by its package name.
    assert find_target(spec, ["kernels=0.14.1"], "huggingface_hub").added
    assert derived_plan(find_target(spec, ["kernels=0.14.1"], "huggingface-hub"), "0.30.0").cells[0].env.axes[
        "huggingface-hub"
    ] == ("0.30.0")
    flashinfer = find_target(spec, ["mode=piecewise", "kernels=locked"], "flashinfer-python")
    assert (flashinfer.axis, flashinfer.package, flashinfer.modes) == (
        "flashinfer",
        "flashinfer-python",
        ("piecewise",),
    )


def test_the_note_reaches_the_failure_page_of_its_class(matrix, tmp_path, monkeypatch):
    found = run_bisection(matrix, tmp_path, monkeypatch, FakePipeline(kernels_history("0.16.0")))
    with Store(tmp_path / "results.sqlite") as store:
        latest = store.latest()
    noted = [r for r in latest if notes([r])]
    assert {r["axes"]["kernels"] for r in noted} == {"0.16.0"} and len(noted) == 2  # both modes of the first bad
    assert all(r["verdict"] == "predicted-fail:import-dependency-conflict" for r in noted)
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "report", "--store", str(tmp_path / "results.sqlite"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    page = (out / "failures" / "import-dependency-conflict.md").read_text()
    assert "## Bisected" in page
    assert f"kernels 0.16.0 introduced it in {matrix}" in page.replace("\\", "")
    assert "last good 0.15.2" in page
    other = (out / "failures" / "missing-module.md").read_text()
    assert "Bisected" not in other
    assert found.note == notes(noted)[0] and NOTE_PREFIX + found.note in noted[0]["evidence"]


# ----------------------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["matrix/glm5-nvfp4.toml", "--axis", "kernels"], "bisect needs one environment, and the selection leaves"),
        (["matrix/h200-smoke.toml", "--axis", "mode"], "--axis mode: bisect searches a package's releases"),
        (["matrix/h200-smoke.toml", "--axis", "cuda"], "--axis cuda: the cuda axis names a cuda kind"),
        (["matrix/h200-smoke.toml", "--axis", "Not A Package"], "neither an axis of matrix/h200-smoke.toml nor"),
        (["matrix/h200-smoke.toml", "--axis", "kernels", "--good", "0.14.1", "--bad", "0.14.1.0"], "same version"),
        (["matrix/h200-smoke.toml", "--axis", "kernels", "--good", "latest"], "--good 'latest' is not a version"),
        (
            ["matrix/cpu-smoke.toml", "--axis", "torch", "--select", "transformers=5.24.0", "--stage", "probe"],
            "--stage probe: this host decides at serve",
        ),
        (
            ["matrix/h200-smoke.toml", "--axis", "flashinfer", "--probe-entry", "custom-op", "--stage", "import"],
            "not --stage import",
        ),
        (["matrix/cpu-smoke.toml", "--axis", "torch", "--probe-entry", "custom-op"], "has no entry probe"),
        (["matrix/nothing.toml", "--axis", "kernels"], "matrix/nothing.toml: no such matrix file"),
        (["matrix/h200-smoke.toml", "--axis", "kernels", "--select", "sglang=0.5.99"], "sglang"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    if "--good" not in args:
        args = [*args, "--good", "0.14.1"]
    if "--bad" not in args:
        args = [*args, "--bad", "0.17.2"]
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "bisect", *args], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servematrix: error: "), done.stderr
    assert message in lines[0]
    assert "Traceback" not in done.stderr


def test_an_entry_probe_row_is_built_by_the_pipelines_row_builder(tmp_path, monkeypatch):
    # The probe itself (a torch+flashinfer venv, minutes) is replaced by its answer; resolve reads the
    # committed lock; the row is the real one the checker stores.
    from servematrix.engines.sglang import traceprobe

    def probed(**kw):
        return traceprobe.ProbeResult(
            traceable=False, entry=kw["entry"], torch=kw["torch_version"], flashinfer=kw["flashinfer_version"],
            arch=kw["arch"], evidence="Unsupported: Attempted to call function marked as skipped", seconds=0.1,
            cached=False, error="",
        )  # fmt: skip

    monkeypatch.setattr(traceprobe, "trace_probe", probed)
    spec = load_spec(REPO / "matrix" / "h200-smoke.toml")
    target = find_target(spec, ["kernels=0.14.1", "mode=piecewise"], "flashinfer")
    options = CheckOptions(
        store=tmp_path / "s.sqlite", workdir=tmp_path / "work", lock_dir=REPO / "matrix" / "locks", probe_entry="plain"
    )
    checker = Checker(target, options, lambda plan, stages: VenvBackend(tmp_path / "envs"))
    check = checker.check(target.env.axes["flashinfer"], "probe")
    assert [c.verdict for c in check.cells] == ["predicted-fail:dynamo-untraceable"]
    with Store(tmp_path / "s.sqlite") as store:
        (row,) = store.all_rows()
    assert row["backend"] == "venv" and row["redacted_flags"] == [] and row["image_digest"] is None
    assert row["lock_file"] and row["evidence"][0].startswith("probe: plain on torch ")
