"""`servematrix merge` when shards arrive twice or at the same time, as they do from CI artifacts and
Slurm array tasks: real processes, real SQLite files."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.store.store import COLUMNS, Store

pytestmark = [pytest.mark.integration]

ROWS_PER_SHARD = 3000

# Each child imports everything, says so, then waits for the start file: the merges overlap for real.
CHILD = """
import os, sys, time
from pathlib import Path
from servematrix.cli import main
start = Path(sys.argv[1])
(start.parent / f"ready-{os.getpid()}").touch()
while not start.exists():
    time.sleep(0.002)
sys.exit(main(["merge", *sys.argv[2:]]))
"""


def make_shard(path: Path, run_id: str, cells: range, verdict: str = "pass") -> Path:
    with Store(path) as store:
        for i in cells:
            store.record(
                run_id=run_id, cell_id=f"c{i:05d}", env_id=f"e{i // 2:05d}", engine="transformers",
                mode=("static", "continuous-batching")[i % 2], matrix="matrix/cpu-smoke.toml",
                axes={"transformers": "5.24.0", "gpu": "cpu"}, inputs_hash=f"h{i}", verdict=verdict,
                metrics={"levels": [{"concurrency": 2, "output_tok_s": {"median": float(i)}}]},
            )  # fmt: skip
    return path


def dump(path: Path) -> list[tuple]:
    """Every row, every column, in key order: what `merge` must leave alone or add to."""
    with Store(path) as store:
        rows = store.all_rows()
    return sorted(tuple(str(r[c]) for c in COLUMNS) for r in rows)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("shards")
    # Two tasks of one run (disjoint cells), and a second run that repeats some cells of the first.
    return [
        make_shard(root / "a.sqlite", "run-a", range(0, ROWS_PER_SHARD)),
        make_shard(root / "b.sqlite", "run-a", range(ROWS_PER_SHARD, 2 * ROWS_PER_SHARD)),
        make_shard(root / "c.sqlite", "run-c", range(ROWS_PER_SHARD // 2, 3 * ROWS_PER_SHARD // 2), "fail:cuda-oom"),
    ]


@pytest.fixture(scope="module")
def expected(shards) -> list[tuple]:
    return sorted({row for shard in shards for row in dump(shard)})


def test_merging_the_same_shard_twice_changes_nothing(tmp_path, shards, expected, capsys):
    out = tmp_path / "out.sqlite"
    assert main(["merge", str(out), *map(str, shards)]) == 0
    once = dump(out)
    assert once == expected
    capsys.readouterr()
    assert main(["merge", str(out), str(shards[0]), str(shards[0]), *map(str, shards)]) == 0
    assert dump(out) == once
    assert capsys.readouterr().err.count(": 0 new row(s)") == 2 + len(shards)
    # The table is the same too: the report reads the newest finished row of each cell.
    with Store(out) as store:
        latest = {r["cell_id"]: r["verdict"] for r in store.latest()}
    assert len(latest) == 2 * ROWS_PER_SHARD


@pytest.mark.parametrize("fresh", [True, False], ids=["into-a-new-store", "into-an-existing-store"])
def test_merges_at_the_same_time_lose_nothing(tmp_path, shards, expected, fresh):
    out = tmp_path / "out.sqlite"
    if not fresh:
        assert main(["merge", str(out), str(shards[2])]) == 0
    start = tmp_path / "go"
    # Two merges of different shards, and two of the same shard, all at once.
    jobs = [[shards[0]], [shards[1]], [shards[2], shards[0]], [shards[1], shards[2]]]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(start), str(out), *map(str, job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < len(children) and time.monotonic() < deadline:
        time.sleep(0.01)
    start.touch()
    results = [(c.wait(timeout=120), *c.communicate()) for c in children]
    assert [r[0] for r in results] == [0] * len(jobs), results
    assert dump(out) == expected
    # Each row was added exactly once, by one of the merges.
    added = sum(
        int(line.rsplit(": ", 1)[1].split()[0]) for r in results for line in r[2].splitlines() if "new row" in line
    )
    assert added == len(expected) - (ROWS_PER_SHARD if not fresh else 0)


def test_a_shard_merged_while_its_task_ran_is_completed_by_the_next_merge(tmp_path):
    """A shard merged early (someone peeks while the tasks run) and again when its task has ended."""
    row = {
        "run_id": "r1", "cell_id": "c1", "env_id": "e1", "engine": "transformers", "mode": "static",
        "matrix": "matrix/cpu-smoke.toml", "axes": {"transformers": "5.24.0", "gpu": "cpu"}, "inputs_hash": "h",
        "host": {"hostname": "node-1"}, "argv": ["python", "-m", "serve"],  # a running row says where and what
    }  # fmt: skip
    shard, out = tmp_path / "shard.sqlite", tmp_path / "out.sqlite"
    with Store(shard) as store:
        store.start(**row)
    assert main(["merge", str(out), str(shard)]) == 0
    with Store(shard) as store:
        store.finish("r1", "c1", verdict="pass")
    assert main(["merge", str(out), str(shard)]) == 0
    assert main(["merge", str(out), str(shard)]) == 0  # and then nothing changes any more
    assert dump(out) == dump(shard)
