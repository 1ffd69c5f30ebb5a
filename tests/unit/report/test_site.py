"""The published report from synthetic rows: markdown, HTML, plots, failure pages, the docs site build.

The rows are made up (no GPU run stands behind them) to cover what the CPU matrix cannot show: failures
with their classes, a predicted failure, a missing combination, crossed pins, a second GPU kind.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from servematrix.classify import load_signatures
from servematrix.engines import load_engine
from servematrix.report import markdown
from servematrix.report.plots import SQUARE_STYLES, speedup_heatmaps, throughput_plot, write_plots
from servematrix.report.regressions import load_export, published_rows
from servematrix.report.rows import comparison
from servematrix.report.site import build_report, failure_classes, prediction, render_html
from servematrix.store.store import Row
from tests.conftest import REPO

SGLANG = "matrix/synthetic-sglang.toml"


# What a passing mode's row stores once its greedy answers matched the baseline's (run/serving.py).
MATCHED = {"result": {"ok": True, "method": "top-k logprobs", "compared": 16}, "summary": "correctness: 16 match"}


def metrics(*levels: tuple[int, float, float, float]) -> dict[str, Any]:
    return {
        "model": "m",
        "correctness": MATCHED,
        "completion_tokens": 1000,
        "error_count": 0,
        "levels": [
            {
                "concurrency": c,
                "completion_tokens": 500,
                "error_count": 0,
                "output_tok_s": {"min": lo, "median": med, "max": hi},
                "request_s": {"min": 1.0, "median": 1.0, "max": 1.0},
                # one repeat of each of two server starts
                "runs": [{"repeat": 0, "start": 1, "output_tok_s": lo}, {"repeat": 0, "start": 2, "output_tok_s": hi}],
            }
            for c, lo, med, hi in levels
        ],
    }


def with_prefill(record: dict[str, Any], ttft_s: tuple[float, float], input_len: int = 1024) -> dict[str, Any]:
    """A record with a prefill profile at one stream: two repeats whose mean TTFT are `ttft_s`."""
    runs = [
        {"repeat": 0, "start": i + 1, "ttft": {"mean": t}, "input_tok_s": input_len / t} for i, t in enumerate(ttft_s)
    ]
    prefill = {
        "workload": {"input_len": input_len, "output_len": 1},
        "levels": [
            {
                "concurrency": 1,
                "runs": runs,
                "ttft_mean_s": {"min": min(ttft_s), "median": sum(ttft_s) / 2, "max": max(ttft_s)},
            }
        ],
    }
    return {**record, "prefill": prefill}


def row(
    cell: str,
    *,
    sglang: str,
    flashinfer: str,
    mode: str,
    verdict: str,
    gpu: str = "b200",
    tok: dict[str, Any] | None = None,
    **extra: Any,
) -> Row:
    values = {
        "run_id": "run-1",
        "cell_id": cell,
        "env_id": f"env-{sglang}-{flashinfer}-{gpu}",
        "engine": "sglang",
        "mode": mode,
        "matrix": SGLANG,
        "axes": {"sglang": sglang, "torch": "pinned", "flashinfer": flashinfer, "cuda": "13.0", "gpu": gpu},
        "inputs_hash": "h",
        "status": "finished",
        "verdict": verdict,
        "excerpt": "",
        "evidence": [],
        "metrics": tok,
        "argv": ["python", "-m", "sglang.launch_server", "--model-path", "/models/glm5", "--port", "30000"],
        "lock_hash": "ab" * 32,
        "lock_file": "matrix/locks/x.lock.txt",
        "crossed_pins": {},
        "image_digest": "sha256:" + "cd" * 32,
        "host": {
            "hostname": "gpu-1",
            "cpu": "Xeon",
            "cpus": 96,
            "os": "Linux",
            "gpu_sku": "NVIDIA B200",
            "gpus": [{}] * 8,
            "driver": "580.65",
        },
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:10:00+00:00",
        **extra,
    }
    return Row.of(values)


DYNAMO_EXCERPT = (
    '  File "flashinfer/fp4_quantization.py", line 80, in get_fp4_quantization_module\n'
    "torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped"
)


def sglang_rows() -> list[Row]:
    return [
        row("a1", sglang="0.5.9", flashinfer="pinned", mode="baseline", verdict="pass",
            tok=metrics((1, 90, 100, 110), (64, 1800, 2000, 2100))),
        row("a2", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="fail:dynamo-untraceable",
            evidence=["flashinfer fp4 JIT"], excerpt=DYNAMO_EXCERPT),
        row("b1", sglang="0.5.9", flashinfer="0.6.12", mode="baseline", verdict="pass",
            tok=metrics((1, 95, 100, 105), (64, 1900, 2000, 2050)), crossed_pins={"flashinfer-python": "0.6.12"}),
        row("b2", sglang="0.5.9", flashinfer="0.6.12", mode="piecewise", verdict="predicted-fail:dynamo-untraceable",
            excerpt="probe: fp4_quantize does not trace under torch 2.9.1 + flashinfer 0.6.12"),
        row("c1", sglang="0.5.12", flashinfer="pinned", mode="baseline", verdict="pass",
            tok=with_prefill(metrics((1, 100, 110, 120), (64, 2000, 2100, 2200)), (0.050, 0.052))),
        row("c2", sglang="0.5.12", flashinfer="pinned", mode="piecewise", verdict="pass",
            tok=with_prefill(metrics((1, 120, 130, 140), (64, 2400, 2520, 2600)), (0.040, 0.041))),
        # 0.5.12 with flashinfer 0.6.12 was not run: the heatmap must show a gap, not crash.
        row("d1", sglang="0.5.12", flashinfer="pinned", mode="baseline", verdict="skipped:no-gpu", gpu="rtx-pro-6000",
            excerpt="needs 8x sm_120"),
        row("d2", sglang="0.5.12", flashinfer="pinned", mode="piecewise", verdict="skipped:no-gpu", gpu="rtx-pro-6000",
            excerpt="needs 8x sm_120"),
    ]  # fmt: skip


class _Page(HTMLParser):
    """Collects the table rows (their data attributes) and the images of the page."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str | None]] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "tr" and "data-cell" in values:
            self.rows.append(values)
        if tag == "img":
            self.images.append(values.get("src") or "")
        if tag == "a":
            self.links.append(values.get("href") or "")
        for name in ("src", "href"):
            if re.match(r"(?i)^(https?:)?//", values.get(name) or ""):
                self.external.append(values[name] or "")


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def test_report_writes_every_part(tmp_path: Path):
    result = build_report(sglang_rows(), tmp_path, baseline=None)
    assert result.markdown == tmp_path / "compatibility.md"
    assert result.html == tmp_path / "compatibility.html"
    assert result.results == tmp_path / "results" / "latest.json"
    assert {p.name for p in result.plots} == {"synthetic-sglang-throughput.svg", "synthetic-sglang-speedup.svg"}
    assert result.regressions == () and result.baseline is None
    pages = {p.name for p in result.failure_pages}
    signature_ids = {s.id for s in load_signatures("sglang")} | {s.id for s in load_signatures("transformers")}
    assert pages == {f"{cls}.md" for cls in signature_ids} | {"index.md"}


