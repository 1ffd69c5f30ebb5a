"""Validation of matrix files: every error names file, line and key, and nothing is expanded before."""

from __future__ import annotations

import pytest

from servematrix.errors import InputError
from servematrix.spec import load_spec
from tests.conftest import MATRIX, SMALL_SGLANG


def _error(write_matrix, text: str) -> InputError:
    path = write_matrix(text)
    with pytest.raises(InputError) as info:
        load_spec(path)
    return info.value


def test_product_matrices_validate():
    for name in ("glm5-nvfp4.toml", "cpu-smoke.toml"):
        spec = load_spec(MATRIX / name)
        assert spec.file.axes["mode"]


def test_unknown_key_names_file_line_and_key(write_matrix):
    text = SMALL_SGLANG.replace("count = 8", "count = 8\nwarp_speed = 9")
    err = _error(write_matrix, text)
    assert err.location is not None
    assert str(err.location.file).endswith("m.toml")
    assert err.location.key == "gpu.b200.warp_speed"
    assert err.location.line == text.lstrip().splitlines().index("warp_speed = 9") + 1
    assert "unknown key" in str(err)


def test_bad_version_points_at_the_item_line(write_matrix):
    text = SMALL_SGLANG.replace('sglang = ["0.5.9", "0.5.12"]', 'sglang = [\n  "0.5.9",\n  "zero.five",\n]')
    err = _error(write_matrix, text)
    assert err.location.key == "axes.sglang[1]"
    assert err.location.line == text.lstrip().splitlines().index('  "zero.five",') + 1
    assert "not a valid version" in err.message


def test_shell_metacharacters_are_rejected(write_matrix):
    text = SMALL_SGLANG + '[server]\nargs = ["--tp", "8; rm -rf /"]\n'
    err = _error(write_matrix, text)
    assert err.location.key == "server.args[1]"
    assert "metacharacters" in err.message


def test_empty_axis_is_an_error(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG.replace('cuda = ["13.0"]', "cuda = []"))
    assert err.location.key == "axes.cuda"
    assert "empty" in err.message


def test_unknown_gpu_kind_and_mode(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG.replace('gpu = ["b200"]', 'gpu = ["b200", "h100"]'))
    assert err.location.key == "axes.gpu[1]"
    err = _error(write_matrix, SMALL_SGLANG.replace('"piecewise"]', '"turbo"]'))
    assert "unknown mode" in err.message


def test_pinned_only_where_the_engine_allows(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG.replace('sglang = ["0.5.9", "0.5.12"]', 'sglang = ["pinned"]'))
    assert err.location.key == "axes.sglang[0]"


def test_bad_specifier_in_exclude_rule(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG + '[[exclude]]\nsglang = ">=0.5.x"\n')
    assert err.location.key == "exclude[0].sglang"
    assert err.location.line is not None


def test_wrong_type_names_the_key(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG.replace("count = 8", 'count = "eight"'))
    assert err.location.key == "gpu.b200.count"


def test_invalid_toml_gives_the_line(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG + "[broken\n")
    assert err.location.line == len(SMALL_SGLANG.lstrip().splitlines()) + 1


def test_missing_axis(write_matrix):
    err = _error(write_matrix, SMALL_SGLANG.replace('cuda = ["13.0"]\n', ""))
    assert "'cuda' is missing" in err.message
