"""A server argv against a flag surface: flags the parser would reject, and values outside their choices.

As argparse reads it (sglang's parser keeps `allow_abbrev=True`): an unambiguous prefix names its option,
`--flag=value` or the next token is the value, and tokens after a bare `--` are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


def unknown_flags(argv: Sequence[str], accepted: Collection[str], *, allow_abbrev: bool = True) -> list[str]:
    """Flags in argv (`--x` or `--x=y`) that the parser would reject, in order, each once.

    Like argparse (sglang's parser keeps `allow_abbrev=True`), a flag that is the prefix of exactly one
    accepted option is accepted: the cookbook's `--tp` means `--tp-size`. A prefix of several options
    is rejected ("ambiguous option"). Tokens after a bare `--` are positional and not checked.
    """
    unknown: list[str] = []
    for token in argv:
        if token == "--":
            break
        if not token.startswith("--"):
            continue
        flag = token.split("=", 1)[0]
        if canonical_flag(flag, accepted, allow_abbrev=allow_abbrev) is None and flag not in unknown:
            unknown.append(flag)
    return unknown


def canonical_flag(flag: str, accepted: Collection[str], *, allow_abbrev: bool = True) -> str | None:
    """The accepted option a flag names: itself, the one option it abbreviates, or None."""
    if flag in accepted:
        return flag
    if not allow_abbrev or not flag.startswith("--") or len(flag) <= 2:
        return None
    matches = [option for option in accepted if option.startswith(flag)]
    return matches[0] if len(matches) == 1 else None


def invalid_choices(
    argv: Sequence[str],
    choices: Mapping[str, Sequence[str]],
    *,
    multi_value: Collection[str] = (),
    accepted: Collection[str] = (),
) -> list[tuple[str, str]]:
    """`(flag, value)` pairs in argv whose value is not among the flag's declared choices.

    A value is `--flag=value` or the next token; flags in `multi_value` take every following token up
    to the next option (sglang's server parser has no positional arguments). With `accepted`, an
    abbreviated flag is checked as the option it abbreviates.
    """
    bad: list[tuple[str, str]] = []
    tokens = list(argv)
    for i, token in enumerate(tokens):
        if token == "--":
            break
        if not token.startswith("--"):
            continue
        flag, eq, inline = token.partition("=")
        option = canonical_flag(flag, accepted) if accepted else flag
        allowed = choices.get(option or flag)
        if allowed is None:
            continue
        if eq:
            values = [inline]
        else:
            values = []
            for following in tokens[i + 1 :]:
                if _is_option(following):
                    break
                values.append(following)
                if (option or flag) not in multi_value:
                    break
        bad += [(flag, value) for value in values if value not in allowed]
    return bad


def _is_option(token: str) -> bool:
    return token.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?", token)


@dataclass(frozen=True, kw_only=True)
class FlagCheck:
    sglang: str
    unknown: tuple[str, ...]
    invalid: tuple[tuple[str, str], ...]  # (flag, value) outside the flag's declared choices
    deprecated: tuple[str, ...]  # accepted, with a warning

    @property
    def ok(self) -> bool:
        return not self.unknown and not self.invalid

    @property
    def evidence(self) -> str:
        parts = []
        if self.unknown:
            parts.append(f"sglang {self.sglang} does not accept: {' '.join(self.unknown)}")
        for flag, value in self.invalid:
            parts.append(f"sglang {self.sglang}: {flag} {value!r} is not among its choices")
        return "; ".join(parts)
