"""Load probe: sglang's own start-up path on a CPU, as far as it goes, for one cell.

Run by the interpreter of the environment the import check installs (the cell's whole lock), for one GPU
arch, as a small server on stdin/stdout:

    VENV/bin/python load_script.py --arch 12.0

Its first stdout line says it is ready ({"ready": true, "seconds": s}, or why not). Then each stdin line is a
request, {"argv": [server argv, no launcher], "model_dir": DIR, "tp_size": 8, "layers_to_build": N or null},
answered by one stdout line, from a fork of the prepared process (sglang imported once):
{"steps": [{"name", "ok", "detail"}], "reached": the last step that passed, "faked": [...],
 "error": {"type", "message", "frames": [{"file", "line", "function"}]} or null, "seconds": s}

It must stay self-contained: the standard library at the top, torch and sglang imported inside main, because
it never runs in servematrix's own environment.

What it fakes (each recorded in "faked" when applied):
- the GPU's compute capability: torch.cuda's device queries (capability, properties, count, memory) answer for
  the cell's arch, and so do sglang's own platform helpers (`sglang.srt.utils.common`: every
  `_check_cuda_device_version` helper such as is_blackwell_supported / is_sm120_supported, get_device_sm,
  get_device_capability). torch.cuda.is_available() stays False, so sglang's `is_cuda()` is False: it would
  otherwise import sgl_kernel, which needs libcuda.so.1;
- `--device cuda` added to the argv (ServerArgs would ask the machine for its device otherwise);
- one gloo process group of one rank, and the model built with tensor parallelism 1 (the cell's tp_size is
  given to ServerArgs as it is, but the modules are built unsharded);
- the model's layers reduced to `layers_to_build` (default: the dense layers before the first MoE layer plus
  one MoE layer), on the meta device (no memory).
"""

import argparse
import json
import os
import sys
import time
import traceback

STEPS = ("server-args", "model-config", "architecture", "quantization", "backends", "distributed", "modules")
FRAMES = 12


CURRENT = None  # the Run that fakes applied later (a stub asked for, a meta tensor moved) are recorded in


def note(what):
    if CURRENT is not None:
        CURRENT.fake(what)


