from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from servematrix.classify import (
    NO_MATCH,
    LogScanner,
    SignatureDataError,
    classify_file,
    classify_text,
    load_signatures,
    parse_signatures,
    printable,
    required_literals,
)
from servematrix.cli import main
from servematrix.errors import InputError

SRC = Path(__file__).resolve().parents[3] / "src" / "servematrix"
LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"

FP4_FRAMES = (
    "frames: quantization/fp4_quantization.py:725 fp4_quantize → polyfills/__init__.py:392 getattr_and_trace"
    " → python3.12/subprocess.py:548 run"
)

# (fixture, class, deciding line, evidence labels). Lines were read off the fixtures by hand.
SGLANG_CASES = [
    ("h200-sglang-0.5.12-ipython-missing.log", "missing-module", 14, ()),
    (
        "h200-sglang-0.5.12-grpc-port-break.log",
        "port-out-of-range",
        23,
        ("port arithmetic: SGLANG_GRPC_PORT 65827 = --port 55827 + 10000, above 65535",),
    ),
    ("dynamo-untraceable-sglang-0.5.10.log", "dynamo-untraceable", 22, ("flashinfer fp4 JIT",)),
    ("dynamo-untraceable-sglang-0.5.9-no-wrapper.log", "dynamo-untraceable", 47, ("flashinfer fp4 JIT",)),
    ("real-dynamo-fp4-flashinfer-0.6.3.trace", "dynamo-untraceable", 34, ("flashinfer fp4 JIT",)),
    ("kv-cache-oom.log", "kv-cache-oom", 35, ()),
    ("cuda-oom.log", "cuda-oom", 43, ("during cuda graph capture",)),
    ("no-kernel-image.log", "no-kernel-image", 40, ()),
    ("kernel-abi-mismatch.log", "kernel-abi-mismatch", 18, ("sgl-kernel",)),
    ("dependency-version.log", "dependency-version", 15, ()),
    ("dependency-version-flashinfer-cubin.log", "dependency-version", 26, ()),
    ("jit-build-failed.log", "jit-build-failed", 39, ("flashinfer JIT",)),
    # The deciding line is the traceback's source line `raise RuntimeError(f"NCCL error: ...")`, the
    # first line naming the cause.
    ("nccl-error.log", "nccl-error", 38, ()),
    ("unknown-flag.log", "unknown-flag", 6, ()),
    ("nan-output.log", "nan-output", 40, ()),
    ("scheduler-died.log", "scheduler-died", 13, ()),
    ("scheduler-died-rank-dead.log", "scheduler-died", 12, ()),
    ("graph-capture-failed.log", "graph-capture-failed", 21, ()),
    ("address-in-use.log", "address-in-use", 9, ()),
    ("python-exception.log", "python-exception", 7, ()),
    # Issue 34: written from the real wheels' frames (sglang 0.5.8/0.5.11/0.5.12/0.5.14, flashinfer 0.6.8.post1,
    # torch 2.11.0, transformers 4.57.1) in 0.5.12's real log format. The kernel faults' deciding line is the
    # exception line; their phase comes from the frames.
    ("kernel-fault-capture-sglang-0.5.12.log", "kernel-fault", 41, ("phase: capture",)),
    ("kernel-fault-replay-sglang-0.5.12.log", "kernel-fault", 36, ("phase: replay",)),
    ("kernel-fault-forward-sglang-0.5.12.log", "kernel-fault", 35, ("phase: forward",)),
    # A plain TypeError: the frames decide, at the exception line that ends their traceback.
    (
        "graph-capture-failed-typeerror-sglang-0.5.12.log",
        "graph-capture-failed",
        41,
        ("frames: model_executor/cuda_graph_runner.py:1187 capture_one_batch_size",),
    ),
    (
        "graph-capture-failed-compile-pass-sglang-0.5.14.log",
        "graph-capture-failed",
        39,
        ("frames: runner_backend/tc_piecewise_cuda_graph_backend.py:192 _run_compile_pass",),
    ),
    # A real log (the H200, 2026-12-05, GLM-5's architecture on sglang 0.5.12, breakable; machine paths
    # shortened): the RuntimeError shows only in the frames, under "Scheduler hit an exception".
    (
        "h200-sglang-0.5.12-glm5-breakable-warmup.log",
        "graph-capture-failed",
        120,
        ("frames: model_executor/breakable_cuda_graph_runner.py:307 _warmup",),
    ),
    # A real log (the H200, 2026-12-05, GLM-5's architecture on sglang 0.5.15 from a bundle without
    # nvidia-cutlass-dsl): the fallback decides, not the ValueError the Transformers backend raised after it.
    (
        "h200-sglang-0.5.15-glm5-transformers-fallback.log",
        "transformers-fallback",
        56,
        ("sglang skipped its model modules: No module named 'cutlass'",),
    ),
    # No torch._dynamo.exc line: the frames decide, at the subprocess frame that completes them.
    ("dynamo-untraceable-frames-only-sglang-0.5.11.log", "dynamo-untraceable", 37, ("flashinfer fp4 JIT", FP4_FRAMES)),
    ("dynamo-untraceable-truncated-sglang-0.5.11.log", "dynamo-untraceable", 37, ("flashinfer fp4 JIT", FP4_FRAMES)),
    ("model-unsupported-sglang-0.5.8.log", "model-unsupported", 27, ("model type glm_moe_dsa",)),
    (
        "moe-runner-unsupported-sglang-0.5.12.log",
        "moe-runner-unsupported",
        22,
        ("MoE runner MoeRunnerBackend.CUTLASS",),
    ),
]

