"""classify on a 20 MB log that is one line, against a 20 MB log of ordinary lines, both ending in a fatal
line. Lines are scanned in their first LINE_SCAN_MAX characters, so the single line should cost no more
than ordinary lines of the same size (before, it cost about 1 s per MB: 200 MB took 5 min 37 s).

A benchmark, not a timed assertion: `-s` shows both times and their ratio; the assertions only check that
both logs were classified.
"""

from __future__ import annotations

import time
from pathlib import Path

from servematrix.classify import classify_file

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
SIZE = 20 * 1024 * 1024
FATAL = (LOGS / "dynamo-untraceable-sglang-0.5.10.log").read_text(encoding="utf-8").split("\n")[21]


def _write_logs(tmp_path: Path) -> tuple[Path, Path]:
    single = tmp_path / "single-line.log"
    with single.open("wb") as out:
        out.write(b"[2026-01-01 10:00:00] server_args=ServerArgs(")
        block = b"model_path='nvidia/GLM-5-NVFP4', tp_size=8, " * 1024
        for _ in range(SIZE // len(block)):
            out.write(block)
        out.write(b")\n" + FATAL.encode() + b"\n")
    normal = tmp_path / "normal.log"
    ordinary = (LOGS / "benign-ready.log").read_bytes()
    with normal.open("wb") as out:
        for _ in range(SIZE // len(ordinary)):
            out.write(ordinary)
        out.write(FATAL.encode() + b"\n")
    return single, normal


def _seconds(path: Path) -> float:
    started = time.perf_counter()
    result = classify_file(path, "sglang", env={})
    elapsed = time.perf_counter() - started
    assert result["class"] == "dynamo-untraceable"
    return elapsed


def test_single_line_log_vs_normal_log(benchmark, tmp_path):
    single, normal = _write_logs(tmp_path)
    times: dict[str, float] = {}

    def both() -> None:
        times["single"] = min(times.get("single", float("inf")), _seconds(single))
        times["normal"] = min(times.get("normal", float("inf")), _seconds(normal))

    benchmark.pedantic(both, rounds=2, iterations=1)
    ratio = times["single"] / times["normal"]
    benchmark.extra_info.update(single_line_s=times["single"], normal_s=times["normal"], ratio=ratio)
    print(
        f"\nclassify 20 MB: one line {times['single']:.2f} s, ordinary lines {times['normal']:.2f} s "
        f"(ratio {ratio:.3f})"
    )
