"""Remove secrets from text that servematrix stores or publishes (log excerpts, argv, reports).

Server logs echo their arguments and environment (sglang prints `server_args=ServerArgs(... api_key=...)`),
and excerpts end up in a public compatibility table. Two passes: exact values of secret-looking
environment variables, then shapes that are secrets whatever variable they came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

REDACTED = "[REDACTED]"

# Shorter values are too likely to occur by chance ("true", "1", "auto") and would shred the text.
MIN_SECRET_LEN = 6

_SECRET_ENV_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

# A secret-bearing name must END with the secret word: `max_total_num_tokens=262144` and
# `tokenizer_path=...` are ordinary sglang arguments, `hf_token=...` and `api_key=...` are not.
_NAME_WORD = r"(?:token|secret|api[_-]?key|apikey|access[_-]?key|private[_-]?key|secret[_-]?key|password|passwd|pwd|credentials?)"
_ASSIGNED_SECRET = re.compile(
    r"""(?ix)
    (?<![A-Za-z0-9])
    (?P<name>(?:[A-Za-z0-9]+[_.-])*"""
    + _NAME_WORD
    + r""")
    (?![A-Za-z0-9_])
    (?P<sep>["']?\s*[:=]\s*["']?)
    (?P<value>[^\s"',;&)}\]]+)
    """
)
_FLAG_SECRET = re.compile(
    r"""(?ix)
    (?P<name>--(?:[a-z0-9]+-)*(?:token|secret|api-key|password|passwd))
    (?P<sep>\s+|=|["']\s*,\s*["'])
    (?P<value>(?!-)[^\s"',\]]+)
    """
)

_TOKEN_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    # Hugging Face user/org tokens.
    (re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{20,}"), REDACTED),
    # OpenAI / Anthropic style keys (sk-..., sk-proj-..., sk-ant-...).
    (re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}"), REDACTED),
    # GitHub tokens: classic (ghp_, gho_, ghu_, ghs_, ghr_) and fine-grained.
    (re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),
    (re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    # AWS access key ids.
    (re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"), REDACTED),
    # JSON Web Tokens (header.payload.signature, the header always starts with {" in base64).
    (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    # Slack tokens.
    (re.compile(r"(?<![A-Za-z0-9_])xox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    # HTTP authorization keeps its scheme so the reader still sees what was sent. "Basic" and "Token"
    # count only after "Authorization": in prose they are ordinary words.
    (re.compile(r"(?i)\b(Bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    (
        re.compile(r"""(?i)(\bAuthorization["']?\s*[:=]\s*["']?(?:Basic|Token)\s+)[A-Za-z0-9._~+/=-]{6,}"""),
        r"\1" + REDACTED,
    ),
    # user:password@ in URLs (pip index URLs, proxies).
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]+):[^/\s@]+@"), r"\1:" + REDACTED + "@"),
    (
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL),
        REDACTED,
    ),
)


def secret_env_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking variables, longest first so a value containing another is replaced whole."""
    values = {
        value for name, value in env.items() if _SECRET_ENV_NAME.search(name) and value and len(value) >= MIN_SECRET_LEN
    }
    return sorted(values, key=len, reverse=True)


def _looks_secret(value: str) -> bool:
    if value == REDACTED or value.startswith("[REDACTED"):
        return False
    if value.lower() in {"none", "null", "true", "false", "''", '""'}:
        return False
    # Counts and sizes (`#token: 1061`) are numbers, not secrets.
    if value.isdigit():
        return False
    return len(value) >= MIN_SECRET_LEN


def _replace_assigned(match: re.Match[str]) -> str:
    value = match.group("value")
    if not _looks_secret(value):
        return match.group(0)
    return f"{match.group('name')}{match.group('sep')}{REDACTED}"


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Return text with secrets replaced by [REDACTED].

    env defaults to this process's environment: the servers whose logs are redacted inherit it.
    """
    if env is None:
        env = os.environ
    for value in secret_env_values(env):
        if value in text:
            text = text.replace(value, REDACTED)
    for pattern, replacement in _TOKEN_SHAPES:
        text = pattern.sub(replacement, text)
    text = _FLAG_SECRET.sub(_replace_assigned, text)
    text = _ASSIGNED_SECRET.sub(_replace_assigned, text)
    return text
