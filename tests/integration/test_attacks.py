"""The attack list of the second hardening pass, replayed: a crafted store, a crafted published record, a
hostile OpenAI server, symlinked output folders, a 401 index, secrets in unusual variable names, limits.

`nox -s tests` installs the package non-editable, so there these run against the installed copy. Each test
is seconds: they call the CLI in-process (`servematrix.cli.main`) and share the fake server of
tests/fakes/, in its hostile modes.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from servematrix.cli import main
from servematrix.stages.bench_worker import CIRCUIT_TIMEOUTS, BatchSpec, Runner
from servematrix.store.store import Store
from tests.conftest import REPO
from tests.fakes.fake_openai_server import FakeBehavior, FakeOpenAIServer

pytestmark = pytest.mark.integration

MATRIX = "matrix/cpu-smoke.toml"
AXES = {"transformers": "5.24.0", "torch": "2.9.1", "gpu": "cpu"}
ATTR_LIST_XSS = '*x*{: onmouseover="alert(document.domain)" }'
T1 = "2026-01-02T00:00:00+00:00"


def metrics(tok_s: float = 10.0, tokens: int = 100) -> dict[str, Any]:
    return {
        "completion_tokens": tokens,
        "levels": [
            {
                "concurrency": 1,
                "completion_tokens": tokens,
                "error_count": 0,
                "output_tok_s": {"min": tok_s, "median": tok_s, "max": tok_s},
                "runs": [],
            }
        ],
    }


def values(cell: str = "a", **extra: Any) -> dict[str, Any]:
    return {
        "run_id": "r1",
        "cell_id": cell,
        "env_id": f"env-{cell}",
        "engine": "transformers",
        "mode": "static",
        "matrix": MATRIX,
        "axes": AXES,
        "inputs_hash": "h",
        "verdict": "pass",
        "metrics": metrics(),
        "backend": "venv",
        "started_at": T1,
        "finished_at": T1,
        **extra,
    }


def make_store(path: Path, *rows: dict[str, Any]) -> Path:
    with Store(path) as store:
        for row in rows or (values(),):
            store.record(**row)
    return path


def tamper(path: Path, sql: str, *params: Any) -> None:
    """Change a store behind servematrix's back, as a crafted artifact would be."""
    db = sqlite3.connect(path)
    with db:
        db.execute(sql, params)
    db.close()


def site_html(markdown_text: str) -> str:
    """Markdown as the docs site renders it: mkdocs.yml's extensions."""
    md = pytest.importorskip("markdown")
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    extensions = [e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    return md.markdown(markdown_text, extensions=extensions)


class _Attributes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [(tag, name) for name, _ in attrs if name.startswith("on")]
        if tag in ("script", "img"):
            self.found.append((tag, ""))


def live_attributes(html: str) -> list[tuple[str, str]]:
    """Event handlers, and elements a row's text could only have made through markup."""
    parser = _Attributes()
    parser.feed(html)
    return parser.found


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("servematrix: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------ 1: stored XSS through attr_list


def test_attr_list_markup_in_free_text_fields_renders_as_text(project: Path):
    """host.cpu, host.gpu_sku, evidence and the excerpt are free text: escaped for mkdocs' attr_list."""
    store = make_store(
        project / "s.sqlite",
        values(
            verdict="fail:dynamo-untraceable",
            metrics=None,
            excerpt=f"Traceback\n{ATTR_LIST_XSS}",
            evidence=[ATTR_LIST_XSS, '_y_{: onclick="alert(1)" }'],
            host={"cpu": ATTR_LIST_XSS, "gpu_sku": ATTR_LIST_XSS, "driver": "1"},
        ),
    )
    assert main(["report", "--store", str(store), "--out", "site"]) == 0
    pages = [project / "site" / "compatibility.md", *(project / "site" / "failures").glob("*.md")]
    assert len(pages) > 2
    for page in pages:
        assert live_attributes(site_html(page.read_text())) == [], page.name


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("mode", ATTR_LIST_XSS),
        ("axes", json.dumps({**AXES, "gpu": ATTR_LIST_XSS})),
        ("matrix", "matrix/<img src=x onerror=alert(1)>.toml"),
        ("env_id", "env{: onclick=x}"),
    ],
)
def test_a_stored_name_outside_the_safe_set_is_refused_at_its_row(
    project: Path, capsys: pytest.CaptureFixture[str], column: str, value: str
):
    store = make_store(project / "s.sqlite")
    tamper(store, f"UPDATE cell_runs SET {column} = ?", value)
    assert main(["report", "--store", str(store), "--out", "site"]) == 2
    assert "row r1/a" in one_error_line(capsys)
    assert not (project / "site").exists()
    assert main(["merge", "merged.sqlite", str(store)]) == 2
    assert "row r1/a" in one_error_line(capsys)
    assert not (project / "merged.sqlite").exists()


def _publish(project: Path) -> Path:
    assert main(["report", "--publish", "--store", str(make_store(project / "s.sqlite"))]) == 0
    return project / "docs" / "results" / "latest.json"


def test_a_crafted_published_record_is_refused_at_its_cell(project: Path, capsys: pytest.CaptureFixture[str]):
    record = _publish(project)
    capsys.readouterr()
    data = json.loads(record.read_text())
    data["cells"]["a"]["axes"]["gpu"] = ATTR_LIST_XSS
    record.write_text(json.dumps(data))
    before = {p: p.read_bytes() for p in (project / "docs").rglob("*") if p.is_file()}
    assert main(["report", "--publish", "--from-published"]) == 2
    assert "cell 'a'" in one_error_line(capsys)
    assert {p: p.read_bytes() for p in (project / "docs").rglob("*") if p.is_file()} == before


# ------------------------------------------------------------------------ 6, 9: absurd figures, bad types


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("axes", "[]"),
        ("host", "5"),
        ("host", 5),
        ("evidence", '{"a": 1}'),
        ("metrics", json.dumps(metrics(tok_s=-43e6))),
        ("metrics", json.dumps(metrics(tok_s=1e30))),
        ("metrics", json.dumps(metrics(tokens=-1000000))),
        ("metrics", json.dumps(metrics()).replace('"median": 10.0', '"median": NaN')),
        ("metrics", json.dumps(metrics()).replace('"completion_tokens": 100,', '"completion_tokens": true,', 1)),
    ],
)
def test_a_row_of_the_wrong_type_or_an_absurd_figure_is_refused_on_read_and_merge(
    project: Path, capsys: pytest.CaptureFixture[str], column: str, value: Any
):
    store = make_store(project / "s.sqlite")
    tamper(store, f"UPDATE cell_runs SET {column} = ?", value)
    assert main(["merge", "merged.sqlite", str(store)]) == 2
    assert "row r1/a" in one_error_line(capsys)
    assert not (project / "merged.sqlite").exists()
    assert main(["report", "--publish", "--store", str(store)]) == 2
    assert "row r1/a" in one_error_line(capsys)
    assert not (project / "docs").exists()


