"""Trace probe: does dynamo (torch.compile, fullgraph=True) trace an FP4 quantize entry point?

This file is run by the interpreter of a throwaway venv that holds one (torch, flashinfer-python) pair:

    VENV/bin/python probe_script.py --entry plain|custom-op|sglang-op --arch 100|120 [--module M]

It must stay self-contained (standard library at the top, torch and flashinfer imported inside main)
because it never runs in servematrix's own environment. It prints exactly one JSON line on stdout.

No CUDA kernel runs and no GPU is needed:
- the compile backend only captures the FX graph and raises a sentinel, so nothing compiled is ever
  executed;
- tensor inputs live on the ``meta`` device, so custom ops only run their fake (shape) implementations.

Entries:
- ``plain``: a function that calls flashinfer's ``get_fp4_quantization_module(arch)``, which is what the
  public ``fp4_quantize`` reaches. Its JIT spec builder shells out to nvcc, which dynamo cannot trace.
  (The public ``fp4_quantize`` itself is not probed: with CPU/meta tensors its device checks fail first,
  which would give the right verdict for the wrong reason.)
- ``custom-op``: ``torch.ops.flashinfer.fp4_quantize`` (registered by flashinfer >= 0.6.12).
- ``sglang-op``: what sglang >= 0.5.12 does in ``layers/quantization/fp4_utils.py``: wrap the public
  ``flashinfer.fp4_quantize`` as its own custom op with a fake implementation. The body is opaque to
  dynamo, so this traces with any flashinfer; the probe also reports whether flashinfer's
  ``fp4_quantize`` accepts the ``backend=`` keyword sglang passes (older releases raise TypeError at the
  first real call, a run-time failure, not a trace failure).
"""

import argparse
import json
import os
import sys
import time
import traceback
from typing import Optional, Tuple  # noqa: UP035  (torch's schema inference across releases)

MODULE_CANDIDATES = ("flashinfer.quantization.fp4_quantization", "flashinfer.fp4_quantization")
MESSAGE_LINES = 4
OBSERVED_EXCEPTION = "Observed exception"


class GraphCaptured(Exception):
    """Raised by the capture-only backend once dynamo hands it a complete graph."""


