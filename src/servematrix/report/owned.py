"""The files a report folder holds that servematrix wrote, so that a later report removes only those.

`plots/` and `failures/` each keep a manifest (`.servematrix-files`, one file name a line; mkdocs skips dot
files). A report removes a file of an earlier report only when that report's manifest lists it, it is still
a plain file (not a link), and it is not written again. A folder that is a symbolic link is refused: it
would point the writes and removals at a folder of someone else's (another project's docs, a brand kit).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from servematrix.errors import InputError
from servematrix.report.escape import is_slug
from servematrix.util import atomic_write

MANIFEST = ".servematrix-files"


def own_folder(folder: Path) -> Path:
    """`folder`, created; an InputError when it, or what stands in its place, is not a plain folder."""
    if folder.is_symlink():
        raise InputError(f"{folder}: is a symbolic link; servematrix writes report folders only where it made them")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: is not a folder (the report writes one there)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{folder}: cannot create the report folder: {exc.strerror}") from None
    return folder


def owned(folder: Path) -> set[str]:
    """The names an earlier report recorded as its own in `folder`."""
    manifest = folder / MANIFEST
    if manifest.is_symlink() or not manifest.is_file():
        return set()
    return {name for name in manifest.read_text(encoding="utf-8").splitlines() if is_slug(name)}


def replace_owned(folder: Path, written: Iterable[str]) -> list[Path]:
    """Record `written` as this report's files in `folder` and remove the earlier report's files that are not
    among them. Returns what was removed."""
    keep = set(written)
    removed = []
    for name in sorted(owned(folder) - keep):
        stale = folder / name
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
            removed.append(stale)
    atomic_write(folder / MANIFEST, "".join(f"{name}\n" for name in sorted(keep)))
    return removed