def test_a_published_nan_is_refused_and_never_written(project: Path, capsys: pytest.CaptureFixture[str]):
    record = _publish(project)
    capsys.readouterr()
    record.write_text(record.read_text().replace('"median": 10.0', '"median": NaN'))
    assert main(["report", "--publish", "--from-published"]) == 2
    assert "NaN" in one_error_line(capsys)


# ------------------------------------------------------------------------ 2: deleting what it did not write


@pytest.mark.parametrize("folder", ["plots", "failures"])
def test_a_symlinked_output_folder_is_refused_and_its_target_untouched(
    project: Path, capsys: pytest.CaptureFixture[str], folder: str
):
    brand = project / "brand"
    brand.mkdir()
    (brand / "brand.svg").write_text("<svg/>")
    (brand / "runbook.md").write_text("# runbook")
    (project / "docs").mkdir()
    (project / "docs" / folder).symlink_to(brand)
    store = make_store(project / "s.sqlite", values(verdict="fail:dynamo-untraceable", metrics=None))
    assert main(["report", "--publish", "--store", str(store)]) == 2
    assert "symbolic link" in one_error_line(capsys)
    assert sorted(p.name for p in brand.iterdir()) == ["brand.svg", "runbook.md"]
    assert sorted(p.name for p in (project / "docs").iterdir()) == [folder]


def test_a_report_into_another_projects_docs_removes_none_of_its_files(project: Path):
    docs = project / "other" / "docs"
    for name in ("plots/logo.svg", "failures/runbook.md", "failures/index.md.bak"):
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text("theirs")
    store = make_store(project / "s.sqlite", values(verdict="fail:dynamo-untraceable", metrics=None))
    assert main(["report", "--store", str(store), "--out", str(docs)]) == 0
    assert (docs / "plots" / "logo.svg").read_text() == "theirs"
    assert (docs / "failures" / "runbook.md").read_text() == "theirs"
    assert (docs / "failures" / "dynamo-untraceable.md").is_file()
    # A plot this tool wrote is removed once its matrix is gone; theirs stay.
    store = make_store(project / "t.sqlite", values(cell="b"))
    assert main(["report", "--store", str(store), "--out", str(docs)]) == 0
    ours = sorted(p.name for p in (docs / "plots").glob("*.svg") if p.name != "logo.svg")
    assert ours
    store = make_store(project / "u.sqlite", values(cell="c", matrix="matrix/other.toml"))
    assert main(["report", "--store", str(store), "--out", str(docs)]) == 0
    assert not [name for name in ours if (docs / "plots" / name).exists()]
    assert (docs / "plots" / "logo.svg").read_text() == "theirs"
    assert (docs / "failures" / "runbook.md").read_text() == "theirs"


# ------------------------------------------------------------------------ 8 and Low: all or nothing, one line


def test_a_read_only_results_folder_leaves_every_page_as_it_was(project: Path, capsys: pytest.CaptureFixture[str]):
    record = _publish(project)
    docs = project / "docs"
    before = {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()}
    store = make_store(project / "t.sqlite", values(cell="b", verdict="fail:dynamo-untraceable", metrics=None))
    capsys.readouterr()
    if os.geteuid() == 0:  # root writes a read-only folder: a folder where the record goes fails as late
        record.unlink()
        record.mkdir()
        before = {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()}
        assert main(["report", "--publish", "--store", str(store)]) == 2
    else:
        record.parent.chmod(0o555)
        try:
            assert main(["report", "--publish", "--store", str(store)]) == 2
        finally:
            record.parent.chmod(0o755)
    assert "nothing was written" in one_error_line(capsys)
    assert {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()} == before
    assert not [p for p in docs.iterdir() if p.name.startswith(".servematrix-staging")]


@pytest.mark.parametrize("out", ["a-file", "x" * 5000])
def test_an_out_that_is_a_file_or_too_long_is_one_line(project: Path, capsys: pytest.CaptureFixture[str], out: str):
    (project / "a-file").write_text("mine")
    store = make_store(project / "s.sqlite")
    assert main(["report", "--publish", "--store", str(store), "--out", out]) == 2
    one_error_line(capsys)
    assert (project / "a-file").read_text() == "mine"


# ------------------------------------------------------------------------ 5: an index that refuses credentials


