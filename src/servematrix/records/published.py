"""The published record, `docs/results/latest.json`: a cell's latest run as the report publishes it (no pids,
log paths or run status; argv and paths made portable; figures trimmed), with the comparison it was published
with (`previous`). Its JSON schema is generated from these models (`results_json_schema`).

Writing it (`report/regressions.py:export_results`) and the checks a crafted record must pass beyond its
shape (`store/rowschema.py:row_problem`: names that reach pages and file names) are not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA = 1  # the record's `schema`: a reader refuses any other
PUBLISHED_SITE = Path("docs")  # the published site, relative to the project
RECORD = Path("results") / "latest.json"  # the published record, inside the site

# A figure's spread over the repeats: min, median, max (and whatever else the bench client summarised).
Spread = dict[str, float | None]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Previous(_Record):
    """What a published cell was compared with: the run before it, summarised (report/regressions.py)."""

    run_id: str | None = None
    finished_at: str | None = None
    verdict: str | None = None
    tok_s: dict[str, Spread] = Field(default_factory=dict, description="output tok/s by concurrency")
    ttft_s: dict[str, Spread] = Field(default_factory=dict, description="the prefill profile's TTFT by concurrency")
    workload: Any = Field(default=None, description="the benchmark workload it was measured with, when known")


class Host(BaseModel):
    """The host a cell ran on (provenance); a host may say more than these."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    hostname: str | None = None
    cpu: str | None = None
    os: str | None = None
    gpu_sku: str | None = None
    driver: str | None = None
    cpus: int | str | None = None
    gpus: list[Any] | None = None


class PublishedCell(_Record):
    """One published cell: the row's exported columns (`report/regressions.py:EXPORTED`), and `previous`."""

    cell_id: str
    run_id: str
    env_id: str
    engine: str
    mode: str
    matrix: str = Field(description="the matrix file the run named")
    axes: dict[str, str]
    inputs_hash: str | None = None
    verdict: str | None = None
    excerpt: str | None = None
    evidence: list[str] | None = None
    metrics: dict[str, Any] | None = Field(default=None, description="the benchmark report, trimmed")
    argv: list[str] | None = Field(default=None, description="the server argv, paths relative to the project")
    redacted_flags: list[str] | None = None
    lock_hash: str | None = None
    lock_file: str | None = None
    crossed_pins: dict[str, Any] | None = None
    image_digest: str | None = None
    backend: str | None = None
    host: Host | None = None
    stages: dict[str, float | int] | None = Field(default=None, description="stage -> seconds")
    preflight_hash: str | None = None
    preflight: dict[str, dict[str, Any]] | None = Field(
        default=None, description="pre-flight stage -> its key, outcome, verdict and evidence (run/reuse.py)"
    )
    prediction: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    previous: Previous | None = None


class PublishedRecord(_Record):
    """`docs/results/latest.json`: every published cell by its id."""

    schema_: Literal[1] = Field(alias="schema", description="the record's format; a reader refuses any other")
    cells: dict[str, PublishedCell]


def cell_problem(entry: object) -> str | None:
    """What makes a published cell's JSON unfit for `PublishedCell`, naming the field, or None."""
    try:
        PublishedCell.model_validate(entry)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the cell"
        return f"{where}: {first['msg']}"
    return None


def results_json_schema() -> dict[str, Any]:
    """The JSON schema of `docs/results/latest.json`, from the models."""
    schema = PublishedRecord.model_json_schema(by_alias=True)
    schema["title"] = "servematrix published results (docs/results/latest.json)"
    return schema
