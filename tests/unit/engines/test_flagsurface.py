"""Unit tests of the flag-surface reader: synthetic sglang sources, no network, nothing imported."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from servematrix.engines.sglang import flagsurface, wheels
from servematrix.engines.sglang.flagsurface import (
    FlagSurface,
    FlagSurfaceError,
    canonical_flag,
    invalid_choices,
    surface_from_sources,
    surface_from_wheel,
    unknown_flags,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flagsurface"


def tree(name: str) -> dict[str, str]:
    root = FIXTURES / name
    return {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*.py")}


@pytest.fixture(scope="module")
def legacy() -> FlagSurface:
    return surface_from_sources(tree("legacy"), version="0.5.9")


@pytest.fixture(scope="module")
def fields() -> FlagSurface:
    return surface_from_sources(tree("fields"), version="0.5.20")


# ------------------------------------------------------------------------------ add_argument (legacy)


def test_legacy_collects_every_option_string_with_aliases(legacy):
    for flag in ("--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--trust-remote-code"):
        assert flag in legacy.flags


def test_legacy_boolean_optional_action_adds_no_form(legacy):
    assert {"--enable-thing", "--no-enable-thing"} <= legacy.flags
    assert "--no-trust-remote-code" not in legacy.flags


def test_legacy_group_and_helper_functions_that_receive_the_parser(legacy):
    assert "--hicache-ratio" in legacy.flags  # parser.add_argument_group(...).add_argument
    assert "--lora-paths" in legacy.flags  # _add_lora_args(parser), a module function
    assert "--speculative-algorithm" in legacy.flags  # ServerArgs._add_spec_args(parser)


def test_legacy_other_parsers_in_the_file_are_not_the_server(legacy):
    assert "--port-args-only" not in legacy.flags


def test_help_is_always_accepted(legacy):
    assert {"-h", "--help"} <= legacy.flags


def test_deprecated_actions_are_accepted_and_marked(legacy):
    assert "--enable-piecewise-cuda-graph" in legacy.flags
    assert legacy.deprecated == {"--enable-piecewise-cuda-graph"}


@pytest.mark.parametrize(
    ("flag", "values"),
    [
        ("--kv-cache-dtype", ("auto", "fp8_e4m3", "bf16")),  # literal list
        ("--load-format", ("auto", "pt", "safetensors")),  # module constant
        ("--draft-load-format", ("auto", "pt", "safetensors", "dummy")),  # [*CONST, "x"]
        ("--sampling-backend", ("flashinfer", "pytorch")),  # set constant, sorted
        ("--grammar-backend", ("xgrammar", "outlines", "none")),  # imported constant + list
        ("--mode", ("a", "b")),  # relative import
        ("--piecewise-cuda-graph-compiler", ("eager", "inductor")),
        ("--top-k-choices", ("0", "2", "4")),  # ints compare as argv strings
    ],
)
def test_legacy_closed_choices(legacy, flag, values):
    assert legacy.closed_choices()[flag] == values


def test_plugin_extendable_choices_are_known_but_not_closed(legacy):
    assert legacy.choices["--attention-backend"] == ("triton", "fa3")
    assert "--attention-backend" in legacy.extendable
    assert "--attention-backend" not in legacy.closed_choices()


def test_dynamic_choices_are_left_out(legacy):
    assert "--reasoning-parser" in legacy.flags
    assert "--reasoning-parser" not in legacy.choices


def test_multi_value_flags(legacy):
    assert {"--cuda-graph-bs", "--lora-paths"} <= legacy.multi_value
    assert "--load-format" not in legacy.multi_value


# ------------------------------------------------------------------------- dataclass fields (0.5.14+)


def test_fields_on_server_args_itself(fields):
    assert {"--tp-size", "--tensor-parallel-size", "--mem-fraction-static", "--dsa-decode-backend"} <= fields.flags
    assert fields.choices["--dsa-decode-backend"] == ("flashmla_sparse", "trtllm")


def test_fields_skipped_without_cli_metadata(fields):
    assert "--plain-annotation" not in fields.flags  # no A[...]
    assert "--only-ns" not in fields.flags  # A[T, NS(...)] only
    assert "--derived-only" not in fields.flags  # A[T, Derived(...)]


def test_no_cli_field_but_manual_deprecated_registration(fields):
    # `disable_cuda_graph: A[bool, Arg(no_cli=True)]` plus a manual DeprecatedStoreTrueAction.
    assert "--disable-cuda-graph" in fields.flags
    assert fields.deprecated == {"--disable-cuda-graph"}


def test_namespace_classes_gathered_by_collect_input_fields(fields):
    assert {"--model-path", "--model", "--trust-remote-code", "--kv-cache-dtype"} <= fields.flags
    assert "--cuda-graph-backend-prefill" in fields.flags
    assert "--inherited-flag" in fields.flags  # a field of a namespace class's base
    assert "--not-a-server-flag" not in fields.flags  # a namespace class not passed to ServerArgs


def test_cli_name_replaces_the_field_name(fields):
    assert "--quant-method" in fields.flags
    assert "--quantization" not in fields.flags


def test_boolean_optional_action_on_a_field(fields):
    assert {"--enable-tf32-matmul", "--no-enable-tf32-matmul"} <= fields.flags


def test_literal_annotation_gives_choices(fields):
    assert fields.choices["--kv-cache-dtype"] == ("auto", "fp8_e4m3", "bf16")


def test_explicit_choices_win_over_literal_and_follow_class_constants_across_modules(fields):
    # choices=Backend.ALL, where Backend lives in model_executor/cuda_graph_config.py: tc_piecewise is gone.
    assert fields.choices["--cuda-graph-backend-prefill"] == ("full", "breakable", "disabled")


def test_list_fields_take_several_values(fields):
    assert "--cuda-graph-bs-decode" in fields.multi_value


def test_bool_fields_have_no_choices(fields):
    assert "--trust-remote-code" not in fields.choices


# ------------------------------------------------------------------------------------- robustness


def test_missing_server_args_is_an_error():
    with pytest.raises(FlagSurfaceError, match=r"server_args\.py"):
        surface_from_sources({"sglang/__init__.py": ""})


def test_unrecognised_declaration_mechanism_is_an_error_not_an_empty_surface():
    source = "class ServerArgs:\n    @staticmethod\n    def add_cli_args(parser):\n        register_all(parser)\n"
    with pytest.raises(FlagSurfaceError, match="no flags"):
        surface_from_sources({"sglang/srt/server_args.py": source})


def test_surface_from_wheel_reads_a_zip(tmp_path):
    wheel = tmp_path / "sglang-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in tree("legacy").items():
            zf.writestr(name, text)
        zf.writestr("sglang-0.0.1.dist-info/METADATA", "Name: sglang\n")
    surface = surface_from_wheel(wheel, version="0.0.1")
    assert surface.flags == surface_from_sources(tree("legacy")).flags
    assert surface.wheel == wheel.name
    assert len(surface.sha256) == 64


def test_json_round_trip(fields):
    again = FlagSurface.from_json(json.loads(json.dumps(fields.to_json())))
    assert again == fields


def test_flag_surface_uses_the_cache_without_downloading(tmp_path, monkeypatch, legacy):
    cached = tmp_path / "flagsurface" / "sglang-0.5.9.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps(legacy.to_json()))

    def no_download(*a, **k):
        raise AssertionError("downloaded although cached")

    monkeypatch.setattr(flagsurface, "download_wheel", no_download)
    assert flagsurface.accepted_flags("0.5.9", cache_dir=tmp_path) == legacy.flags
    assert flagsurface.accepted_choices("0.5.9", cache_dir=tmp_path) == legacy.closed_choices()
    assert flagsurface.accepted_choices("0.5.9", cache_dir=tmp_path, include_extendable=True) == dict(legacy.choices)


def test_flag_surface_rereads_the_wheel_on_a_stale_schema(tmp_path, monkeypatch):
    cached = tmp_path / "flagsurface" / "sglang-0.0.1.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"schema": -1, "version": "0.0.1", "flags": ["--stale"]}))
    wheel = tmp_path / "wheels" / "sglang-0.0.1-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in tree("legacy").items():
            zf.writestr(name, text)
    monkeypatch.setattr(wheels, "_pip_command", lambda: pytest.fail("the cached wheel was not reused"))
    flags = flagsurface.accepted_flags("0.0.1", cache_dir=tmp_path)
    assert "--stale" not in flags and "--model-path" in flags
    assert json.loads(cached.read_text())["schema"] == flagsurface.SCHEMA


# ---------------------------------------------------------------------------------- unknown_flags

ACCEPTED = frozenset({"--model-path", "--model", "--tp-size", "--trust-remote-code", "--enable-x", "--enable-xy"})


def test_unknown_flags_handles_equals_values_and_ignores_values():
    argv = ["python", "-m", "sglang.launch_server", "--model-path=/m", "--tp-size", "4", "--nope", "--tp-size=8"]
    assert unknown_flags(argv, ACCEPTED) == ["--nope"]


def test_unknown_flags_reports_each_flag_once_in_order():
    assert unknown_flags(["--b", "--a", "--b=1", "--a"], ACCEPTED) == ["--b", "--a"]


def test_unknown_flags_abbreviation_like_argparse():
    assert unknown_flags(["--tp", "4"], ACCEPTED) == []  # unique prefix of --tp-size
    assert unknown_flags(["--trust"], ACCEPTED) == []
    assert unknown_flags(["--enable-x"], ACCEPTED) == []  # exact match wins over longer options
    assert unknown_flags(["--enable"], ACCEPTED) == ["--enable"]  # ambiguous: --enable-x, --enable-xy
    assert unknown_flags(["--tp"], ACCEPTED, allow_abbrev=False) == ["--tp"]


def test_unknown_flags_stops_at_double_dash_and_skips_short_options():
    assert unknown_flags(["-h", "--", "--not-a-flag"], ACCEPTED) == []


def test_unknown_flags_empty_and_bare_prefix():
    assert unknown_flags([], ACCEPTED) == []
    assert unknown_flags(["--=x"], ACCEPTED) == ["--"]


def test_canonical_flag():
    assert canonical_flag("--tp", ACCEPTED) == "--tp-size"
    assert canonical_flag("--model", ACCEPTED) == "--model"  # exact, though also a prefix of --model-path
    assert canonical_flag("--enable", ACCEPTED) is None
    assert canonical_flag("--", ACCEPTED) is None


# -------------------------------------------------------------------------------- invalid_choices

CHOICES = {"--cuda-graph-backend-prefill": ("full", "breakable", "disabled"), "--bs": ("1", "2", "4")}


def test_invalid_choices_catches_a_removed_value():
    argv = ["--cuda-graph-backend-prefill", "tc_piecewise", "--tp-size", "4"]
    assert invalid_choices(argv, CHOICES) == [("--cuda-graph-backend-prefill", "tc_piecewise")]


def test_invalid_choices_equals_form_and_valid_values():
    assert invalid_choices(["--cuda-graph-backend-prefill=tc_piecewise"], CHOICES) == [
        ("--cuda-graph-backend-prefill", "tc_piecewise")
    ]
    assert invalid_choices(["--cuda-graph-backend-prefill", "disabled"], CHOICES) == []


def test_invalid_choices_multi_value_flags_check_every_value():
    argv = ["--bs", "1", "3", "4", "--other", "9"]
    assert invalid_choices(argv, CHOICES, multi_value={"--bs"}) == [("--bs", "3")]
    assert invalid_choices(argv, CHOICES) == []  # single-valued: only "1" is its value


def test_invalid_choices_through_an_abbreviation():
    accepted = {"--cuda-graph-backend-prefill", "--cuda-graph-backend-decode"}
    argv = ["--cuda-graph-backend-p", "tc_piecewise"]
    assert invalid_choices(argv, CHOICES, accepted=accepted) == [("--cuda-graph-backend-p", "tc_piecewise")]


def test_invalid_choices_missing_value_is_left_to_argparse():
    assert invalid_choices(["--cuda-graph-backend-prefill", "--tp-size", "2"], CHOICES) == []
