"""A real single-node Slurm (ci/services/slurm.sh) runs the cpu-smoke matrix as a job array, and the
merged store gives the same table as a local run of the same matrix.

The benchmark workload is cut down (the table's verdicts, not its numbers, are compared), and the
environments and the tiny model are the ones the other integration tests use (the shared test cache).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.store.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL_BENCH = """[bench]
concurrency = [2]
input_len = 8
output_len = 8
prompts_per_concurrency = 4
warmup = 1
repeats = 1
api = "chat"
"""


def submit(argv: list[str]) -> int:
    """`servematrix submit ...` as the command line runs it."""
    return main(["submit", *argv])


@pytest.fixture
def slurm() -> None:
    error = os.environ.get("SERVEMATRIX_SLURM_ERROR")
    if error:
        pytest.fail(error)
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        pytest.skip("no Slurm here: `source ci/services/slurm.sh` starts one (ci/test.sh does)")


def verdict_table(markdown: str) -> list[tuple[str, ...]]:
    """The table without its measured numbers: header, then the axes and verdict columns of each row,
    then each cell's line (id, axes, mode, verdict) and reproduce command."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines[start:]]
    table = table[: next((i for i, row in enumerate(table) if not lines[start + i].startswith("|")), len(table))]
    keep = [i for i, name in enumerate(table[0]) if "tok/s" not in name and " / " not in name]
    rows = sorted(tuple(row[i] for i in keep) for row in table[2:])
    cells = sorted((line,) for line in lines if line.startswith(("- `", "  - reproduce")))
    return [tuple(table[0][i] for i in keep), *rows, *cells]


def test_job_array_over_cpu_smoke_gives_the_local_table(slurm, smoke_project: Path, test_cache: Path, capsys):
    matrix = smoke_project / "matrix" / "cpu-smoke.toml"
    matrix.write_text(re.sub(r"(?ms)^\[bench\].*", SMALL_BENCH, matrix.read_text()))
    workdir = test_cache / "work"
    out = smoke_project / "slurm"

    started = time.monotonic()
    assert (
        submit(
            [
                "matrix/cpu-smoke.toml",
                "--slurm",
                "--backend",
                "venv",
                "--out",
                str(out),
                "--workdir",
                str(workdir),
                "--wait",
            ]
        )
        == 0
    )
    took = time.monotonic() - started
    printed = capsys.readouterr()
    job_ids = printed.out.split()
    assert len(job_ids) == 2, printed  # one array (one GPU kind), one merge job
    logs = sorted((out / "logs").iterdir())
    assert [p.name for p in logs if p.name.startswith("cpu-")] == ["cpu-0.out", "cpu-1.out"], printed.err
    print(f"job array + merge: {took:.0f} s", file=sys.stderr)

    with Store(out / "results.sqlite") as store:
        rows = store.all_rows()
    assert len(rows) == 4, [p.read_text()[-2000:] for p in logs]
    # Two tasks, two stores, two runs: both modes of an environment ran in the same task.
    assert len({r["run_id"] for r in rows}) == 2
    assert all(len({r["run_id"] for r in rows if r["env_id"] == e}) == 1 for e in {r["env_id"] for r in rows})
    assert {r["verdict"] for r in rows} == {"pass"}, [(r["cell_id"], r["verdict"], r["excerpt"]) for r in rows]

    local = smoke_project / "local"
    assert main(["run", "matrix/cpu-smoke.toml", "--backend", "venv", "--workdir", str(workdir), "--store", str(local / "r.sqlite"),
                 "--report", str(local / "compatibility.md")]) == 0  # fmt: skip
    slurm_table = (out / "compatibility.md").read_text()
    local_table = (local / "compatibility.md").read_text()
    assert verdict_table(slurm_table) == verdict_table(local_table)
    # The baseline passes with its answers stored; the other mode passes only with answers matching them.
    assert "| 5.24.0 | 2.9.1 | cpu | ✅ `pass (correctness: the baseline's 16 greedy answers stored" in slurm_table
    assert "✅ `pass (correctness: 16 greedy answers match the baseline's" in slurm_table
