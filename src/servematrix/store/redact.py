"""Remove secrets from what servematrix stores, prints or publishes: argv, environment values, log text.

Redaction happens once, on the way in: the plan masks each cell's argv, the serve stage writes the server
log through a redacting writer (a SIGKILLed harness leaves no clear text on disk), and the store masks
argv, excerpts and evidence again as they are written or merged. Everything after (reports, exports,
`plan`) only ever sees redacted text.

Secrets are found three ways: the values of secret-bearing flags (`--api-key X`, `--hf-token=X`; the list
is engine data, `secret_flags`, extendable by the matrix), the exact values of secret-looking environment
variables, and shapes that are secrets whatever carried them (hf_…, sk-…, ghp_…, github_pat_…).

A masked flag value is `***`. A matrix may write `***` itself as a secret flag's value: the harness then
takes the value from the environment variable `secret_variable(flag)` names, so a published reproduce
command says what to set instead of showing the secret.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servematrix.config.spec import Spec

REDACTED = "[REDACTED]"
# What a secret flag's value becomes in argv: short, and valid as the placeholder a matrix may write.
MASK = "***"
SECRET_VARIABLE_PREFIX = "SERVEMATRIX_SECRET_"

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


# Variables every process environment has that carry no secret: settings and paths a log shows to explain
# a failure. Together with an engine's `public_env` (engine data), they are the only variables given to a
# server whose values are not masked by value in what it prints.
PUBLIC_PROCESS_ENV = frozenset(
    {
        "PATH", "HOME", "PWD", "OLDPWD", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ",
        "TMPDIR", "HOSTNAME", "SHLVL", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED",
        "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NO_COLOR", "COLUMNS", "LINES", "_",
    }
)  # fmt: skip
_PUBLIC_PROCESS_PREFIXES = ("LC_", "XDG_")


def launch_secret_values(
    env: Mapping[str, str], passed: Collection[str] = (), public: Collection[str] = ()
) -> list[str]:
    """Every value the server is given that could be a secret, whatever its variable is called (`DB_PASS`,
    `GPU_AUTH`), but those of public variables and values that cannot hide one (short, a number, a boolean,
    folders of this host). A variable the harness sets itself (`passed`: the matrix's, the GPU kind's, the
    engine's) is masked whatever its value looks like; one the server inherits from the harness only when
    its value mixes letters and digits (a CI runner's `GITHUB_EVENT_NAME=schedule` must not mask every
    "scheduler" in a log). A secret-looking name is secret even when listed as public."""
    values = set(secret_env_values(env))
    for name, value in env.items():
        if name in public or name in PUBLIC_PROCESS_ENV or name.startswith(_PUBLIC_PROCESS_PREFIXES):
            continue
        if not _looks_secret(value) or _host_paths(value):
            continue
        if name in passed or _INHERITED_SECRET.fullmatch(value):
            values.add(value)
    return sorted(values, key=len, reverse=True)


# An inherited value masked by value: one token of 8 or more characters with a letter and a digit, not a
# version (`12.4.1`, `3.11`).
_INHERITED_SECRET = re.compile(r"(?=[^\s]*[A-Za-z])(?=[^\s]*\d)(?![\d.]+$)\S{8,}")


def _host_paths(value: str) -> bool:
    """Whether `value` is folders or files of this host (a path list included): a log names them, and masking
    them would shred every traceback."""
    parts = [p for p in value.split(os.pathsep) if p]
    return bool(parts) and all(os.path.isabs(p) and os.path.exists(p) for p in parts)


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


def redact(
    text: str,
    env: Mapping[str, str] | None = None,
    *,
    flags: Collection[str] = (),
    values: Iterable[str] = (),
) -> str:
    """Return text with secrets replaced by [REDACTED].

    env defaults to this process's environment: the servers whose logs are redacted inherit it. `flags`
    are secret-bearing flags whose following value is masked wherever the text shows `FLAG VALUE` or
    `FLAG=VALUE`; `values` are known secrets (e.g. those flags' values in the launched argv).
    """
    return _redact(text, _known_values(values, env), _flag_pattern(frozenset(flags)) if flags else None)


def _known_values(values: Iterable[str], env: Mapping[str, str] | None) -> tuple[str, ...]:
    """Exact secrets, longest first so a value containing another is replaced whole."""
    known = {v for v in values if v and len(v) >= MIN_SECRET_LEN and v != MASK}
    known |= set(secret_env_values(os.environ if env is None else env))
    return tuple(sorted(known, key=len, reverse=True))


# An excerpt is a few lines of a log shown beside a verdict: bounded in lines and in each line's length wherever
# it is made and again wherever it is stored or published (one crash printing a 30 MB repr made a 31 MB record).
EXCERPT_LINES_MAX = 40
EXCERPT_LINE_MAX = 1000  # as a signature's excerpt line (classify's EXCERPT_LINE_MAX)
EVIDENCE_ITEMS_MAX = 40


def bounded_line(line: str, limit: int = EXCERPT_LINE_MAX) -> str:
    """One line cut to at most `limit` characters, saying how much was cut (idempotent)."""
    if len(line) <= limit:
        return line
    keep = limit - 40  # room for the note, whose count has at most 20 digits
    return f"{line[:keep]} … ({len(line) - keep} characters cut)"


def bounded_excerpt(text: str, *, lines: int = EXCERPT_LINES_MAX) -> str:
    """An excerpt of at most `lines` lines of at most EXCERPT_LINE_MAX characters: its first line (what the
    verdict says) and its last lines (what the log said last), the rest elided with a count. Idempotent."""
    if len(text) <= EXCERPT_LINE_MAX and "\n" not in text:
        return text
    kept = text.split("\n")
    if len(kept) > lines:
        kept = [kept[0], f"… ({len(kept) - lines + 2} lines elided)", *kept[-(lines - 2) :]]
    return "\n".join(bounded_line(line) for line in kept)


def bounded_evidence(items: Sequence[Any]) -> list[Any]:
    """At most EVIDENCE_ITEMS_MAX items of evidence, each text bounded as an excerpt line."""
    if len(items) <= EVIDENCE_ITEMS_MAX:
        return [bounded_line(i) if isinstance(i, str) else i for i in items]
    kept = [bounded_line(i) if isinstance(i, str) else i for i in items[: EVIDENCE_ITEMS_MAX - 1]]
    return [*kept, f"… ({len(items) - len(kept)} more items of evidence elided)"]


# Terminal control sequences (ECMA-48, 7- and 8-bit) and control characters, but tab, line feed and carriage
# return: removed before anything is redacted, so an escape inside a secret (`Xy7k\e[0mq9ZzP4wL`) cannot hide it
# from a match, and no excerpt drives the terminal that prints it (as classify/lines.py does for one line).
_TERMINAL_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x00-\x1f\x7f-\x9f]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
    r"|[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
# Invisible format characters (zero-width spaces and joiners, the soft hyphen, word joiners, the BOM, bidi
# controls) are removed with them: a secret split by one (`Xy7k\u200bq9ZzP4wL`) is whole again for the match,
# and a browser showed it as the secret itself.
_CONTROL_CHARACTER = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)  # every sequence starts with one


def strip_terminal_controls(text: str) -> str:
    return _TERMINAL_CONTROL.sub("", text) if _CONTROL_CHARACTER.search(text) else text


# What each of _TOKEN_SHAPES needs in the lower-cased text, and what _ASSIGNED_SECRET needs: a pattern whose
# literals are absent is not run (the log writer redacted 3 MB/s running every pattern over every line).
_SHAPE_HINTS: tuple[tuple[str, ...], ...] = (
    ("hf_",), ("sk-",), ("gh",), ("github_pat_",), ("akia", "asia"), ("eyj",), ("xox",), ("bearer",),
    ("authorization",), ("://",), ("private key",),
)  # fmt: skip
_NAME_HINTS = ("token", "secret", "key", "passw", "pwd", "credential")


def _redact(text: str, known: Sequence[str], flag_pattern: re.Pattern[str] | None) -> str:
    text = strip_terminal_controls(text)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    lower = text.lower()
    for (pattern, replacement), hints in zip(_TOKEN_SHAPES, _SHAPE_HINTS, strict=True):
        if any(hint in lower for hint in hints):
            text = pattern.sub(replacement, text)
    if flag_pattern is not None:
        text = flag_pattern.sub(_replace_flag_value, text)
    text = _FLAG_SECRET.sub(_replace_assigned, text)
    if any(hint in lower for hint in _NAME_HINTS):
        text = _ASSIGNED_SECRET.sub(_replace_assigned, text)
    return text


@functools.lru_cache(maxsize=64)
def _flag_pattern(flags: frozenset[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(f) for f in sorted(flags, key=len, reverse=True))
    # The value may be quoted (a Python list repr of argv) or follow `=`; a following flag is not a value.
    return re.compile(rf"""(?<![\w-])(?P<name>{names})(?P<sep>\s+|=|["']\s*,\s*["'])(?P<value>(?!-)[^\s"',\]]+)""")


def _replace_flag_value(match: re.Match[str]) -> str:
    value = match.group("value")
    if value in (MASK, REDACTED) or value.startswith("[REDACTED"):
        return match.group(0)
    return f"{match.group('name')}{match.group('sep')}{MASK}"


# -- argv ------------------------------------------------------------------------------------------


def _flag_name_is_secret(flag: str) -> bool:
    """A flag whose name says it carries a secret (`--hf-token`, `--admin-api-key`), listed or not."""
    return _FLAG_SECRET.fullmatch(flag + " x") is not None


def _split_flag(arg: str) -> tuple[str, str | None]:
    if arg.startswith("--") and "=" in arg:
        name, _, value = arg.partition("=")
        return name, value
    return arg, None


def _value_at(argv: Sequence[str], index: int) -> tuple[str, str | None, bool]:
    """(flag name, its value or None, whether the value is inline `--flag=value`) of argv[index]."""
    name, inline = _split_flag(argv[index])
    if inline is not None:
        return name, inline, True
    following = argv[index + 1] if index + 1 < len(argv) else None
    if following is None or (following.startswith("-") and following != MASK):
        return name, None, False
    return name, following, False


def _is_secret(name: str, value: str | None, secret_flags: Collection[str]) -> bool:
    if value is None or not name.startswith("-"):
        return False
    if name in secret_flags:
        return True
    return _flag_name_is_secret(name) and (value == MASK or _looks_secret(value))


def masked_flags(argv: Sequence[str], secret_flags: Collection[str] = ()) -> list[str]:
    """The secret flags whose values `redact_argv` masks in this argv, in order, each once."""
    found: list[str] = []
    for index in range(len(argv)):
        name, value, _ = _value_at(argv, index)
        if _is_secret(name, value, secret_flags) and name not in found:
            found.append(name)
    return found


def redact_argv(argv: Sequence[str], secret_flags: Collection[str] = ()) -> list[str]:
    """argv with the value of every secret flag replaced by `***`, and secret shapes in any element redacted.

    Both forms are masked: `--api-key VALUE` and `--api-key=VALUE`. A listed flag's value is masked
    whatever it looks like; a flag whose name merely sounds secret (`--x-token`) only when its value does
    (not `--max-new-token 64`). The result depends on argv alone, not on any environment.
    """
    out = [_redact(arg, (), None) for arg in argv]
    for index in range(len(argv)):
        name, value, inline = _value_at(argv, index)
        if not _is_secret(name, value, secret_flags):
            continue
        if inline:
            out[index] = f"{name}={MASK}"
        else:
            out[index + 1] = MASK
    return out


def secret_variable(flag: str) -> str:
    """The environment variable that supplies a secret flag written as `***` in a matrix.

    `--api-key` -> `SERVEMATRIX_SECRET_API_KEY`, `--hf-token` -> `SERVEMATRIX_SECRET_HF_TOKEN`.
    """
    return SECRET_VARIABLE_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).upper()


class MissingSecretError(LookupError):
    def __init__(self, flag: str) -> None:
        super().__init__(f"{flag} is given as {MASK}: set {secret_variable(flag)} to its value")
        self.flag = flag
        self.variable = secret_variable(flag)


def placeholder_flags(argv: Sequence[str], secret_flags: Collection[str]) -> list[str]:
    """Secret flags whose value in argv is the `***` placeholder, to be taken from the environment."""
    found = []
    for index in range(len(argv)):
        name, value, _ = _value_at(argv, index)
        if name in secret_flags and value == MASK and name not in found:
            found.append(name)
    return found


def fill_secrets(argv: Sequence[str], secret_flags: Collection[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """argv with each `***` value of a secret flag replaced by its variable's value (MissingSecretError if unset)."""
    out: list[str] = []
    fill_for: str | None = None
    for arg in argv:
        if fill_for is not None:
            out.append(_secret_value(fill_for, env) if arg == MASK else arg)
            fill_for = None
            continue
        name, inline = _split_flag(arg)
        if name in secret_flags and inline == MASK:
            out.append(f"{name}={_secret_value(name, env)}")
        else:
            out.append(arg)
            fill_for = name if name in secret_flags and inline is None else None
    return tuple(out)


def _secret_value(flag: str, env: Mapping[str, str]) -> str:
    value = env.get(secret_variable(flag))
    if not value:
        raise MissingSecretError(flag)
    return value


def spec_secret_flags(spec: Spec) -> frozenset[str]:
    """The engine's secret flags and the matrix's own (`[server] secret_flags`)."""
    extra = spec.file.server.secret_flags
    return frozenset((*spec.engine.secret_flags, *extra))


@functools.lru_cache(maxsize=4096)
def redacted_command(command: tuple[str, ...], flags: frozenset[str]) -> tuple[str, ...]:
    """`redact_argv` of a planned command, once per distinct command: a matrix has few and many cells
    (`cells.expand` shares them)."""
    return tuple(redact_argv(command, flags))


# -- streams ---------------------------------------------------------------------------------------


class Redactor:
    """Everything known to be secret for one server launch, prepared once: it redacts every line of a log."""

    def __init__(
        self, env: Mapping[str, str] | None = None, flags: Collection[str] = (), values: Iterable[str] = ()
    ) -> None:
        self._known = _known_values(values, env if env is not None else {})
        self._flags = _flag_pattern(frozenset(flags)) if flags else None

    @classmethod
    def for_launch(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        flags: Collection[str],
        *,
        passed: Collection[str] = (),
        public_env: Collection[str] = (),
    ) -> Redactor:
        """The values of the variables given to the server (`launch_secret_values`; `passed` names those the
        harness sets), and the values of argv's secret flags."""
        values = launch_secret_values(env, passed, public_env)
        for index in range(len(argv)):
            name, value, _ = _value_at(argv, index)
            if value is not None and _is_secret(name, value, flags):
                values.append(value)
        return cls(env=env, flags=flags, values=values)

    def text(self, text: str) -> str:
        return _redact(text, self._known, self._flags)


class LineRedactingWriter:
    """Writes a byte stream to a file, one redacted line at a time, so the file never holds a secret.

    A line is written (unbuffered) as soon as its newline arrives. A line longer than `max_line` is cut
    at its last carriage return (progress bars) or at `max_line`, so memory stays bounded.
    """

    def __init__(self, handle: Any, redactor: Redactor, max_line: int = 1 << 20) -> None:
        self._handle = handle
        self._redactor = redactor
        self._pending = b""
        self._max_line = max_line

    def write(self, chunk: bytes) -> None:
        data = self._pending + chunk
        end = data.rfind(b"\n")
        if end < 0 and len(data) > self._max_line:
            cut = data.rfind(b"\r")
            end = cut if cut > 0 else self._max_line - 1
        if end < 0:
            self._pending = data
            return
        self._pending = data[end + 1 :]
        self._emit(data[: end + 1])

    def close(self) -> None:
        if self._pending:
            self._emit(self._pending)
            self._pending = b""

    def _emit(self, data: bytes) -> None:
        text = data.decode("utf-8", errors="surrogateescape")
        self._handle.write(self._redactor.text(text).encode("utf-8", errors="surrogateescape"))
