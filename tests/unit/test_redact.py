from __future__ import annotations

import pytest

from servematrix.redact import REDACTED, redact, secret_env_values

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