class Run:
    def __init__(self):
        self.steps = []
        self.faked = []
        self.error = None
        self.current = None

    def ok(self, name, detail=""):
        self.steps.append({"name": name, "ok": True, "detail": str(detail)[:500]})

    def fake(self, what):
        if what not in self.faked:
            self.faked.append(what)

    def fail(self, name, exc):
        self.steps.append({"name": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}"[:2000]})
        self.error = {"type": type(exc).__name__, "message": str(exc)[:4000], "frames": _frames(exc)}

    def result(self, started):
        passed = [s["name"] for s in self.steps if s["ok"]]
        return {
            "steps": self.steps,
            "reached": passed[-1] if passed else None,
            "faked": self.faked,
            "error": self.error,
            "seconds": round(time.monotonic() - started, 3),
        }


def _short(path):
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _frames(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    return [{"file": _short(f.filename), "line": f.lineno, "function": f.name} for f in frames[-FRAMES:]]


def fake_device(run, arch):
    """torch's device queries and sglang's platform helpers answer for `arch` (major, minor)."""
    import types

    import torch

    major, minor = arch
    props = types.SimpleNamespace(
        name=f"faked sm_{major}{minor}",
        major=major,
        minor=minor,
        total_memory=96 * 2**30,
        multi_processor_count=188,
        gcnArchName="",
        L2_cache_size=128 * 2**20,
        warp_size=32,
        uuid="faked",
        is_integrated=False,
        max_shared_memory_per_block_optin=101376,
    )
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.get_device_name = lambda device=None: props.name
    torch.cuda.current_device = lambda: 0
    torch.cuda.mem_get_info = lambda device=None: (90 * 2**30, 96 * 2**30)
    torch.cuda.set_device = lambda device: None
    run.fake(
        f"torch.cuda device queries answer sm_{major}{minor} (capability, properties, memory); "
        "torch.cuda.is_available() stays False"
    )
    if not torch.version.cuda:
        torch.version.cuda = "13.0"
        run.fake("torch.version.cuda = 13.0 (a CPU build of torch)")

    import functools

    from sglang.srt.utils import common

    sm = major * 10 + minor
    cuda = tuple(int(x) for x in torch.version.cuda.split(".")[:2])
    patched = {}
    for name, value in list(vars(common).items()):
        inner = getattr(value, "__wrapped__", None)
        if isinstance(inner, functools.partial) and getattr(inner.func, "__name__", "") == "_check_cuda_device_version":
            majors = inner.keywords.get("device_capability_majors", ())
            wanted = inner.keywords.get("cuda_version", (0, 0))
            answer = major in majors and cuda >= tuple(wanted)
            patched[name] = (value, (lambda answer=answer: answer))
    for name in ("get_device_sm",):
        if hasattr(common, name):
            patched[name] = (getattr(common, name), (lambda *a, **k: sm))
    for name in ("get_device_capability",):
        if hasattr(common, name):
            patched[name] = (getattr(common, name), (lambda *a, **k: (major, minor)))
    modules = [common] + [m for n, m in list(sys.modules.items()) if n.startswith("sglang.") and m is not common]
    for module in modules:
        for name, (original, replacement) in patched.items():
            if getattr(module, name, None) is original:
                setattr(module, name, replacement)
    run.fake(f"sglang.srt.utils.common platform helpers answer sm_{sm}: {', '.join(sorted(patched))}")


def stub_missing(run, names=("vllm",)):
    """Modules that sglang imports only on its non-CUDA path (is_cuda() is False here) and that the lock
    does not hold: stubbed, every attribute a callable that raises if it is ever called (nothing runs a
    kernel here). Each stubbed name that sglang asked for is recorded."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    for name in names:
        if importlib.util.find_spec(name) is not None:
            continue

        class _Stub(types.ModuleType):
            def __getattr__(self, attr, _root=name):
                if attr.startswith("__"):
                    raise AttributeError(attr)
                note(f"stubbed {self.__name__}.{attr} ({_root} is not in the lock; sglang imports it off CUDA)")

                def _never(*args, **kwargs):
                    raise RuntimeError(f"stub {self.__name__}.{attr} called")

                return _never

        class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, fullname, path=None, target=None, _root=name):
                if fullname == _root or fullname.startswith(_root + "."):
                    return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
                return None

            def create_module(self, spec):
                return _Stub(spec.name)

            def exec_module(self, module):
                module.__path__ = []

        sys.meta_path.append(_Finder())


def keep_meta_on_meta(run):
    """A meta tensor moved to "cuda" (`.cuda()`, `.to("cuda")`) stays on meta: module builds that move a
    shape-only buffer to the GPU (0.5.12's swizzle_blockscale) would otherwise initialise CUDA."""
    import torch

    original_cuda, original_to = torch.Tensor.cuda, torch.Tensor.to

    def cuda(self, *args, **kwargs):
        if self.is_meta:
            note("Tensor.cuda() of a meta tensor stays on meta")
            return self
        return original_cuda(self, *args, **kwargs)

    def to(self, *args, **kwargs):
        if self.is_meta:
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, (str, torch.device)) and str(target).startswith("cuda"):
                note("Tensor.to('cuda') of a meta tensor stays on meta")
                rest = tuple(a for a in args[1:] if not isinstance(a, (str, torch.device)))
                kwargs = {k: v for k, v in kwargs.items() if k != "device"}
                return original_to(self, *rest, **kwargs) if (rest or kwargs) else self
        return original_to(self, *args, **kwargs)

    torch.Tensor.cuda = cuda
    torch.Tensor.to = to


def _argv_for(argv, model_dir, tp_size=None):
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("--model-path", "--model") and i + 1 < len(argv):
            skip = True
            continue
        if arg.startswith(("--model-path=", "--model=")):
            continue
        if tp_size is not None and arg in ("--tp", "--tp-size", "--tensor-parallel-size") and i + 1 < len(argv):
            skip = True
            continue
        out.append(arg)
    out = ["--model-path", model_dir, *out]
    if tp_size is not None:
        out += ["--tp-size", str(tp_size)]
    if "--device" not in out:
        out += ["--device", "cuda"]
    return out


class UsageError(Exception):
    """The release's argparse refused the argv (what `launch_server` prints before it exits 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message}")


def server_args_of(argv):
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def _backends(sa):
    keys = (
        "attention_backend",
        "prefill_attention_backend",
        "decode_attention_backend",
        "nsa_prefill_backend",
        "nsa_decode_backend",
        "dsa_prefill_backend",
        "dsa_decode_backend",
        "moe_runner_backend",
        "moe_a2a_backend",
        "fp4_gemm_runner_backend",
        "kv_cache_dtype",
        "quantization",
        "disable_shared_experts_fusion",
    )
    return {k: getattr(sa, k) for k in keys if getattr(sa, k, None) is not None}


def _publish(sa, run):
    """Make `sa` the process's server args, as the scheduler does (each release names it its own way)."""
    from sglang.srt import server_args as module

    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        rc = None
    if rc is not None and hasattr(rc, "publish"):
        ranks = None
        if hasattr(rc, "derive_spawn_ranks"):
            try:
                ranks = rc.derive_spawn_ranks(sa, tp_rank=0, pp_rank=0)
            except Exception:
                ranks = None
        try:
            rc.publish(sa, role="scheduler", ranks=ranks)
        except TypeError:
            rc.publish(sa, role="scheduler")
        return
    for name in ("set_global_server_args_for_scheduler", "set_global_server_args"):
        if hasattr(module, name):
            getattr(module, name)(sa)
            return


def _init_moe(sa):
    import inspect

    from sglang.srt.layers import moe

    fn = getattr(moe, "initialize_moe_config", None)
    if fn is None:
        from sglang.srt.layers.moe import utils as moe_utils

        fn = moe_utils.initialize_moe_config
    if inspect.signature(fn).parameters:
        fn(sa)
    else:
        fn()
    from sglang.srt.layers.moe import get_moe_runner_backend

    # The GEMM backends the scheduler initialises after the MoE config (0.5.12: fp8_utils, fp4_utils; 0.5.23 also
    # unquant's bf16 one), where the release has them.
    modules = []
    try:
        from sglang.srt.layers.quantization import fp8_utils

        modules.append(fp8_utils)
    except ImportError:
        pass
    try:
        from sglang.srt.layers.quantization import fp4_utils

        modules.append(fp4_utils)
    except ImportError:
        pass
    try:
        from sglang.srt.layers.quantization import unquant

        modules.append(unquant)
    except ImportError:
        pass
    for module in modules:
        for name in ("initialize_fp8_gemm_config", "initialize_fp4_gemm_config", "initialize_bf16_gemm_config"):
            f = getattr(module, name, None)
            if f is not None:
                f(sa) if inspect.signature(f).parameters else f()
    return get_moe_runner_backend()


def _distributed(run):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}"
    )
    initialize_model_parallel(backend="gloo")
    run.fake("one gloo process group of one rank (tensor parallelism 1)")
    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        return
    if hasattr(rc, "_parallel_fields") and hasattr(rc, "get_parallel"):
        values = {f: (1 if f.endswith("size") else 0) for f in rc._parallel_fields() if f.endswith(("_rank", "_size"))}
        try:
            rc.get_parallel().override_permanently(**values)
            run.fake("sglang's parallel context: every rank 0, every size 1")
        except Exception as exc:
            run.fake(f"sglang's parallel context not overridden ({type(exc).__name__}: {str(exc)[:120]})")