def _message_head(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return "\n".join(lines[:MESSAGE_LINES])


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__


def _import_module(explicit: str | None):
    import importlib

    names = (explicit,) if explicit else MODULE_CANDIDATES
    errors = []
    for name in names:
        try:
            return name, importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("; ".join(errors))


def _build(entry: str, arch: str, module_name: str | None, report: dict):
    """Return (fn, args) to trace for the entry point."""
    import torch

    x = torch.empty((128, 64), dtype=torch.bfloat16, device="meta")
    global_scale = torch.empty((1,), dtype=torch.float32, device="meta")

    if entry == "plain":
        name, module = _import_module(module_name)
        report["module"] = name
        getter = module.get_fp4_quantization_module

        def plain(t):
            getter(arch)
            return t + 1

        return plain, (x,)

    if entry == "custom-op":
        import flashinfer  # registers torch.ops.flashinfer.*

        if not hasattr(torch.ops.flashinfer, "fp4_quantize"):
            raise LookupError("torch.ops.flashinfer.fp4_quantize is not registered by this flashinfer")
        op = torch.ops.flashinfer.fp4_quantize
        report["module"] = "torch.ops.flashinfer"

        def custom_op(t, gs):
            # Explicit enable_pdl: its default (None) is a run-time fault on GPUs, see domain notes.
            return op(t, gs, 16, False, True, False, False)

        return custom_op, (x, global_scale)

    if entry == "sglang-op":
        import inspect

        import flashinfer

        public = flashinfer.fp4_quantize
        report["module"] = "flashinfer"
        try:
            params = inspect.signature(public).parameters
            report["accepts_backend_kwarg"] = "backend" in params
        except (TypeError, ValueError):
            report["accepts_backend_kwarg"] = None

        @torch.library.custom_op("servematrix_probe::flashinfer_fp4_quantize", mutates_args=())
        def wrapped(
            input: torch.Tensor,
            global_scale: Optional[torch.Tensor] = None,  # noqa: UP045
            sf_vec_size: int = 16,
            sf_use_ue8m0: bool = False,
            is_sf_swizzled_layout: bool = True,
            is_sf_8x4_layout: bool = False,
            enable_pdl: Optional[bool] = None,  # noqa: UP045
        ) -> Tuple[torch.Tensor, torch.Tensor]:  # noqa: UP006
            return public(
                input,
                global_scale,
                sf_vec_size,
                sf_use_ue8m0,
                is_sf_swizzled_layout,
                is_sf_8x4_layout,
                enable_pdl,
            )

        @wrapped.register_fake
        def _(
            input,
            global_scale=None,
            sf_vec_size=16,
            sf_use_ue8m0=False,
            is_sf_swizzled_layout=True,
            is_sf_8x4_layout=False,
            enable_pdl=None,
        ):
            m = input.numel() // input.shape[-1]
            k = input.shape[-1]
            x_q = input.new_empty((*input.shape[:-1], k // 2), dtype=torch.uint8)
            rows = -(-m // (8 if is_sf_8x4_layout else 128)) * (8 if is_sf_8x4_layout else 128)
            cols = -(-(k // sf_vec_size) // 4) * 4
            return x_q, input.new_empty((rows, cols), dtype=torch.uint8)

        def sglang_op(t, gs):
            return torch.ops.servematrix_probe.flashinfer_fp4_quantize(t, gs, 16, False, True, False, False)

        return sglang_op, (x, global_scale)

    raise ValueError(f"unknown entry {entry!r}")


def probe(entry: str, arch: str, module_name: str | None, assume_cuda: str = "") -> dict:
    report: dict = {
        "traceable": None,
        "error_type": "",
        "message": "",
        "seconds": 0.0,
        "import_seconds": 0.0,
        "torch": "",
        "flashinfer": "",
        "entry": entry,
        "arch": arch,
        "module": "",
        "graph": [],
        "cuda_assumed": "",
    }
    started = time.monotonic()
    try:
        import torch

        report["torch"] = torch.__version__
        if torch.version.cuda is None and assume_cuda:
            # A CPU build of torch reports no CUDA version; flashinfer's arch selection reads it
            # (0.6.12+: sm_120 -> sm_120f when CUDA >= 12.9) before it reaches the nvcc probe.
            torch.version.cuda = assume_cuda
            report["cuda_assumed"] = assume_cuda
        import flashinfer

        report["flashinfer"] = getattr(flashinfer, "__version__", "")
        fn, args = _build(entry, arch, module_name, report)
    except Exception as exc:
        report["error_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
        report["message"] = _message_head(exc) or traceback.format_exc(limit=1)
        report["import_seconds"] = round(time.monotonic() - started, 3)
        return report
    report["import_seconds"] = round(time.monotonic() - started, 3)

    captured: list = []

    def capture_only(gm, example_inputs):
        captured.append([str(node.target) for node in gm.graph.nodes if node.op == "call_function"])
        raise GraphCaptured

    torch._dynamo.reset()
    traced_at = time.monotonic()
    try:
        torch.compile(fn, fullgraph=True, backend=capture_only)(*args)
    except Exception as exc:
        chain = list(_chain(exc))
        if any(isinstance(e, GraphCaptured) for e in chain):
            report["traceable"] = True
            report["graph"] = captured[-1] if captured else []
        else:
            from torch._dynamo.exc import Unsupported

            deciding = next((e for e in chain if isinstance(e, Unsupported)), None)
            if deciding is None:
                # Not dynamo's verdict (e.g. the probe itself broke): inconclusive.
                deciding = exc
            elif str(deciding).lstrip().startswith(OBSERVED_EXCEPTION):
                # The traced code raised (in this CPU environment) before reaching anything dynamo
                # refuses; a GPU environment would take another path, so this decides nothing.
                pass
            else:
                report["traceable"] = False
            report["error_type"] = f"{type(deciding).__module__}.{type(deciding).__qualname__}"
            report["message"] = _message_head(deciding)
    else:
        # The backend raises, so reaching here means dynamo never called it: nothing was traced.
        report["error_type"] = "NoGraph"
        report["message"] = "torch.compile returned without handing a graph to the backend"
    report["seconds"] = round(time.monotonic() - traced_at, 3)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entry", required=True, choices=("plain", "custom-op", "sglang-op"))
    parser.add_argument("--arch", required=True, help="compute capability without the dot, e.g. 100, 120")
    parser.add_argument("--module", default=None, help="module holding get_fp4_quantization_module")
    parser.add_argument(
        "--assume-cuda",
        default="13.0",
        help="torch.version.cuda to report when torch is a CPU build ('' leaves it None)",
    )
    args = parser.parse_args(argv)
    report = probe(args.entry, args.arch, args.module, args.assume_cuda)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    # The report is out and flushed. Skip interpreter teardown: with a CUDA build of torch and dynamo
    # loaded it can take longer than the probe itself.
    os._exit(code)
