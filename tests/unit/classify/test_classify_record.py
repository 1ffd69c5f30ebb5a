"""No log a class names today loses its class (issue 34): every fixture log and every published excerpt
(docs/results/latest.json) is classified again and compared with the class it had before traceback frames
were evidence (tests/fixtures/classify-record.json, recorded with the classifier of commit e516850). A class
may change only to a more specific one: a higher priority in the signature data (or from none at all).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servematrix.classify import classify_text, load_signatures

ROOT = Path(__file__).resolve().parents[3]
LOGS = ROOT / "tests" / "fixtures" / "logs"
RECORD = json.loads((ROOT / "tests" / "fixtures" / "classify-record.json").read_text(encoding="utf-8"))
PUBLISHED = json.loads((ROOT / "docs" / "results" / "latest.json").read_text(encoding="utf-8"))["cells"]


def _engine(name: str) -> str:
    return "transformers" if name.startswith("transformers-") else "sglang"


def _kept_or_sharpened(engine: str, before: str | None, after: str | None) -> bool:
    if before == after or before is None:
        return True
    if after is None:
        return False
    sigs = load_signatures(engine)
    return sigs.get(after).priority > sigs.get(before).priority


# The shapes of issue 34, and the class their frames or lines now name (the record holds what they were
# before: scheduler-died, no class, graph-capture-failed, import-dependency-conflict).
SHARPENED = {
    "dynamo-untraceable-frames-only-sglang-0.5.11.log": "dynamo-untraceable",
    "dynamo-untraceable-truncated-sglang-0.5.11.log": "dynamo-untraceable",
    "graph-capture-failed-compile-pass-sglang-0.5.14.log": "graph-capture-failed",
    "graph-capture-failed-typeerror-sglang-0.5.12.log": "graph-capture-failed",
    "kernel-fault-capture-sglang-0.5.12.log": "kernel-fault",
    "kernel-fault-forward-sglang-0.5.12.log": "kernel-fault",
    "kernel-fault-replay-sglang-0.5.12.log": "kernel-fault",
    "model-unsupported-sglang-0.5.8.log": "model-unsupported",
}


@pytest.mark.parametrize("name", sorted(RECORD["fixtures"]))
def test_no_fixture_loses_its_class(name):
    found = classify_text((LOGS / name).read_text(encoding="utf-8", errors="replace"), _engine(name))
    before, after = RECORD["fixtures"][name], (found.cls if found else None)
    assert _kept_or_sharpened(_engine(name), before, after), (before, after)
    if name in SHARPENED:
        assert (before, after) != (SHARPENED[name], SHARPENED[name]) and after == SHARPENED[name]
        assert before in (None, "scheduler-died", "graph-capture-failed", "import-dependency-conflict")


def test_no_published_excerpt_loses_its_class():
    compared = 0
    for cell, before in RECORD["published"].items():
        row = PUBLISHED.get(cell)
        if row is None or not row.get("excerpt"):
            continue  # republished since: not in this record
        found = classify_text(row["excerpt"], row["engine"])
        after = found.cls if found else None
        assert _kept_or_sharpened(row["engine"], before, after), (cell, before, after)
        compared += 1
    assert compared >= 20
