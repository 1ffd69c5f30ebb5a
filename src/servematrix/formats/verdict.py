"""Verdicts: what a cell's run concluded, with the log excerpt that decided it.

`pass`, `fail:<class>`, `skipped:<reason>`, `unresolvable`, `predicted-fail:<class>`, `error:<fault>` (the
harness or the infrastructure failed, not the stack: retried on the next run), `interrupted` (retried too).
Which failures are the harness's is data: data/harness_faults.toml.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from servematrix.formats import tomlsource
from servematrix.formats.tomlsource import DataTable

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


# -- harness faults ------------------------------------------------------------------------------


def _patterns(raw: Any) -> tuple[re.Pattern[str], ...]:
    """Python regexes from the data, searched case-insensitively."""
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise ValueError(f"must be a list of regex strings, got {raw!r}")
    try:
        return tuple(re.compile(p, re.IGNORECASE) for p in raw)
    except re.error as exc:
        raise ValueError(f"invalid regex {exc.pattern!r}: {exc}") from None


Patterns = Annotated[tuple[re.Pattern[str], ...], BeforeValidator(_patterns)]


class ServeFaults(DataTable):
    harness_port_classes: frozenset[str]
    harness_port_fault: str


class BuildFaults(DataTable):
    network_fault: str
    network_patterns: Patterns
    storage_fault: str
    storage_patterns: Patterns


class ResolveFaults(DataTable):
    network_patterns: Patterns
    offline_miss_patterns: Patterns
    conflict_patterns: Patterns


class HarnessFaults(DataTable):
    """What turns a failure into `error:<fault>` (data/harness_faults.toml)."""

    schema_version: Literal[1] = Field(alias="schema")
    serve: ServeFaults
    build: BuildFaults
    resolve: ResolveFaults


@functools.cache
def harness_faults() -> HarnessFaults:
    raw = resources.files("servematrix.data").joinpath("harness_faults.toml").read_bytes()
    return tomlsource.validate(tomlsource.parse(raw, "servematrix/data/harness_faults.toml"), HarnessFaults)


def served(result: Verdict, *, harness_picked_port: bool) -> Verdict:
    """A server's verdict, with a port race the harness caused turned into a retried error."""
    faults = harness_faults()
    if harness_picked_port and result.kind == "fail" and result.detail in faults.serve.harness_port_classes:
        excerpt = (
            f"the port the harness picked was taken by another process before the server bound it\n{result.excerpt}"
        )
        return Verdict(kind="error", detail=faults.serve.harness_port_fault, excerpt=excerpt, evidence=result.evidence)
    return result


def resolve_ended(status: str, reason: str) -> Verdict | None:
    """The verdict a resolve outcome ends its environment with: `unresolvable` (the versions cannot be
    resolved: a fact), `error:resolve` (the index or the day failed: retried), None when it resolved."""
    if status == "unresolvable":
        return Verdict(kind="unresolvable", excerpt=reason)
    if status == "error":
        return error("resolve", reason)
    return None


def build_failed(excerpt: str, log_tail: str = "") -> Verdict:
    """A failed build: `error:build-storage` when the host's storage or the container engine failed,
    `error:build-network` when an index or registry could not be reached, else `fail:build`."""
    faults = harness_faults()
    text = f"{log_tail}\n{excerpt}"
    if any(p.search(text) for p in faults.build.storage_patterns):
        return error(faults.build.storage_fault, excerpt=excerpt)
    if any(p.search(text) for p in faults.build.network_patterns):
        return error(faults.build.network_fault, excerpt=excerpt)
    return failed("build", excerpt=excerpt)


def unavailable(text: str, excerpt: str, evidence: Sequence[str] = ()) -> Verdict:
    """The verdict of an environment a backend could not provide, for a reason that says nothing about the
    stack (`Built.unavailable`): `error:<fault>` (an image pull failed: retried) or `skipped:<reason>` (an image
    that does not hold the cell: final, never a judgement of the stack)."""
    result = Verdict.parse(text, excerpt)
    if result.kind not in ("error", "skipped") or not result.detail:
        raise ValueError(f"an unavailable environment is error:<fault> or skipped:<reason>, not {text!r}")
    return Verdict(kind=result.kind, detail=result.detail, excerpt=excerpt, evidence=tuple(evidence))


# What a run can say of a cell it did not serve: a CPU prediction, nothing yet (no GPU here), or that the image
# `--backend image` serves from cannot serve it (no image of that release, or one without the cell's versions).
# Such a verdict never replaces, nor regresses, one observed by serving the cell on its GPUs.
UNSERVED = ("predicted-fail", "skipped:no-gpu", "skipped:no-image", "skipped:not-in-image")


def observed(text: str) -> bool:
    """Whether a stored verdict was observed by serving the cell (pass or fail), not predicted on a CPU."""
    return text == "pass" or text.startswith("fail:")


def unserved(text: str) -> bool:
    return text.startswith(UNSERVED)
