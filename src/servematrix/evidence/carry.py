"""When an observed failure on one GPU kind predicts the same failure on another (`carry.toml`, docs/evidence.md).

`judge(source, target)` answers for a pair whose release, mode and model architecture already match (`derive.py`
finds the pairs): the rule that carries the failure, or why it is not carried. A failure is carried only where
its deciding error is one of the rules' (a Python error in code the GPU does not choose), no kernel fault shows in
its excerpt, no deciding frame is in an arch-gated path, and the flags and axes the rule names are the same on
both cells. Anything else is refused: refusing is the safe side, since a refused failure still marks the cell at
risk, where a wrongly carried one would hide a stack that works.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from servematrix.store.store import Row

RULES_FILE = "carry.toml"
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_TIMESTAMP = re.compile(r"^\[[^\]]*\]\s*")


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    what: str
    exception: re.Pattern[str]
    frames: tuple[re.Pattern[str], ...] = ()
    flags: tuple[str, ...] = ()
    axes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Rules:
    rules: tuple[Rule, ...]
    kernel_fault: tuple[re.Pattern[str], ...]
    arch_gated: tuple[re.Pattern[str], ...]
    aliases: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class Judgement:
    rule: Rule | None  # the rule that carries the failure; None: not carried
    why: str  # the rule's `what`, or why the failure is not carried
    error: str  # the deciding error line, as the excerpt has it ("" where none was found)
    frames: tuple[str, ...]


def parse_rules(text: str) -> Rules:
    data = tomllib.loads(text)
    refuse = data.get("refuse", {})
    flags = re.IGNORECASE
    return Rules(
        rules=tuple(
            Rule(
                id=entry["id"],
                what=entry["what"],
                exception=re.compile(entry["exception"]),
                frames=tuple(re.compile(p) for p in entry.get("frames", ())),
                flags=tuple(entry.get("flags", ())),
                axes=tuple(entry.get("axes", ())),
            )
            for entry in data.get("rule", ())
        ),
        kernel_fault=tuple(re.compile(p, flags) for p in refuse.get("kernel_fault", ())),
        arch_gated=tuple(re.compile(p, flags) for p in refuse.get("arch_gated_frame", ())),
        aliases=dict(data.get("aliases", {})),
    )


@functools.cache
def load_rules() -> Rules:
    return parse_rules((resources.files(__package__) / RULES_FILE).read_text(encoding="utf-8"))


def frames_of(row: Row) -> tuple[str, ...]:
    """The frames that decided a failure: the classifier's `frames:` evidence, then the excerpt's traceback lines
    (`file:line function`, the path's last parts only)."""
    found: list[str] = []
    for line in row.evidence or ():
        if str(line).startswith("frames: "):
            found += [f.strip() for f in str(line).removeprefix("frames: ").split(";") if f.strip()]
    for match in _FILE_LINE.finditer(str(row.excerpt or "")):
        path = "/".join(match.group(1).split("/")[-3:])
        found.append(f"{path}:{match.group(2)} {match.group(3)}")
    return tuple(dict.fromkeys(found))


def flag_value(argv: Sequence[str], flag: str, aliases: Mapping[str, str]) -> str | None:
    """The value the argv gives `flag` (or a flag that is the same under another name); the last one wins, as in
    argparse. None where it gives none."""
    value = None
    for i, arg in enumerate(argv):
        name, eq, inline = str(arg).partition("=")
        if aliases.get(name, name) != flag:
            continue
        value = inline if eq else (str(argv[i + 1]) if i + 1 < len(argv) else "")
    return value


def error_line(row: Row, rules: Rules) -> tuple[Rule | None, str]:
    """The first rule whose error a line of the excerpt shows, with that line; else (None, the last exception-like
    line, for the refusal's text)."""
    lines = [_TIMESTAMP.sub("", line.strip()) for line in str(row.excerpt or "").splitlines() if line.strip()]
    for rule in rules.rules:
        for line in lines:
            if rule.exception.search(line):
                return rule, _first_sentence(line)
    raised = [line for line in lines if re.match(r"^\w+(\.\w+)*(Error|Exception|Unsupported): ", line)]
    return None, _first_sentence(raised[-1]) if raised else ""


def _first_sentence(line: str, least: int = 40) -> str:
    """An error line without what follows its first sentence (a schema, a "Did you mean")."""
    end = line.find(". ", least)
    return line[: end + 1] if end > 0 else line


def judge(source: Row, target: Row, rules: Rules | None = None) -> Judgement:
    """Whether `source`'s observed failure is carried to `target` (same release, mode and architecture)."""
    rules = rules or load_rules()
    frames = frames_of(source)
    rule, error = error_line(source, rules)
    excerpt = str(source.excerpt or "")

    def refused(why: str) -> Judgement:
        return Judgement(rule=None, why=why, error=error, frames=frames)

    fault = next((m.group(0) for p in rules.kernel_fault if (m := p.search(excerpt))), None)
    if fault:
        return refused(f"a kernel or device fault ({fault!r} in its log): one GPU's kernels say nothing of another's")
    gated = next((f for f in frames if any(p.search(f) for p in rules.arch_gated)), None)
    if gated:
        return refused(f"a deciding frame is in a path the GPU's arch chooses ({gated})")
    if rule is None:
        return refused("its error is not one the carry rules know as GPU-independent (docs/evidence.md)")
    if rule.frames and not any(p.search(f) for p in rule.frames for f in frames):
        return refused(f"its frames are not in the code rule {rule.id} covers")
    for axis in rule.axes:
        if source.axes.get(axis) != target.axes.get(axis):
            return refused(f"{axis} {source['axes'].get(axis)} there, {target['axes'].get(axis)} here")
    for flag in rule.flags:
        there = flag_value(source.argv or (), flag, rules.aliases)
        here = flag_value(target.argv or (), flag, rules.aliases)
        if there != here:
            return refused(
                f"{flag} {there or '(unset)'} there, {here or '(unset)'} here: it chooses the code that raised"
            )
    return Judgement(rule=rule, why=rule.what, error=error, frames=frames)
