"""The published page from a real cpu-smoke run, loaded in headless Chromium (Debian's `chromium` package).

The run is real (uv venvs, `transformers serve`, the benchmark client, SQLite) with a smaller workload than
the matrix's, to keep CI short. Chromium renders the page from disk (file://, no server, no network) and
shows that the table and the plots rendered (a screenshot, checked by its colours) and that the filters
work (the DOM after the page's script ran, for filters given in the query string).

`ci/services/chromium.sh` installs Chromium and exports SERVEMATRIX_CHROMIUM. Set
SERVEMATRIX_SCREENSHOT_DIR to keep the screenshot.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from servematrix.cli import main
from servematrix.report.site import build_report
from servematrix.store.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A smaller workload than the matrix's: two levels (the plot needs a line), two repeats (the spread).
REDUCED_BENCH = """[bench]
concurrency = [1, 4]
input_len = 8
output_len = 16
prompts_per_concurrency = 4
warmup = 1
repeats = 2
api = "chat"
"""
PASS_GREEN = (0x1A, 0x7F, 0x37)  # the pass badge (site.css --pass)
PLOT_BLUE = (0x1F, 0x77, 0xB4)  # matplotlib tab10: the first mode's line
PLOT_ORANGE = (0xFF, 0x7F, 0x0E)  # the second mode's line


def chromium() -> str:
    error = os.environ.get("SERVEMATRIX_CHROMIUM_ERROR")
    if error:
        pytest.fail(error)
    browser = os.environ.get("SERVEMATRIX_CHROMIUM") or shutil.which("chromium")
    if not browser:
        pytest.skip("no chromium here: `source ci/services/chromium.sh` installs it (ci/test.sh does)")
    return browser


def run_chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root: dict[str, str | None] = {}
        self.rows: list[dict[str, str | None]] = []
        self.shown: list[str | None] = []
        self.no_match: list[bool] = []  # per matrix: is its "no cell matches the filters" line shown
        self.matrix_totals: list[str | None] = []  # per matrix, in page order: its own count of cells
        self.sections: list[str | None] = []  # the matrices, in page order

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "html":
            self.root = values
        elif tag == "tr" and "data-cell" in values:
            self.rows.append(values)
        elif tag == "output":
            self.shown.append(values.get("data-shown"))
        elif tag == "p" and "no-match" in (values.get("class") or ""):
            self.no_match.append("hidden" not in values)
        elif tag == "p" and "matrix-counts" in (values.get("class") or ""):
            self.matrix_totals.append(values.get("data-matrix-total"))
        elif tag == "section" and "data-matrix" in values:
            self.sections.append(values.get("data-matrix"))


def dom_after_script(browser: str, profile: Path, page: Path, query: str) -> _Dom:
    done = run_chromium(browser, profile, "--virtual-time-budget=5000", "--dump-dom", page.as_uri() + query)
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
    dom = _Dom()
    dom.feed(done.stdout)
    assert dom.root.get("data-ready") == "1", "the page's script did not run"
    return dom


def visible(dom: _Dom) -> list[dict[str, str | None]]:
    return [r for r in dom.rows if "hidden" not in r]


def test_page_from_a_real_run_renders_and_filters_in_chromium(smoke_project: Path, test_cache: Path, tmp_path: Path):
    browser = chromium()
    matrix = smoke_project / "matrix" / "cpu-smoke.toml"
    matrix.write_text(re.sub(r"(?ms)^\[bench\].*", REDUCED_BENCH, matrix.read_text()))
    started = time.monotonic()
    args = [
        "run",
        "matrix/cpu-smoke.toml",
        "--backend",
        "venv",
        "--workdir",
        str(test_cache / "work"),
        "--store",
        "results.sqlite",
    ]
    assert main([*args, "--no-report"]) == 0
    run_seconds = time.monotonic() - started
    with Store(smoke_project / "results.sqlite") as store:
        rows = store.latest()
    assert len(rows) == 4 and {r["verdict"] for r in rows} == {"pass"}, [(r["cell_id"], r["verdict"]) for r in rows]

    site = smoke_project / "site"
    result = build_report(rows, site, baseline=site / "results" / "latest.json")
    assert {p.name for p in result.plots} == {"cpu-smoke-throughput.svg", "cpu-smoke-speedup.svg"}
    page = result.html
    cells = {r["cell_id"]: r for r in rows}
    static = {c for c, r in cells.items() if r["mode"] == "static"}
    assert len(static) == 2

    # The screenshot: the table's pass badges and both modes' plot lines are on it.
    shot = tmp_path / "compatibility.png"
    done = run_chromium(browser, tmp_path / "profile", "--window-size=1400,1400", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    keep = os.environ.get("SERVEMATRIX_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    import numpy
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1400, 1400)
        pixels = numpy.asarray(image.convert("RGB"), dtype=numpy.int16)
    # The table sits above the plots at this window size; the heatmap's greens must not count as badges.
    table, plots = pixels[:500], pixels[500:]
    counts = {
        name: int((numpy.abs(region - numpy.array(color)) <= 24).all(axis=-1).sum())
        for name, region, color in (
            ("pass badges", table, PASS_GREEN),
            ("first mode", plots, PLOT_BLUE),
            ("second mode", plots, PLOT_ORANGE),
        )
    }
    assert all(n > 200 for n in counts.values()), counts
    print(f"cpu-smoke run {run_seconds:.0f} s; screenshot {shot}; colour pixels {counts}")

    # No filter: every cell shows, and the browser decoded both plots.
    everything = dom_after_script(browser, tmp_path / "profile", page, "")
    assert {r["data-cell"] for r in visible(everything)} == set(cells)
    assert everything.root.get("data-plots") == "2/2"
    assert everything.shown == ["4"]

    # Filters from the query string: by mode, by axis and mode, by verdict.
    by_mode = dom_after_script(browser, tmp_path / "profile", page, "?mode=static")
    assert {r["data-cell"] for r in visible(by_mode)} == static
    assert all(r["data-mode"] == "continuous-batching" for r in by_mode.rows if "hidden" in r)
    assert by_mode.shown == ["2"]
    one = dom_after_script(browser, tmp_path / "profile", page, "?transformers=5.24.0&mode=continuous-batching")
    assert [(r["data-axis-transformers"], r["data-mode"]) for r in visible(one)] == [("5.24.0", "continuous-batching")]
    failed = dom_after_script(browser, tmp_path / "profile", page, "?verdict=fail")
    assert visible(failed) == [] and failed.shown == ["0"]
    # A filter that matches nothing says so in one line instead of an empty table (issue 27); it is hidden
    # while cells show.
    assert failed.no_match == [True] and everything.no_match == [False] and by_mode.no_match == [False]


def test_a_report_of_two_matrices_counts_each_and_explains_an_empty_heatmap(tmp_path: Path):
    # Issue 27: the report of two matrices, one measured, one only pre-flighted on a CPU (every cell skipped:
    # no GPU), in Chromium. Each matrix has counts of its own, the one run last leads, and the heatmap that
    # holds no number says why.
    from servematrix.store.store import Row
    from tests.unit.report.test_site import sglang_rows

    measured = [Row.of({**r.values, "finished_at": "2026-06-01T00:00:00+00:00"}) for r in sglang_rows()]
    cpu_only = [
        Row.of({**r.values, "cell_id": f"p{i}", "env_id": f"p-{r['env_id']}", "matrix": "matrix/preflight.toml",
                    "verdict": "skipped:no-gpu", "metrics": None, "finished_at": "2026-07-01T00:00:00+00:00"})
        for i, r in enumerate(sglang_rows())
    ]  # fmt: skip
    result = build_report([*measured, *cpu_only], tmp_path / "site", baseline=None, write_record=False)
    dom = dom_after_script(chromium(), tmp_path / "profile", result.html, "")
    assert dom.sections == ["matrix/preflight.toml", "matrix/synthetic-sglang.toml"]  # the newest first
    assert dom.matrix_totals == [str(len(cpu_only)), str(len(measured))]
    assert dom.shown == [str(len(cpu_only)), str(len(measured))]
    (empty,) = [p for p in result.plots if p.name == "preflight-speedup.svg"]
    assert "no square holds a measured speedup" in empty.read_text()
    (full,) = [p for p in result.plots if p.name == "synthetic-sglang-speedup.svg"]
    assert "no square holds a measured speedup" not in full.read_text()
