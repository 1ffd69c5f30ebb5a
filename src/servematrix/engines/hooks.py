"""The contract an engine's hooks module implements: every hook declared once, here, with its rule.

An engine's data names its hooks module (`hooks = "servematrix.engines.sglang"`); that module defines some of
the hooks in `HOOKSPECS`, by these attribute names, with these signatures:

- `PREFLIGHTS: Mapping[str, Preflight]`: the CPU pre-flights the data's `preflight` list names, besides the
  runner's own (`GENERIC_PREFLIGHTS`). **firstresult**: they run in the data's order, and the first that
  returns a verdict ends the cell; the rest are not called. `None` means "nothing to say", and
  `PreflightUnavailable` means "cannot run here" (the next one runs). Any other exception is a harness fault.
- `preamble(cells, engine, cache_dir) -> list[str]`: what the run says before it starts (cost, downloads);
  every line is printed.
- `probe_entry(inp, entry, *, needs_gpu) -> (Verdict, cached)`: the probe stage of `servematrix bisect
  --probe-entry ENTRY`, one named probe of a cell; `bisect` refuses `--probe-entry` for an engine without it.

Each `HookSpec` decides, rather than describes: its `firstresult` is how `multicall` combines the answers of
the hooks it calls (the runner's pre-flights go through it), and its `protocol` is the signature
`engines/plugins.py` checks every implementation against (its parameter names) when the engine loads.

This module imports only types, so any module may import it without loading an engine or the cells. The data
loader (`engines/__init__.py`) never imports a hooks module: `engines/plugins.py` does, and checks the data's
names against this contract when a plan is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from servematrix.engines import Engine
    from servematrix.formats.verdict import Verdict
    from servematrix.records.cell import Cell

GENERIC_PREFLIGHTS = ("import",)  # run by the runner's own stages, for any engine; no hook implements them


class PreflightUnavailable(Exception):
    """A pre-flight that cannot run here (e.g. a wheel it reads could not be downloaded): it predicts
    nothing, and the GPU stages decide. Any other exception from a hook is a harness fault."""


@dataclass(frozen=True, kw_only=True)
class PreflightInput:
    """What a pre-flight hook is given about one cell."""

    cell: Cell
    engine: Engine
    pins: Mapping[str, str]  # the environment's resolved lock, by package name (empty before resolve)
    cache_dir: Path  # where a hook keeps what it fetched or derived, shared by every cell
    # The interpreter of the cell's environment, its whole lock installed on this CPU as the import check
    # installs it: installed on the first call (None where it cannot be: no lock, no such Python), removed
    # by the runner once the environment's cells are done. None where the runner offers none (a host with
    # the cell's GPUs, a run without the import check).
    python: Callable[[], Path | None] | None = None
    # The folder of the model's config files (config.json, the quantization config; no weights) on this
    # host: the matrix's `[model] config_dir`, else the model path when it is a local folder holding a
    # config.json; None when neither is there.
    model_config: Path | None = None

    def package(self, axis: str) -> str | None:
        """The version of an axis's package: the lock's, else the axis value or the release pin."""
        return self.pins.get(self.engine.axis_package(axis)) or self.cell.env.effective(axis, self.engine.pins)


class Preflight(Protocol):
    """One CPU pre-flight of one cell: a verdict ends the cell (firstresult), `None` lets the next one run. A
    `pass` verdict lets the next one run too, and its evidence is shown with the cell (what was checked and
    found fine: why the CPU did not rule the cell out)."""

    def __call__(self, inp: PreflightInput, /) -> Verdict | None: ...


class Preamble(Protocol):
    """Lines said before a run of `cells` starts (what the pre-flights will download or build)."""

    def __call__(self, cells: Sequence[Cell], engine: Engine, cache_dir: Path, /) -> list[str]: ...


class ProbeEntry(Protocol):
    """`bisect --probe-entry ENTRY`: one named probe of a cell, as (its verdict, whether the result was cached)."""

    def __call__(self, inp: PreflightInput, entry: str, /, *, needs_gpu: bool) -> tuple[Verdict, bool]: ...


@dataclass(frozen=True, kw_only=True)
class HookSpec:
    """One hook of the contract: the attribute a hooks module defines it as, and how its answers combine."""

    attribute: str
    firstresult: bool  # the first answer that is not None wins, and later ones are not asked (`multicall`)
    mapping: bool  # a Mapping of names (the data's) to callables, rather than one callable
    protocol: type  # the signature each implementation must have (its `__call__`, checked by parameter name)
    doc: str


HOOKSPECS = (
    HookSpec(
        attribute="PREFLIGHTS",
        firstresult=True,
        mapping=True,
        protocol=Preflight,
        doc="CPU pre-flights by the names the engine data's `preflight` lists, run in that order",
    ),
    HookSpec(
        attribute="preamble",
        firstresult=False,
        mapping=False,
        protocol=Preamble,
        doc="what a run says before it starts about the pre-flights' cost",
    ),
    HookSpec(
        attribute="probe_entry",
        firstresult=False,
        mapping=False,
        protocol=ProbeEntry,
        doc="the probe stage of `bisect --probe-entry ENTRY`: one named probe of a cell",
    ),
)


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """An engine's hooks, as the runner sees them (`engines.plugins.hooks_of`); empty for an engine without."""

    preflights: Mapping[str, Preflight] = field(default_factory=dict)
    preamble: Preamble | None = None
    probe_entry: ProbeEntry | None = None


def hookspec(attribute: str) -> HookSpec:
    """The HookSpec of `attribute`."""
    return next(found for found in HOOKSPECS if found.attribute == attribute)


Answer = TypeVar("Answer")


def multicall(hookspec: HookSpec, calls: Iterable[Callable[[], Answer | None]]) -> list[Answer]:
    """Call each of `calls` (a hook bound to its arguments), in order, as `hookspec` says its answers combine
    (pluggy's `_multicall`): the answers that are not None, in order; under `firstresult` the first one
    alone, and the calls after it are not made."""
    answers: list[Answer] = []
    for call in calls:
        answer = call()
        if answer is None:
            continue
        answers.append(answer)
        if hookspec.firstresult:
            break
    return answers