class _Refusing(http.server.BaseHTTPRequestHandler):
    status = 401

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("WWW-Authenticate", 'Basic realm="index"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("status", [401, 403])
def test_an_index_that_refuses_credentials_is_a_harness_error_not_unresolvable(tmp_path: Path, status: int):
    """Real uv against a local index answering 401/403: `error` (run again next time), never `unresolvable`."""
    from servematrix.stages.resolve import classify_failure

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    handler = type("Refusing", (_Refusing,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        (tmp_path / "in.txt").write_text("sglang\n")
        done = subprocess.run(
            [uv, "pip", "compile", "--no-cache", "--python-version", "3.11", "--no-config", "in.txt",
             "--index-url", f"http://127.0.0.1:{server.server_address[1]}/simple"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"},
        )  # fmt: skip
    finally:
        server.shutdown()
    assert done.returncode != 0
    assert classify_failure(done.stderr)[0] == "error", done.stderr


# ------------------------------------------------------------------------ 4: secrets in unusual variable names


def test_values_of_unusual_variables_given_to_a_server_never_reach_its_log(tmp_path: Path):
    """A real server process that prints its whole environment and dies: nothing the cell gave it (but public
    variables) and no mixed letter-digit value it inherited survives in its log, where excerpts come from."""
    import sys

    from servematrix.backends import LaunchSpec
    from servematrix.engines import Readiness, load_engine
    from servematrix.stages.serve import Server, free_port

    given = {
        "DB_PASS": "correct-horse-battery",
        "GPU_AUTH": "zz9plural",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": "/hf-home-public",
    }
    inherited = {"RUNNER_SESSION": "a1b2c3d4e5f6", "GITHUB_EVENT_NAME": "schedule"}
    code = "import os, sys; [print(f'{k}={v}') for k, v in sorted(os.environ.items())]; sys.exit(3)"
    launch = LaunchSpec(argv=(sys.executable, "-c", code), env={**os.environ, **inherited, **given}, owns_listener=True)
    log = tmp_path / "server.log"
    server = Server(
        launch, engine="transformers", port=free_port(), log_path=log, timeout_s=20,
        readiness=Readiness(path="/health", interval_s=0.1, timeout_s=20),
        public_env=load_engine("transformers").public_env, passed_env=tuple(given),
    )  # fmt: skip
    with server:
        server.wait_ready()
    text = log.read_text()
    assert "DB_PASS=[REDACTED]" in text and "GPU_AUTH=[REDACTED]" in text and "RUNNER_SESSION=[REDACTED]" in text
    for value in ("correct-horse-battery", "zz9plural", "a1b2c3d4e5f6"):
        assert value not in text
    assert "HF_HOME=/hf-home-public" in text and "GITHUB_EVENT_NAME=schedule" in text  # public, and a word


# ------------------------------------------------------------------------ 6, 7, 9, Low: a hostile server


@pytest.fixture(scope="module")
def hostile() -> Iterator[FakeOpenAIServer]:
    """One fake server for the module; each test sets its hostile behaviour."""
    with FakeOpenAIServer(FakeBehavior()) as server:
        yield server


def _body(max_tokens: int = 8) -> bytes:
    return json.dumps(
        {"model": "fake", "stream": True, "max_tokens": max_tokens, "stream_options": {"include_usage": True},
         "messages": [{"role": "user", "content": "hi"}]}
    ).encode()  # fmt: skip


def _batch(server: FakeOpenAIServer, n: int, streams: int, timeout_s: float, deadline: float | None = None) -> Any:
    spec = BatchSpec(f"{server.base_url}/v1/chat/completions", [_body()] * n, streams, "chat", timeout_s, deadline)
    runner = Runner()
    loop = asyncio.new_event_loop()
    try:
        started = time.perf_counter()
        results, _, _ = loop.run_until_complete(runner.run(spec))
        again, _, _ = loop.run_until_complete(runner.run(spec))  # the breaker's state outlives a batch
        return results, again, time.perf_counter() - started
    finally:
        runner.close()
        loop.close()


@pytest.mark.parametrize(
    "usage", ['{"completion_tokens": -1000000}', '{"completion_tokens": 1e30}', '{"completion_tokens": NaN}',
              '{"completion_tokens": true}', '{"completion_tokens": 9000}', "[1, 2]", '"many"',
              '{"completion_tokens": 8, "prompt_tokens": -5}'],
)  # fmt: skip
def test_absurd_or_malformed_usage_is_a_protocol_error_of_that_request(hostile: FakeOpenAIServer, usage: str):
    hostile.set_behavior(FakeBehavior(usage_raw=usage))
    results, _, _ = _batch(hostile, 4, 2, 10.0)
    assert len(results) == 4
    assert {r.error for r in results} == {"bad_usage"} and not any(r.ok for r in results)
    assert all(r.completion_tokens is None for r in results)


def test_a_sane_usage_still_counts(hostile: FakeOpenAIServer):
    hostile.set_behavior(FakeBehavior(usage_raw='{"completion_tokens": 8, "prompt_tokens": 1}'))
    results, _, _ = _batch(hostile, 2, 2, 10.0)
    assert [r.completion_tokens for r in results] == [8, 8] and all(r.ok for r in results)


def test_a_server_that_hangs_mid_stream_trips_the_breaker(hostile: FakeOpenAIServer):
    """Endless streams: after CIRCUIT_TIMEOUTS timeouts in a row the rest is not sent; the next batch sends
    one request. 40 requests at 0.3 s would take 6 s one by one over 2 streams."""
    hostile.set_behavior(FakeBehavior(hang_after_chunks=2))
    first, again, elapsed = _batch(hostile, 40, 2, 0.3)
    assert elapsed < 3.0
    timeouts = sum(r.error == "timeout" for r in first)
    assert CIRCUIT_TIMEOUTS <= timeouts <= CIRCUIT_TIMEOUTS + 1  # the other stream's request was in flight
    assert sum(r.error == "circuit_open" for r in first) == 40 - timeouts
    assert sum(r.error == "timeout" for r in again) == 1 and len(again) == 40


def test_the_cells_budget_bounds_every_request(hostile: FakeOpenAIServer):
    hostile.set_behavior(FakeBehavior(hang_after_chunks=2))
    first, again, elapsed = _batch(hostile, 4, 4, 60.0, deadline=time.perf_counter() + 0.5)
    assert elapsed < 3.0
    assert {r.error for r in first} <= {"timeout", "circuit_open", "budget"}
    assert {r.error for r in again} == {"budget"}


def test_a_100_mb_line_without_a_newline_is_cut_off(hostile: FakeOpenAIServer):
    hostile.set_behavior(FakeBehavior(long_line_bytes=100 << 20))
    started = time.process_time()
    results, _, _ = _batch(hostile, 1, 1, 20.0)
    assert results[0].error == "protocol" and "SSE line" in results[0].error_detail
    assert time.process_time() - started < 5.0  # CPU of this process (the fake's thread included)


# ------------------------------------------------------------------------ Low


def test_a_device_node_is_not_a_store(project: Path, capsys: pytest.CaptureFixture[str]):
    from servematrix.errors import InputError

    journal = Path("/dev/full-journal")
    there = journal.exists()  # left by an older servematrix, maybe
    with pytest.raises(InputError, match="device, pipe or socket"):
        Store(Path("/dev/full"))
    assert journal.exists() == there


def test_a_store_locked_by_another_process_is_one_line(project: Path, monkeypatch: pytest.MonkeyPatch):
    from servematrix.errors import InputError
    from servematrix.store import store as store_module

    path = make_store(project / "s.sqlite")
    monkeypatch.setattr(store_module, "_LOCK_WAIT_S", 0.2)
    monkeypatch.setattr(store_module, "_WRITE_WAIT_S", 0.5)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Store(path) as store, pytest.raises(InputError, match="locked by another process"):
            store.record(**values(cell="b"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_an_absolute_lock_path_is_not_published(project: Path):
    store = make_store(project / "s.sqlite", values(lock_file="/srv/secret-host/locks/transformers/x.lock.txt"))
    assert main(["report", "--publish", "--store", str(store)]) == 0
    published = (project / "docs" / "results" / "latest.json").read_text()
    assert "/srv/secret-host" not in published and "x.lock.txt" in published
    assert "/srv/secret-host" not in (project / "docs" / "compatibility.html").read_text()


def test_a_null_verdict_is_refused_not_published_as_none(project: Path, capsys: pytest.CaptureFixture[str]):
    store = make_store(project / "s.sqlite")
    tamper(store, "UPDATE cell_runs SET verdict = NULL")
    assert main(["report", "--publish", "--store", str(store)]) == 2
    assert "without a verdict" in one_error_line(capsys)


def test_merge_refuses_a_newer_schema_and_says_what_it_kept(project: Path, capsys: pytest.CaptureFixture[str]):
    newer = make_store(project / "newer.sqlite")
    tamper(newer, "ALTER TABLE cell_runs ADD COLUMN energy_j REAL")
    assert main(["merge", "merged.sqlite", str(newer)]) == 2
    assert "newer servematrix" in one_error_line(capsys) and not (project / "merged.sqlite").exists()
    first = make_store(project / "a.sqlite")
    second = make_store(project / "b.sqlite", values(verdict="fail:dynamo-untraceable", metrics=None))
    assert main(["merge", "merged.sqlite", str(first), str(second)]) == 0
    err = capsys.readouterr().err
    assert "b.sqlite: 0 new row(s); 1 row(s) the target already held finished were kept as they were" in err


def test_report_reads_an_old_store_without_changing_it(project: Path):
    old = project / "old.sqlite"
    db = sqlite3.connect(old)
    db.execute(
        "CREATE TABLE cell_runs (run_id TEXT, cell_id TEXT, env_id TEXT, engine TEXT, mode TEXT, matrix TEXT,"
        " axes TEXT, inputs_hash TEXT, status TEXT, verdict TEXT, started_at TEXT, finished_at TEXT)"
    )
    with db:
        db.execute(
            "INSERT INTO cell_runs VALUES ('r1', 'a', 'env-a', 'transformers', 'static', ?, ?, 'h', 'finished',"
            " 'pass', ?, ?)",
            (MATRIX, json.dumps(AXES), T1, T1),
        )
    db.close()
    before = old.read_bytes()
    old.chmod(0o444)
    assert main(["report", "--store", str(old), "--out", "site"]) == 0
    assert old.read_bytes() == before
    assert sorted(p.name for p in project.iterdir() if p.name.startswith("old")) == ["old.sqlite"]


def test_max_jobs_is_capped_at_what_github_takes(capsys: pytest.CaptureFixture[str]):
    assert main(["plan", str(REPO / MATRIX), "--format", "github", "--max-jobs", "400"]) == 2
    assert "at most 256" in one_error_line(capsys)


def test_a_credential_in_the_slurm_launcher_is_masked_and_its_scripts_private(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: a dry run
    out = tmp_path / "o"
    launcher = "env HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz DB_PASS=hunter2hunter2 servematrix"
    argv = ["submit", str(REPO / MATRIX), "--slurm", "--out", str(out), "--dry-run", "--launcher", launcher,
            "--sbatch-arg=--export=ALL,GPU_AUTH=zz9plural"]  # fmt: skip
    assert main(argv) == 0
    shown = capsys.readouterr()
    for secret in ("hf_abcdefghijklmnopqrstuvwxyz", "hunter2hunter2", "zz9plural"):
        assert secret not in shown.out + shown.err
    scripts = list(out.glob("*.sbatch"))
    assert scripts and all(p.stat().st_mode & 0o077 == 0 for p in scripts)


def test_an_immutable_record_leaves_every_page_as_it_was(project: Path, capsys: pytest.CaptureFixture[str]):
    """chattr +i refuses even root, which os.access does not tell: the report is tried before it is moved."""
    chattr = shutil.which("chattr")
    record = _publish(project)
    if chattr is None or subprocess.run([chattr, "+i", str(record)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a filesystem that has it)")
    try:
        docs = project / "docs"
        before = {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()}
        store = make_store(project / "t.sqlite", values(cell="b", verdict="fail:dynamo-untraceable", metrics=None))
        capsys.readouterr()
        assert main(["report", "--publish", "--store", str(store)]) == 2
        assert "nothing was written" in one_error_line(capsys)
        assert {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()} == before
    finally:
        subprocess.run([chattr, "-i", str(record)], check=True)


def test_a_figure_that_is_not_finite_is_stored_as_null_not_nan(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        store.record(**values(metrics={**metrics(), "duration_s": float("inf"), "ttft": [float("nan"), 1.0]}))
        stored = store._db.execute("SELECT metrics FROM cell_runs").fetchone()[0]
        assert "NaN" not in stored and "Infinity" not in stored
        assert store.latest()[0]["metrics"]["ttft"] == [None, 1.0]


@pytest.mark.parametrize("command", [["report", "--store"], ["report", "--publish", "--store"], ["plan"], ["run"]])
def test_a_path_of_5000_characters_is_one_line(project: Path, capsys: pytest.CaptureFixture[str], command: list[str]):
    assert main([*command, "x" * 5000]) == 2
    one_error_line(capsys)


def test_a_gpu_kind_name_with_a_trailing_newline_is_refused_in_the_matrix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    text = (REPO / MATRIX).read_text()
    assert "[gpu.cpu]" in text
    matrix = tmp_path / "m.toml"
    matrix.write_text(text.replace("[gpu.cpu]", '[gpu."cpu\\n"]').replace('gpu = ["cpu"]', 'gpu = ["cpu\\n"]'))
    assert main(["plan", str(matrix)]) == 2  # the plan took `cpu\n` as a GPU kind: `$` matches before a newline
    assert "not a valid GPU kind name" in capsys.readouterr().err


# ======================================================================== third pass (issue 38)
# ------------------------------------------------------------------------ High 1: the reaper kills only its own


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def _here() -> dict[str, str]:
    from servematrix.run import hostinfo

    return {"hostname": hostinfo.host().hostname}


def _running(cell: str = "a", **extra: Any) -> dict[str, Any]:
    row = values(cell, harness_pid=_dead_pid(), host=_here(), argv=["python"], **extra)
    for key in ("verdict", "metrics", "finished_at"):
        row.pop(key)
    return row


@pytest.mark.parametrize("argv", [[], ["x"], ["python", "***"]])
def test_a_crafted_running_row_kills_no_process_it_did_not_start(project: Path, argv: list[str]):
    from servematrix.run.reaper import reap_orphans

    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # The leader of a group exits; its member lives on: a row naming only that group.
    group = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    member = int(group.stdout.readline()) if group.stdout else 0
    group.wait()
    try:
        with Store(project / "s.sqlite") as store:
            store.start(**{**_running("a", server_pid=victim.pid, server_pgid=victim.pid), "argv": argv})
            store.start(**_running("b", server_pgid=group.pid))
            reap_orphans(store)
            assert store.running() == []  # both rows are interrupted, their "servers" untouched
        assert victim.poll() is None and psutil_alive(member)
    finally:
        victim.kill()
        os.kill(member, 9)
        victim.wait()


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_reaper_kills_the_orphan_its_harness_started(project: Path):
    from servematrix.run.reaper import reap_orphans
    from servematrix.stages import serve

    argv = ["sleep", "61"]
    with Store(project / "s.sqlite") as store:
        store.start(**{**_running("a"), "argv": argv})
        env = {**os.environ, serve.HARNESS_MARKER: serve.harness_marker("r1", "a")}
        orphan = subprocess.Popen(argv, env=env, start_new_session=True)
        store.update("r1", "a", server_pid=orphan.pid, server_pgid=orphan.pid)
        assert orphan.pid in reap_orphans(store)
        assert orphan.wait(timeout=10) is not None


@pytest.mark.parametrize(("column", "value"), [("host", None), ("argv", None), ("argv", "[]")])
def test_merge_refuses_a_running_row_with_no_host_or_argv(
    project: Path, capsys: pytest.CaptureFixture[str], column: str, value: Any
):
    store = project / "s.sqlite"
    with Store(store) as shard:
        shard.start(**_running("a", server_pid=1, server_pgid=1))
    tamper(store, f"UPDATE cell_runs SET {column} = ?", value)
    assert main(["merge", "merged.sqlite", str(store)]) == 2
    assert "no host or no argv" in one_error_line(capsys)


def test_a_merged_running_row_brings_no_pids(project: Path):
    with Store(project / "s.sqlite") as shard:
        shard.start(**_running("a", server_pid=1, server_pgid=1))
    assert main(["merge", "merged.sqlite", str(project / "s.sqlite")]) == 0
    with Store(project / "merged.sqlite") as merged:
        (row,) = merged.running()
    assert row["server_pid"] is None and row["server_pgid"] is None


# ------------------------------------------------------------------------ Medium 6: a skewed clock pins no cell


def test_a_future_finished_at_is_refused_by_merge_and_pins_no_published_cell(
    project: Path, capsys: pytest.CaptureFixture[str]
):
    future = "2099-01-01T00:00:00+00:00"
    skewed = make_store(project / "skewed.sqlite", values(finished_at=future, started_at=future))
    assert main(["merge", "merged.sqlite", str(skewed)]) == 2
    assert "in the future" in one_error_line(capsys)
    record = _publish(project)
    data = json.loads(record.read_text())
    data["cells"]["a"]["finished_at"] = future
    record.write_text(json.dumps(data))
    newer = make_store(project / "newer.sqlite", values(run_id="r2", verdict="fail:server-timeout", metrics=None))
    assert main(["report", "--publish", "--store", str(newer)]) == 0
    assert json.loads(record.read_text())["cells"]["a"]["verdict"] == "fail:server-timeout"


# ------------------------------------------------------------------------ High 2: concurrent publishes


def _publish_into(store: Path, err: Path) -> None:
    with err.open("w") as sys.stderr:
        code = main(["report", "--publish", "--store", str(store)])
    os._exit(code)


def test_two_publishes_at_once_keep_both_stores_cells(project: Path):
    stores = []
    for name in ("a", "b"):
        rows = [
            values(f"{name}{i}", run_id=f"r{name}", env_id=f"env-{name}", verdict="fail:server-timeout", metrics=None)
            for i in range(5)
        ]
        stores.append(make_store(project / f"{name}.sqlite", *rows))
    import multiprocessing

    import servematrix.report.site  # noqa: F401  (imported once, before the fork: both start at once)

    runs = [
        multiprocessing.get_context("fork").Process(target=_publish_into, args=(store, project / f"{store.stem}.err"))
        for store in stores
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=120)
    errors = [(project / f"{store.stem}.err").read_text() for store in stores]
    assert [run.exitcode for run in runs] == [0, 0], errors
    assert len(json.loads((project / "docs" / "results" / "latest.json").read_text())["cells"]) == 10
    assert sorted("published 10 cell(s)" in e for e in errors) == [False, True]  # the second merged into the first's


def test_a_killed_publish_leaves_no_staging_folder_behind(project: Path):
    _publish(project)
    leftover = project / "docs" / ".servematrix-staging-killed"
    (leftover / "results").mkdir(parents=True)
    (leftover / "results" / "latest.json").write_text("{")
    _publish(project)
    assert not leftover.exists()
    assert ".servematrix-staging-*/" in (REPO / ".gitignore").read_text().split()


# ------------------------------------------------------------------------ Medium 3: the readiness probe


def _hostile_health(answer: bytes, trickle_s: float) -> tuple[int, threading.Event]:
    """A /health on 127.0.0.1 that sends `answer` a byte at a time every `trickle_s`, then an endless body."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    for byte in answer:
                        if stop.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(trickle_s)
                    while not stop.is_set():
                        conn.sendall(b"\x1f\x8b" + bytes(65536))
                except OSError:
                    continue
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], stop


@pytest.mark.parametrize(
    ("answer", "trickle_s", "ok"),
    [
        (b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000, 0.3, False),  # 1 byte every 0.3 s: never within 2 s
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n", 0.0, True),  # an endless gzip body
    ],
)
def test_a_hostile_health_endpoint_holds_the_harness_no_longer_than_its_deadline(
    tmp_path: Path, answer: bytes, trickle_s: float, ok: bool
):
    from servematrix.backends import LaunchSpec
    from servematrix.engines import Readiness
    from servematrix.stages.serve import Server

    port, stop = _hostile_health(answer, trickle_s)
    launch = LaunchSpec(argv=("sleep", "30"), env=dict(os.environ), owns_listener=False)
    readiness = Readiness(path="/health", interval_s=1.0, timeout_s=2.0)
    done: list[Any] = []
    try:
        with Server(
            launch, engine="transformers", port=port, log_path=tmp_path / "s.log", readiness=readiness, timeout_s=2.0
        ) as server:
            waiter = threading.Thread(target=lambda: done.append(server.wait_ready()), daemon=True)
            waiter.start()
            waiter.join(timeout=10)
    finally:
        stop.set()
    assert done and done[0].ok is ok and done[0].seconds < 5


# ------------------------------------------------------------------------ Medium 9: another user's port folder


def test_a_port_folder_another_user_can_write_denies_no_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from servematrix.run import ports

    folder = tmp_path / "servematrix-ports"
    folder.mkdir()
    monkeypatch.setattr(ports, "LOWEST", 41000)
    monkeypatch.setattr(ports, "MAX_PORT", 41009)
    for port in range(41000, 41010):
        (folder / str(port)).write_text("1")  # pid 1 lives for ever: every port "held"
    folder.chmod(0o777)
    with ports.reserved_port((), folder=folder) as port:
        assert 41000 <= port <= 41009
    if os.getuid() == 0:  # made first by another user, 0755: ours cannot be written there
        folder.chmod(0o755)
        os.chown(folder, 65534, 65534)
        with ports.reserved_port((), folder=folder) as port:
            assert 41000 <= port <= 41009


# ------------------------------------------------------------------------ Medium 10 and Low: sbatch scripts


def _directives(script: str) -> dict[str, str]:
    """The #SBATCH options as sbatch reads them: the line split at spaces, quotes honoured."""
    import shlex

    found: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            for word in shlex.split(line.removeprefix("#SBATCH ")):
                key, _, value = word.partition("=")
                found[key] = value
    return found


def test_sbatch_paths_with_a_space_or_a_percent_reach_slurm_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from servematrix.cli import parse_args
    from servematrix.scaleout.slurm import options_from_args, prepare

    project = tmp_path / "My Proj %j"
    project.mkdir()
    monkeypatch.chdir(project)
    options = options_from_args(parse_args(["submit", str(REPO / MATRIX), "--slurm", "--out", "o 100%"]))
    (array,) = prepare(options).arrays
    found = _directives(array.script.read_text())
    assert found["--chdir"] == str(project)
    assert found["--output"] == str(project / "o 100%%" / "logs").replace("%j", "%%j") + "/cpu-%a.out"


def test_a_partition_with_a_line_break_is_refused(project: Path, capsys: pytest.CaptureFixture[str]):
    code = main(["submit", str(REPO / MATRIX), "--slurm", "--dry-run", "--partition", "gpu\necho owned"])
    assert code == 2
    assert "partition" in one_error_line(capsys)


# ------------------------------------------------------------------------ Medium 7: plots of one file stem


def test_two_matrices_of_one_file_stem_get_plots_of_their_own(project: Path):
    store = make_store(
        project / "s.sqlite",
        values("a", matrix="matrix/a/cpu-smoke.toml"),
        values("b", env_id="env-b", matrix="matrix/b/cpu-smoke.toml", metrics=metrics(tok_s=99.0)),
    )
    assert main(["report", "--store", str(store), "--out", "out"]) == 0
    page = (project / "out" / "compatibility.md").read_text()
    links = [line for line in page.splitlines() if "throughput.svg" in line]
    assert len(links) == 2 and links[0] != links[1], links
    assert len(list((project / "out" / "plots").glob("*throughput.svg"))) == 2


# ------------------------------------------------------------------------ Medium 8: report linear in environments


def test_the_throughput_figure_holds_a_bounded_number_of_panels(project: Path, monkeypatch: pytest.MonkeyPatch):
    """A panel per environment made 1500 environments take 20 minutes (tests/benchmarks/test_report_scale.py)."""
    from servematrix.report import plots

    monkeypatch.setattr(plots, "MAX_PANELS", 2)
    rows = [
        values(str(i), env_id=f"env-{i}", axes={**AXES, "transformers": f"5.2{i}.0"}, metrics=metrics(10.0 + i))
        for i in range(3)
    ]
    store = make_store(project / "s.sqlite", *rows)
    assert main(["report", "--store", str(store), "--out", "out"]) == 0
    svg = next((project / "out" / "plots").glob("*throughput.svg")).read_text()
    assert "the newest 2 of 3 environments" in svg and "transformers 5.20.0" not in svg


# ------------------------------------------------------------------------ Medium 4 and Low: terminal escapes


def test_a_secret_split_by_a_terminal_escape_is_redacted_in_the_log_and_its_excerpt(tmp_path: Path):
    from servematrix.backends import LaunchSpec
    from servematrix.engines import Readiness
    from servematrix.stages.serve import Server

    secret = "Xy7kq9ZzP4wL"
    script = (
        "import sys; sys.stdout.write('token Xy7k\\x1b[0mq9ZzP4wL\\n\\x1b]0;owned\\x07\\x1b]52;c;aGk=\\x07\\x1b[2J"
        "bye\\n'); sys.exit(3)"
    )
    launch = LaunchSpec(argv=(sys.executable, "-c", script), env={**os.environ, "MY_KEY": secret}, owns_listener=False)
    readiness = Readiness(path="/health", interval_s=1.0, timeout_s=10.0)
    with Server(
        launch, engine="transformers", port=1, log_path=tmp_path / "s.log", readiness=readiness, timeout_s=10.0,
        passed_env=("MY_KEY",),
    ) as server:  # fmt: skip
        ready = server.wait_ready()
    assert ready.verdict is not None and ready.verdict.excerpt
    for text in (ready.verdict.excerpt, (tmp_path / "s.log").read_text()):
        assert "Xy7k" not in text and "q9ZzP4wL" not in text
        assert "\x1b" not in text and "\x07" not in text


def test_a_progress_bar_of_bare_carriage_returns_holds_a_bounded_partial_line(tmp_path: Path):
    from servematrix.backends import LaunchSpec
    from servematrix.engines import Readiness
    from servematrix.stages import serve, serverlog

    script = "import sys, time; sys.stdout.write('10%\\r' * 400_000); sys.stdout.flush(); time.sleep(30)"
    launch = LaunchSpec(argv=(sys.executable, "-c", script), env=dict(os.environ), owns_listener=False)
    readiness = Readiness(path="/health", interval_s=1.0, timeout_s=10.0)
    with serve.Server(
        launch, engine="transformers", port=1, log_path=tmp_path / "s.log", readiness=readiness, timeout_s=10.0
    ) as server:
        deadline = time.monotonic() + 10
        while (tmp_path / "s.log").stat().st_size < 1_000_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.check()
        assert len(server._live.partial) <= serverlog.PARTIAL_MAX


def test_recommend_prints_no_terminal_control_sequence(project: Path, capsys: pytest.CaptureFixture[str]):
    hostile = "fail:boom\x1b]0;owned\x07\x1b]52;c;aGk=\x07\x1b[2J"
    store = make_store(project / "s.sqlite", values("a"), values("b", env_id="env-b", verdict=hostile, metrics=None))
    capsys.readouterr()
    assert main(["recommend", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "boom" in out and "\x1b" not in out and "\x07" not in out


# ------------------------------------------------------------------------ Medium 5: a long merge beside a run


def test_a_write_waits_out_a_holder_longer_than_one_busy_timeout(project: Path, monkeypatch: pytest.MonkeyPatch):
    from servematrix.store import store as store_module

    path = make_store(project / "s.sqlite")
    monkeypatch.setattr(store_module, "_LOCK_WAIT_S", 0.2)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.0, lambda: holder.execute("ROLLBACK"))
    release.start()
    try:
        with Store(path) as store:
            store.record(**values(cell="b"))  # a run's verdict, written once the holder lets go
            assert {r["cell_id"] for r in store.latest()} == {"a", "b"}
    finally:
        release.join()
        holder.close()


def test_a_merge_holds_the_write_lock_a_batch_at_a_time(project: Path, monkeypatch: pytest.MonkeyPatch):
    from servematrix.store import store as store_module

    shard = make_store(project / "shard.sqlite", *(values(f"c{i}", env_id=f"e{i}") for i in range(5)))
    monkeypatch.setattr(store_module, "_MERGE_BATCH", 2)
    with Store(project / "merged.sqlite") as target:
        commits: list[str] = []
        target._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        assert target.merge([shard]) == [5]
        assert target.merge([shard]) == [0]
    assert len(commits) == 6  # 3 batches of at most 2 rows, twice


# ------------------------------------------------------------------------ Low: inputs a traceback used to answer


def test_a_matrix_with_a_byte_order_mark_is_read(tmp_path: Path):
    from servematrix.formats import tomlsource

    source = tomlsource.parse(b"\xef\xbb\xbf" + (REPO / MATRIX).read_bytes(), "m.toml")
    assert source.data == tomlsource.parse((REPO / MATRIX).read_bytes(), "m.toml").data


def test_a_published_record_nested_100k_deep_is_one_line(project: Path, capsys: pytest.CaptureFixture[str]):
    record = _publish(project)
    capsys.readouterr()
    record.write_text('{"schema": 1, "cells": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["report", "--publish", "--from-published"]) == 2
    assert "nested too deeply" in one_error_line(capsys)


def test_a_full_disk_while_publishing_is_one_line(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    import errno

    from servematrix.report import site

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    store = make_store(project / "s.sqlite")
    monkeypatch.setattr(site, "build_report", full)
    assert main(["report", "--publish", "--store", str(store)]) == 2
    assert "No space left on device" in one_error_line(capsys)
    assert not list((project / "docs").glob(".servematrix-staging-*"))


# ------------------------------------------------------------------------ Low: a hostile index


class _EndlessRange(http.server.BaseHTTPRequestHandler):
    """Answers any Range with 206 and the right Content-Range, then bytes without end."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        start = self.headers.get("Range", "bytes=0-0").removeprefix("bytes=").split("-")[0]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{int(start) + 99}/100000000")
        self.end_headers()
        try:
            while True:
                self.wfile.write(bytes(1 << 16))
        except OSError:
            pass


def test_an_index_that_sends_more_than_the_range_is_read_no_further(tmp_path: Path):
    from servematrix.formats.remotewheel import RemoteWheelError, wheel_metadata

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EndlessRange)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            wheel_metadata(f"http://127.0.0.1:{server.server_address[1]}/x.whl", "x", size=100_000_000)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    server.shutdown()
    assert outcome and isinstance(outcome[0], RemoteWheelError)  # zeros are no zip directory


def test_a_metadata_that_inflates_past_the_bound_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import zipfile

    from servematrix.formats import remotewheel
    from tests.wheelserver import RangeHandler, serve

    monkeypatch.setattr(remotewheel, "MAX_METADATA", 4096)
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as out:
        out.writestr("demo_pkg-1.0.dist-info/METADATA", "Name: demo-pkg\n" + "x" * 1_000_000)
    with serve(tmp_path, RangeHandler) as (base, _), pytest.raises(remotewheel.RemoteWheelError, match="over"):
        remotewheel.wheel_metadata(f"{base}/{wheel.name}", "demo-pkg", size=wheel.stat().st_size)


# ------------------------------------------------------------------------ Low: crafted sglang sources


def test_a_server_args_of_200k_terms_is_unreadable_not_a_recursion_error():
    from servematrix.engines.sglang.flagreader import SourceReader, UnreadableSource

    sources = {"sglang/srt/server_args.py": "x = " + " + ".join(["a"] * 200_000) + "\n"}
    with pytest.raises(UnreadableSource):
        SourceReader(sources).collect()


def test_bases_named_again_and_again_are_walked_once():
    from servematrix.engines.sglang.flagreader import SourceReader

    lines = ["class C0:\n    f0: int\n"]
    for level in range(1, 7):  # each class names the one below six times (10 levels took hours)
        lines.append(f"class C{level}({', '.join([f'C{level - 1}'] * 6)}):\n    f{level}: int\n")
    reader = SourceReader({"m.py": "".join(lines)})
    mod = reader.module("m")
    assert mod is not None
    fields = [node.target.id for node, _ in reader._record_fields(mod.classes["C6"], mod, depth=0)]  # type: ignore[attr-defined]
    assert fields == [f"f{level}" for level in range(7)]


# ------------------------------------------------------------------------ Low: the bench client


def _exchange_of(raw: bytes) -> Any:
    from servematrix.stages.bench_worker import _Exchange

    loop = asyncio.new_event_loop()
    try:
        ex = _Exchange("chat", True, loop.create_future())
        ex.feed(raw, 0.0)
        return ex
    finally:
        loop.close()


def test_an_interim_100_continue_is_not_the_answer():
    body = b'data: {"choices": [{"delta": {"content": " hi"}}]}\n\ndata: [DONE]\n\n'
    final = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    ex = _exchange_of(b"HTTP/1.1 100 Continue\r\n\r\n" + final)
    assert ex.status == 200 and ex.failure is None and ex.body_done and "".join(ex.parts) == " hi"


def test_usage_nested_200k_deep_is_a_protocol_error_of_that_request():
    body = b'data: {"choices": [], "usage": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n\n"
    ex = _exchange_of(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert ex.failure is not None and ex.failure[0] == "protocol"


# ------------------------------------------------------------------------ Low: bidi and overflow on the page


def test_a_bidi_override_is_dropped_and_a_long_verdict_badge_cut(project: Path):
    long_verdict = "fail:" + "x" * 200  # (3000 characters also make a failure page name too long: one line)
    store = make_store(
        project / "s.sqlite",
        values("a", excerpt="\u202eyek-ipa-- was here", verdict="fail:server-timeout", metrics=None),
        values("b", env_id="env-b", verdict=long_verdict, metrics=None),
    )
    assert main(["report", "--store", str(store), "--out", "out"]) == 0
    page = (project / "out" / "compatibility.html").read_text()
    assert "\u202e" not in page and "yek-ipa-- was here" in page
    assert long_verdict[:79] + "…</" in page
    assert not re.search(r'class="badge[^>]*>' + long_verdict, page)


# ------------------------------------------------------------------------ Low: values that reach CI scripts


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('python = "3.11"', 'python = "3.11\\nmatrix={}\\njobs=0"'),  # a line of its own in $GITHUB_OUTPUT
        ("timeout_minutes = ", "timeout_minutes = 9999999 # "),  # GitHub's timeout-minutes, sbatch --time
    ],
)
def test_a_matrix_value_that_reaches_a_ci_script_is_bounded(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str
):
    text = (REPO / MATRIX).read_text()
    assert old in text
    (project / "m.toml").write_text(text.replace(old, new, 1))
    assert main(["plan", "m.toml", "--format", "github"]) == 2
    assert "m.toml" in one_error_line(capsys)


# ------------------------------------------------------------------------ Low: leftovers of a SIGKILLed harness


def test_the_ceilings_fake_server_ends_with_a_sigkilled_harness(tmp_path: Path):
    import signal

    import psutil

    starts_the_fake = (  # as the ceiling starts it (stages/bench/ceiling.py), in its own session
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-m', 'servematrix.stages.bench_fake', '--port', '0', '--processes', '2'],"
        " stdout=subprocess.PIPE, text=True, start_new_session=True); "
        "print(p.pid, p.stdout.readline(), flush=True); time.sleep(60)"
    )
    harness = subprocess.Popen([sys.executable, "-c", starts_the_fake], stdout=subprocess.PIPE, text=True)
    assert harness.stdout is not None
    fake = int(harness.stdout.readline().split()[0])
    tree = [psutil.Process(fake), *psutil.Process(fake).children(recursive=True)]
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive


def test_reservation_files_of_dead_harnesses_are_swept(tmp_path: Path):
    from servematrix.run import ports

    (tmp_path / "41234").write_text(str(_dead_pid()))
    with ports.reserved_port((), folder=tmp_path):
        pass
    assert not (tmp_path / "41234").exists() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ Low (L11): SIGTERM to `lock`

HANGING_LOCK = """engine = "sglang"
python = "3.12"
[model]
name = "m"
path = "m"
[axes]
sglang = ["0.5.9"]
torch = ["pinned"]
flashinfer = ["pinned"]
cuda = ["12.8"]
gpu = ["b200"]
mode = ["baseline"]
[gpu.b200]
arch = "sm_100"
count = 1
[cuda."12.8"]
index_url = "http://127.0.0.1:{port}/simple"
[bench]
concurrency = [1]
input_len = 8
output_len = 8
prompts_per_concurrency = 2
"""


def test_sigterm_to_lock_ends_its_uv_too(project: Path):
    """L11: an index that accepts and never answers keeps `uv pip compile` waiting; SIGTERM to `servematrix lock`
    kills that uv (it was left running with ppid 1, until uv's own timeout) and exits 130."""
    import signal
    import socket

    import psutil

    assert shutil.which("uv"), "uv is a dependency of servematrix: it is installed with it"
    index = socket.socket()
    index.bind(("127.0.0.1", 0))
    index.listen(64)  # accepted by the kernel, never answered
    (project / "hang.toml").write_text(HANGING_LOCK.format(port=index.getsockname()[1]))
    env = {**os.environ, "SERVEMATRIX_ENGINES": "", "UV_CACHE_DIR": str(project / "uv-cache"), "UV_HTTP_TIMEOUT": "120"}
    lock = subprocess.Popen(
        [sys.executable, "-m", "servematrix", "lock", "hang.toml", "--out", "locks"],
        cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        uv: list[psutil.Process] = []
        while not uv and time.monotonic() < deadline and lock.poll() is None:
            time.sleep(0.2)
            uv = [p for p in psutil.Process(lock.pid).children(recursive=True) if "uv" in p.name()]
        assert uv, "uv never started"
        time.sleep(1)
        lock.send_signal(signal.SIGTERM)
        _, err = lock.communicate(timeout=30)
        _, alive = psutil.wait_procs(uv, timeout=10)
        for proc in alive:
            proc.kill()
        assert not alive, "uv outlived lock"
        assert lock.returncode == 130, err
        assert "Traceback" not in err and "interrupted" in err
    finally:
        if lock.poll() is None:
            lock.kill()
            lock.communicate()
        index.close()


# ------------------------------------------------------------------------ Low (L12): a gzip bomb for bisect


def test_bisect_against_a_gzip_bomb_index_page_is_one_line(project: Path, capsys: pytest.CaptureFixture[str]):
    """L12: the project page is 256 kB of gzip that inflates to 256 MiB of JSON (the attack's inflated to 1.5 GB,
    a MemoryError): bisect reads it no further than the page bound and says so in one line (exit 2)."""
    from servematrix.formats.indexpage import MAX_PAGE
    from tests.unit.formats.test_indexpage import bomb, serve

    body = bomb(4 * MAX_PAGE // 2**20)
    for url in serve(body, "gzip"):
        port = url.split(":")[2].split("/")[0]
        (project / "bomb.toml").write_text(HANGING_LOCK.format(port=port))
        code = main(["bisect", "bomb.toml", "--axis", "sglang", "--good", "0.5.9", "--bad", "0.5.10"])
        assert code == 2
        line = one_error_line(capsys)
        assert "cannot read the releases of sglang" in line and "bytes once inflated" in line