TRANSFORMERS_CASES = [
    ("transformers-address-in-use.log", "address-in-use", 4),
    ("transformers-unknown-flag.log", "unknown-flag", 4),
    ("transformers-missing-module.log", "missing-module", 8),
    ("transformers-cpu-oom.log", "cpu-oom", 8),
    ("transformers-traceback.log", "python-exception", 5),
]

NO_ENV: dict[str, str] = {}


def fixture_text(name: str) -> str:
    """A fixture as the harness reads a log: bytes decoded, a tqdm bar's carriage returns kept inside its line."""
    return (LOGS / name).read_bytes().decode("utf-8")


def fixture_line(name: str, line: int) -> str:
    return fixture_text(name).split("\n")[line - 1]


# ---- whole logs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "cls", "line", "evidence"), SGLANG_CASES)
def test_sglang_fixture_classifies_to_its_class_and_line(name, cls, line, evidence):
    result = classify_file(LOGS / name, "sglang", env=NO_ENV)

    assert set(result) == {"class", "title", "line", "excerpt"}
    assert result["class"] == cls
    assert result["line"] == line
    assert result["title"] == load_signatures("sglang").get(cls).title
    assert fixture_line(name, line) in result["excerpt"]

    match = classify_text(fixture_text(name), "sglang", env=NO_ENV)
    assert match is not None
    assert (match.cls, match.line, match.evidence) == (cls, line, evidence)
    assert match.to_contract() == result


@pytest.mark.parametrize(("name", "cls", "line"), TRANSFORMERS_CASES)
def test_transformers_fixture_classifies_to_its_class_and_line(name, cls, line):
    result = classify_file(LOGS / name, engine="transformers", env=NO_ENV)
    assert (result["class"], result["line"]) == (cls, line)
    assert fixture_line(name, line) in result["excerpt"]


def test_every_sglang_class_has_a_fixture():
    covered = {cls for _, cls, _, _ in SGLANG_CASES}
    from_logs = {s.id for s in load_signatures("sglang") if not s.harness_assigned}
    assert from_logs <= covered


@pytest.mark.parametrize(
    ("name", "engine"), [("benign-ready.log", "sglang"), ("transformers-benign.log", "transformers")]
)
def test_healthy_log_matches_nothing(name, engine):
    assert classify_file(LOGS / name, engine=engine) == NO_MATCH
    assert classify_file(LOGS / name, engine=engine) == {"class": None, "title": None, "line": None, "excerpt": None}
    assert classify_text((LOGS / name).read_text(encoding="utf-8"), engine) is None


def test_benign_log_holds_lookalikes_of_real_signatures():
    # Guards the test above against a fixture that is trivially clean.
    text = (LOGS / "benign-ready.log").read_text(encoding="utf-8")
    for lookalike in ("undefined symbol: ", "nccl", "max_total_num_tokens", "Capture cuda graph begin", "api_key"):
        assert lookalike in text


def test_the_dynamo_trace_is_real_and_neutral():
    text = (LOGS / "real-dynamo-fp4-flashinfer-0.6.3.trace").read_text(encoding="utf-8")
    assert text.startswith("# ")
    assert "torch==2.13.0" in text.splitlines()[0] and "flashinfer-python==0.6.3" in text.splitlines()[0]
    assert "torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped" in text
    assert "qualname: allocate_lock" in text
    for host_path in ("/tmp/", "/root/", "/home/", "pyenv"):
        assert host_path not in text


# ---- ranking ---------------------------------------------------------------------------------------


def test_most_specific_cause_wins_over_the_earlier_generic_line():
    text = (LOGS / "dynamo-untraceable-sglang-0.5.9-no-wrapper.log").read_text(encoding="utf-8")
    scanner = LogScanner("sglang", env=NO_ENV)
    for line in text.splitlines():
        scanner.feed(line)

    ranked = [(m.cls, m.line) for m in scanner.matches()]
    assert ranked[0] == ("dynamo-untraceable", 47)
    assert ("scheduler-died", 21) in ranked
    assert ranked.index(("scheduler-died", 21)) > 0


