"""Validation of matrix files: every error names file, line and key, and nothing is expanded before."""

from __future__ import annotations

import json
import tomllib

import pytest

from servematrix.cli import main
from servematrix.config.spec import load_spec
from servematrix.errors import InputError
from tests.conftest import MATRIX, REPO, SMALL_SGLANG


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


# ---- unbounded and odd input (issue 14) ---------------------------------------------------------


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "m.toml"
    lines = SMALL_SGLANG.lstrip().splitlines()
    bad = lines.index('path = "org/model"')
    path.write_bytes(
        "\n".join(lines[:bad]).encode() + b'\npath = "org/m\xffodel"\n' + "\n".join(lines[bad + 1 :]).encode()
    )
    with pytest.raises(InputError) as info:
        load_spec(path)
    assert info.value.location.file == path
    assert info.value.location.line == bad + 1
    assert "not valid UTF-8" in info.value.message and "0xff" in info.value.message


def test_invalid_utf8_exits_2_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "m.toml"
    path.write_bytes(b'engine = "sglang"\n# caf\xe9\n')
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and "UTF-8" in err and "Traceback" not in err


@pytest.mark.parametrize("nested", ["[" * 5000 + "]" * 5000, "{a = " * 5000 + "1" + "}" * 5000])
def test_deep_nesting_is_an_input_error(write_matrix, nested):
    err = _error(write_matrix, SMALL_SGLANG + f"x = {nested}\n")
    assert str(err.location.file).endswith("m.toml")
    assert "nested too deeply" in err.message


@pytest.mark.parametrize(
    ("axis_line", "duplicate"),
    [
        ('sglang = ["0.5.9", "0.5.12", "0.5.9"]', "'0.5.9'"),
        ('sglang = ["0.5.9", "0.5.09"]', "'0.5.09'"),  # the same version, spelled twice
        ('mode = ["baseline", "piecewise", "baseline"]', "'baseline'"),
        ('gpu = ["b200", "b200"]', "'b200'"),
    ],
)
def test_duplicate_axis_values_are_rejected_with_their_line(write_matrix, axis_line, duplicate):
    axis = axis_line.split(" ")[0]
    original = next(line for line in SMALL_SGLANG.splitlines() if line.startswith(f"{axis} ="))
    text = SMALL_SGLANG.replace(original, axis_line)
    err = _error(write_matrix, text)
    assert err.location.key.startswith(f"axes.{axis}[")
    assert err.location.line == text.lstrip().splitlines().index(axis_line) + 1
    assert f"duplicate value {duplicate}" in err.message


def test_a_duplicate_on_its_own_line_points_at_that_line(write_matrix):
    text = SMALL_SGLANG.replace('sglang = ["0.5.9", "0.5.12"]', 'sglang = [\n  "0.5.9",\n  "0.5.12",\n  "0.5.9",\n]')
    err = _error(write_matrix, text)
    lines = text.lstrip().splitlines()
    item = '  "0.5.9",'
    assert err.location.key == "axes.sglang[2]"
    assert err.location.line == len(lines) - lines[::-1].index(item)
    assert f"on line {lines.index(item) + 1}" in err.message


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("concurrency = [1]", "concurrency = [-1, 0]", "bench.concurrency[0]"),
        ("concurrency = [1]", "concurrency = [4, 0]", "bench.concurrency[1]"),
        ("concurrency = [1]", "concurrency = [4, 4]", "bench.concurrency[1]"),
        ("input_len = 8", "input_len = 0", "bench.input_len"),
        ("[bench]", "[server]\nready_timeout_s = inf\n[bench]", "server.ready_timeout_s"),
        ("[bench]", "[server]\nready_timeout_s = nan\n[bench]", "server.ready_timeout_s"),
        ("[bench]", "[server]\nready_timeout_s = -5\n[bench]", "server.ready_timeout_s"),
        ("prompts_per_concurrency = 2", "prompts_per_concurrency = 2\ntemperature = inf", "bench.temperature"),
        # Limits up front (issue 24): a typo of a size fails at its line, not after the server started.
        ("prompts_per_concurrency = 2", "prompts_per_concurrency = 1000000000", "bench.prompts_per_concurrency"),
        ("input_len = 8", "input_len = 1000000000", "bench.input_len"),
        ("concurrency = [1]", "concurrency = [1, 100000]", "bench.concurrency[1]"),
        ("prompts_per_concurrency = 2", "prompts_per_concurrency = 2\nrepeats = 1000", "bench.repeats"),
        ("prompts_per_concurrency = 2", "prompts_per_concurrency = 2\nwarmup = 99999999", "bench.warmup"),
        (
            "prompts_per_concurrency = 2",
            "prompts_per_concurrency = 2\n[bench.prefill]\ninput_len = 9999999",
            "bench.prefill.input_len",
        ),
        (
            "prompts_per_concurrency = 2",
            "prompts_per_concurrency = 2\n[bench.prefill]\nconcurrency = [2, 2]",
            "bench.prefill.concurrency[1]",
        ),
    ],
)
def test_bench_numbers_are_positive_and_timeouts_finite(write_matrix, old, new, key):
    err = _error(write_matrix, SMALL_SGLANG.replace(old, new))
    assert err.location.key == key
    assert err.location.line is not None