def test_markdown_links_each_failed_cell_to_its_class_page(tmp_path: Path):
    build_report(sglang_rows(), tmp_path, baseline=None)
    text = (tmp_path / "compatibility.md").read_text()
    assert "❌ [`fail:dynamo-untraceable (flashinfer fp4 JIT)`](failures/dynamo-untraceable.md)" in text
    assert "⚠️ [`predicted-fail:dynamo-untraceable`](failures/dynamo-untraceable.md)" in text
    assert "✅ `pass`" in text
    assert "(crosses pin)" in text  # flashinfer 0.6.12 crosses 0.5.9's pin
    assert "![synthetic-sglang: output tok/s against concurrency](plots/synthetic-sglang-throughput.svg)" in text
    assert "[the interactive table](compatibility.html)" in text
    # Environments in version order: 0.5.9 before 0.5.12, pinned before 0.6.12.
    order = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| 0.5.")]
    assert order == ["0.5.9", "0.5.9", "0.5.12", "0.5.12"]
    # piecewise changes prefill: judged on TTFT at one stream (0.051 / 0.0405 s), its t-interval over the
    # server starts; the decode figures beside it, with the starts an indeterminate one would need.
    assert "**1.26×** TTFT @1, 1024 in (1.12–1.42, faster)" in text
    assert (
        "1.19× decode tok/s @64 (0.90–1.57, indeterminate: interval holds 1.0; ~8 starts per mode (6 more) would "
        "likely resolve a 10% effect)" in text
    )
    assert "piecewise / baseline: TTFT @1, 1024 in" in text and "baseline TTFT ms @1, 1024 in" in text


def test_plain_markdown_write_is_unchanged(tmp_path: Path):
    """`write(rows, out)` alone: no links to pages that were not written, no plots, same columns."""
    out = markdown.write(sglang_rows(), tmp_path / "table.md")
    text = out.read_text()
    assert "failures/" not in text and "plots/" not in text and "compatibility.html" not in text
    assert "❌ `fail:dynamo-untraceable (flashinfer fp4 JIT)`" in text
    assert "- reproduce: `servematrix run matrix/synthetic-sglang.toml --select id=a2 --rerun`" in text


def test_failure_page_has_the_signature_text_and_the_cells(tmp_path: Path):
    build_report(sglang_rows(), tmp_path, baseline=None)
    page = (tmp_path / "failures" / "dynamo-untraceable.md").read_text()
    signature = load_signatures("sglang").get("dynamo-untraceable")
    assert signature is not None
    assert page.startswith("<!-- generated")
    assert f"# `dynamo-untraceable`: {signature.title}" in page
    assert signature.explanation.strip() in page
    assert signature.workaround.strip() in page
    assert "`flashinfer fp4 JIT`, `flashinfer JIT build_and_load`" in page  # the template's own text kept as is
    assert "[`a2`](../compatibility.html#cell-a2)" in page
    assert "[`b2`](../compatibility.html#cell-b2)" in page
    assert "Attempted to call function marked as skipped" in page
    # A class two engines define shows both engines' texts.
    shared = (tmp_path / "failures" / "unknown-flag.md").read_text()
    assert "## sglang" in shared and "## transformers" in shared
    assert "None in the current results." in shared
    index = (tmp_path / "failures" / "index.md").read_text()
    assert "| [`dynamo-untraceable`](dynamo-untraceable.md) |" in index and "| 2 |" in index


