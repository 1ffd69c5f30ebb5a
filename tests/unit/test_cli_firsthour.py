"""The first hour of a new user (issue 27): mistyped choices and matrix paths get a suggestion, `report`
before any run says how to get something to report, the help names every stage and shows the common
commands, and a run ends by pointing at its report and at `recommend`, in a form that works from here."""

from __future__ import annotations

import pytest

from servematrix.cli import command_hint, main, next_steps
from servematrix.stages import STAGES
from servematrix.store.store import DEFAULT_STORE
from tests.conftest import REPO


@pytest.fixture
def no_servematrix_on_path(monkeypatch, tmp_path):
    """The README's route: servematrix lives only in nox's venv."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no usage dump, no traceback
    return err


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["run", "--backend", "dockr"], "did you mean 'docker'?"),
        (["plan", "--format", "jsn"], "did you mean 'json'?"),
        (["classify", "x.log", "--format", "txt"], "did you mean 'text'?"),
        (["rn"], "did you mean 'run'?"),
    ],
)
def test_a_mistyped_choice_suggests_the_closest(argv, suggested, capsys):
    assert main(argv) == 2
    err = _error(capsys)
    assert suggested in err and "choices: " in err


def test_a_misspelt_matrix_path_suggests_the_files_in_matrix(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["plan", "matrix/cpu-smok.toml"]) == 2
    err = _error(capsys)
    assert "matrix/cpu-smok.toml: no such matrix file; did you mean matrix/cpu-smoke.toml?" in err
    assert "glm5-nvfp4.toml" in err  # the files there are listed
    assert main(["run", "matrx/glm5-nvfp4.toml"]) == 2
    assert "did you mean matrix/glm5-nvfp4.toml?" in _error(capsys)


def test_report_before_any_run_says_how_to_get_one(monkeypatch, tmp_path, capsys, no_servematrix_on_path):
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 2
    err = _error(capsys)
    assert f"{DEFAULT_STORE}: no such store" in err
    assert "`nox -s matrix -- matrix/cpu-smoke.toml`" in err  # run first, the way the README runs things
    assert "docs/compatibility.html" in err and "`nox -s report -- --publish --from-published`" in err
    assert "recommend" in err  # which reads the published results, where report refuses
    assert not (tmp_path / ".servematrix").exists()  # nothing half-written


def test_with_servematrix_on_path_the_hints_name_it(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: f"/bin/{name}")
    monkeypatch.delenv("NOX_CURRENT_SESSION", raising=False)
    assert command_hint("run", "matrix/cpu-smoke.toml") == "servematrix run matrix/cpu-smoke.toml"
    assert command_hint("report") == "servematrix report"
    # Inside a nox session its venv is on PATH, but not in the shell of the person who ran nox.
    monkeypatch.setenv("NOX_CURRENT_SESSION", "matrix")
    assert command_hint("run", "matrix/cpu-smoke.toml") == "nox -s matrix -- matrix/cpu-smoke.toml"


def test_a_run_ends_pointing_at_the_report_and_recommend(no_servematrix_on_path, tmp_path):
    report, recommend = next_steps(DEFAULT_STORE, reported=None)
    assert report == "report: `nox -s report` writes .servematrix/report/compatibility.html"
    assert recommend == f"which stack to pick: `nox -s recommend -- --store {DEFAULT_STORE}`"
    other = tmp_path / "other.sqlite"
    assert f"`nox -s report -- --store {other}`" in next_steps(other, reported=None)[0]
    assert next_steps(other, reported=tmp_path / "out" / "compatibility.md")[0] == (
        f"report: {tmp_path / 'out' / 'compatibility.html'}"
    )


def test_the_help_names_every_stage_and_shows_the_common_commands(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    run_help = " ".join(capsys.readouterr().out.split())
    assert " → ".join(STAGES) in run_help  # import included
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    for command in (
        "servematrix run matrix/cpu-smoke.toml",
        "servematrix report",
        "servematrix recommend",
        "servematrix plan ",
        "servematrix classify ",
        "nox -s matrix|report|recommend|plan",
    ):
        assert command in top, command
