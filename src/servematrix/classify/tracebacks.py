"""What a Python traceback says about packages: which distributions its frames ran in, in call order.

An import-time failure raised inside one package while another imported it is a dependency conflict between
the two, whatever the exception says: sglang 0.5.12's lock pairs transformers 5.6.0 with kernels 0.17.2, and
`import sglang` dies in kernels (`ValueError: Either a revision or a version must be specified.`) called from
transformers' hub_kernels. The verdict should name both packages, not "python exception".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePosixPath

_FRAME = re.compile(r'^\s*File "(?P<path>/[^"]+\.py)", line \d+, in (?P<function>\S+)')
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Warning): ")
_STDLIB = re.compile(r"/python3\.\d+/(?!site-packages|dist-packages)[^/]+")


@dataclass(frozen=True, kw_only=True)
class ImportConflict:
    raised_in: str  # the package whose code raised
    imported_by: str  # the package whose import reached it
    chain: tuple[str, ...]  # every package on the way, outermost first
    exception: str  # the exception line
    line: int  # its 1-based line number in the text


def _package_root(paths: list[PurePosixPath]) -> PurePosixPath | None:
    """The directory most frames' packages sit in (site-packages, or a --target folder such as /tmp/site)."""
    counts: Counter[PurePosixPath] = Counter()
    for path in paths:
        for parent in path.parents:
            if parent.name in ("site-packages", "dist-packages"):
                counts[parent] += 100  # a real site directory wins outright
        if len(path.parents) >= 3:
            counts[path.parents[1]] += 1  # .../<root>/<package>/module.py
            if len(path.parents) >= 4:
                counts[path.parents[2]] += 1  # .../<root>/<package>/<sub>/module.py
    if not counts:
        return None
    return counts.most_common(1)[0][0]


def packages_in_order(frames: list[str]) -> list[str]:
    """Top-level package names of the frames' files, in call order, consecutive repeats collapsed."""
    paths = [PurePosixPath(p) for p in frames if not _STDLIB.search(p)]
    root = _package_root(paths)
    if root is None:
        return []
    out: list[str] = []
    for path in paths:
        try:
            relative = path.relative_to(root)
        except ValueError:
            continue
        name = relative.parts[0].removesuffix(".py")
        if not out or out[-1] != name:
            out.append(name)
    return out


class TracebackReader:
    """Follows a log line by line and keeps the last import conflict (for the stream scanner)."""

    MAX_LINES = 400

    def __init__(self) -> None:
        self._lines: list[str] | None = None
        self.found: tuple[int, ImportConflict, tuple[str, ...]] | None = None  # (line number, conflict, tail)

    def feed(self, number: int, text: str) -> None:
        if text.startswith("Traceback (most recent call last)"):
            self._lines = [text]
            self._start = number
            return
        if self._lines is None:
            return
        if len(self._lines) < self.MAX_LINES:
            self._lines.append(text)
        if _EXCEPTION.match(text):
            conflict = import_conflict("\n".join(self._lines))
            if conflict is not None:
                self.found = (self._start + conflict.line - 1, conflict, tuple(self._lines[-8:]))
            self._lines = None


def import_conflict(text: str) -> ImportConflict | None:
    """The last traceback in `text`, if it ended while importing and was raised in a package other than the
    one that imported it; None otherwise (a missing module is not a conflict: see missing-module)."""
    lines = text.splitlines()
    end = next((i for i in range(len(lines) - 1, -1, -1) if _EXCEPTION.match(lines[i])), None)
    if end is None or lines[end].startswith(("ModuleNotFoundError", "ImportError")):
        return None
    start = next((i for i in range(end, -1, -1) if lines[i].startswith("Traceback (most recent call last)")), None)
    if start is None:
        return None
    frames = [m for line in lines[start:end] if (m := _FRAME.match(line))]
    if not any(m.group("function") == "<module>" for m in frames):
        return None  # not raised while importing a module
    chain = packages_in_order([m.group("path") for m in frames])
    if len(chain) < 2:
        return None
    return ImportConflict(
        raised_in=chain[-1], imported_by=chain[-2], chain=tuple(chain), exception=lines[end].strip(), line=end + 1
    )
