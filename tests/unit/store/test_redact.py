from __future__ import annotations

import io

import pytest

from servematrix.store.redact import (
    MASK,
    REDACTED,
    LineRedactingWriter,
    MissingSecretError,
    Redactor,
    fill_secrets,
    masked_flags,
    placeholder_flags,
    redact,
    redact_argv,
    secret_env_values,
    spec_secret_flags,
)

HF = "hf_" + "aB3" * 12
OPENAI = "sk-proj-" + "Zx9_" * 8


def test_values_of_secret_env_vars_are_replaced():
    env = {"HF_TOKEN": HF, "OPENAI_API_KEY": "abcdef-secret-1", "DB_PASSWORD": "hunter22", "HOME": "/root"}
    text = f"token {HF} key abcdef-secret-1 pw hunter22 home /root"
    assert redact(text, env) == f"token {REDACTED} key {REDACTED} pw {REDACTED} home /root"


def test_short_env_values_are_left_alone():
    # "false" would otherwise vanish from every log line that says so.
    env = {"TOKENIZERS_PARALLELISM": "false", "MY_KEY": "12345"}
    assert redact("parallel=false id=12345", env) == "parallel=false id=12345"
    assert secret_env_values(env) == []


def test_longer_env_value_is_replaced_whole():
    env = {"A_TOKEN": "abcdef", "B_TOKEN": "abcdefghij"}
    assert redact("x abcdefghij y", env) == f"x {REDACTED} y"


def test_default_env_is_the_process_environment(monkeypatch):
    monkeypatch.setenv("SERVEMATRIX_TEST_SECRET", "process-secret-value")
    assert redact("saw process-secret-value") == f"saw {REDACTED}"
    assert redact("saw process-secret-value", env={}) == "saw process-secret-value"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"token {HF} end", f"token {REDACTED} end"),
        (f"key={OPENAI}", f"key={REDACTED}"),
        ("gh ghp_" + "a1B2" * 9, f"gh {REDACTED}"),
        ("gho_" + "Z" * 36, REDACTED),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", REDACTED),
        ("aws AKIAIOSFODNN7EXAMPLE done", f"aws {REDACTED} done"),
        ("Authorization: Bearer abc.def-123_456", f"Authorization: Bearer {REDACTED}"),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {REDACTED}"),
        ("https://user:pa55w0rd@index.example/simple", f"https://user:{REDACTED}@index.example/simple"),
        ("token=0123456789abcdef0123456789abcdef", f"token={REDACTED}"),
        ("api_key='s3cr3t-v4lue'", f"api_key='{REDACTED}'"),
        ('{"password": "hunter22"}', f'{{"password": "{REDACTED}"}}'),
        ("--api-key supersecret99 --port 30000", f"--api-key {REDACTED} --port 30000"),
        ('["--hf-token", "abcdef123"]', f'["--hf-token", "{REDACTED}"]'),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            f"jwt {REDACTED}",
        ),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY-----\nafter", f"{REDACTED}\nafter"),
    ],
)
def test_token_shapes_are_replaced(text, expected):
    assert redact(text, env={}) == expected


@pytest.mark.parametrize(
    "text",
    [
        "[2026-01-01 10:00:00 TP0] Decode batch, #running-req: 16, #token: 1061, token usage: 0.00",
        "max_total_num_tokens=1203712, chunked_prefill_size=32768",
        "Decode batch, #running-req: 512, #token: 1203712, token usage: 0.98",
        "server_args=ServerArgs(tokenizer_path='/models/GLM-5-NVFP4', api_key=None, skip_tokenizer_init=False)",
        "Token throughput is high; The Bearer of news",
        "--api-key --port 30000",
        "disk-usage-report-for-the-cluster-nodes",
        "torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped",
        "--max-total-tokens 262144 --tokenizer-path /models/x",
    ],
)
def test_ordinary_log_text_is_untouched(text):
    assert redact(text, env={}) == text


def test_redaction_is_idempotent():
    text = f"Bearer abcdefghijk {HF} https://u:p4ssw0rd@h/x api_key='s3cr3t-v4lue' --api-key supersecret99"
    once = redact(text, env={})
    assert HF not in once and "p4ssw0rd" not in once and "s3cr3t-v4lue" not in once and "supersecret99" not in once
    assert redact(once, env={}) == once


# -- argv ------------------------------------------------------------------------------------------

SK = "sk-" + "Q7w" * 10
GHP = "ghp_" + "Xy3" * 12
ENGINE_FLAGS = ("--api-key", "--hf-token", "--token")


def test_secret_flag_values_are_masked_in_both_forms():
    argv = ["serve", "--api-key", "plainvalue1", f"--hf-token={HF}", "--token", GHP, "--port", "8000"]
    assert redact_argv(argv, ENGINE_FLAGS) == [
        "serve", "--api-key", MASK, f"--hf-token={MASK}", "--token", MASK, "--port", "8000",
    ]  # fmt: skip
    assert masked_flags(argv, ENGINE_FLAGS) == ["--api-key", "--hf-token", "--token"]


