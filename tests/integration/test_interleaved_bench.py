"""Interleaved server starts on the real CPU engine: an environment's modes start in turn (static,
continuous-batching, static, continuous-batching), each cell's benchmark pools its starts' repeats, the
client's ceiling is measured on this host and recorded beside the figures. Before any figure, continuous
batching's greedy answers are checked against static's, for real (transformers serve gives no logprobs:
greedy text equality, at one stream and batched)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_two_interleaved_starts_per_mode(smoke_project):
    matrix = smoke_project / "matrix" / "cpu-smoke.toml"
    text = matrix.read_text()
    bench = text[text.index("[bench]") :]
    matrix.write_text(
        text.replace(
            bench,
            "[bench]\nconcurrency = [4]\ninput_len = 16\noutput_len = 16\nprompts_per_concurrency = 8\n"
            'warmup = 1\nrepeats = 2\napi = "chat"\n',
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "servematrix", "run", "matrix/cpu-smoke.toml", "--select", "transformers=5.24.0",
         "--backend", "venv", "--store", "s.sqlite", "--starts", "2"],  # the matrix says one start
        cwd=smoke_project, capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(smoke_project / "s.sqlite") as db:
        rows = db.execute("SELECT cell_id, mode, verdict, metrics, evidence, log_path FROM cell_runs").fetchall()
    assert sorted((mode, verdict) for _, mode, verdict, *_ in rows) == [
        ("continuous-batching", "pass"),
        ("static", "pass"),
    ]
    logs, evidences = {}, {}
    for cell_id, mode, _, metrics, evidence, log_path in rows:
        data = json.loads(metrics)
        evidences[mode] = json.loads(evidence)
        assert data["correctness"]["key"]["prompt_set"] == "greedy-v1"
        assert data["starts"] == 2
        (level,) = data["levels"]
        assert sorted({run["start"] for run in level["runs"]}) == [1, 2] and len(level["runs"]) == 4
        assert data["client_ceiling"]["levels"][0]["tok_s"] > 0  # measured on this host, beside every figure
        assert "server starts: 2, interleaved with the other modes" in json.loads(evidence)
        folder = (
            (smoke_project / log_path).parent
            if not log_path.startswith("/")
            else __import__("pathlib").Path(log_path).parent
        )
        logs[mode] = (folder / f"{cell_id}.log", folder / f"{cell_id}.start2.log")
    # Started in turn: each log was last written when its server stopped.
    assert set(json.loads(next(m for _, mode, _, m, *_ in rows if mode == "static"))["correctness"]["answers"]) == {
        "1",
        "4",
    }
    assert (
        "correctness: the baseline's 16 greedy answers stored (text only: the API gave no logprobs)"
        in evidences["static"]
    )
    assert (
        "correctness: 16 greedy answers match the baseline's (greedy text equality (the API gave no logprobs))"
        in evidences["continuous-batching"]
    )
    order = [logs["static"][0], logs["continuous-batching"][0], logs["static"][1], logs["continuous-batching"][1]]
    times = [path.stat().st_mtime for path in order]
    assert times == sorted(times)
