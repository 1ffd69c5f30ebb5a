"""The peer check: is the spread of servematrix's decode figures the client's, or the server's API path's?

On one GPU host with sglang installed, start ONE sglang server and measure the same decode workload with
several clients, round by round, each on the same CPUs of their own (the server on the rest):

- servematrix's client over ``/v1/completions`` (4 worker processes, as the H200 lane runs it, and 1);
- servematrix's client over sglang's native ``/generate`` (``[bench] api = "generate"``);
- sglang's own ``bench_serving --backend sglang-oai`` (``/v1/completions``);
- sglang's own ``bench_serving --backend sglang`` (``/generate``).

Each round runs every client once, in an order rotated by one each round, so that no client always follows
the same one (the first run of 2026-12-03 had servematrix first in every round, and its repeats rose
through the run). Same client on two paths separates the path; two clients on one path separate the client.

    python ci/gpu/peer_check.py --python PY --model DIR [--repeats 6] [--out peer-check.json]

``PY`` is an interpreter that imports sglang (a venv, or a wrapper that sets PYTHONPATH). sglang's
``bench_serving`` imports ``datasets`` when it loads; for ``random-ids`` nothing of it is used, so a stub goes
last on its path (a real ``datasets`` wins). The JSON is written again after every round, so a run cut short
keeps the rounds it finished. Nothing here is a test: it needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
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


def _bench_serving(python: str, backend: str, args: argparse.Namespace, port: int, cpus: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.jsonl"
        # Run as a module from -c so that the stub goes on sys.path whatever PYTHONPATH the interpreter sets.
        launcher = (
            f"import runpy, sys; sys.path.append({str(env['SERVEMATRIX_PEER_STUB'])!r}); "
            "sys.argv[0] = 'bench_serving'; runpy.run_module('sglang.bench_serving', run_name='__main__')"
        )
        argv = [
            "taskset", "-c", cpus, python, "-c", launcher, "--backend", backend,
            "--host", "127.0.0.1", "--port", str(port), "--model", args.model, "--tokenizer", args.model,
            "--dataset-name", "random-ids", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(args.prompts), "--max-concurrency", str(args.concurrency),
            "--output-file", str(out), "--disable-tqdm", "--seed", str(int(time.time())),
        ]  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.is_file():
            raise SystemExit(f"peer check: bench_serving --backend {backend} failed:\n{done.stderr[-3000:]}")
        result = json.loads(out.read_text().splitlines()[-1])
        return {
            "output_tok_s": float(result["output_throughput"]),
            "wall_s": float(result["duration"]),
            "prompt_tokens": int(result["total_input_tokens"]),
            "completion_tokens": int(result["total_output_tokens"]),
        }


def _servematrix(url: str, args: argparse.Namespace, api: str, processes: int, cpus: tuple[int, ...]) -> dict:
    workload = bench.Workload(
        concurrency=(args.concurrency,), input_len=args.input_len, output_len=args.output_len,
        prompts_per_concurrency=args.prompts, warmup=args.concurrency, repeats=1, api=api,
        ignore_eos=True, client_processes=processes, client_cpus=cpus,
    )  # fmt: skip
    run = bench.run_workload_sync(url, args.model, workload).levels[0].runs[0]
    if run.error_count:
        raise SystemExit(f"peer check: servematrix ({api}) had {run.error_count} errors: {run.error_samples[:3]}")
    return {
        "output_tok_s": run.output_tok_s,
        "wall_s": run.wall_s,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "client_busy": run.client_busy,
    }


def _summary(args: argparse.Namespace, split: bench.CpuSplit, rounds: list[dict]) -> dict:
    names = list(rounds[0]["order"]) if rounds else []
    per_client: dict[str, dict] = {}
    for name in names:
        figures = [r["results"][name]["output_tok_s"] for r in rounds]
        mean = statistics.fmean(figures)
        per_client[name] = {
            "repeats": figures,
            **_spread(figures),
            "cv": statistics.stdev(figures) / mean if len(figures) > 1 else 0.0,
            "prompt_tokens": [r["results"][name]["prompt_tokens"] for r in rounds],
        }
    # The mean figure of each place in a round, over clients normalised by their own median: an order effect
    # (the server warming up under whoever runs first) shows as a slope here.
    by_place = [
        statistics.fmean(
            r["results"][r["order"][place]]["output_tok_s"] / per_client[r["order"][place]]["median"] for r in rounds
        )
        for place in range(len(names))
    ] if rounds else []  # fmt: skip
    return {
        "workload": {"concurrency": args.concurrency, "input_len": args.input_len, "output_len": args.output_len,
                     "prompts": args.prompts, "rounds": len(rounds), "ignore_eos": True},
        "server_args": args.server_arg,
        "client_cpus": split.client_cpuset,
        "server_cpus": split.server_cpuset,
        "output_tok_s": per_client,
        "relative_by_place_in_round": by_place,
        "rounds": rounds,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="an interpreter that imports sglang")
    parser.add_argument("--model", required=True, help="the model directory to serve")
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--repeats", type=int, default=6, help="rounds; each runs every client once")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=256, help="requests per repeat")
    parser.add_argument("--client-cpus", type=int, default=4, help="CPUs the clients get to themselves")
    parser.add_argument("--server-arg", action="append", default=[], help="an extra server argument")
    parser.add_argument("--out", type=Path, default=Path("peer-check.json"))
    args = parser.parse_args()
    # A `timeout` or a cancelled job ends the run through the `finally` below: the server is stopped and the
    # rounds finished so far are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    split = bench.split_cpus(args.client_cpus)
    if split is None:
        raise SystemExit("peer check: needs at least two CPUs (server and clients apart)")
    stub = Path(tempfile.mkdtemp()) / "stub"
    (stub / "datasets").mkdir(parents=True)
    (stub / "datasets" / "__init__.py").write_text(STUB)
    # Appended to sys.path: a real `datasets` earlier on the path wins.
    env = {**os.environ, "SERVEMATRIX_PEER_STUB": str(stub)}
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
    cpus = split.client_cpuset
    clients: dict[str, Callable[[], dict]] = {
        "servematrix /v1/completions x4": lambda: _servematrix(url, args, "completions", args.client_cpus, split.client),
        "servematrix /v1/completions x1": lambda: _servematrix(url, args, "completions", 1, split.client),
        "servematrix /generate x4": lambda: _servematrix(url, args, "generate", args.client_cpus, split.client),
        "bench_serving sglang-oai /v1/completions": lambda: _bench_serving(args.python, "sglang-oai", args, args.port, cpus, env),
        "bench_serving sglang /generate": lambda: _bench_serving(args.python, "sglang", args, args.port, cpus, env),
    }  # fmt: skip
    names = list(clients)
    rounds: list[dict] = []
    try:
        ready_s = _wait_ready(url, server, 900)
        print(f"peer check: server ready after {ready_s:.0f} s; clients on CPUs {cpus}", flush=True)
        for name in names:  # warm the server (and each client's path) once, uncounted
            clients[name]()
        for r in range(args.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            results = {name: clients[name]() for name in order}
            rounds.append({"order": order, "results": results})
            print(f"peer check: round {r + 1}: " + ", ".join(f"{n} {results[n]['output_tok_s']:,.0f}" for n in order),
                  flush=True)  # fmt: skip
            args.out.write_text(json.dumps(_summary(args, split, rounds), indent=2) + "\n")
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
    summary = _summary(args, split, rounds)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for name, figures in summary["output_tok_s"].items():
        print(f"peer check: {name}: median {figures['median']:,.0f} tok/s, ±{figures['plus_minus']:.1%}, "
              f"cv {figures['cv']:.1%}")  # fmt: skip
    print(
        "peer check: relative figure by place in round: "
        + ", ".join(f"{v:.3f}" for v in summary["relative_by_place_in_round"])
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