def test_a_listed_flag_is_masked_whatever_its_value_looks_like():
    assert redact_argv(["--my-credential", "abc"], ["--my-credential"]) == ["--my-credential", MASK]
    assert redact_argv(["--my-credential", "abc"]) == ["--my-credential", "abc"]


def test_flags_named_like_secrets_are_masked_when_their_value_looks_secret():
    assert redact_argv(["--admin-api-key", "s3cr3t-value"]) == ["--admin-api-key", MASK]
    assert redact_argv(["--max-new-token", "64", "--skip-special-token"]) == [
        "--max-new-token", "64", "--skip-special-token",
    ]  # fmt: skip


def test_token_shapes_are_redacted_in_any_argument():
    assert redact_argv(["--header", f"x-key:{SK}", f"--model=org/m?{HF}"]) == [
        "--header", f"x-key:{REDACTED}", f"--model=org/m?{REDACTED}",
    ]  # fmt: skip


def test_a_secret_flag_without_a_value_masks_nothing():
    assert redact_argv(["--api-key", "--port", "1"], ENGINE_FLAGS) == ["--api-key", "--port", "1"]
    assert redact_argv(["serve", "--api-key"], ENGINE_FLAGS) == ["serve", "--api-key"]


def test_argv_redaction_is_idempotent():
    argv = ["--api-key", SK, f"--hf-token={HF}", "--x", GHP]
    once = redact_argv(argv, ENGINE_FLAGS)
    assert redact_argv(once, ENGINE_FLAGS) == once


def test_the_matrix_extends_the_engine_flags():
    from types import SimpleNamespace

    from servematrix.engines import load_engine

    engine = load_engine("sglang")
    assert {"--api-key", "--hf-token", "--token"} <= set(engine.secret_flags)
    spec = SimpleNamespace(engine=engine, file=SimpleNamespace(server=SimpleNamespace(secret_flags=["--db-dsn"])))
    flags = spec_secret_flags(spec)  # type: ignore[arg-type]
    assert "--db-dsn" in flags and "--api-key" in flags
    assert redact_argv(["--db-dsn", "postgres://u@h/db"], flags) == ["--db-dsn", MASK]


def test_placeholders_are_filled_from_their_variables():
    env = {"SERVEMATRIX_SECRET_API_KEY": SK, "SERVEMATRIX_SECRET_HF_TOKEN": HF}
    argv = ("serve", "--api-key", MASK, f"--hf-token={MASK}", "--port", "1")
    assert placeholder_flags(argv, ENGINE_FLAGS) == ["--api-key", "--hf-token"]
    assert fill_secrets(argv, ENGINE_FLAGS, env) == ("serve", "--api-key", SK, f"--hf-token={HF}", "--port", "1")
    with pytest.raises(MissingSecretError) as missing:
        fill_secrets(argv, ENGINE_FLAGS, {})
    assert missing.value.variable == "SERVEMATRIX_SECRET_API_KEY"


# -- text and streams --------------------------------------------------------------------------------


def test_known_values_and_flags_are_redacted_in_text():
    redactor = Redactor.for_launch(["serve", "--db-dsn", "postgres-pw-123"], {}, ["--db-dsn"])
    text = "ServerArgs(db_dsn='postgres-pw-123')\nlaunch: serve --db-dsn postgres-pw-123"
    out = redactor.text(text)
    assert "postgres-pw-123" not in out


def test_the_stream_writer_redacts_a_secret_split_across_writes():
    sink = io.BytesIO()
    writer = LineRedactingWriter(sink, Redactor())
    line = f"loading with token {HF} now\n".encode()
    for i in range(0, len(line), 7):
        writer.write(line[i : i + 7])
        assert HF.encode() not in sink.getvalue()
    writer.write(b"a line with no newline yet")
    assert b"no newline" not in sink.getvalue()  # held back until its end is known
    writer.close()
    assert sink.getvalue() == f"loading with token {REDACTED} now\na line with no newline yet".encode()


def test_the_stream_writer_bounds_a_line_without_newlines():
    sink = io.BytesIO()
    writer = LineRedactingWriter(sink, Redactor(), max_line=1000)
    for _ in range(50):
        writer.write(b"progress 10%\r" * 10)
    assert len(sink.getvalue()) > 0  # written as it came, at its carriage returns
    writer.close()
    assert sink.getvalue() == b"progress 10%\r" * 500


@pytest.mark.parametrize("split", ["\u200b", "\u00ad", "\u2060", "\ufeff", "\u200d", "\u202e"])
def test_a_secret_split_by_an_invisible_character_is_still_redacted(split):
    """L1: a zero-width space, soft hyphen, word joiner, BOM or bidi control inside a secret hid it from the
    match, and a browser showed it whole. They are removed before matching (and never reach the page)."""
    env = {"DB_PASSWORD": "Xy7kq9ZzP4wL"}
    text = f"connecting with Xy7k{split}q9ZzP4wL and {HF[:5]}{split}{HF[5:]}"
    out = redact(text, env)
    assert "q9ZzP4wL" not in out and HF[5:] not in out and split not in out
    assert out == f"connecting with {REDACTED} and {REDACTED}"
