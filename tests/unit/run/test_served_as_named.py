"""A server that answered through sglang's Transformers fallback fails its cell (signature data
`fails_a_pass`): its figures and modes would be the fallback's, not the named release's. Read from real H200
logs: a passing sglang 0.5.12 baseline log, and the two lines sglang 0.5.15 printed when its `deepseek_v2`
module did not import (tests/fixtures/logs/h200-sglang-0.5.15-glm5-transformers-fallback.log), put into it
before its ready line as a server that fell back and still served would print them."""

from __future__ import annotations

from pathlib import Path

from servematrix.classify import load_signatures
from servematrix.engines import load_engine
from servematrix.run.serving import served_as_named

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
PASSING = LOGS / "h200-sglang-0.5.12-baseline-server.log"
FALLBACK = LOGS / "h200-sglang-0.5.15-glm5-transformers-fallback.log"


def _fallback_lines() -> list[str]:
    lines = FALLBACK.read_text(encoding="utf-8").splitlines()
    skipped = next(line for line in lines if "loading sglang.srt.models.deepseek_v2:" in line)
    fell_back = next(line for line in lines if "falling back to Transformers implementation" in line)
    return [skipped, fell_back]


def test_a_real_passing_log_passes():
    assert served_as_named(load_engine("sglang"), PASSING).kind == "pass"


def test_a_passing_log_that_fell_back_fails_with_the_skipped_import(tmp_path):
    lines = PASSING.read_text(encoding="utf-8").splitlines()
    ready = next(i for i, line in enumerate(lines) if "The server is fired up and ready to roll!" in line)
    log = tmp_path / "server.log"
    log.write_text("\n".join([*lines[:ready], *_fallback_lines(), *lines[ready:]]) + "\n", encoding="utf-8")
    found = served_as_named(load_engine("sglang"), log)
    assert str(found) == "fail:transformers-fallback"
    assert found.evidence == ("sglang skipped its model modules: No module named 'cutlass'",)
    assert found.excerpt.startswith("the server answered, but: sglang's own model code did not import")
    assert "GlmMoeDsaForCausalLM has no SGLang implementation" in found.excerpt


def test_the_fallback_is_the_only_sglang_signature_that_fails_a_pass():
    assert [s.id for s in load_signatures("sglang") if s.fails_a_pass] == ["transformers-fallback"]
    assert served_as_named(load_engine("sglang"), Path("/nonexistent/server.log")).kind == "pass"
