"""sglang's hooks: the CPU pre-flights its data names (`preflight = ["flags", "trace", "import"]`).

- `flags`: every flag of the cell's server argv must be accepted by that sglang release, and every value must
  be among its declared choices (`flagsurface`, read from the wheel of the cell's Python and platform).
- `trace`: a cell whose mode traces with dynamo (`trace_modes`) gets the FP4 trace probe (`traceprobe`): an
  FP4 quantize entry point that does not trace predicts `dynamo-untraceable` before any GPU time is spent.

`import` is the runner's generic import check and needs no hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servematrix import verdict
from servematrix.cells import Cell
from servematrix.engines import Engine, PreflightInput, PreflightUnavailable
from servematrix.engines.sglang import flagsurface, traceprobe
from servematrix.verdict import Verdict


def flags(inp: PreflightInput) -> Verdict | None:
    env = inp.cell.env
    try:
        check = flagsurface.flag_check(
            sglang_version=env.version,
            argv=inp.cell.command,
            cache_dir=inp.cache_dir,
            python_version=env.python,
            platform=env.gpu.platform,
        )
    except flagsurface.FlagSurfaceError as exc:
        raise PreflightUnavailable(str(exc)) from None
    return None if check.ok else verdict.failed("unknown-flag", excerpt=check.evidence)


def _trace_pair(inp: PreflightInput) -> tuple[str, str, str] | None:
    """(torch, flashinfer, arch) of a cell the trace probe applies to, else None."""
    cell = inp.cell
    if cell.mode not in inp.engine.trace_modes:
        return None
    torch_version, flashinfer = inp.package("torch"), inp.package("flashinfer")
    if not (torch_version and flashinfer):
        return None
    return torch_version, flashinfer, cell.env.gpu.arch.removeprefix("sm_")


def trace(inp: PreflightInput) -> Verdict | None:
    pair = _trace_pair(inp)
    if pair is None:
        return None
    torch_version, flashinfer, arch = pair
    result = traceprobe.probe_cell(
        sglang_version=inp.cell.env.version,
        torch_version=torch_version,
        flashinfer_version=flashinfer,
        arch=arch,
        cache_dir=inp.cache_dir,
    )
    if result is None or result.traceable is not False:
        return None  # nothing to probe, it traces, or the probe could not decide (the GPU stages will)
    return Verdict(
        kind="predicted-fail",
        detail="dynamo-untraceable",
        excerpt=result.evidence,
        evidence=(f"probe: {result.entry} on torch {result.torch}, flashinfer {result.flashinfer}",),
    )


PREFLIGHTS = {"flags": flags, "trace": trace}


def preamble(cells: Sequence[Cell], engine: Engine, cache_dir: Path) -> list[str]:
    """Said before a run with the trace probe starts: it downloads CUDA builds of torch, several GB each."""
    pairs = set()
    for cell in cells:
        pair = _trace_pair(PreflightInput(cell=cell, engine=engine, pins={}, cache_dir=cache_dir))
        if (
            pair is not None
            and traceprobe.piecewise_traces_with_dynamo(cell.env.version)
            and traceprobe.entry_point_for(cell.env.version, pair[2], pair[1]) is not None
        ):
            pairs.add(pair[:2])
    missing = sorted(pair for pair in pairs if not traceprobe.venv_is_built(cache_dir, *pair))
    if not missing:
        return []
    torches = sorted({t for t, _ in missing})
    return [
        f"The FP4 trace probe builds {len(missing)} torch+flashinfer venv(s) under {cache_dir / 'probe'}: "
        f"CUDA builds of torch {', '.join(torches)} (several GB each to download the first time; later "
        "venvs link them from uv's cache). --stages resolve skips the probe."
    ]