def test_a_finite_timeout_is_accepted(write_matrix):
    spec = load_spec(write_matrix(SMALL_SGLANG.replace("[bench]", "[server]\nready_timeout_s = 90.5\n[bench]")))
    assert spec.file.server.ready_timeout_s == 90.5


# ---- names -----------------------------------------------------------------------------------------


def test_markup_in_a_gpu_kind_name_is_an_input_error(write_matrix):
    name = "<script>alert(1)</script>"
    text = SMALL_SGLANG.replace('gpu = ["b200"]', f'gpu = ["{name}"]').replace("[gpu.b200]", f'[gpu."{name}"]')
    err = _error(write_matrix, text)
    assert err.location.key == f"gpu.{name}"
    assert err.location.line == text.lstrip().splitlines().index(f'[gpu."{name}"]') + 1
    assert "not a valid GPU kind name" in err.message


@pytest.mark.parametrize(
    ("old", "new", "key", "what"),
    [
        ('"piecewise"]', '"piece wise"]', "axes.mode[1]", "mode name"),
        ('engine = "sglang"', 'engine = "../../etc/passwd"', "engine", "engine name"),
        ('engine = "sglang"', 'engine = "<b>sglang</b>"', "engine", "engine name"),
        ("[gpu.b200]", '[cuda."13.0;x"]\n[gpu.b200]', "cuda.13.0;x", "CUDA kind name"),
    ],
)
def test_names_are_limited_to_safe_characters(write_matrix, old, new, key, what):
    err = _error(write_matrix, SMALL_SGLANG.replace(old, new))
    assert err.location.key == key
    assert err.location.line is not None
    assert f"not a valid {what}" in err.message


def test_ordinary_names_are_accepted():
    from servematrix.config.spec import NAME

    for name in ("b200", "rtx-pro-6000", "gb200_nvl72", "h100+nvlink", "sm_120.x"):
        assert NAME.match(name)
    for name in ("", "-b200", ".hidden", "a b", "a/b", "<b>", "a;b", "ä100"):
        assert not NAME.match(name)


def test_the_committed_matrix_schema_is_the_one_servematrix_prints(capsys):
    # matrix/schema.json is generated (`servematrix schema > matrix/schema.json`): it must not drift.
    from servematrix.cli import main

    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json.loads((REPO / "matrix" / "schema.json").read_text()), (
        "regenerate: servematrix schema > matrix/schema.json"
    )


def test_every_committed_matrix_meets_the_schema_and_a_typo_does_not():
    import jsonschema

    schema = json.loads((REPO / "matrix" / "schema.json").read_text())
    for matrix in sorted((REPO / "matrix").glob("*.toml")):
        jsonschema.validate(tomllib.loads(matrix.read_text()), schema)
    broken = tomllib.loads((REPO / "matrix" / "cpu-smoke.toml").read_text())
    broken["bench"]["concurency"] = [1]
    with pytest.raises(jsonschema.ValidationError, match="concurency"):
        jsonschema.validate(broken, schema)


def test_a_bench_api_the_engine_does_not_serve_is_refused_at_its_line(write_matrix):
    # transformers serve has no /generate (engine data `bench_apis`); sglang has
    text = (MATRIX / "cpu-smoke.toml").read_text().replace('api = "chat"', 'api = "generate"')
    err = _error(write_matrix, text)
    assert err.location is not None and err.location.key == "bench.api"
    assert err.location.line == text.splitlines().index('api = "generate"') + 1
    assert "does not serve the 'generate' API" in str(err)


CPU_SMOKE = (MATRIX / "cpu-smoke.toml").read_text()