@pytest.mark.parametrize("cause_first", [True, False])
def test_cause_wins_whichever_order_it_is_printed_in(cause_first):
    generic = "[2026-01-01 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):"
    cause = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    lines = ["[2026-01-01 10:00:00 TP0] Load weight end.", *((cause, generic) if cause_first else (generic, cause))]
    match = classify_text("\n".join(lines), "sglang")
    assert match is not None
    assert match.cls == "kv-cache-oom"
    assert match.line == (2 if cause_first else 3)


def test_wrapper_line_names_dynamo_only_when_the_error_is_dynamos():
    dynamo = "[t TP0] Piecewise CUDA Graph failed with error: Attempted to call function marked as skipped"
    other = "[t TP0] Piecewise CUDA Graph failed with error: PCG capture stream is not set"
    fault = "[t TP0] Piecewise CUDA Graph failed with error: CUDA error: an illegal memory access was encountered"
    assert classify_text(dynamo, "sglang").cls == "dynamo-untraceable"
    assert classify_text(other, "sglang").cls == "graph-capture-failed"
    # A kernel fault is more specific than the capture that saw it (issue 34).
    found = classify_text(fault, "sglang")
    assert (found.cls, found.evidence) == ("kernel-fault", ("phase: capture",))


def test_equal_priorities_pick_the_earliest_line():
    sigs = parse_signatures(
        """
schema = 1
engine = "test"
[[signature]]
id = "alpha"
title = "A"
explanation = "a"
workaround = "a"
fatal = true
priority = 5
patterns = ["ALPHA"]
[[signature]]
id = "beta"
title = "B"
explanation = "b"
workaround = "b"
fatal = true
priority = 5
patterns = ["BETA"]
""",
        source="test.toml",
    )
    assert classify_text("x\nBETA\nALPHA\n", sigs).cls == "beta"
    assert classify_text("x\nALPHA\nBETA\n", sigs).cls == "alpha"
    assert classify_text("x\nALPHA\nBETA\n", sigs).line == 2


# ---- evidence --------------------------------------------------------------------------------------


def test_evidence_labels_the_verdict():
    match = classify_text((LOGS / "dynamo-untraceable-sglang-0.5.10.log").read_text(encoding="utf-8"), "sglang")
    assert match.evidence == ("flashinfer fp4 JIT",)
    assert match.label == "dynamo-untraceable (flashinfer fp4 JIT)"


def test_no_evidence_without_the_flashinfer_frames():
    text = "torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped\n  Explanation: ...\n"
    match = classify_text(text, "sglang")
    assert match.cls == "dynamo-untraceable"
    assert match.evidence == ()
    assert match.label == "dynamo-untraceable"