def test_a_class_without_signature_data_gets_an_honest_page(tmp_path: Path):
    rows = [*sglang_rows(), row("e1", sglang="0.5.12", flashinfer="0.6.12", mode="baseline", verdict="fail:build")]
    result = build_report(rows, tmp_path, baseline=None)
    assert tmp_path / "failures" / "build.md" in result.failure_pages
    page = (tmp_path / "failures" / "build.md").read_text()
    assert "no signature data describes it yet" in page and "[`e1`]" in page
    assert "[`fail:build`](failures/build.md)" in (tmp_path / "compatibility.md").read_text()
    assert "build" in failure_classes(rows)
    # Stale pages go when their class does.
    build_report(sglang_rows(), tmp_path, baseline=None)
    assert not (tmp_path / "failures" / "build.md").exists()


def test_html_is_self_contained_and_carries_every_cell(tmp_path: Path):
    build_report(sglang_rows(), tmp_path, baseline=None)
    html = (tmp_path / "compatibility.html").read_text()
    page = parse(html)
    assert not page.external, page.external  # no CDN, no server
    assert "<script src" not in html and "<link" not in html
    assert [r["data-cell"] for r in page.rows] == ["a1", "a2", "b1", "b2", "c1", "c2", "d1", "d2"]
    by_id = {r["data-cell"]: r for r in page.rows}
    assert by_id["a2"]["data-verdict"] == "fail" and by_id["b2"]["data-verdict"] == "predicted-fail"
    assert by_id["a1"]["data-axis-sglang"] == "0.5.9" and by_id["a1"]["data-mode"] == "baseline"
    assert len(page.images) == 2 and all(src.startswith("data:image/svg+xml;base64,") for src in page.images)
    # Failed cells link to the class explanation inside the page.
    assert "#class-dynamo-untraceable" in page.links
    assert 'id="class-dynamo-untraceable"' in html
    assert load_signatures("sglang").get("dynamo-untraceable").workaround.strip()[:60] in html  # type: ignore[union-attr]
    # The reproduce block: command, server argv, lock, image, host, driver, GPU.
    for text in (
        "servematrix run matrix/synthetic-sglang.toml --select id=a2 --rerun",
        "python -m sglang.launch_server --model-path /models/glm5 --port 30000",
        "ab" * 32,
        "sha256:" + "cd" * 32,
        "gpu-1",
        "8× NVIDIA B200 · driver 580.65",
    ):
        assert text in html, text
    assert "1.26×" in html and "TTFT @1, 1024 in (1.12–1.42, faster)" in html
    # Predicted against observed.
    predicted = re.search(r'<span class="pred pred-predicted"[^>]*>\s*(.*?)\s*</span>', html, re.S)
    assert predicted and re.sub(r"\s+", " ", predicted.group(1)) == "<code>fail:dynamo-untraceable</code> / not run"
    assert 'class="pred pred-observed"' in html


def test_predicted_versus_observed():
    observed = row("x", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="fail:dynamo-untraceable")
    assert prediction(observed) == {"predicted": "", "observed": "fail:dynamo-untraceable", "status": "observed"}
    predicted = row(
        "x", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="predicted-fail:dynamo-untraceable"
    )
    assert prediction(predicted)["status"] == "predicted"  # type: ignore[index]
    # A row that carries both (a future `prediction` field): agreeing and disagreeing.
    both = row("x", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="fail:dynamo-untraceable",
               prediction="predicted-fail:dynamo-untraceable")  # fmt: skip
    assert prediction(both)["status"] == "confirmed"  # type: ignore[index]
    wrong = row("x", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="pass",
                prediction="predicted-fail:dynamo-untraceable")  # fmt: skip
    assert prediction(wrong)["status"] == "missed"  # type: ignore[index]
    skipped = row("x", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="skipped:no-gpu")
    assert prediction(skipped) is None


def test_html_of_no_rows_says_so():
    html = render_html([])
    assert "No results yet" in html


def _svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(t.itertext()).strip() for t in root.iter("{http://www.w3.org/2000/svg}text")]


