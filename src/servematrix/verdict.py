"""Verdicts: what a cell's run concluded, with the log excerpt that decided it.

`pass`, `fail:<class>`, `skipped:<reason>`, `unresolvable`, `predicted-fail:<class>`, `error` (the
harness or the infrastructure failed, not the stack: retried on the next run), `interrupted`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Verdicts that say nothing about the stack: the cell runs again next time.
RETRY_KINDS = frozenset({"error", "interrupted"})


@dataclass(frozen=True, kw_only=True)
class Verdict:
    kind: str  # pass | fail | skipped | unresolvable | predicted-fail | error | interrupted
    detail: str = ""  # the failure class or skip reason
    excerpt: str = ""
    evidence: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}:{self.detail}" if self.detail else self.kind

    @property
    def final(self) -> bool:
        return self.kind not in RETRY_KINDS

    @classmethod
    def parse(cls, text: str, excerpt: str = "") -> Verdict:
        kind, _, detail = text.partition(":")
        return cls(kind=kind, detail=detail, excerpt=excerpt)


def passed() -> Verdict:
    return Verdict(kind="pass")


def failed(cls: str, excerpt: str = "", evidence: tuple[str, ...] = ()) -> Verdict:
    return Verdict(kind="fail", detail=cls, excerpt=excerpt, evidence=evidence)


def skipped(reason: str, excerpt: str = "") -> Verdict:
    return Verdict(kind="skipped", detail=reason, excerpt=excerpt)


def error(reason: str, excerpt: str = "") -> Verdict:
    return Verdict(kind="error", detail=reason, excerpt=excerpt)