def test_evidence_belongs_to_its_class_only():
    # fp4 frames beside an OOM do not make the OOM a dynamo failure, nor label it.
    text = (
        '  File "/venv/lib/python3.11/site-packages/flashinfer/fp4_quantization.py", line 677, in fp4_quantize\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    match = classify_text(text, "sglang")
    assert match.cls == "cuda-oom"
    assert match.evidence == ()


# ---- streaming -------------------------------------------------------------------------------------


def test_scanner_reports_the_first_fatal_line_once():
    lines = (LOGS / "dynamo-untraceable-sglang-0.5.10.log").read_text(encoding="utf-8").splitlines(keepends=True)
    scanner = LogScanner("sglang", env=NO_ENV)
    reported = [(number, found) for number, line in enumerate(lines, 1) if (found := scanner.feed(line))]

    assert len(reported) == 1
    number, found = reported[0]
    assert number == 22
    assert (found.cls, found.line, found.fatal) == ("dynamo-untraceable", 22, True)
    # Only what was fed so far: three lines before, none after.
    assert found.excerpt.splitlines()[-1] == lines[21].rstrip("\n")
    assert len(found.excerpt.splitlines()) == 4
    assert scanner.line_count == len(lines)
    assert scanner.best() == classify_text("".join(lines), "sglang", env=NO_ENV)


def test_scanner_aborts_on_the_generic_line_and_best_reranks():
    lines = (LOGS / "dynamo-untraceable-sglang-0.5.9-no-wrapper.log").read_text(encoding="utf-8").splitlines()
    scanner = LogScanner("sglang", env=NO_ENV)
    first = None
    for line in lines:
        found = scanner.feed(line)
        if found and first is None:
            first = found
            assert scanner.line_count == 21
    assert (first.cls, first.line) == ("scheduler-died", 21)
    assert (scanner.best().cls, scanner.best().line) == ("dynamo-untraceable", 47)
    assert scanner.best().evidence == ("flashinfer fp4 JIT",)


def test_scanner_never_aborts_on_a_non_fatal_class():
    scanner = LogScanner("sglang")
    assert scanner.feed("Traceback (most recent call last):") is None
    assert scanner.feed("ValueError: something odd") is None
    assert scanner.best().cls == "python-exception"
    assert scanner.best().fatal is False


def test_scanner_counts_lines_across_chunks_and_line_endings():
    scanner = LogScanner("sglang")
    assert scanner.feed("one\ntwo\r\n") is None
    assert scanner.feed("three\r\n") is None
    found = scanner.feed("four\nlaunch_server.py: error: unrecognized arguments: --bogus\nsix\n")
    assert found is not None
    assert (found.cls, found.line) == ("unknown-flag", 5)
    assert scanner.line_count == 6


def test_scanner_ignores_terminal_colours():
    found = LogScanner("sglang").feed("\x1b[31mRuntimeError: NCCL error: unhandled cuda error\x1b[0m")
    assert found.cls == "nccl-error"
    assert "\x1b" not in found.excerpt


NCCL = "RuntimeError: NCCL error: unhandled cuda error"
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # what a terminal acts on; tab is plain text

# (a log line, what is left of it): every terminal control sequence goes, with its payload, and the text stays.
CONTROL_CASES = [
    ("\x1b]52;c;ZWNobyBwd25lZA==\x07" + NCCL, NCCL),  # OSC 52: writes the clipboard
    ("\x1b]8;;https://example.invalid\x1b\\" + NCCL + "\x1b]8;;\x1b\\", NCCL),  # OSC 8 link, ST-terminated
    ("\x1b]0;title\x9c" + NCCL, NCCL),  # 8-bit ST
    ("\x9d52;c;ZWNobw==\x07" + NCCL, NCCL),  # 8-bit OSC
    ("\x1bP1$qm\x1b\\" + NCCL, NCCL),  # DCS
    ("\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\" + NCCL, NCCL),  # APC, PM, SOS
    ("\x9b2J\x1b[?1049h\x1b[38;5;196m" + NCCL + "\x1b[0m", NCCL),  # CSI, 7- and 8-bit
    ("\x1bc\x1b(0\x1b7" + NCCL + "\x1b8", NCCL),  # reset, charset, save/restore cursor
    ("\x07\x08\x0e" + NCCL + "\x7f\x1b", NCCL),  # bell, backspace, shift out, DEL, a lone ESC
    ("\x1b]52;c;never terminated " + NCCL, "52;c;never terminated " + NCCL),  # only the introducer goes
    ("\t" + NCCL, "\t" + NCCL),
]


@pytest.mark.parametrize(("line", "left"), CONTROL_CASES)
def test_no_terminal_control_sequence_reaches_an_excerpt(line, left):
    assert printable(line) == left
    found = classify_text(f"noise\n{line}\n", "sglang")
    assert found is not None and found.cls == "nccl-error"
    assert not CONTROL.search(found.excerpt.replace("\n", "")), repr(found.excerpt)


def test_classify_prints_no_terminal_control_sequence(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_bytes(("\n".join(line for line, _ in CONTROL_CASES) + "\n").encode())
    assert main(["classify", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nccl-error:") and not CONTROL.search(out.replace("\n", "")), repr(out)


def test_removing_control_sequences_stays_linear_on_unterminated_strings():
    # Each 8-bit OSC introducer opens a string that is never terminated: a body scan that ran to the end of the
    # line from each one would cost 30,000 x 30,000 steps here.
    assert printable("\x9da" * 30_000) == "a" * 30_000
    assert printable("\x1b]a" * 30_000) == "a" * 30_000


def test_scanner_accepts_a_signatures_object():
    sigs = load_signatures("transformers")
    assert LogScanner(sigs).feed("ModuleNotFoundError: No module named 'requests'").cls == "missing-module"


# ---- excerpts --------------------------------------------------------------------------------------


def test_excerpt_is_redacted():
    secret = "hf_" + "Q" * 34
    text = "\n".join(
        [
            "[2026-01-01 10:00:00] starting",
            f"[2026-01-01 10:00:01] HF_TOKEN={secret} model=/models/GLM-5-NVFP4",
            "[2026-01-01 10:00:02] api_key='plainsecret99'",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            "[2026-01-01 10:00:03] env value mysecretvalue42 echoed",
        ]
    )
    match = classify_text(text, "sglang", env={"MY_PASSWORD": "mysecretvalue42"})
    assert match.cls == "kv-cache-oom"
    assert secret not in match.excerpt
    assert "plainsecret99" not in match.excerpt
    assert "mysecretvalue42" not in match.excerpt
    assert match.excerpt.count("[REDACTED]") == 3
    assert "Not enough memory" in match.excerpt


def test_excerpt_has_context_around_the_deciding_line():
    lines = [f"line {i}" for i in range(1, 21)]
    lines[9] = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    match = classify_text("\n".join(lines), "sglang")
    assert match.line == 10
    assert match.excerpt.splitlines() == lines[6:15]


def test_excerpt_clips_huge_lines():
    text = "x" * 50_000 + "\nRuntimeError: NCCL error: remote process exited\n"
    match = classify_text(text, "sglang")
    assert match.line == 2
    assert len(match.excerpt) < 2_000


def test_classify_file_reads_bad_bytes_and_bare_carriage_returns(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(
        b"Capturing batches: 10%\rCapturing batches: 100%\n"
        b"\xff\xfe not utf-8\n"
        b"RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    result = classify_file(log, "sglang")
    assert (result["class"], result["line"]) == ("kv-cache-oom", 3)


def test_classify_file_of_a_missing_file_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="cannot read log file"):
        classify_file(tmp_path / "absent.log", "sglang")


# ---- signature data --------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang", "transformers"])
def test_packaged_signatures_are_complete(engine):
    sigs = load_signatures(engine)
    assert sigs.engine == engine
    for signature in sigs:
        assert signature.title and signature.explanation and signature.workaround
        assert isinstance(signature.fatal, bool)
        assert bool(signature.patterns) != signature.harness_assigned
    timeout = sigs.get("server-timeout")
    assert timeout is not None and timeout.harness_assigned and not timeout.patterns
    assert load_signatures(engine) is sigs  # cached


def test_sglang_ranks_causes_above_symptoms():
    sigs = load_signatures("sglang")
    priority = {s.id: s.priority for s in sigs}
    causes = set(priority) - {"scheduler-died", "python-exception", "server-timeout", "graph-capture-failed"}
    assert all(priority[c] > priority["graph-capture-failed"] for c in causes)
    assert priority["graph-capture-failed"] > priority["scheduler-died"] > priority["python-exception"]
    assert sigs.get("dynamo-untraceable").fatal and sigs.get("scheduler-died").fatal
    assert {e.label for e in sigs.get("dynamo-untraceable").evidence} >= {"flashinfer fp4 JIT"}


@pytest.mark.parametrize("engine", ["sglang", "transformers"])
def test_every_packaged_pattern_has_a_literal_prefilter(engine):
    # A pattern without a required literal is searched on every line of every log.
    assert all(probe.literals for probe in load_signatures(engine).prefilter.probes)


@pytest.mark.parametrize("engine", ["sglang", "transformers"])
def test_prefilter_agrees_with_searching_every_pattern(engine):
    prefilter = load_signatures(engine).prefilter
    lines = [line for log in sorted(LOGS.iterdir()) for line in log.read_text(encoding="utf-8").split("\n")]
    lines += ["ADDRESS ALREADY IN USE", "Out Of Memory", "ncclSystemError", "torch._dynamo.exc.UserError: x"]
    seen = 0
    for line in lines:
        expected = [probe for probe in prefilter.probes if probe.pattern.search(line)]
        assert prefilter.hits(line) == expected, line
        seen += bool(expected)
    assert seen > 15


def test_unknown_engine_is_a_clear_error():
    with pytest.raises(SignatureDataError, match="no failure signatures for engine 'nope'") as info:
        load_signatures("nope")
    assert "signatures/nope.toml" in str(info.value)
    assert isinstance(info.value, InputError)


GOOD = """\
schema = 1
engine = "toy"

[[signature]]
id = "first"
title = "First"
explanation = "x"
workaround = "y"
fatal = true
priority = 10
patterns = ["FIRST"]

[[signature]]
id = "second"
title = "Second"
explanation = "x"
workaround = "y"
fatal = false
priority = 5
patterns = ["SECOND", "OTHER"]

  [[signature.evidence]]
  label = "ev"
  patterns = ["EVIDENCE"]
"""


def _from_file(path: Path):
    """Signatures from a test's own file (the engine is the file's stem, as a packaged file's name is)."""
    return parse_signatures(path.read_bytes(), source=str(path), default_engine=path.stem)


def test_a_valid_toy_file_loads(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(GOOD)
    sigs = _from_file(path)
    assert sigs.ids == ("first", "second")
    assert classify_text("EVIDENCE\nSECOND\n", sigs).label == "second (ev)"


@pytest.mark.parametrize(
    ("old", "new", "key", "line", "message"),
    [
        (
            'patterns = ["SECOND", "OTHER"]',
            'patterns = ["SECOND", "(unclosed"]',
            "signature[1].patterns[1]",
            20,
            "invalid regex",
        ),
        ('workaround = "y"\nfatal = false', "fatal = false", "signature[1].workaround", 13, "missing"),
        ('patterns = ["FIRST"]', 'paterns = ["FIRST"]', "signature[0].paterns", 11, "unknown key"),
        ("fatal = true", 'fatal = "yes"', "signature[0].fatal", 9, "true or false"),
        ("priority = 10", "priority = true", "signature[0].priority", 10, "integer"),
        ('id = "second"', 'id = "first"', "signature[1].id", 14, "duplicate"),
        ('id = "second"', 'id = "Second One"', "signature[1].id", 14, "lowercase"),
        ('patterns = ["FIRST"]', 'patterns = ["A*"]', "signature[0].patterns[0]", 11, "matches an empty line"),
        ('patterns = ["FIRST"]', "patterns = []", "signature[0].patterns", 11, "at least one"),
        ('label = "ev"', 'lable = "ev"', "signature[1].evidence[0].lable", 23, "unknown key"),
        ("schema = 1", "schema = 2", "schema", 1, "schema must be 1"),
        ('engine = "toy"', 'engine = "other"', "engine", 2, "expected 'toy'"),
        # The second signature's evidence: the locator follows [[signature.evidence]] into its signature.
        (
            'patterns = ["EVIDENCE"]',
            'patterns = ["EVI(DENCE"]',
            "signature[1].evidence[0].patterns[0]",
            24,
            "invalid regex",
        ),
        ('label = "ev"', 'label = ""', "signature[1].evidence[0].label", 23, "non-empty string"),
        ('patterns = ["EVIDENCE"]', "patterns = []", "signature[1].evidence[0].patterns", 24, "at least one pattern"),
        # A misspelt key is named as unknown, not as the key it should have been (missing).
        ("fatal = false", "fatl = false", "signature[1].fatl", 18, "unknown key"),
        ('engine = "toy"', 'engine = "toy"\nsignatures = []', "signatures", 3, "unknown key"),
        ('title = "First"', "title = 7", "signature[0].title", 6, "non-empty string, got 7"),
        ('patterns = ["FIRST"]', "patterns = [3]", "signature[0].patterns[0]", 11, "regex string, got 3"),
        ('patterns = ["FIRST"]', 'patterns = "FIRST"', "signature[0].patterns", 11, "expected a list"),
        ('engine = "toy"', 'engine = "Toy"', "engine", 2, "lowercase"),
    ],
)
def test_malformed_data_names_file_line_and_key(tmp_path, old, new, key, line, message):
    assert old in GOOD
    path = tmp_path / "toy.toml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(SignatureDataError) as info:
        if key == "engine":
            parse_signatures(path.read_text(), source=str(path), engine="toy")
        else:
            _from_file(path)
    assert isinstance(info.value, InputError)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: {key}: "), text
    assert message in text


def test_harness_assigned_signature_must_have_no_patterns():
    data = GOOD.replace("priority = 10", "priority = 10\nharness_assigned = true", 1)
    with pytest.raises(SignatureDataError, match=r"signature\[0\]\.patterns: a harness-assigned"):
        parse_signatures(data, source="toy.toml")


def test_only_a_non_fatal_signature_can_fail_a_pass():
    data = GOOD.replace("priority = 10", "priority = 10\nfails_a_pass = true", 1)  # on the fatal one
    with pytest.raises(SignatureDataError, match=r"signature\[0\]\.fails_a_pass: a signature that fails a pass"):
        parse_signatures(data, source="toy.toml")
    fine = GOOD.replace("priority = 5", "priority = 5\nfails_a_pass = true", 1)
    assert [s.fails_a_pass for s in parse_signatures(fine, source="toy.toml")] == [False, True]


def test_invalid_toml_names_the_line():
    with pytest.raises(SignatureDataError, match=r"^toy\.toml:3: invalid TOML"):
        parse_signatures('schema = 1\nengine = "toy"\n[[signature]\n', source="toy.toml")


def test_a_signature_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_bytes(GOOD.encode().replace(b'title = "Second"', b'title = "Sec\xffond"'))
    with pytest.raises(SignatureDataError, match=rf"^{re.escape(str(path))}:15: not valid UTF-8"):
        _from_file(path)


def test_signatures_are_immutable_data():
    signature = load_signatures("sglang").get("unknown-flag")
    with pytest.raises((AttributeError, ValueError), match="frozen"):
        signature.priority = 0  # type: ignore[misc]


# (pattern, the literals every match contains, whether they are lowercased, a line the pattern matches)
LITERAL_CASES = [
    ("error: unrecognized arguments:", {"error: unrecognized arguments:"}, False, "x error: unrecognized arguments: y"),
    (r"torch\._dynamo\.exc\.(Unsupported|UserError)\b", {"torch._dynamo.exc."}, False, "torch._dynamo.exc.UserError"),
    (r"(?i)address already in use", {"address already in use"}, True, "OSError: Address Already In Use"),
    (r"x(?i:Hello)Worlds", {"Worlds"}, False, "xhELLOWorlds"),
    (r"ab?cdef", {"cdef"}, False, "acdef"),
    (r"ab*cdef", {"cdef"}, False, "abbbcdef"),
    (r"xy+zzzz", {"zzzz"}, False, "xyyyzzzz"),
    (r"q{0,3}rstu", {"rstu"}, False, "rstu"),
    (r"q{,3}rstu", {"rstu"}, False, "qrstu"),
    (r"a{}bc", {"a{}bc"}, False, "a{}bc"),
    (r"\{key\}=", {"{key}="}, False, "{key}="),
    (r"\x41BC\tD", {"ABC\tD"}, False, "ABC\tD"),
    (r"[Dd]ynamo", {"ynamo"}, False, "Dynamo"),
    (r"[]x]yzw", {"yzw"}, False, "]yzw"),
    (r"foo(?=barbaz)", {"foo"}, False, "foobarbaz"),
    (r"(?<!x)hello", {"hello"}, False, "hello"),
    (r"(abc)de\1", {"abcde"}, False, "abcdeabc"),
    (r"hel(?#a comment)lo", {"hello"}, False, "hello"),
    (
        r"(Piecewise failed|Capture failed).*marked",
        {"Piecewise failed", "Capture failed"},
        False,
        "Capture failed: marked",
    ),
    (r"(?:ab|)cdef", {"cdef"}, False, "cdef"),
    (r"(?:abc|de(?:fgh|ijk))", {"abc", "fgh", "ijk"}, False, "deijk"),  # per branch, its longest
    (r"(?:A|B)(?i:xyz)", {"xyz"}, True, "AXyZ"),
    (r"\d+ms", None, False, "12ms"),  # "ms" alone is too short to reject a line
    (r"\101bc", {"Abc"}, False, "Abc"),  # octal
]


@pytest.mark.parametrize(("pattern", "literals", "folded", "line"), LITERAL_CASES)
def test_required_literals_are_read_from_the_pattern_text(pattern, literals, folded, line):
    compiled = re.compile(pattern)
    assert compiled.search(line), "the case's line must match its pattern"
    found, found_folded = required_literals(compiled)
    if literals is None:
        assert found is None or min(map(len, found)) < 3
        return
    assert (found, found_folded) == (frozenset(literals), folded)
    haystack = line.lower() if folded else line
    assert any(literal in haystack for literal in found)  # sound: the matching line passes the filter


@pytest.mark.parametrize(
    ("pattern", "line"),
    [(r"(?x) fatal \s+ error", "fatal error"), (r"(a)?(?(1)bcd|efg)", "efg"), (r"\N{EM DASH}dash", "\N{EM DASH}dash")],
)
def test_a_pattern_the_reader_does_not_follow_is_searched_on_every_line(tmp_path, pattern, line):
    assert required_literals(re.compile(pattern)) == (None, False)
    path = tmp_path / "toy.toml"
    path.write_text(GOOD.replace('patterns = ["FIRST"]', f"patterns = ['{pattern}']", 1), encoding="utf-8")
    sigs = _from_file(path)
    assert sigs.prefilter.probes[0].literals == ()
    assert classify_text(f"noise\n{line}\n", sigs).cls == "first"


def test_no_module_reads_the_private_regex_parser():
    private = {"re._parser", "re._constants", "re._compiler", "sre_parse", "sre_constants", "sre_compile"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            else:
                continue
            found += [f"{path.relative_to(SRC)}: {name}" for name in sorted(names & private)]
    assert found == []


def test_every_classify_module_is_in_the_digests_of_cached_checks():
    # classify is a package: its __init__ only re-exports, and the scanner is what decides a class.
    from servematrix import classify
    from servematrix.engines import load_engine
    from servematrix.run import reuse
    from servematrix.stages import importcheck

    modules = set(Path(classify.__file__).parent.glob("*.py"))
    assert {"scanner.py", "signatures.py", "prefilter.py"} <= {p.name for p in modules}
    assert modules <= set(importcheck.code_files())
    # The classifier is in no pre-flight stage's key: a class is named again at reuse (stages/naming.py).
    code = reuse.hook_code(load_engine("sglang"))
    assert not any(label.startswith("servematrix.classify") for hook in code.values() for label in hook.sources)


# ---- traceback frames as evidence (issue 34) -------------------------------------------------------

NEW_SHAPES = {
    "kernel-fault-capture-sglang-0.5.12.log": "kernel-fault",
    "kernel-fault-replay-sglang-0.5.12.log": "kernel-fault",
    "kernel-fault-forward-sglang-0.5.12.log": "kernel-fault",
    "graph-capture-failed-typeerror-sglang-0.5.12.log": "graph-capture-failed",
    "graph-capture-failed-compile-pass-sglang-0.5.14.log": "graph-capture-failed",
    "dynamo-untraceable-frames-only-sglang-0.5.11.log": "dynamo-untraceable",
    "dynamo-untraceable-truncated-sglang-0.5.11.log": "dynamo-untraceable",
    "model-unsupported-sglang-0.5.8.log": "model-unsupported",
}


@pytest.mark.parametrize("name", sorted(NEW_SHAPES))
def test_new_shapes_are_not_scheduler_died_and_abort_early_on_their_class(name):
    lines = (LOGS / name).read_text(encoding="utf-8").splitlines()
    scanner = LogScanner("sglang", env=NO_ENV)
    reported = [found for line in lines if (found := scanner.feed(line))]
    first = reported[0] if reported else None
    assert scanner.best().cls == NEW_SHAPES[name] != "scheduler-died"
    # Fatal: a running server is stopped by the first fatal line (a generic one may come first; the serve
    # stage re-ranks what its log holds before it kills the server), at the latest by the class's own line.
    assert first is not None and first.fatal and first.line <= scanner.best().line
    assert scanner.best().fatal


def test_frames_that_decided_are_in_the_excerpt():
    match = classify_text((LOGS / "dynamo-untraceable-frames-only-sglang-0.5.11.log").read_text(), "sglang")
    head = match.excerpt.splitlines()[:4]
    assert head[0] == "frames that decided (dynamo traced flashinfer's FP4 JIT into subprocess):"
    assert head[1:] == [f"  {frame}" for frame in match.frames]
    assert match.frames[-1] == "python3.12/subprocess.py:548 run"


def test_frames_rule_with_raises_needs_its_exception_line():
    capture = '  File "/x/sglang/srt/model_executor/cuda_graph_runner.py", line 1187, in capture_one_batch_size'
    text = "\n".join(["Traceback (most recent call last):", capture, "    run_once()"])
    assert classify_text(text, "sglang") is None  # cut before its exception: no class from a `raises` rule
    assert classify_text(text + "\nTypeError: bad", "sglang").cls == "graph-capture-failed"
    # The same frames in another listing than the one that raised do not count.
    other = (
        text + '\n[t] some log line\nTraceback (most recent call last):\n  File "/x/y.py", line 1, in f\nTypeError: x'
    )
    assert classify_text(other, "sglang").cls == "python-exception"


def test_frames_must_come_in_call_order():
    polyfills = '  File "/v/torch/_dynamo/polyfills/__init__.py", line 392, in getattr_and_trace'
    fp4 = '  File "/v/flashinfer/quantization/fp4_quantization.py", line 725, in fp4_quantize'
    sub = '  File "/usr/lib/python3.12/subprocess.py", line 548, in run'
    assert classify_text("\n".join(["from user code:", fp4, polyfills, sub]), "sglang").cls == "dynamo-untraceable"
    assert classify_text("\n".join(["from user code:", polyfills, fp4, sub]), "sglang").cls == "dynamo-untraceable"
    assert classify_text("\n".join(["from user code:", sub, fp4]), "sglang") is None
    # Redacted paths (`.../site-packages/...`, as the published excerpts show them) are frames too.
    redacted = [line.replace("/v/", ".../site-packages/") for line in (fp4, polyfills)]
    assert classify_text("\n".join(["Traceback (most recent call last):", *redacted, sub]), "sglang").cls == (
        "dynamo-untraceable"
    )


def test_phase_is_the_first_of_its_group_in_data_order():
    # A replay traceback runs through the forward too: replay is named, not both.
    match = classify_text((LOGS / "kernel-fault-replay-sglang-0.5.12.log").read_text(), "sglang")
    assert match.evidence == ("phase: replay",)


def test_model_unsupported_names_the_architecture_from_the_registry_message():
    line = (
        "ValueError: Model architectures ['GlmMoeDsaForCausalLM'] are not supported for now. "
        "Supported architectures: dict_keys(['LlamaForCausalLM'])"
    )
    match = classify_text(f"[t TP0] Scheduler hit an exception: Traceback (most recent call last):\n{line}\n", "sglang")
    assert (match.cls, match.evidence) == ("model-unsupported", ("architectures ['GlmMoeDsaForCausalLM']",))


def test_signature_data_cites_its_sources_for_the_new_shapes():
    sigs = load_signatures("sglang")
    assert any("#26541" in s for s in sigs.get("kernel-fault").sources)
    assert any("#2999" in s for s in sigs.get("dynamo-untraceable").sources)
    assert all(sigs.get(c).fatal for c in ("kernel-fault", "model-unsupported", "graph-capture-failed"))
