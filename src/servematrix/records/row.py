"""A stored row: one cell run, a field per column of the store's `cell_runs` table (`store/rowschema.py` owns
the SQL, the checks and the encoding; `COLUMNS` is read from here).

A row is made from the values a store, a merged store or the published record gives (`Row.of`); the columns
given are remembered, so `values` gives back exactly what was given (a published record keeps a subset of
the columns). A column not given reads as its default: empty text, no table, None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from servematrix.records.published import Host

# Field metadata: `json` (the column is stored as JSON text), `column` (False: shown beside a row by the report's
# evidence layer, never stored).
_JSON = {"json": True}
_SHOWN = {"column": False}


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One cell run. Readers use the attributes. Mapping-style `row["key"]` and `row.get("key")` read the given
    columns only, as the plain mapping a row once was: for the published record's projection of the given
    columns (`report/regressions.py:export_results`), for `run/reuse.py`, which reads a published cell and a
    stored row alike, and for the tests' reads."""

    run_id: str = ""
    cell_id: str = ""
    env_id: str = ""
    engine: str = ""
    mode: str = ""
    matrix: str = ""
    axes: Mapping[str, str] = field(default_factory=dict, metadata=_JSON)
    inputs_hash: str | None = None  # cell id + workload + model: unchanged inputs are not run again
    status: str = ""  # running | finished
    verdict: str | None = None
    excerpt: str | None = None
    evidence: Sequence[str] | None = field(default=None, metadata=_JSON)
    metrics: Mapping[str, Any] | None = field(default=None, metadata=_JSON)  # the benchmark report
    argv: Sequence[str] | None = field(default=None, metadata=_JSON)  # secret values masked as ***
    redacted_flags: Sequence[str] | None = field(default=None, metadata=_JSON)
    lock_hash: str | None = None
    lock_file: str | None = None
    crossed_pins: Mapping[str, Any] | None = field(default=None, metadata=_JSON)
    image_digest: str | None = None
    backend: str | None = None  # its --backend name, for the reproduce command
    host: Mapping[str, Any] | None = field(default=None, metadata=_JSON)  # hostname, CPU, GPU SKU, driver
    harness_pid: int | None = None  # the servematrix process that owns a running row
    server_pid: int | None = None
    server_pgid: int | None = None
    log_path: str | None = None
    stages: Mapping[str, Any] | None = field(default=None, metadata=_JSON)  # stage -> seconds
    preflight_hash: str | None = None  # the inputs of its CPU pre-flight verdict (run/reuse.py)
    preflight: Mapping[str, Any] | None = field(default=None, metadata=_JSON)  # pre-flight stage -> key, outcome
    prediction: str | None = None  # a served cell's own CPU pre-flight verdict, beside what it observed
    started_at: str | None = None
    finished_at: str | None = None
    # Shown, not stored: the report's evidence layer (evidence/derive.py `apply`).
    evidence_model: Sequence[Mapping[str, Any]] | None = field(default=None, metadata=_SHOWN)
    own_verdict: str | None = field(default=None, metadata=_SHOWN)
    given: frozenset[str] = field(default=frozenset(), repr=False, compare=False, metadata=_SHOWN)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Row:
        """A row of `values` (column -> decoded value); a key that is no field is a KeyError naming it."""
        unknown = set(values) - _FIELDS
        if unknown:
            raise KeyError(f"not a row field: {', '.join(sorted(unknown))}")
        return cls(**values, given=frozenset(values))

    @property
    def values(self) -> dict[str, Any]:
        """The given columns and their values, as they were given (in field order)."""
        return {name: getattr(self, name) for name in _ORDER if name in self.given}

    def replace(self, **changes: Any) -> Row:
        """A copy with `changes` given."""
        return Row.of({**self.values, **changes})

    @property
    def on_host(self) -> Host:
        """The host it ran on, typed: the stored JSON as it is (checked as the row was read), fields absent read
        as None."""
        return Host.model_construct(**(self.host or {}))

    def __getitem__(self, key: str) -> Any:
        if key not in self.given:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.given else default


_ORDER = tuple(f.name for f in fields(Row) if f.name != "given")
_FIELDS = frozenset(_ORDER)
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Row) if f.metadata.get("column", True))
JSON_COLUMNS: frozenset[str] = frozenset(f.name for f in fields(Row) if f.metadata.get("json"))
