"""The peer check: is the spread of servematrix's decode figures the client's, or the server's API path's?

On one GPU host with sglang installed, start ONE sglang server and measure the same decode workload with
three clients, interleaved repeat by repeat, each on the same CPUs of their own (the server on the rest):

- servematrix's client (``servematrix.stages.bench``, over ``/v1/completions``);
- sglang's own ``bench_serving --backend sglang-oai`` (the same API path, ``/v1/completions``);
- sglang's own ``bench_serving --backend sglang`` (its native ``/generate``).

If servematrix's client spreads more than ``sglang-oai`` on the same server, the client is the cause; if both
OpenAI-path clients spread alike and more than ``/generate``, the server's OpenAI path is.

    python ci/gpu/peer_check.py --python PY --model DIR [--repeats 5] [--out peer-check.json]

``PY`` is an interpreter that imports sglang (a venv, or a wrapper that sets PYTHONPATH). sglang's
``bench_serving`` imports ``datasets`` when it loads; for ``random-ids`` nothing of it is used, so a stub is put
first on its path when the real package is missing. Nothing here is a test: it needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from servematrix.stages import bench  # noqa: E402

STUB = "def load_dataset(*args, **kwargs):\n    raise RuntimeError('datasets stub: not used by random-ids')\n"


def _spread(values: list[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {
        "min": min(values),
        "median": median,
        "max": max(values),
        # half the range over the median: "about ±7 %"
        "plus_minus": (max(values) - min(values)) / 2 / median if median else 0.0,
    }


def _wait_ready(url: str, server: subprocess.Popen, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if server.poll() is not None:
            raise SystemExit(f"peer check: the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
                if reply.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"peer check: the server was not ready after {timeout_s:.0f} s")


def _bench_serving(python: str, backend: str, args: argparse.Namespace, port: int, cpus: str, env: dict) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.jsonl"
        argv = [
            "taskset", "-c", cpus, python, "-m", "sglang.bench_serving", "--backend", backend,
            "--host", "127.0.0.1", "--port", str(port), "--model", args.model, "--tokenizer", args.model,
            "--dataset-name", "random-ids", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(args.prompts), "--max-concurrency", str(args.concurrency),
            "--output-file", str(out), "--disable-tqdm", "--seed", str(int(time.time())),
        ]  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.is_file():
            raise SystemExit(f"peer check: bench_serving --backend {backend} failed:\n{done.stderr[-3000:]}")
        return float(json.loads(out.read_text().splitlines()[-1])["output_throughput"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="an interpreter that imports sglang")
    parser.add_argument("--model", required=True, help="the model directory to serve")
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=256, help="requests per repeat")
    parser.add_argument("--client-cpus", type=int, default=4, help="CPUs the clients get to themselves")
    parser.add_argument("--server-arg", action="append", default=[], help="an extra server argument")
    parser.add_argument("--out", type=Path, default=Path("peer-check.json"))
    args = parser.parse_args()

    split = bench.split_cpus(args.client_cpus)
    if split is None:
        raise SystemExit("peer check: needs at least two CPUs (server and clients apart)")
    stub = Path(tempfile.mkdtemp()) / "stub"
    (stub / "datasets").mkdir(parents=True)
    (stub / "datasets" / "__init__.py").write_text(STUB)
    env = dict(os.environ)
    probe = subprocess.run([args.python, "-c", "import datasets"], env=env, capture_output=True)
    if probe.returncode != 0:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", ""), str(stub)]))
    log = args.out.with_suffix(".server.log")
    server_argv = [
        args.python, "-m", "sglang.launch_server", "--model-path", args.model, "--host", "127.0.0.1",
        "--port", str(args.port), *args.server_arg,
    ]  # fmt: skip
    with log.open("w") as log_file:
        server = subprocess.Popen(
            split.pin_server(server_argv), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{args.port}"
    results: dict[str, list[float]] = {"servematrix (/v1/completions)": [], "sglang-oai (/v1/completions)": [],
                                       "sglang (/generate)": []}  # fmt: skip
    try:
        ready_s = _wait_ready(url, server, 900)
        print(f"peer check: server ready after {ready_s:.0f} s; clients on CPUs {split.client_cpuset}", flush=True)
        workload = bench.Workload(
            concurrency=(args.concurrency,), input_len=args.input_len, output_len=args.output_len,
            prompts_per_concurrency=args.prompts, warmup=args.concurrency, repeats=1, api="completions",
            ignore_eos=True, client_processes=args.client_cpus, client_cpus=split.client,
        )  # fmt: skip
        _bench_serving(args.python, "sglang-oai", args, args.port, split.client_cpuset, env)  # warm the server
        for repeat in range(1, args.repeats + 1):
            ours = bench.run_workload_sync(url, args.model, workload).levels[0].runs[0].output_tok_s
            results["servematrix (/v1/completions)"].append(ours)
            for backend, key in (("sglang-oai", "sglang-oai (/v1/completions)"), ("sglang", "sglang (/generate)")):
                results[key].append(_bench_serving(args.python, backend, args, args.port, split.client_cpuset, env))
            print(f"peer check: repeat {repeat}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in results.items()),
                  flush=True)  # fmt: skip
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
    summary = {
        "workload": {"concurrency": args.concurrency, "input_len": args.input_len, "output_len": args.output_len,
                     "prompts": args.prompts, "repeats": args.repeats, "ignore_eos": True},
        "client_cpus": split.client_cpuset,
        "server_cpus": split.server_cpuset,
        "output_tok_s": {k: {"repeats": v, **_spread(v)} for k, v in results.items()},
    }  # fmt: skip
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for name, figures in summary["output_tok_s"].items():
        print(f"peer check: {name}: median {figures['median']:,.0f} tok/s, ±{figures['plus_minus']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
