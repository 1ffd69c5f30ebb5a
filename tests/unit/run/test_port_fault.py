"""A real port fault from an H200 (tests/fixtures/logs/h200-sglang-0.5.12-grpc-port-break.log, the log as the
server wrote it): `classify` names it a port fault of the harness or the host, not the stack's, and shows
the port arithmetic that explains the number in the log."""

from __future__ import annotations

import json

import pytest

from servematrix.classify import SignatureDataError, classify_text, parse_signatures
from servematrix.cli import main
from tests.conftest import REPO

LOG = REPO / "tests" / "fixtures" / "logs" / "h200-sglang-0.5.12-grpc-port-break.log"
ARITHMETIC = "port arithmetic: SGLANG_GRPC_PORT 65827 = --port 55827 + 10000, above 65535"


def test_classify_names_the_port_fault_with_its_arithmetic(capsys):
    assert main(["classify", str(LOG)]) == 0
    out = capsys.readouterr().out
    first, second = out.splitlines()[:2]
    assert first.startswith("port-out-of-range: ") and "harness or the host" in first
    assert "python-exception" not in out
    assert second == f"evidence: {ARITHMETIC}"
    assert "ValueError: SGLANG_GRPC_PORT (65827) must be between 1 and 65535" in out


def test_the_json_contract_keeps_its_shape(capsys):
    assert main(["classify", str(LOG), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"class", "title", "line", "excerpt"}
    assert (result["class"], result["line"]) == ("port-out-of-range", 23)


def test_the_arithmetic_follows_the_number_in_the_log():
    found = classify_text("ValueError: SGLANG_GRPC_PORT (70001) must be between 1 and 65535\n", "sglang")
    assert found is not None and found.cls == "port-out-of-range"
    assert found.evidence == ("port arithmetic: SGLANG_GRPC_PORT 70001 = --port 60001 + 10000, above 65535",)
    # Another derived port: the class still names the fault, with no arithmetic it cannot know.
    other = classify_text("ValueError: SGLANG_DIST_PORT (65599) must be between 1 and 65535\n", "sglang")
    assert other is not None and (other.cls, other.evidence) == ("port-out-of-range", ())


def test_a_label_may_only_name_groups_its_patterns_capture():
    text = """
schema = 1
engine = "toy"
[[signature]]
id = "x"
title = "t"
explanation = "e"
workaround = "w"
fatal = false
priority = 1
patterns = ['boom']
  [[signature.evidence]]
  label = "port {port}"
  patterns = ['PORT (\\d+)']
"""
    with pytest.raises(SignatureDataError, match=r"label names \{port\}"):
        parse_signatures(text, source="toy.toml")