def _line(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_flag_axis_a_mode_sets_itself_is_refused(write_matrix, capsys):
    """M4: the mode's args come after the swept flag, and argparse keeps the last value: a sweep of
    --cb-num-blocks on continuous batching (whose args set it to 512) would label three cells 64/256/1024
    that all run 512. The matrix is refused at the axis's flag, naming the mode."""
    text = CPU_SMOKE.replace(
        'mode = ["static", "continuous-batching"]', 'mode = ["continuous-batching"]\nblocks = ["64", "256"]'
    )
    text += '\n[flag_axes.blocks]\nflag = "--cb-num-blocks"\n'
    err = _error(write_matrix, text)
    assert err.location.key == "flag_axes.blocks.flag"
    assert err.location.line == _line(text, 'flag = "--cb-num-blocks"')
    assert "mode 'continuous-batching' sets itself" in err.message
    assert main(["plan", str(write_matrix(text))]) == 2
    assert "Traceback" not in capsys.readouterr().err
    # A flag no mode sets is swept as before.
    assert load_spec(write_matrix(text.replace("--cb-num-blocks", "--cb-other")))


def test_a_flag_axis_the_tensor_parallel_args_set_is_refused(write_matrix):
    """M4: on a tensor-parallel kind the engine appends `--tp-size {gpus}` after the kind's args."""
    text = (MATRIX / "h200-smoke.toml").read_text()
    text = text.replace("[axes]\n", '[axes]\ntp = ["4", "8"]\n', 1) + '\n[flag_axes.tp]\nflag = "--tp-size"\n'
    err = _error(write_matrix, text)
    assert err.location.key == "flag_axes.tp.flag"
    assert "tensor-parallel args of GPU kind" in err.message


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda t: t.replace("[server]\n", '[server]\nargs = ["--port", "9999"]\n', 1), "server.args[0]"),
        (lambda t: t.replace("[server]\n", '[server]\nargs = ["--host=0.0.0.0"]\n', 1), "server.args[0]"),
        (
            lambda t: (
                t.replace('mode = ["static", "continuous-batching"]', 'mode = ["static"]\nbind = ["x0"]')
                + '\n[flag_axes.bind]\nflag = "--host"\n'
            ),
            "flag_axes.bind.flag",
        ),
    ],
)
def test_a_matrix_never_sets_the_harnesss_port_or_host(write_matrix, edit, key):
    """L5: the harness picks the port it probes and binds the server to loopback; a matrix's `--port` would
    make a `server-timeout` of the stack, and its `--host 0.0.0.0` would expose the server."""
    text = edit(CPU_SMOKE)
    assert text != CPU_SMOKE
    err = _error(write_matrix, text)
    assert err.location.key == key
    assert "the harness's own" in err.message


def _rows(*rows: tuple[str, str]) -> str:
    return "".join(
        f'\n[[gpu.cpu.args_by_release]]\nversions = "{versions}"\nargs = {args}\nsource = "a test"\n'
        for versions, args in rows
    )


@pytest.mark.parametrize(
    ("rows", "index", "says"),
    [
        ([(">=6,<5", '["--x", "1"]')], 0, "holds no release"),
        ([("==5.*,!=5.*", '["--x", "1"]')], 0, "holds no release"),
        ([(">=5", '["--x", "1"]'), ("~=5.2", '["--y", "2", "--x=3"]')], 1, "overlaps row 1's '>=5'"),
    ],
)
def test_args_by_release_with_an_empty_or_a_conflicting_range_is_refused(write_matrix, capsys, rows, index, says):
    """L4: a range that holds no release never applies, and two rows whose ranges share a release and set one
    flag leave the later row's value silently: both are refused at the row's `versions` line (exit 2)."""
    text = CPU_SMOKE + _rows(*rows)
    err = _error(write_matrix, text)
    assert err.location.key == f"gpu.cpu.args_by_release[{index}].versions"
    assert err.location.line == _line(text, f'versions = "{rows[index][0]}"')
    assert says in err.message
    assert main(["plan", str(write_matrix(text))]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_args_by_release_with_disjoint_or_unrelated_rows_is_accepted(write_matrix):
    """Rows that share no release, or share one but set different flags, are accepted as before."""
    disjoint = _rows(("<5.3", '["--x", "1"]'), (">=5.3", '["--x", "2"]'))
    unrelated = _rows((">=5", '["--x", "1"]'), (">=5.3", '["--y", "2"]'))
    for rows in (disjoint, unrelated):
        assert load_spec(write_matrix(CPU_SMOKE + rows)).file.gpu["cpu"].args_by_release
