"""Reading advisories: every `*.json` record of a folder, checked, as `Advisory` values.

A malformed record is the user's to fix, so it is an `InputError` that names the file, the record (its id,
or the file's stem before an id is known) and the key path of the first mistake (the CLI exits 2). A file is
named for its record's id (`SMX-2026-0001.json`), as OSV databases name theirs, and ids are unique.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servematrix.advisories.model import Advisory, OsvRecord
from servematrix.errors import InputError, Location

# The packaged records (package data, shipped in the wheel).
ADVISORIES_DIR = Path(str(resources.files("servematrix.data").joinpath("advisories")))


def load_advisories(folder: Path | None = None) -> tuple[Advisory, ...]:
    """Every advisory of `folder` (default: the packaged ones), by id."""
    where = folder if folder is not None else ADVISORIES_DIR
    if not where.is_dir():
        raise InputError(f"{where}: no such advisories folder")
    advisories: dict[str, Advisory] = {}
    for path in sorted(where.glob("*.json")):
        advisory = read_advisory(path)
        if advisory.id in advisories:
            raise InputError(
                f"advisory id {advisory.id} is also {advisories[advisory.id].file}",
                Location(file=path, key=f"{advisory.id}: id"),
            )
        advisories[advisory.id] = advisory
    return tuple(advisories[key] for key in sorted(advisories))


def read_advisory(path: Path) -> Advisory:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 ({exc.reason})", Location(file=path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON: {exc.msg}", Location(file=path, line=exc.lineno)) from None
    record: str = data["id"] if isinstance(data, dict) and isinstance(data.get("id"), str) else path.stem
    if not isinstance(data, dict):
        raise InputError("an advisory is a JSON object", Location(file=path, key=record))
    try:
        parsed = OsvRecord.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = _key_path(error["loc"], data)
        raise InputError(error["msg"], Location(file=path, key=f"{record}: {key or '(record)'}")) from None
    if parsed.id != path.stem:
        raise InputError(
            f"the file is named {path.name}: name it {parsed.id}.json", Location(file=path, key=f"{record}: id")
        )
    return Advisory.of(parsed, str(path))


def _key_path(loc: tuple[Any, ...], data: Any) -> str:
    """pydantic's error location as a key path of the JSON (`database_specific.class`, `affected[0].ranges`):
    the field alias, not the attribute (`class`, not `class_`), and no validator names."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item == "class_":
            parts.append(".class")
        elif isinstance(item, str) and "[" not in item and "." not in item:
            parts.append(f".{item}")
    return "".join(parts).lstrip(".")
