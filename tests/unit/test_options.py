"""servematrix.options: every option declared once. The parsers of `servematrix` and of `python -m
servematrix.scaleout.nixexport` are built from the declarations alone, an option two commands share parses and fails
alike in both, and the modules that declare and consume options do not import the command line back."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys

import pytest

from servematrix import options
from servematrix.backends.registry import CHOICES
from servematrix.cli import HANDLERS, build_parser, main, parse_args
from servematrix.scaleout import nixexport
from servematrix.stages import STAGES
from tests.conftest import MATRIX, REPO

SMOKE = MATRIX / "cpu-smoke.toml"


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def declared(action: argparse.Action, command: str) -> options.Option:
    """The one declaration an action was made from."""
    names = tuple(action.option_strings) or (action.dest,)
    (option,) = (o for o in options.options_of(command) if o.flags == names)
    return option


def shared_by(*commands: str) -> list[options.Option]:
    return [o for o in options.OPTIONS if all(c in o.commands for c in commands)]


def exit_and_error(argv: list[str], capsys) -> tuple[int | str | None, str]:
    """What `servematrix ARGV` exits with, and its error without the program's name (`servematrix run:` from
    argparse, `servematrix:` from an InputError)."""
    try:
        code: int | str | None = main(argv)
    except SystemExit as exc:
        code = exc.code
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1].split(" error: ", 1)[-1] if lines else ""


# --------------------------------------------------------------------------------------- declarations


def test_every_parser_action_comes_from_one_declaration():
    for name, subparser in subparsers(build_parser()).items():
        made = actions(subparser)
        assert [declared(action, name) for action in made] == list(options.options_of(name)), name
        for action in made:
            option = declared(action, name)
            assert (action.dest, action.help) == (option.attribute, option.help)
    assert {c.name for c in options.COMMANDS} == set(subparsers(build_parser())) == set(HANDLERS)
    assert {c for o in options.OPTIONS for c in o.commands} <= set(options.COMMAND)


def test_a_flag_shared_by_two_commands_is_one_declaration_unless_it_means_something_else():
    """`--out` is a lock directory, a report directory, a Slurm directory and a JSON file: four options;
    `--dry-run` writes scripts without submitting them, or says what a reclassify would change. Any other flag
    two commands take is one declaration, so its help, default and checks cannot drift apart."""
    counts: dict[str, int] = {}
    for option in options.OPTIONS:
        counts[option.name] = counts.get(option.name, 0) + 1
    meanings = {name for name, count in counts.items() if count > 1}
    assert meanings == {"matrix", "--out", "--format", "--store", "--python", "--dry-run"}
    for name in meanings:  # each meaning is its own: the same flag never reaches one command twice
        commands = [c for o in options.OPTIONS if o.name == name for c in o.commands]
        assert len(commands) == len(set(commands)), name


def test_every_backend_option_offers_the_registry_choices():
    found = {
        name: action.choices
        for name, subparser in subparsers(build_parser()).items()
        for action in actions(subparser)
        if "--backend" in action.option_strings
    }
    assert set(found) == {"run", "submit", "bisect"}
    assert all(tuple(choices or ()) == CHOICES for choices in found.values()), found


# ------------------------------------------------------------------ run and submit: same values, same errors


# A value other than the default for each option run and submit share (the matrix aside).
SHARED_VALUES = {
    "--select": ["--select", "mode=static", "--select", "torch>=2.9"],
    "--stages": ["--stages", "serve , resolve"],
    "--backend": ["--backend", "venv"],
    "--image": ["--backend", "image", "--image", "localhost/mine:1"],
    "--workdir": ["--workdir", "elsewhere"],
    "--rerun": ["--rerun"],
}


def test_the_cases_cover_every_option_run_and_submit_share():
    assert {*SHARED_VALUES, "matrix"} == {o.name for o in shared_by("run", "submit")}


@pytest.mark.parametrize("flags", SHARED_VALUES.values(), ids=SHARED_VALUES)
def test_run_and_submit_parse_a_shared_option_to_the_same_value(flags):
    run = parse_args(["run", str(SMOKE), *flags])
    submit = parse_args(["submit", str(SMOKE), "--slurm", *flags])
    for option in shared_by("run", "submit"):
        assert getattr(run, option.attribute) == getattr(submit, option.attribute), option.name
    assert set(run.stages) <= set(STAGES)


@pytest.mark.parametrize(
    "flags",
    [
        ["--stages", "serve,nap"],
        ["--stages", ""],
        ["--backend", "nonesuch"],
        ["--select", "flavour=mint"],
        ["--image", "localhost/mine:1"],  # without --backend image
    ],
)
def test_run_and_submit_refuse_a_bad_shared_value_alike(flags, tmp_path, capsys):
    out = tmp_path / "slurm"
    run = exit_and_error(["run", str(SMOKE), "--store", str(tmp_path / "r.sqlite"), *flags], capsys)
    submit = exit_and_error(["submit", str(SMOKE), "--slurm", "--dry-run", "--out", str(out), *flags], capsys)
    assert run[0] == 2 and run == submit
    assert not out.exists() and not (tmp_path / "r.sqlite").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", str(SMOKE), "--max-jobs", "0"], "--max-jobs must be at least 1"),
        (["submit", str(SMOKE), "--slurm", "--max-tasks", "0"], "--max-tasks must be at least 1"),
        (["submit", str(SMOKE), "--slurm", "--max-parallel", "0"], "--max-parallel must be at least 1"),
        (["submit", str(SMOKE), "--slurm", "--launcher", "srun 'servematrix"], "No closing quotation"),
        (["submit", str(SMOKE), "--slurm", "--launcher", " "], "--launcher is empty"),
        (["nix-export", "--check", "--wheel-base", "mirror"], "--wheel-base 'mirror': expected NAME=URL"),
        # The rules between options (`only_with`, `not_with`), enforced by `validate` for every command.
        (["report", "--prune"], "--prune is for --publish"),
        (["report", "--from-published"], "--from-published is for --publish: it renders the published results"),
        (["report", "--publish", "--from-published", "--prune"], "--from-published takes no --prune"),
        (["report", "--publish", "--from-published", "--store", "s.db"], "--from-published takes no --store"),
        (["run", str(SMOKE), "--image", "localhost/x:1"], "--image is for --backend image"),
    ],
)
def test_a_checked_value_is_a_one_line_input_error(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, here or anywhere
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusal is not the one-line error wanted here
        pytest.fail(f"argparse refused {argv}: {exc}")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("servematrix: error: ") and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_every_rule_names_an_option_of_each_command_that_takes_it():
    for option in options.OPTIONS:
        for command in option.commands:
            names = {o.name for o in options.options_of(command)}
            ruled = ([option.only_with[0]] if option.only_with else []) + list(option.not_with)
            assert set(ruled) <= names, (option.name, command, ruled)


def test_to_argv_parses_back_to_the_values_it_was_given():
    """`to_argv` writes a command's arguments from the declarations (nox's `to_argv`): parsed again, they give
    the same values; a value left at its default is left out."""
    shared = options.passed_on("submit")
    assert {o.name for o in shared} == {
        "matrix",
        "--select",
        "--stages",
        "--backend",
        "--image",
        "--workdir",
        "--rerun",
    }
    given = parse_args(["run", str(SMOKE), "--select", "mode=a", "--select", "gpu=cpu", "--stages", "serve,resolve"])
    given = parse_args(["run", *options.to_argv(shared, vars(given))])
    values = vars(given)
    assert options.to_argv(shared, values) == [
        str(SMOKE),
        "--select",
        "mode=a",
        "--select",
        "gpu=cpu",
        "--stages",
        "resolve,serve",
    ]
    assert given.stages == ("resolve", "serve") and given.backend == "auto" and not given.rerun
    defaults = vars(parse_args(["run", str(SMOKE)]))
    assert options.to_argv(shared, defaults) == [str(SMOKE)]


# ---------------------------------------------------------------------------------------------- imports


def import_graph() -> dict[str, set[str]]:
    """servematrix's modules and every servematrix module each imports, at its top or inside a function."""
    source = REPO / "src"
    files = {
        ".".join(path.relative_to(source).with_suffix("").parts).removesuffix(".__init__"): path
        for path in source.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        graph[module] = {name for name in imported if name in files} - {module}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for module in graph[todo.pop()] - seen:
            seen.add(module)
            todo.append(module)
    return seen


def test_nothing_the_command_line_is_built_from_imports_it_back():
    graph = import_graph()
    assert "servematrix.scaleout.slurm" in reachable(graph, "servematrix.cli")  # the graph sees function-level imports
    for module in ("servematrix.options", "servematrix.scaleout.slurm", "servematrix.scaleout.nixexport"):
        around = reachable(graph, module)
        assert "servematrix.cli" not in around, module
        assert module not in around, f"{module} imports itself back"


def test_a_submission_is_prepared_without_the_command_line(tmp_path):
    """In a fresh interpreter: submit's options parsed from their declarations, and its scripts written,
    with servematrix.cli never imported."""
    code = f"""
import sys
from servematrix import options
from servematrix.scaleout import slurm
args = options.validate(options.command_parser("submit", prog="submit").parse_args(
    [{str(SMOKE)!r}, "--slurm", "--out", {str(tmp_path / "o")!r}, "--stages", "resolve"]))
submission = slurm.prepare(slurm.options_from_args(args))
print(submission.arrays[0].tasks, "servematrix.cli" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "False"]


# ------------------------------------------------------------------------------------------- nix-export


def test_nix_export_has_the_same_options_as_a_subcommand_and_as_a_module():
    alone = actions(nixexport.build_parser())
    sub = actions(subparsers(build_parser())["nix-export"])
    assert [declared(a, "nix-export") for a in alone] == [declared(a, "nix-export") for a in sub]
    assert [declared(a, "nix-export") for a in alone] == list(options.options_of("nix-export"))
    (lock_dir,) = (o for o in options.options_of("nix-export") if o.name == "--lock-dir")
    assert "run" in lock_dir.commands  # the locks run writes are the ones nix-export reads


def nix_export(how: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *how, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        check=False,
    )


def test_nix_export_checks_alike_as_a_subcommand_and_as_a_module(tmp_path):
    committed = json.loads((REPO / "nix" / "envs.json").read_text())
    stale = tmp_path / "envs.json"
    committed["environments"].popitem()
    stale.write_text(nixexport.render(committed))
    for out, code in ((REPO / "nix" / "envs.json", 0), (stale, 1)):
        argv = ("--check", "--out", str(out), "--root", str(REPO))  # every matrix/*.toml
        sub = nix_export(["servematrix", "nix-export"], *argv)
        module = nix_export(["servematrix.scaleout.nixexport"], *argv)
        assert (sub.returncode, sub.stderr) == (module.returncode, module.stderr) == (code, module.stderr)
        assert ("in step with the locks" in sub.stderr) == (code == 0)
