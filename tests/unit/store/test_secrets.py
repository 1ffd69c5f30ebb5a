"""Secrets in server arguments: redacted on the way in, so nothing stored, printed, exported or rendered shows
them. A matrix with `--api-key sk-…`, `--hf-token=hf_…` and `--token ghp_…` runs end to end (fake backend,
real server process, real store), then `plan`, the store, the server log, `report` are searched for them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from servematrix.cli import main
from servematrix.planning.plan import make_plan
from servematrix.records.row import Row
from servematrix.run.pipeline import run_plan
from servematrix.run.runplan import RunOptions
from servematrix.store.redact import secret_variable
from servematrix.store.store import Store
from tests.conftest import SMALL_SGLANG
from tests.fakes.fake_backend import MATRIX, FakeBackend

SK = "sk-" + "Q7w" * 10
HF = "hf_" + "Zq4" * 10
GHP = "ghp_" + "Xy3" * 12
SECRETS = (SK, HF, GHP)
ARGS = f'args = ["--api-key", "{SK}", "--hf-token={HF}", "--token", "{GHP}"]'


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _files_under(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def test_plan_json_and_table_never_show_a_secret(write_matrix, capsys):
    path = write_matrix(SMALL_SGLANG.replace("[bench]", f"[server]\n{ARGS}\n[bench]"))
    assert main(["plan", str(path), "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    command = next(c["command"] for c in cells if c["applicable"])
    assert command[-5:] == ["--api-key", "***", "--hf-token=***", "--token", "***"]
    assert main(["plan", str(path), "--commands"]) == 0
    table = capsys.readouterr().out
    assert not _leaks(table) and "***" in table


def test_ids_do_not_change_with_redaction(write_matrix, capsys):
    """Masking happens after the ids are computed: a plan with secrets keeps the ids it always had."""
    from servematrix.config.spec import load_spec
    from servematrix.planning.cells import expand

    path = write_matrix(SMALL_SGLANG.replace("[bench]", f"[server]\n{ARGS}\n[bench]"))
    assert [c.id for c in make_plan(path).cells] == [c.id for c in expand(load_spec(path))]


@pytest.fixture
def secret_run(tmp_path):
    """A run whose server is given the secrets and prints them, as servers echo their arguments."""
    log = tmp_path / "echo.log"
    log.write_text(f"ServerArgs(api_key='{SK}', hf_token='{HF}')\nargv: --token {GHP}\n")
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX.format(server=ARGS))
    launches = tmp_path / "launches.jsonl"
    backend = FakeBackend(
        tmp_path, server_args=("--replay", str(log), "--after", "0", "--serve-after", "0.3"), launches=launches
    )
    options = RunOptions(stages=("build", "serve"), store=tmp_path / "s.sqlite", workdir=tmp_path / "work")
    summary = run_plan(make_plan(matrix, ["mode=static"]), backend, options, console=Console(file=io.StringIO()))
    assert set(summary.verdicts.values()) == {"pass"}
    return tmp_path, launches


def test_the_server_gets_the_secrets_and_nothing_stores_them(secret_run):
    root, launches = secret_run
    launched = [json.loads(line)["argv"] for line in launches.read_text().splitlines()]
    assert all(set(SECRETS) <= set(" ".join(argv).replace("=", " ").split()) for argv in launched)

    with Store(root / "s.sqlite") as store:
        rows = store.all_rows()
    assert rows
    for row in rows:
        assert row["argv"][-5:] == ["--api-key", "***", "--hf-token=***", "--token", "***"]
        assert row["redacted_flags"] == ["--api-key", "--hf-token", "--token"]
    raw = (root / "s.sqlite").read_bytes() + b"".join(p.read_bytes() for p in root.glob("s.sqlite-*"))
    assert not [s for s in SECRETS if s.encode() in raw]

    logs = _files_under(root / "work" / "logs")
    assert "ServerArgs(api_key=" in logs  # the server's lines are there, without the secrets
    assert not _leaks(logs)


def test_report_and_published_results_never_show_a_secret(secret_run, capsys):
    root, _ = secret_run
    out = root / "site"
    assert main(["report", "--store", str(root / "s.sqlite"), "--out", str(out)]) == 0
    published = _files_under(out)
    assert "***" in published  # the argv is there, masked
    assert not _leaks(published)


def test_a_matrix_may_leave_a_secret_to_the_environment(tmp_path, monkeypatch):
    """`--api-key ***` in the matrix: the harness takes the value from the variable the reproduce block names."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX.format(server='args = ["--api-key", "***"]'))
    options = RunOptions(stages=("build", "serve"), store=tmp_path / "s.sqlite", workdir=tmp_path / "work")
    plan = make_plan(matrix, ["mode=static"])
    variable = secret_variable("--api-key")
    assert variable == "SERVEMATRIX_SECRET_API_KEY"

    monkeypatch.delenv(variable, raising=False)
    assert main(["run", str(matrix), "--backend", "venv", "--store", str(tmp_path / "x.sqlite"), "--no-report"]) == 2

    monkeypatch.setenv(variable, SK)
    launches = tmp_path / "launches.jsonl"
    backend = FakeBackend(tmp_path, launches=launches)
    summary = run_plan(plan, backend, options, console=Console(file=io.StringIO()))
    assert set(summary.verdicts.values()) == {"pass"}
    assert all(SK in json.loads(line)["argv"] for line in launches.read_text().splitlines())
    with Store(tmp_path / "s.sqlite") as store:
        assert {tuple(r["argv"][-2:]) for r in store.all_rows()} == {("--api-key", "***")}


def test_the_run_says_a_secret_flag_is_in_the_servers_argv(tmp_path, monkeypatch):
    """docs/containers.md promised no secret in a process list; a secret flag's value is there (issue 38)."""
    from servematrix.run.runplan import preamble

    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX.format(server='args = ["--api-key", "***"]'))
    lines = preamble(make_plan(matrix), RunOptions(workdir=tmp_path / "work", store=tmp_path / "s.sqlite"))
    assert any("--api-key" in line and "SERVEMATRIX_SECRET_API_KEY" in line and "ps" in line for line in lines)


def test_a_missing_secret_variable_is_named(tmp_path, monkeypatch, capsys):
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX.format(server='args = ["--hf-token=***"]'))
    monkeypatch.delenv("SERVEMATRIX_SECRET_HF_TOKEN", raising=False)
    assert main(["run", str(matrix), "--backend", "venv", "--store", str(tmp_path / "s.sqlite"), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert "SERVEMATRIX_SECRET_HF_TOKEN" in err and "--hf-token" in err
    assert not (tmp_path / "s.sqlite").exists()


def test_the_reproduce_command_names_the_variable_of_each_masked_flag():
    from servematrix.report.markdown import reproduce

    row = {"matrix": "matrix/m.toml", "cell_id": "abc", "backend": "venv", "redacted_flags": ["--api-key"]}
    command = reproduce(Row.of(row))
    assert command.startswith("SERVEMATRIX_SECRET_API_KEY=*** servematrix run matrix/m.toml")
    assert reproduce(Row.of({**row, "redacted_flags": []})).startswith("servematrix run")