SKIPPED_MODELS: list[str] = []  # model modules sglang's registry could not import here, with why (its own log line)


def _watch_registry():
    """sglang's registry skips a model module that fails to import, and says so in its log ("Ignore import
    error when loading sglang.srt.models.X: ..."). Off a GPU that can be sgl_kernel wanting libcuda.so.1: an
    architecture missing from the registry for that reason is the CPU's limit, not the release's."""
    import logging

    class Handler(logging.Handler):
        def emit(self, record):
            text = record.getMessage()
            if "Ignore import error when loading" in text:
                SKIPPED_MODELS.append(text[:400])

    logging.getLogger().addHandler(Handler(level=logging.DEBUG))


def prepare(arch):
    """What every request of this process shares: the faked device and stubs, then sglang's heavy imports
    (done once: each request runs in a fork of this process). Returns the fakes it applied."""
    global CURRENT
    run = CURRENT = Run()
    fake_device(run, arch)
    stub_missing(run)
    keep_meta_on_meta(run)
    _watch_registry()
    import sglang.srt.configs.model_config
    import sglang.srt.model_loader.loader
    import sglang.srt.server_args  # noqa: F401
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.get_supported_archs()
    return run.faked


def probe(request, faked):
    global CURRENT
    started = time.monotonic()
    run = CURRENT = Run()
    run.faked = list(faked)
    model_dir = request["model_dir"]
    argv = list(request.get("argv") or [])
    step = "server-args"
    try:
        os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
        full_argv = _argv_for(argv, model_dir)
        if "--device" not in argv:
            run.fake("--device cuda added to the argv")
        sa = server_args_of(full_argv)
        run.ok(step, json.dumps(_backends(sa), default=str))
        tp = int(request.get("tp_size") or getattr(sa, "tp_size", 1) or 1)
        if tp != 1:
            sa = server_args_of(_argv_for(argv, model_dir, tp_size=1))
            run.fake(f"the modules are built at tensor parallelism 1 (ServerArgs above saw tp {tp})")

        step = "model-config"
        from sglang.srt.configs.model_config import ModelConfig

        model_config = ModelConfig.from_server_args(sa)
        hf = model_config.hf_config
        total_layers = getattr(hf, "num_hidden_layers", None)
        run.ok(
            step,
            f"{type(hf).__name__}: {getattr(hf, 'architectures', None)}, {total_layers} layers, "
            f"dtype {model_config.dtype}, quantization {model_config.quantization}",
        )

        step = "architecture"
        from sglang.srt.model_loader.utils import get_model_architecture

        model_class, arch_name = get_model_architecture(model_config)
        run.ok(step, f"{arch_name} -> {model_class.__module__}.{model_class.__name__}")

        step = "backends"
        _publish(sa, run)
        runner = _init_moe(sa)
        run.ok(step, f"moe runner {getattr(runner, 'value', runner)}; {json.dumps(_backends(sa), default=str)}")

        step = "distributed"
        _distributed(run)
        try:
            import inspect

            from sglang.srt.layers import dp_attention

            fn = getattr(dp_attention, "initialize_dp_attention", None)
            if fn is not None:
                params = inspect.signature(fn).parameters
                kw = {k: v for k, v in (("server_args", sa), ("model_config", model_config)) if k in params}
                fn(**kw)
        except Exception as exc:
            run.fake(f"initialize_dp_attention skipped ({type(exc).__name__}: {str(exc)[:120]})")
        run.ok(step, "gloo, world size 1")

        step = "quantization"
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.model_loader import loader

        load_config = LoadConfig(
            load_format=getattr(sa, "load_format", "auto"), download_dir=getattr(sa, "download_dir", None)
        )
        quant_config = loader._get_quantization_config(model_config, load_config)
        run.ok(step, type(quant_config).__name__ if quant_config is not None else "none")

        step = "modules"
        import torch

        layers = request.get("layers_to_build")
        if not layers and total_layers:
            dense = getattr(hf, "first_k_dense_replace", None)
            moe = getattr(hf, "n_routed_experts", None)
            layers = (int(dense) + 1) if isinstance(dense, int) and moe else min(2, total_layers)
        if layers and total_layers and layers < total_layers:
            hf.num_hidden_layers = layers
            for name in ("mlp_layer_types", "layer_types", "indexer_types"):
                value = getattr(hf, name, None)
                if isinstance(value, list) and len(value) == total_layers:
                    setattr(hf, name, value[:layers])
            run.fake(f"layers reduced to {layers} of {total_layers}")
        from sglang.srt.model_loader.utils import set_default_torch_dtype

        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            model = loader._initialize_model(model_config, load_config, quant_config)
        built = getattr(getattr(model, "model", model), "layers", None)
        count = len(built) if built is not None else None
        methods = sorted(
            {
                type(m.quant_method).__name__
                for n, m in model.named_modules()
                if n.endswith(".experts") and getattr(m, "quant_method", None) is not None
            }
        )
        run.ok(
            step,
            json.dumps(
                {"class": type(model).__name__, "layers_built": count, "of": total_layers, "moe_quant_methods": methods}
            ),
        )
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        run.fail(step, exc)
        if step == "architecture" and SKIPPED_MODELS and run.error is not None:
            run.error["skipped_models"] = list(SKIPPED_MODELS)
    return run.result(started)