def test_heatmap_marks_failed_missing_and_measured_squares(tmp_path: Path):
    (plot,) = speedup_heatmaps(SGLANG, sglang_rows(), tmp_path)
    assert plot is not None and plot.path.name == "synthetic-sglang-speedup.svg"
    texts = _svg_texts(plot.path)
    assert "1.26×" in texts  # 0.5.12 / pinned on b200: TTFT at one stream
    assert "synthetic-sglang: piecewise / baseline speedup" in texts
    joined = " ".join(texts)  # a label's lines are separate text elements
    # 0.5.9: an observed failure (pinned flashinfer) and a CPU prediction (0.6.12), each said as what it is.
    assert joined.count("piecewise fails") == 1 and joined.count("piecewise predicted to fail") == 1
    assert "—" in texts  # 0.5.12 with flashinfer 0.6.12: not run
    assert "no GPU" in texts and "n/a" not in joined  # rtx-pro-6000: the host had no such GPU
    assert "gpu b200" in texts and "gpu rtx-pro-6000" in texts
    assert "sglang" in texts and "flashinfer" in texts
    assert "unchecked" not in texts  # every measured mode's answers matched its baseline's
    # the same figures from rows measured before the correctness check: the ratio, marked as no verdict
    (old,) = speedup_heatmaps(SGLANG, [_without_correctness(r) for r in sglang_rows()], tmp_path / "old")
    old_texts = _svg_texts(old.path)
    assert "1.26×" in old_texts and "unchecked" in old_texts


def test_throughput_plot_has_a_panel_per_measured_environment(tmp_path: Path):
    plot = throughput_plot(SGLANG, sglang_rows(), tmp_path)
    assert plot is not None
    texts = _svg_texts(plot.path)
    panels = [t for t in texts if t.startswith("sglang ")]
    assert panels == [
        "sglang 0.5.9 · flashinfer pinned · gpu b200",
        "sglang 0.5.9 · flashinfer 0.6.12 · gpu b200",
        "sglang 0.5.12 · flashinfer pinned · gpu b200",
    ]
    assert "baseline" in texts and "piecewise" in texts


def test_plots_are_deterministic_and_skip_matrices_with_nothing_to_draw(tmp_path: Path):
    first = write_plots(sglang_rows(), tmp_path / "a")
    second = write_plots(sglang_rows(), tmp_path / "b")
    assert [p.path.read_bytes() for p in first] == [p.path.read_bytes() for p in second]
    nothing = [r for r in sglang_rows() if r["verdict"].startswith("skipped")]
    assert [p.kind for p in write_plots(nothing, tmp_path / "c")] == ["speedup"]  # only "no GPU" squares


def test_transformers_heatmap_uses_transformers_by_torch(tmp_path: Path):
    rows = [
        Row.of({**r.values, "engine": "transformers", "matrix": "matrix/cpu.toml",
                    "axes": {"transformers": t, "torch": "2.9.1", "gpu": "cpu"}, "env_id": f"e{t}",
                    "mode": {"baseline": "static", "piecewise": "continuous-batching"}[r["mode"]]})
        for r, t in ((sglang_rows()[4], "5.5.4"), (sglang_rows()[5], "5.5.4"))
    ]  # fmt: skip
    (plot,) = speedup_heatmaps("matrix/cpu.toml", rows, tmp_path)
    assert plot is not None
    texts = _svg_texts(plot.path)
    assert "transformers" in texts and "torch" in texts and "1.19×" in texts  # decode: output tok/s @64


def test_report_renders_again_from_the_published_record_alone(tmp_path: Path):
    """The docs build needs no store: the JSON export holds what the page shows."""
    first = build_report(sglang_rows(), tmp_path / "a", baseline=None)
    export = load_export(first.results)
    assert export is not None
    again = build_report(published_rows(export), tmp_path / "b", baseline=None)
    assert again.markdown.read_text() == first.markdown.read_text()
    assert again.html.read_text() == first.html.read_text()


@pytest.mark.slow
def test_mkdocs_builds_the_site_strictly(tmp_path: Path):
    """mkdocs.yml + docs/ + a generated report build with --strict (broken links and nav entries fail)."""
    pytest.importorskip("material", reason="mkdocs-material is not installed (nox -s docs installs it)")
    site = tmp_path / "project"
    shutil.copytree(REPO / "docs", site / "docs", ignore=shutil.ignore_patterns("compatibility.*", "plots"))
    shutil.copy(REPO / "mkdocs.yml", site / "mkdocs.yml")
    build_report(sglang_rows(), site / "docs", baseline=site / "docs" / "results" / "latest.json")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=site,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = tmp_path / "site"
    assert (built / "compatibility.html").is_file()  # the static page, copied as is
    assert (built / "compatibility" / "index.html").is_file()
    assert (built / "failures" / "dynamo-untraceable" / "index.html").is_file()
    assert (built / "plots" / "synthetic-sglang-speedup.svg").is_file()


# ------------------------------------------------------------------------- why a cell has no speedup


