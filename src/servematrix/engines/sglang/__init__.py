"""sglang's hooks (the contract: `engines/hooks.py`): the CPU pre-flights its data names
(`preflight = ["flags", "config", "load", "trace", "import"]`) and the trace probe's preamble.

- `flags`: every flag of the cell's server argv must be accepted by that sglang release, and every value must
  be among its declared choices (`flagsurface`, read from the wheel of the cell's Python and platform).
- `config`: the release knows the model at all (`configcheck`), read without installing sglang: the lock's own
  transformers reads the model's config files, and the release's model registry (read from its wheel) has a
  class for the config's architecture; either failing predicts `model-unsupported`. The server's `SGLANG_*`
  variables that the release never reads, or reads only under another name, are warnings in the evidence.
- `load`: sglang's own start-up on the CPU, in the environment the import check installs, as far as it goes
  (`loadprobe`): ServerArgs from the cell's argv, the model config, the registry, the backends and the
  quantization method chosen for the cell's arch, the modules built on the meta device. sglang's own error
  predicts the failure; how far it got is shown with the cell.
- `trace`: a cell whose mode traces with dynamo (`trace_modes`) gets the FP4 trace probe (`traceprobe`): an
  FP4 quantize entry point that does not trace predicts `dynamo-untraceable` before any GPU time is spent.

`import` is the runner's generic import check and needs no hook. `probe_entry` is the probe stage of
`servematrix bisect --probe-entry`: the trace probe of one named entry point.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from servematrix.engines.hooks import PreflightInput, PreflightUnavailable
from servematrix.engines.sglang import configcheck, flagsurface, loadprobe, traceprobe
from servematrix.errors import InputError
from servematrix.formats import verdict
from servematrix.formats.verdict import Verdict

if TYPE_CHECKING:  # the contract's types only: a hooks module loads neither the cells nor the engine loader
    from servematrix.engines import Engine
    from servematrix.records.cell import Cell


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
    if check.ok:
        return None
    swept = inp.cell.swept_flags
    if not check.unknown and all(swept.get(flag) == value for flag, value in check.invalid):
        # The matrix swept a flag's values, and this release lacks this one: not applicable, not a failure.
        return Verdict(kind="skipped", detail="not-applicable", excerpt=check.evidence, evidence=(check.evidence,))
    return verdict.failed("unknown-flag", excerpt=check.evidence)


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
    if result is None or result.traceable is None:
        return None  # nothing to probe, or the probe could not decide (the GPU stages will)
    if result.traceable:  # said, so that a cell the probe did not rule out shows why (sm_100 vs sm_120)
        return Verdict(kind="pass", evidence=(f"{_probed(result)}: traces for sm_{arch}",))
    return untraceable(result)


def _probed(result: traceprobe.ProbeResult) -> str:
    return f"probe: {result.entry} on torch {result.torch}, flashinfer {result.flashinfer}"


def untraceable(result: traceprobe.ProbeResult) -> Verdict:
    """The one verdict of an FP4 entry point that does not trace under dynamo: a predicted failure."""
    return Verdict(
        kind="predicted-fail", detail="dynamo-untraceable", excerpt=result.evidence, evidence=(_probed(result),)
    )


PREFLIGHTS = {"flags": flags, "config": configcheck.config, "load": loadprobe.load, "trace": trace}


def probe_entry(inp: PreflightInput, entry: str, *, needs_gpu: bool) -> tuple[Verdict, bool]:
    """`bisect --probe-entry ENTRY`: the trace probe of that FP4 entry point alone, on the cell's locked
    torch and flashinfer, as (verdict, whether the probe's result was cached). It traces (the CPU says nothing
    against it: skipped), it does not trace (`predicted-fail:dynamo-untraceable`, as the `trace` pre-flight
    says), the entry point is missing (`predicted-fail:fp4-entry-missing`), or no answer (`error:probe`)."""
    torch_version, flashinfer = inp.package("torch"), inp.package("flashinfer")
    if not torch_version or not flashinfer:
        raise InputError(f"--probe-entry: the lock of {inp.cell.env_id} has no torch or flashinfer-python to probe")
    result = traceprobe.trace_probe(
        torch_version=torch_version,
        flashinfer_version=flashinfer,
        entry=entry,
        arch=inp.cell.env.gpu.arch.removeprefix("sm_"),
        cache_dir=inp.cache_dir,
    )
    return entry_verdict(result, needs_gpu=needs_gpu), result.cached


def entry_verdict(result: traceprobe.ProbeResult, *, needs_gpu: bool) -> Verdict:
    if result.traceable is True:
        detail = "no-gpu" if needs_gpu else "stages"
        evidence = (f"{_probed(result)}: {result.evidence}",)
        return Verdict(kind="skipped", detail=detail, excerpt=result.evidence, evidence=evidence)
    if result.traceable is False:
        return untraceable(result)
    if "LookupError" in result.error:
        return Verdict(
            kind="predicted-fail", detail="fp4-entry-missing", excerpt=result.error, evidence=(_probed(result),)
        )
    return verdict.error("probe", result.error or "the trace probe gave no answer")


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