def _answer(result):
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


def main():
    """Each stdin line is a request, answered by one stdout line, in a fork of the prepared process (its
    faked device and imports shared; each request starts from the same state)."""
    cli = argparse.ArgumentParser()
    cli.add_argument("--arch", default="12.0")
    arch = tuple(int(x) for x in cli.parse_args().arch.split(".")[:2])
    # sglang's own logging goes to stderr; stdout carries the answers only.
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(real_stdout, "w")
    started = time.monotonic()
    try:
        faked = prepare(arch)
        ready = {"ready": True, "seconds": round(time.monotonic() - started, 3)}
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        run = Run()
        run.fail("prepare", exc)
        ready = {"ready": False, **run.result(started)}
        faked = None
    _answer(ready)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if faked is None:
            _answer(ready)
            continue
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                result = probe(request, faked)
            except BaseException as exc:
                result = {
                    "steps": [],
                    "reached": None,
                    "faked": faked,
                    "error": {"type": type(exc).__name__, "message": str(exc), "frames": _frames(exc)},
                }
            with os.fdopen(write, "w") as out:
                out.write(json.dumps(result, default=str))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as inp:
            text = inp.read()
        _, status = os.waitpid(pid, 0)
        if text:
            _answer(json.loads(text))
        else:
            _answer(
                {
                    "steps": [],
                    "reached": None,
                    "faked": faked,
                    "error": {
                        "type": "crash",
                        "message": f"the probe process died (wait status {status})",
                        "frames": [],
                    },
                }
            )


if __name__ == "__main__":
    main()
