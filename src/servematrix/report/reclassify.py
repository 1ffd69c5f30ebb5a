"""Failure causes named again from the server logs a store kept, by this release's signatures.

A cell that failed on a GPU is expensive to run again, but its cause is a function of its server log and the
signature data alone: when the signatures learn a cause (a traceback's frames, a new class), a stored row's
class can be named again without a GPU. Only a failure the server's own log decided is named again (a class
of the engine's signatures, or `server-exited`); a timeout, a mode without its evidence, wrong answers, the
pre-flights' verdicts and the harness's faults are decided elsewhere and stay. A row whose log is gone, or
whose log no signature matches, stays as it is. The row keeps its run, figures and times; its evidence says
that the class was named again, when, by which signatures, and what the run had named it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from servematrix.classify import load_signatures
from servematrix.classify.scanner import Match, scan_stream
from servematrix.classify.signatures import SignatureDataError
from servematrix.formats.verdict import Verdict
from servematrix.store.rowschema import Row
from servematrix.store.store import Store
from servematrix.util import DEFAULT_WORKDIR

# Decided by the harness from a server's exit, with the log's tail as its excerpt: a signature may name it.
LOG_DECIDED = frozenset({"server-exited"})
NOTE_PREFIX = "cause named again from the stored server log"


@dataclass(frozen=True, kw_only=True)
class Renamed:
    """One stored row whose cause the current signatures name otherwise, with the row's new evidence."""

    run_id: str
    cell_id: str
    matrix: str
    mode: str
    was: str
    now: str
    line: int
    log: Path
    excerpt: str
    evidence: tuple[str, ...]


def log_roots(store_path: Path) -> tuple[Path, ...]:
    """The folders this host's runs write server logs into, as real paths: the working folder's
    `.servematrix/logs`, and beside the store (a store kept in its workdir, or copied off its host with its
    `.servematrix/logs`). A merged row names a log path another host wrote: it is read only inside these."""
    store_dir = store_path.resolve().parent
    folders = (Path.cwd() / DEFAULT_WORKDIR / "logs", store_dir / "logs", store_dir / DEFAULT_WORKDIR / "logs")
    return tuple(dict.fromkeys(folder.resolve() for folder in folders))


def log_of(row: Row, store_path: Path) -> Path | None:
    """The row's server log: as stored (relative to where the run ran), or beside the store when the store
    was copied off its host with its `.servematrix/logs` (a device's results). Only a regular file whose real
    path (every link followed) lies in one of `log_roots` is a log: a path or a link that leaves them names
    another file of this host, never a server log, and is not read."""
    stored = row.log_path
    if not stored or "\0" in str(stored):
        return None
    path = Path(str(stored))
    candidates = [path] if path.is_absolute() else [path, store_path.parent / path]
    roots = log_roots(store_path)
    for candidate in candidates:
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if any(real.is_relative_to(root) for root in roots) and stat.S_ISREG(real.stat().st_mode):
            return real
    return None


def _match_log(log: Path, engine: str) -> Match | None:
    """`match_file` of a log `log_of` allowed, opened without following a link swapped in since."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        return scan_stream(stream, engine).best()


def decided_by_log(row: Row, engine_classes: frozenset[str]) -> bool:
    """Whether the row is a failure its server log decided (see the module doc)."""
    verdict = Verdict.parse(str(row.verdict or ""))
    served = "serve" in (row.stages or {})
    return verdict.kind == "fail" and served and (verdict.detail in engine_classes or verdict.detail in LOG_DECIDED)


def _log_classes(engine: str) -> tuple[frozenset[str], str]:
    """The classes a server log decides for this engine, and its signature data's short digest."""
    signatures = load_signatures(engine)
    classes = frozenset(s.id for s in signatures if not s.harness_assigned)
    data = resources.files("servematrix.data") / "signatures" / f"{engine}.toml"
    return classes, hashlib.sha256(data.read_bytes()).hexdigest()[:12] if data.is_file() else "none"


def renamed(store: Store, store_path: Path) -> Iterator[Renamed]:
    """Every newest finished row whose server log the current signatures name another cause for."""
    engines: dict[str, tuple[frozenset[str], str] | None] = {}
    for row in store.latest():
        engine = str(row.engine or "")
        if engine not in engines:
            try:
                engines[engine] = _log_classes(engine)
            except SignatureDataError:
                engines[engine] = None  # not an engine this release knows: nothing to name its causes by
        known = engines[engine]
        if known is None or not decided_by_log(row, known[0]):
            continue
        log = log_of(row, store_path)
        if log is None:
            continue  # its log was not kept: the class stays as the run named it
        found = _match_log(log, engine)
        was = Verdict.parse(str(row.verdict)).detail
        if found is None or found.cls == was:
            continue
        yield Renamed(
            run_id=str(row.run_id),
            cell_id=str(row.cell_id),
            matrix=str(row.matrix or ""),
            mode=str(row.mode or ""),
            was=was,
            now=found.cls,
            line=found.line,
            log=log,
            excerpt=found.excerpt,
            # The run's other evidence (its environment, its starts) stays, below the new cause.
            evidence=(*found.evidence, _note(was, engine, known[1]), *_kept(row)),
        )


def _note(was: str, engine: str, digest: str) -> str:
    day = datetime.now(UTC).date().isoformat()
    return f"{NOTE_PREFIX} on {day} by {engine}'s signatures {digest}: the run had named it {was}"


def _kept(row: Row) -> list[str]:
    """A row's evidence less an earlier renaming's note."""
    return [str(e) for e in row.evidence or [] if not str(e).startswith(NOTE_PREFIX)]


def apply(store: Store, changes: Sequence[Renamed]) -> None:
    """Write each change into its row."""
    for change in changes:
        store.update(
            change.run_id,
            change.cell_id,
            verdict=f"fail:{change.now}",
            excerpt=change.excerpt,
            evidence=list(change.evidence),
        )