def pair_rows() -> list[Row]:
    """One environment per reason a piecewise speedup can be missing, on one heatmap."""
    tok = metrics((1, 90, 100, 110))
    cases = [
        ("u", "0.5.9", "pinned", "b200", "unresolvable", "unresolvable"),
        ("bf", "0.5.9", "0.6.12", "b200", "fail:cuda-oom", "fail:dynamo-untraceable"),
        ("pr", "0.5.12", "pinned", "b200", "skipped:no-gpu", "predicted-fail:dynamo-untraceable"),
        ("pf", "0.5.12", "0.6.12", "b200", "pass", "fail:dynamo-untraceable"),
        ("na", "0.5.23", "pinned", "b200", "pass", "skipped:not-applicable"),
        ("er", "0.5.23", "0.6.12", "b200", "pass", "error:harness"),
        ("it", "0.5.15", "0.6.12", "b200", "pass", "interrupted"),
        ("ng", "0.5.12", "pinned", "rtx-pro-6000", "skipped:no-gpu", "skipped:no-gpu"),
    ]
    rows = []
    for cell, sglang, flashinfer, gpu, first, second in cases:
        for mode, verdict in (("baseline", first), ("piecewise", second)):
            rows.append(
                row(f"{cell}-{mode}", sglang=sglang, flashinfer=flashinfer, gpu=gpu, mode=mode, verdict=verdict,
                    tok=tok if verdict == "pass" else None)
            )  # fmt: skip
    return rows


EXPECTED_REASONS = {
    "u": "unresolvable",
    "bf": "both fail",
    "pr": "piecewise predicted to fail",
    "pf": "piecewise fails",
    "na": "n/a (mode not in version)",
    "er": "harness error",
    "it": "interrupted (runs again)",
    "ng": "no GPU",
}


def test_each_reason_for_a_missing_speedup_has_its_own_label():
    rows = {r["cell_id"]: r for r in pair_rows()}
    for cell, expected in EXPECTED_REASONS.items():
        first, second = rows[f"{cell}-baseline"], rows[f"{cell}-piecewise"]
        assert comparison(load_engine("sglang"), first, second) is None
        assert markdown.no_speedup_text(markdown.no_speedup(first, second), "baseline", "piecewise") == expected
    assert set(SQUARE_STYLES) == set(markdown.NO_SPEEDUP)  # every reason has a square style


def test_markdown_and_html_say_why_there_is_no_speedup(tmp_path: Path):
    build_report(pair_rows(), tmp_path, baseline=None, write_record=False)
    table = (tmp_path / "compatibility.md").read_text()
    column = {line.split("|")[1].strip() + "/" + line.split("|")[3].strip() + "/" + line.split("|")[5].strip():
              line.rstrip(" |").rsplit("|", 2)[-2].strip()
              for line in table.splitlines() if line.startswith("| 0.5.")}  # fmt: skip
    assert column == {
        "0.5.9/pinned/b200": "— unresolvable",
        "0.5.9/0.6.12/b200": "— both fail",
        "0.5.12/pinned/b200": "— piecewise predicted to fail",
        "0.5.12/0.6.12/b200": "— piecewise fails",
        "0.5.12/pinned/rtx-pro-6000": "— no GPU",
        "0.5.23/pinned/b200": "— n/a (mode not in version)",
        "0.5.23/0.6.12/b200": "— harness error",
        "0.5.15/0.6.12/b200": "— interrupted (runs again)",
    }
    html = (tmp_path / "compatibility.html").read_text()
    for reason in EXPECTED_REASONS.values():
        assert f'<small class="no-speedup">{reason}</small>' in html, reason


def test_heatmap_tells_observed_failures_from_predictions_and_skips(tmp_path: Path):
    (plot,) = speedup_heatmaps(SGLANG, pair_rows(), tmp_path)
    assert plot is not None
    joined = " ".join(_svg_texts(plot.path))
    for reason in EXPECTED_REASONS.values():
        assert joined.count(reason) == 1, (reason, joined)
    svg = plot.path.read_text()
    # Observed and predicted failures are drawn differently (face colour and hatch), not just labelled so.
    observed, predicted = SQUARE_STYLES["second-fails"], SQUARE_STYLES["predicted"]
    assert observed != predicted
    assert observed[0] in svg and predicted[0] in svg  # the squares' faces (hatched ones as pattern fills)


# ------------------------------------------------------------------------------- markup stays text

EVIL_GPU = "<script>alert(1)</script>"
EVIL_MATRIX = "matrix/<img src=x onerror=alert(2)>.toml"
EVIL_EXCERPT = "Traceback\n<b>bold</b> <script>alert(3)</script> | `tick` [x](javascript:alert(4)) <img src=y>"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _live_markup(html: str, *, own_scripts: int = 0, own_handlers: int = 0) -> list[str]:
    """What in `html` would act: script elements and event handlers beyond the page's own, javascript: links,
    and the tags the attack used."""
    page = _Tags()
    page.feed(html)
    found = [f"<{tag}>" for tag, _ in page.tags if tag in ("b", "svg", "iframe")]
    found += [  # the report's own images: the plots, inline or as files
        f"<img src={a.get('src')}>"
        for tag, a in page.tags
        if tag == "img" and not re.fullmatch(r"data:image/svg\+xml;base64,.*|plots/[\w.-]+\.svg", a.get("src") or "")
    ]
    handlers = [f"{tag} {k}" for tag, a in page.tags for k in a if k.startswith("on")]
    if len(handlers) != own_handlers:
        found += handlers
    found += [f"{tag} href" for tag, a in page.tags if "javascript:" in (a.get("href") or "")]
    scripts = sum(1 for tag, _ in page.tags if tag == "script")
    if scripts != own_scripts:
        found.append(f"{scripts} script element(s)")
    return found


