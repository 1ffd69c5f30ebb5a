"""Serve a GLM-5-shaped model (and, if its sparse attention cannot run, the nearest architecture) with sglang on
one H200, prefill graphs off (baseline) and piecewise, server starts interleaved; measure TTFT at 1 stream and
decode tok/s at 32 with sglang's own bench_serving over /generate (random-ids), and compare greedy outputs
between modes. Standard library only (runs under the GPU machine's python3).

    python3 ci/gpu/glm5_h200.py --python /tmp/py-0.5.12-kernels-0.14.1 --out DIR \
        --model glm5=PATH --model dsv3=PATH [--budget-s 480]

PATH: models built by src/servematrix/engines/transformers/tinymoe.py (`--size glm5-gpu`, `--size dsv3-gpu`).
Starts interleave baseline, piecewise, baseline, piecewise; if the GLM-5-shaped model's first baseline start does
not serve, it goes on with the dsv3 model (the same shapes without the indexer, `--attention-backend triton`).
Needs CUDA_HOME (DeepGEMM compiles with nvcc), and BENCH_STUB: a folder holding a `datasets` stub package
(bench_serving imports `datasets`, which the bundle lacks; random-ids never calls it).

Writes DIR/summary.json (every figure, every start's evidence lines) and DIR/logs/ (each server's log, each
bench's JSONL). First run on the H200 2026-12-04: the first start was stopped at its readiness limit (65 s then)
while capturing decode graphs; no figure yet (docs/prefill-graphs.md).
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROMPTS = [
    "The river runs past the old mill and turns toward the sea.",
    "A careful test repeats each measurement, reports the spread, and never trusts one number.",
    "Bread is baked before sunrise, and the smell of it fills the narrow streets.",
    "How far is it from the mill to the lighthouse, if a cart travels twelve miles in three hours?",
    "Machines that serve language models read text as tokens.",
    "In the evening the lamps are lit, the boats come home.",
    "apple onion cheese rope nail paper lamp",
    "1 2 3 4 5 6 7 8 9 10 11 12",
]
# Past the indexer's top-k (2048 tokens): the only prompt whose prefill runs the indexer's logits and top-k
# selection (shorter ones attend to every token).
PROMPTS.append(" ".join(PROMPTS) * 15)
COMMON = [
    "--mem-fraction-static",
    "0.5",
    "--disable-radix-cache",
    "--cuda-graph-max-bs",
    "32",
    "--host",
    "127.0.0.1",
    "--log-level",
    "info",
]
ARCH_ARGS = {
    # GLM-5's DSA on Hopper without FA3 (not in the bundle): bf16 KV, FlashMLA's sparse kernel for prefill and
    # decode, and no dense-MHA one-shot prefill (that path is FA3's).
    "glm5": (
        [
            "--kv-cache-dtype",
            "bfloat16",
            "--nsa-prefill-backend",
            "flashmla_sparse",
            "--nsa-decode-backend",
            "flashmla_sparse",
        ],
        {"SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0"},
    ),
    "dsv3": (["--attention-backend", "triton"], {}),
}
MODE_ARGS = {"baseline": ["--disable-piecewise-cuda-graph"], "piecewise": ["--enforce-piecewise-cuda-graph"]}
EVIDENCE = re.compile(
    r"Capture piecewise CUDA graph|[Pp]iecewise CUDA graph|Set NSA backends|Setting (KV cache dtype|page size)|"
    r"attention backend|Error|error:|Traceback|CUDA|deep_gemm|DeepGEMM|flashmla|fired up|Load weight end|"
    r"KV Cache is allocated|Capture cuda graph end|max_total_num_tokens"
)


def now() -> float:
    return time.monotonic()


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def start(py: str, arch: str, model: str, mode: str, port: int, log: Path, ready_s: float) -> tuple:
    args, env_extra = ARCH_ARGS[arch]
    argv = [
        py,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--port",
        str(port),
        *COMMON,
        *args,
        *MODE_ARGS[mode],
    ]
    env = dict(os.environ, **env_extra)
    t0 = now()
    f = log.open("w")
    f.write("argv: " + " ".join(argv) + "\nenv: " + json.dumps(env_extra) + "\n")
    f.flush()
    proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ready = None
    while now() - t0 < ready_s:
        if proc.poll() is not None:
            break
        if "The server is fired up and ready to roll" in log.read_text(errors="replace"):
            ready = now() - t0
            break
        time.sleep(0.5)
    return proc, ready, argv


def stop(proc) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(40):
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def greedy(port: int) -> list:
    out = []
    for p in PROMPTS:
        r = post(
            f"http://127.0.0.1:{port}/generate",
            {
                "text": p,
                "sampling_params": {"temperature": 0, "max_new_tokens": 32},
                "return_logprob": True,
                "top_logprobs_num": 5,
            },
        )
        meta = r["meta_info"]
        out.append(
            {
                "prompt": p,
                "ids": [t[1] for t in meta.get("output_token_logprobs", [])],
                "logprobs": [
                    round(t[0], 4) if t[0] is not None else None for t in meta.get("output_token_logprobs", [])
                ],
                "top5": [
                    [[round(x[0], 4), x[1]] for x in (step or [])] for step in meta.get("output_top_logprobs", [])
                ],
            }
        )
    return out


def bench(py: str, port: int, model: str, tag: str, logs: Path, in_len: int, out_len: int, n: int, conc: int) -> dict:
    path = logs / f"bench-{tag}.jsonl"
    argv = [
        py,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        "--tokenizer",
        model,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(in_len),
        "--random-output-len",
        str(out_len),
        "--random-range-ratio",
        "1",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--output-file",
        str(path),
        "--disable-tqdm",
        "--seed",
        "1",
    ]
    env = dict(os.environ, PYTHONPATH=os.environ.get("BENCH_STUB", "") + ":" + os.environ.get("PYTHONPATH", ""))
    t0 = now()
    pin = ["taskset", "-c", "0-3"] if shutil.which("taskset") else []
    proc = subprocess.run([*pin, *argv], capture_output=True, text=True, env=env, timeout=120)
    (logs / f"bench-{tag}.out").write_text(proc.stdout[-6000:] + "\n--stderr--\n" + proc.stderr[-6000:])
    res = {"rc": proc.returncode, "wall_s": round(now() - t0, 1)}
    if path.exists():
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if rows:
            r = rows[-1]
            for k in (
                "mean_ttft_ms",
                "median_ttft_ms",
                "p99_ttft_ms",
                "output_throughput",
                "input_throughput",
                "mean_itl_ms",
                "median_itl_ms",
                "mean_tpot_ms",
                "duration",
                "completed",
                "total_output_tokens",
                "total_input_tokens",
            ):
                if k in r:
                    res[k] = r[k]
    return res


def one_start(a, arch: str, model: str, mode: str, idx: int, logs: Path, ready_s: float) -> dict:
    tag = f"{idx:02d}-{arch}-{mode}"
    log = logs / f"server-{tag}.log"
    port = 30000 + idx * 7
    t0 = now()
    proc, ready, argv = start(a.python, arch, model, mode, port, log, ready_s)
    rec = {"idx": idx, "arch": arch, "mode": mode, "argv": argv[1:], "ready_s": round(ready, 1) if ready else None}
    try:
        if ready is None:
            rec["verdict"] = "exited" if proc.poll() is not None else "not-ready"
            rec["rc"] = proc.poll()
            return rec
        try:
            rec["greedy"] = greedy(port)
        except Exception as exc:
            rec["greedy_error"] = f"{type(exc).__name__}: {exc}"
        rec["ttft_1"] = bench(a.python, port, model, tag + "-ttft1", logs, 1024, 1, 16, 1)
        rec["decode_32"] = bench(a.python, port, model, tag + "-dec32", logs, 256, 128, 64, 32)
        rec["verdict"] = "served" if proc.poll() is None else "died-while-benched"
        return rec
    finally:
        stop(proc)
        text = log.read_text(errors="replace")
        rec["evidence"] = [ln[:300] for ln in text.splitlines() if EVIDENCE.search(ln)][-40:]
        rec["log_tail"] = text.splitlines()[-30:] if rec.get("verdict") != "served" else []
        rec["piecewise_captured"] = "Capture piecewise CUDA graph" in text
        rec["wall_s"] = round(now() - t0, 1)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--python", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", action="append", default=[], help="ARCH=PATH")
    p.add_argument("--budget-s", type=float, default=480)
    p.add_argument("--per-start-s", type=float, default=110, help="do not begin a start with less left")
    p.add_argument("--first-ready-s", type=float, default=600, help="readiness limit of each model's first start")
    p.add_argument("--ready-s", type=float, default=240, help="readiness limit of a later start")
    a = p.parse_args()
    models = dict(m.split("=", 1) for m in a.model)
    out = Path(a.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = now()
    summary = {"starts": [], "notes": []}

    def save():
        summary["elapsed_s"] = round(now() - t0, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))

    def left():
        return a.budget_s - (now() - t0)

    idx = 0
    arch = "glm5" if "glm5" in models else "dsv3"
    first = True
    order = ["baseline", "piecewise", "baseline", "piecewise"]
    served = {"baseline": 0, "piecewise": 0}
    while order and left() > a.per_start_s:
        ready_s = min(left() - 40, a.first_ready_s if first else a.ready_s)
        if ready_s < 60:
            break  # too little time left for a start to be ready: not a start that failed
        mode = order.pop(0)
        rec = one_start(a, arch, models[arch], mode, idx, logs, ready_s)
        idx += 1
        first = False
        summary["starts"].append(rec)
        save()
        print(
            json.dumps(
                {
                    k: rec.get(k)
                    for k in (
                        "idx",
                        "arch",
                        "mode",
                        "verdict",
                        "ready_s",
                        "wall_s",
                        "piecewise_captured",
                        "ttft_1",
                        "decode_32",
                    )
                }
            ),
            flush=True,
        )
        if rec["verdict"] == "served":
            served[mode] += 1
        elif arch == "glm5" and served["baseline"] == 0 and "dsv3" in models:
            summary["notes"].append(f"glm5 {mode} did not serve: switching to dsv3 (nearest architecture)")
            arch = "dsv3"
            first = True
            order = ["baseline", "piecewise", "baseline", "piecewise"]
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
