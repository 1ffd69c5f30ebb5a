"""tomlsource: the one TOML reader and key locator, and pydantic errors as file:line:key input errors."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, StrictBool

from servematrix.errors import InputError
from servematrix.formats.tomlsource import load, parse, validate

NESTED = b"""\
title = "t"

[[signature]]
id = "a"

  [[signature.evidence]]
  label = "a0"

[[signature]]
id = "b"

  [[signature.evidence]]
  label = "b0"

  [[signature.evidence]]
  label = "b1"
  patterns = [
    "one",
    "two",
  ]
"""


def test_an_array_of_tables_inside_an_array_of_tables_belongs_to_its_latest_table():
    source = parse(NESTED, "n.toml")
    assert source.line_of(("signature", 0, "evidence", 0, "label")) == 7
    assert source.line_of(("signature", 1, "id")) == 10
    assert source.line_of(("signature", 1, "evidence", 0, "label")) == 13
    assert source.line_of(("signature", 1, "evidence", 1)) == 15
    assert source.line_of(("signature", 1, "evidence", 1, "label")) == 16
    assert source.line_of(("signature", 1, "evidence", 1, "patterns", 1)) == 19
    # A key that is not written falls back to its table's header.
    assert source.line_of(("signature", 1, "evidence", 1, "missing")) == 15


class _Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str
    patterns: tuple[str, ...] = ()


class _Signature(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    fatal: StrictBool = False
    evidence: tuple[_Evidence, ...] = ()


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    signature: tuple[_Signature, ...]


def test_validate_gives_the_model():
    found = validate(parse(NESTED, "n.toml"), _File)
    assert [e.label for s in found.signature for e in s.evidence] == ["a0", "b0", "b1"]


@pytest.mark.parametrize(
    ("old", "new", "where", "message"),
    [
        (b'label = "b0"', b'lable = "b0"', "n.toml:13: signature[1].evidence[0].lable", "unknown key"),
        (b'id = "b"', b"id = 2", "n.toml:10: signature[1].id", "must be a string, got 2"),
        (b'id = "b"', b'id = "b"\nfatal = "yes"', "n.toml:11: signature[1].fatal", "must be true or false, got 'yes'"),
        (b'id = "b"\n', b"", "n.toml:9: signature[1].id", "required key is missing"),
        (b'title = "t"', b'title = ["t"]', "n.toml:1: title", "must be a string, got ['t']"),
    ],
)
def test_validate_names_file_line_and_key_of_the_first_mistake(old, new, where, message):
    assert old in NESTED
    with pytest.raises(InputError) as info:
        validate(parse(NESTED.replace(old, new, 1), "n.toml"), _File)
    assert str(info.value) == f"{where}: {message}"


def test_a_misspelt_key_is_reported_as_unknown_not_as_missing():
    text = NESTED.replace(b'id = "a"', b'idd = "a"', 1)
    with pytest.raises(InputError, match=r"^n\.toml:4: signature\[0\]\.idd: unknown key$"):
        validate(parse(text, "n.toml"), _File)


def test_load_names_what_it_could_not_read(tmp_path):
    with pytest.raises(InputError, match="cannot read signature file: No such file"):
        load(tmp_path / "none.toml", what="signature file")
    with pytest.raises(InputError, match="cannot read matrix file"):
        load(tmp_path / "none.toml")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'a = 1\nb = "\xff"\n', r"^x\.toml:2: not valid UTF-8: byte 0xff at column 6"),
        (b"a = 1\n[b\n", r"^x\.toml:2: invalid TOML: "),
        (b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n", r"^x\.toml: arrays or inline tables nested too deeply"),
    ],
)
def test_unreadable_toml_is_one_input_error(raw, expected):
    with pytest.raises(InputError, match=expected):
        parse(raw, "x.toml")