def _visible_text(html: str) -> str:
    page = _Tags()
    page.feed(html)
    return "".join(page.text)


def _site_markdown(text: str) -> str:
    """Markdown rendered as the docs site renders it (mkdocs.yml's extensions)."""
    md = pytest.importorskip("markdown")
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    extensions = [e if isinstance(e, str) else next(iter(e)) for e in config["markdown_extensions"]]
    return md.markdown(text, extensions=extensions)


def test_markup_in_merged_rows_stays_text_on_every_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A GPU kind, a matrix file name and a log excerpt carrying markup: refused by `merge`, and escaped in
    the HTML page, the Markdown pages (as mkdocs renders them) and the SVGs. A failure class that is not a plain
    name names no page file."""
    from servematrix.cli import main
    from servematrix.store.store import Store

    monkeypatch.chdir(tmp_path)
    evil = {"axes": {"sglang": "0.5.9", "torch": "pinned", "flashinfer": "pinned", "cuda": "13.0", "gpu": EVIL_GPU},
            "matrix": EVIL_MATRIX, "excerpt": EVIL_EXCERPT, "evidence": ["<b>evidence</b>"],
            "host": {"cpu": "<b>cpu</b>", "gpu_sku": EVIL_GPU, "driver": "<b>1</b>"}}  # fmt: skip
    rows = [
        row("e1", sglang="0.5.9", flashinfer="pinned", mode="baseline", verdict="pass",
            tok=metrics((1, 90, 100, 110), (4, 300, 320, 330)), **evil),
        row("e2", sglang="0.5.9", flashinfer="pinned", mode="piecewise", verdict="fail:dynamo-untraceable", **evil),
        row("e3", sglang="0.5.9", flashinfer="0.6.12", mode="baseline", verdict="fail:<svg onload=alert(5)>",
            **{**evil, "axes": {**evil["axes"], "flashinfer": "0.6.12"}}),
        row("e4", sglang="0.5.9", flashinfer="0.6.12", mode="piecewise", verdict="fail:../../../outside",
            **{**evil, "axes": {**evil["axes"], "flashinfer": "0.6.12"}}),
    ]  # fmt: skip
    # Names with markup are refused where they enter (a merge, a read, a published record); what is rendered
    # is escaped all the same, which is what this test checks, so the rows go to the report directly.
    with Store(tmp_path / "shard.sqlite") as shard:
        for r in rows:
            shard.record(**{k: v for k, v in r.values.items() if k != "status"})
    assert main(["merge", "merged.sqlite", "shard.sqlite"]) == 2
    assert not (tmp_path / "merged.sqlite").exists()
    site = tmp_path / "site" / "docs"
    build_report(rows, site, baseline=None, write_record=False)

    html = (site / "compatibility.html").read_text()
    assert _live_markup(html, own_scripts=1, own_handlers=1) == []  # its script, and its filter form's onsubmit
    shown = _visible_text(html)
    assert EVIL_GPU in shown and "<b>bold</b> <script>alert(3)</script>" in shown and EVIL_MATRIX in shown

    pages = [site / "compatibility.md", *sorted((site / "failures").glob("*.md"))]
    for page in pages:
        rendered = _site_markdown(page.read_text())
        assert _live_markup(rendered) == [], page.name
    table = _site_markdown((site / "compatibility.md").read_text())
    assert EVIL_GPU in _visible_text(table) and EVIL_MATRIX in _visible_text(table)
    assert "<b>bold</b> <script>alert(3)</script>" in _visible_text(table)  # the excerpt's line, as text
    failure = _site_markdown((site / "failures" / "dynamo-untraceable.md").read_text())
    assert "<b>bold</b> <script>alert(3)</script> | `tick`" in _visible_text(failure)

    # Class names that are not plain names get no page: nothing written outside failures/, no odd file names.
    assert not (tmp_path / "outside.md").exists() and not (tmp_path / "site" / "outside.md").exists()
    assert all(re.fullmatch(r"[a-z0-9.-]+\.md", p.name) for p in (site / "failures").glob("[!.]*"))
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.svg", p.name) for p in (site / "plots").glob("[!.]*"))

    for svg in (site / "plots").glob("*.svg"):
        tags = {el.tag.rsplit("}", 1)[-1] for el in ET.parse(svg).getroot().iter()}
        assert not tags & {"script", "img", "b", "foreignObject"}, (svg.name, tags)
    heatmap = next((site / "plots").glob("*-speedup.svg"))
    assert f"gpu {EVIL_GPU}" in _svg_texts(heatmap)  # shown as the text it is


def test_recommend_shows_the_prefill_figures_a_mode_is_judged_on():
    from servematrix.report.recommend import recommend

    (b200,) = [r for r in recommend(sglang_rows()) if r.gpu == "b200"]
    piecewise = next(s for s in b200.stacks if s.cell_id == "c2")
    assert piecewise.ttft_ms == pytest.approx(40.5) and piecewise.ttft_concurrency == 1
    assert piecewise.versus_baseline == "1.26× TTFT @1, 1024 in (1.12–1.42, faster) over baseline"
    baseline = next(s for s in b200.stacks if s.cell_id == "c1")
    assert baseline.versus_baseline is None and baseline.ttft_ms == pytest.approx(51.0)


def test_a_longer_ttft_beyond_the_noise_is_a_regression():
    from servematrix.report.regressions import detect_regressions, export_results

    before = sglang_rows()
    slower = [
        Row.of({**r.values, "run_id": "run-2", "metrics": with_prefill(r["metrics"], (0.060, 0.061))})
        if r["cell_id"] == "c2" else r
        for r in before
    ]  # fmt: skip
    export = export_results(before)
    found = detect_regressions(slower, export)
    (ttft,) = [r for r in found if r.kind == "ttft"]
    assert ttft.cell_id == "c2" and ttft.concurrency == 1
    assert "TTFT @1 40.5 -> 60.5 ms" in ttft.reason
    assert not [r for r in detect_regressions(before, export) if r.kind == "ttft"]  # the same run: none


def test_each_matrix_has_its_own_counts_and_the_one_run_last_leads(tmp_path: Path):
    # Two matrices in one report (issue 27): the badges of one never mix with the other's, and the matrix
    # whose cells finished last comes first, in the table and on the page.
    older = [Row.of({**r.values, "finished_at": "2025-01-01T00:00:00+00:00"}) for r in sglang_rows()]
    newer = [
        Row.of({**r.values, "cell_id": f"t{i}", "matrix": "matrix/other.toml", "env_id": f"o{i}",
                    "finished_at": "2026-06-01T00:00:00+00:00"})
        for i, r in enumerate(sglang_rows()[4:6])
    ]  # fmt: skip
    table = markdown.render([*older, *newer])
    assert table.index("## `matrix/other.toml`") < table.index("## `matrix/synthetic-sglang.toml`")
    assert "2 cell(s) of this matrix: 2 pass." in table
    html = render_html([*older, *newer])
    assert html.index('data-matrix="matrix/other.toml"') < html.index('data-matrix="matrix/synthetic-sglang.toml"')
    assert '<p class="summary matrix-counts" data-matrix-total="2">2 cell(s) of this matrix:' in html
    assert "8 cell(s) of this matrix:" in html and "in 2 matrices, the most recently run first" in html
    assert '<p class="no-match" hidden>No cell of this matrix matches the filters' in html


def _without_correctness(row_: Row) -> Row:
    metrics_ = {k: v for k, v in (row_.get("metrics") or {}).items() if k != "correctness"}
    return Row.of({**row_.values, "metrics": metrics_})


def test_a_pass_measured_before_the_correctness_check_is_not_judged_and_says_so(tmp_path: Path):
    engine = load_engine("sglang")
    rows = {r["cell_id"]: r for r in sglang_rows()}
    checked = comparison(engine, rows["c1"], rows["c2"])
    assert checked is not None and checked.headline is not None
    assert "output not checked" not in checked.headline.range_text
    # the same figures from rows stored before servematrix checked answers: shown, never called faster
    old = {cid: _without_correctness(r) for cid, r in rows.items()}
    unchecked = comparison(engine, old["c1"], old["c2"])
    assert unchecked is not None and unchecked.headline is not None
    assert unchecked.headline.ratio == checked.headline.ratio
    assert unchecked.headline.verdict == "indeterminate"
    assert "indeterminate: output not checked against the baseline" in unchecked.headline.range_text
    # a mode checked against no baseline answers is not judged either
    no_base = Row.of(
        {
            **rows["c2"].values,
            "metrics": {
                **rows["c2"]["metrics"],
                "correctness": {
                    "summary": "correctness: unchecked, no baseline answers for this environment, model and prompt set"
                },
            },
        }
    )
    found = comparison(engine, rows["c1"], no_base)
    assert found is not None and found.headline is not None
    assert "no baseline answers" in found.headline.range_text  # fmt: skip
    report = build_report(list(old.values()), tmp_path, baseline=None)
    text_ = report.markdown.read_text()
    assert "✅ `pass (correctness: not checked (measured before servematrix checked answers))`" in text_
    assert "faster" not in text_


def test_the_published_record_keeps_each_modes_correctness_and_capture_times_not_its_answers(tmp_path: Path):
    rows = sglang_rows()
    at = next(i for i, r in enumerate(rows) if r.cell_id == "c2")
    c2 = rows[at]
    rows[at] = c2.replace(
        metrics={
            **(c2.metrics or {}),
            "correctness": {**MATCHED, "answers": {"1": [{"tokens": ["a"], "top": []}]}},
            "capture_s": {"piecewise CUDA graph": 6.8},
            "capture_s_by_start": [{"piecewise CUDA graph": 6.8, "cuda graph": 64.5}, {"piecewise CUDA graph": 8.3}],
        }
    )
    first = build_report(rows, tmp_path / "a", baseline=None)
    export = load_export(first.results)
    assert export is not None
    published = export["cells"]["c2"]["metrics"]
    assert published["correctness"] == MATCHED  # the verdict, not the answers (those stay in the store)
    assert published["capture_s_by_start"][1] == {"piecewise CUDA graph": 8.3}
    text_ = first.markdown.read_text()
    assert "  - correctness: 16 match" in text_
    assert "  - graph capture, s per server start: cuda graph 64.5; piecewise CUDA graph 6.8, 8.3" in text_
    html = first.html.read_text()
    assert "<dt>graph capture, s per server start</dt><dd>cuda graph 64.5; piecewise CUDA graph 6.8, 8.3</dd>" in html
    # rendered again from the published record alone, the page is the same
    again = build_report(published_rows(export), tmp_path / "b", baseline=None)
    assert again.markdown.read_text() == text_


def test_a_matrix_section_says_what_its_figures_are_from_the_matrix_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A matrix whose figures are not the product's (a random model, another GPU) says so above its table, in its
    # file's own words; a matrix file the report cannot read only loses that line.
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / "arch.toml").write_text('engine = "sglang"\ndescription = "random weights, not Blackwell"\n')
    (tmp_path / "matrix" / "broken.toml").write_text('description = "unterminated\n')
    rows = [
        row("a1", sglang="0.5.9", flashinfer="pinned", mode="baseline", verdict="pass", matrix="matrix/arch.toml"),
        row("b1", sglang="0.5.9", flashinfer="pinned", mode="baseline", verdict="pass", matrix="matrix/broken.toml"),
        row("c1", sglang="0.5.9", flashinfer="pinned", mode="baseline", verdict="pass", matrix="matrix/gone.toml"),
    ]
    monkeypatch.chdir(tmp_path)
    result = build_report(rows, tmp_path / "site", baseline=None, write_record=False)
    text = result.markdown.read_text()
    sections = {s.split("`", 1)[0]: s for s in text.split("## `")[1:]}
    assert "random weights, not Blackwell" in sections["matrix/arch.toml"]
    assert text.count("random weights, not Blackwell") == 1
    assert "unterminated" not in sections["matrix/broken.toml"]
    assert "cell(s) of this matrix" in sections["matrix/gone.toml"]
    # the interactive page says it in the same place: under the matrix's heading, once
    page = result.html.read_text()
    arch = page.split('data-matrix="matrix/arch.toml"', 1)[1].split("</section>", 1)[0]
    assert '<p class="matrix-description">random weights, not Blackwell</p>' in arch
    assert page.count('class="matrix-description"') == 1


def test_a_published_cell_its_matrix_no_longer_plans_is_reproduced_by_its_id_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The GLM-5 lane's 0.5.12 rows were published before the matrix set one more server variable: every cell id
    # moved, and their reproduce commands selected no cell. Now the command selects the cell the matrix gives
    # the same axes and mode today, and says why; a row whose axes the matrix lost says that instead.
    from servematrix.planning.plan import make_plan

    lane = "matrix/h200-glm5.toml"
    monkeypatch.chdir(REPO)
    axes = {"sglang": "0.5.12", "torch": "pinned", "flashinfer": "pinned", "cuda": "13.0", "kernels": "0.14.1"}
    (now,) = make_plan(lane, [f"{k}={v}" for k, v in axes.items()] + ["gpu=h200", "mode=baseline"]).cells
    (current,) = make_plan(lane, ["sglang=0.5.15", "gpu=h100", "mode=baseline"]).cells

    def lane_row(cell: str, sglang: str, **extra: Any) -> Row:
        found = row(cell, sglang=sglang, flashinfer="pinned", mode="baseline", verdict="pass", gpu="h200",
                    matrix=lane, backend="existing", **extra)  # fmt: skip
        return found.replace(axes={**axes, "sglang": sglang, "gpu": "h200"})

    stale, lost = lane_row("5ta1e0000000", "0.5.12"), lane_row("1057a0000000", "0.5.9")
    fresh = Row.of({**lane_row(current.id, "0.5.15").values, "axes": dict(current.env.axes)})
    gone = row("90e0000000aa", sglang="0.5.9", flashinfer="pinned", mode="baseline", verdict="pass",
               matrix="matrix/gone.toml")  # fmt: skip
    result = build_report([stale, lost, fresh, gone], tmp_path / "site", baseline=None, write_record=False)
    text = result.markdown.read_text()
    details = {line.split("`")[1]: line for line in text.split("\n- ")[1:] if line.startswith("`")}
    assert f"--select id={now.id} --backend existing --rerun`" in details[stale["cell_id"]]
    assert "has changed this cell's definition since it ran" in details[stale["cell_id"]]
    assert f"it is {now.id} now" in details[stale["cell_id"]]
    assert "--select id=1057a0000000" in details[lost["cell_id"]]
    assert "no longer has a cell with these axes and mode" in details[lost["cell_id"]]
    assert "changed since" not in details[current.id] and f"--select id={current.id}" in details[current.id]
    assert "changed since" not in details[gone["cell_id"]]  # a matrix it cannot plan here moves nothing
    # the interactive page's reproduce block runs the same command and says the same
    page = result.html.read_text()
    block = page.split(f'id="repro-{stale["cell_id"]}"', 1)[1].split("</tr>", 1)[0]
    assert f"--select id={now.id}" in block and "changed since:" in block
