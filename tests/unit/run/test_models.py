"""A built model replaces what is at its path, so the path stays inside servematrix's directories and only a
directory servematrix built (its marker) or an empty one is ever replaced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.config.spec import load_spec
from servematrix.engines import load_engine
from servematrix.engines.transformers import tinymodel
from servematrix.errors import InputError
from servematrix.run.models import ModelBuildError, StackImportError, check_model_path, ensure_model, inside
from servematrix.stages.importcheck import import_failure
from tests.conftest import MATRIX


def _spec_with_model_path(tmp_path: Path, model_path: str):
    text = (
        (MATRIX / "cpu-smoke.toml")
        .read_text()
        .replace('path = ".servematrix/models/tiny-llama"', f'path = "{model_path}"')
    )
    path = tmp_path / "m.toml"
    path.write_text(text)
    return load_spec(path)


@pytest.mark.parametrize("model_path", ["../../somewhere", "/etc", ".", ".servematrix", "work/../../x"])
def test_a_model_path_outside_servematrix_directories_is_bad_input(tmp_path, monkeypatch, model_path):
    monkeypatch.chdir(tmp_path)
    spec = _spec_with_model_path(tmp_path, model_path)
    with pytest.raises(InputError) as caught:
        check_model_path(spec, (Path("work"), Path(".servematrix")))
    line = next(i for i, t in enumerate(spec.path.read_text().splitlines(), 1) if t.startswith("path = "))
    assert str(caught.value).startswith(f"{spec.path}:{line}: model.path: {model_path} is outside")


def test_a_model_path_inside_is_fine_even_through_a_linked_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / ".servematrix").mkdir()
    (tmp_path / ".servematrix" / "models").symlink_to(tmp_path / "cache")
    roots = (tmp_path / "work", Path(".servematrix"))
    check_model_path(_spec_with_model_path(tmp_path, ".servematrix/models/tiny-llama"), roots)
    check_model_path(_spec_with_model_path(tmp_path, str(tmp_path / "work" / "m")), roots)
    assert not inside(Path(".servematrix/models/../../x"), roots)


def _notes(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk\n")
    return notes


def test_the_builder_never_deletes_a_directory_it_did_not_build(tmp_path):
    notes = _notes(tmp_path)
    with pytest.raises(tinymodel.NotReplaceableError, match=r"notes exists and was not built by servematrix"):
        tinymodel.build(notes)
    assert (notes / "todo.txt").read_text() == "buy milk\n"

    done = subprocess.run(
        [sys.executable, str(tinymodel.builder_path()), str(notes), "--force"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "not built by servematrix" in done.stderr
    assert (notes / "todo.txt").read_text() == "buy milk\n"


def test_only_its_own_output_or_an_empty_directory_is_replaceable(tmp_path):
    assert tinymodel.not_replaceable(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert tinymodel.not_replaceable(tmp_path / "empty") is None
    old = tmp_path / "old-model"
    old.mkdir()
    (old / tinymodel.MARKER_NAME).write_text('{"input_hash": "from an older builder"}')
    (old / "model.safetensors").write_bytes(b"x")
    assert tinymodel.not_replaceable(old) is None
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in (tinymodel.not_replaceable(tmp_path / "file") or "")


def test_ensure_model_refuses_before_running_the_builder(tmp_path):
    notes = _notes(tmp_path)
    ran = []

    def python(visible):
        ran.append(visible)
        return [sys.executable]

    with pytest.raises(InputError, match="not built by servematrix"):
        ensure_model(notes, builder="tiny-llama", engine=load_engine("transformers"), python=python)
    assert ran == [] and (notes / "todo.txt").exists()
    with pytest.raises(InputError, match="outside"):
        ensure_model(
            notes, builder="tiny-llama", engine=load_engine("transformers"), python=python, roots=(tmp_path / "w",)
        )


def test_tiny_model_command_on_a_directory_of_notes_exits_2(tmp_path, capsys):
    notes = _notes(tmp_path)
    assert main(["tiny-model", str(notes)]) == 2
    assert "not built by servematrix" in capsys.readouterr().err
    assert (notes / "todo.txt").read_text() == "buy milk\n"


def test_a_model_path_holding_someone_elses_files_is_bad_input_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / ".servematrix" / "models" / "tiny-llama"
    notes.mkdir(parents=True)
    (notes / "todo.txt").write_text("buy milk\n")
    spec = _spec_with_model_path(tmp_path, ".servematrix/models/tiny-llama")
    with pytest.raises(InputError, match=r"m.toml:\d+: model.path: .*not built by servematrix"):
        check_model_path(spec, (Path(".servematrix"),))
    assert (notes / "todo.txt").exists()


def test_a_stack_that_does_not_import_in_the_builder_is_the_stacks_failure(tmp_path):
    # The harness's own interpreter has no torch: the builder's imports die there as a broken stack's would.
    engine = load_engine("transformers")
    with pytest.raises(StackImportError) as caught:
        ensure_model(tmp_path / "m", builder="tiny-llama", engine=engine, python=lambda visible: [sys.executable])
    assert caught.value.returncode == tinymodel.STACK_IMPORT_EXIT
    assert caught.value.output.startswith("Traceback (most recent call last)")  # the stack's traceback alone
    assert import_failure(caught.value.output, engine, returncode=caught.value.returncode)[:2] == (
        "fail",
        "missing-module",
    )
    assert not (tmp_path / "m").exists()


def test_any_other_builder_failure_is_not_blamed_on_the_stack(tmp_path):
    def python(visible):
        return [sys.executable, "-c", "import sys; sys.exit('the builder fell over')"]

    with pytest.raises(ModelBuildError) as caught:
        ensure_model(tmp_path / "m", builder="tiny-llama", engine=load_engine("transformers"), python=python)
    assert not isinstance(caught.value, StackImportError) and "the builder fell over" in str(caught.value)
