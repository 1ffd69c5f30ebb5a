"""The attack list of the second hardening pass, replayed: a crafted store, a crafted published record, a
hostile OpenAI server, symlinked output folders, a 401 index, secrets in unusual variable names, limits.

`nox -s tests` installs the package non-editable, so there these run against the installed copy. Each test
is seconds: they call the CLI in-process (`servematrix.cli.main`) and share the fake server of
tests/fakes/, in its hostile modes.
"""

from __future__ import annotations

import json
import sqlite3
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from servematrix.cli import main
from servematrix.store import Store
from tests.conftest import REPO

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
            evidence=[ATTR_LIST_XSS],
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
