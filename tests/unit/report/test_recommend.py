"""`servematrix recommend` and the docs' lead: observed stacks ranked by measured throughput, predicted ones
after them and labelled so, and the nearest non-failing neighbour of every failing cell."""

from __future__ import annotations

import json

from servematrix.cli import main
from servematrix.records.row import Row
from servematrix.report.recommend import recommend, render_markdown
from servematrix.store.store import Store


def _row(cell: str, mode: str, verdict: str, tok: float | None = None, **axes: str) -> dict:
    metrics = None
    if tok is not None:
        metrics = {"levels": [{"concurrency": 32, "output_tok_s": {"median": tok}, "completion_tokens": 100}]}
    return {
        "cell_id": cell,
        "matrix": "matrix/m.toml",
        "mode": mode,
        "verdict": verdict,
        "metrics": metrics,
        "axes": {"sglang": "0.5.12", "flashinfer": "pinned", "gpu": "b200", **axes},
    }


ROWS = [
    _row("a", "baseline", "pass", 9000.0),
    _row("b", "piecewise", "pass", 11000.0),
    _row("c", "baseline", "skipped:no-gpu", flashinfer="0.6.12"),
    _row("d", "piecewise", "predicted-fail:dynamo-untraceable", sglang="0.5.9"),
    _row("e", "piecewise", "fail:dependency-version", flashinfer="0.6.12"),
    _row("f", "baseline", "skipped:not-applicable", sglang="0.5.23"),
]


def test_observed_first_by_throughput_then_predicted():
    (rec,) = recommend(ROWS)
    assert rec.gpu == "b200"
    assert [s.cell_id for s in rec.stacks] == ["b", "a", "c"]
    assert rec.stacks[0].source.startswith("observed") and rec.stacks[0].tok_s == 11000.0
    assert rec.stacks[2].source.startswith("predicted") and rec.stacks[2].tok_s is None


def test_each_failing_cell_gets_its_nearest_fix():
    (rec,) = recommend(ROWS)
    fixes = {n.cell_id: (n.nearest, n.changes) for n in rec.failing}
    # 0.5.9 piecewise: one change away from the 0.5.12 piecewise that passed.
    assert fixes["d"] == ("b", ("sglang 0.5.12 instead of 0.5.9",))
    # flashinfer 0.6.12 piecewise: the pinned flashinfer (same mode) is as near as the baseline (same axes).
    assert fixes["e"][0] in ("b", "c") and len(fixes["e"][1]) == 1
    assert "f" not in fixes  # not applicable is not a failure


def test_the_markdown_lead_escapes_and_labels(tmp_path):
    rows = [*ROWS, _row("g", "baseline", "fail:x", gpu="<b>kind</b>")]
    text = render_markdown(rows)
    assert "<b>kind</b>" not in text
    assert "observed on this GPU kind" in text and "lighter CPU pre-flights" in text


def test_the_command_reads_a_store(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with Store(store) as s:
        for i, row in enumerate(ROWS[:2]):
            s.record(
                run_id="r", cell_id=row["cell_id"], env_id=f"e{i}", engine="sglang", mode=row["mode"],
                matrix=row["matrix"], axes=row["axes"], inputs_hash="h", verdict=row["verdict"], metrics=row["metrics"],
            )  # fmt: skip
    assert main(["recommend", "--store", str(store), "--format", "json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert [s["cell_id"] for s in rec["stacks"]] == ["b", "a"]


def test_the_command_filters_by_matrix_and_refuses_an_unknown_one(tmp_path, capsys):
    assert main(["recommend", "matrix/glm5-nvfp4.toml"]) == 0  # the published results hold the product matrix
    out = capsys.readouterr().out
    assert "NVIDIA B200 (b200, matrix/glm5-nvfp4.toml):" in out
    # A GPU kind is named by its card (the matrix's sku), never by its axis in upper case.
    assert "NVIDIA RTX PRO 6000 Blackwell (rtx-pro-6000, matrix/glm5-nvfp4.toml):" in out
    assert "(on NVIDIA RTX PRO 6000 Blackwell)" in out and "RTX-PRO-6000" not in out
    assert "cpu (" not in out
    assert main(["recommend", "matrix/no-such.toml"]) == 2


def test_matrices_are_never_pooled_on_one_gpu_kind(capsys):
    # Two lanes on the H200 serve different models: the dense Llama's 0.5.12 piecewise passes, the GLM-5
    # architecture's fails with the same axes. Pooled, the failure's "nearest fix" was the other model's
    # cell with nothing changed (an empty fix); each matrix is its own recommendation.
    llama = [{**_row("l1", "baseline", "pass", 9000.0, gpu="h200"), "matrix": "matrix/llama.toml"},
             {**_row("l2", "piecewise", "pass", 12000.0, gpu="h200"), "matrix": "matrix/llama.toml"}]  # fmt: skip
    glm = [{**_row("g1", "baseline", "pass", 10000.0, gpu="h200"), "matrix": "matrix/glm.toml"},
           {**_row("g2", "piecewise", "fail:graph-capture-failed", gpu="h200"), "matrix": "matrix/glm.toml"}]  # fmt: skip
    recs = {(r.matrix, r.gpu): r for r in recommend([*llama, *glm])}
    assert set(recs) == {("matrix/llama.toml", "h200"), ("matrix/glm.toml", "h200")}
    (failing,) = recs["matrix/glm.toml", "h200"].failing
    assert failing.nearest == "g1" and failing.changes == ("baseline instead of piecewise",)
    assert [s.cell_id for s in recs["matrix/glm.toml", "h200"].stacks] == ["g1"]
    assert main(["recommend"]) == 0  # the published results: each lane of the H200 under its own heading
    out = capsys.readouterr().out
    assert "NVIDIA H200 (h200, matrix/h200-glm5.toml):" in out and "NVIDIA H200 (h200, matrix/h200-smoke.toml):" in out
    assert not any(line.endswith("-> ") for line in out.splitlines())  # every failing cell names its fix


def _open(cell: str, mode: str, evidence: list[str], **axes: str) -> dict:
    return {**_row(cell, mode, "skipped:no-gpu", **axes), "evidence": evidence, "evidence_model": []}


def test_ranked_by_evidence_own_pins_first_and_nothing_against_a_pick():
    build = ["load: loaded to the module build for sm_100, 4 of 78 layers"]
    against = {"kind": "advisory", "stance": "at-risk", "text": "at-risk: advisory X", "headline": "advisory X"}
    supports = {"kind": "sibling", "stance": "supports", "text": "supports: y", "headline": "y"}
    rows = [
        _open("light", "breakable", ["import check: pass"], sglang="0.5.23"),
        {
            **_open("crossed", "breakable", build, sglang="0.5.23", flashinfer="0.6.12"),
            "crossed_pins": {"flashinfer-python": {}},
        },
        _open("own", "breakable", build, sglang="0.5.17"),
        {**_open("risky", "breakable", build, sglang="0.5.23"), "evidence_model": [against]},
        {**_open("sibling", "baseline", ["import check: pass"], sglang="0.5.12"), "evidence_model": [supports]},
    ]
    (rec,) = recommend(rows)
    assert [s.cell_id for s in rec.stacks] == ["sibling", "own", "crossed", "light"]
    assert [s.cell_id for s in rec.held] == ["risky"] and rec.held[0].against == ("advisory X",)
    assert [s.tier for s in rec.stacks] == [1, 2, 2, 3]
    assert (
        rec.stacks[2].words.startswith("flashinfer 0.6.12 (crosses its pin)")
        or "crosses its pin" in rec.stacks[2].words
    )
    # matrix/m.toml names no card: the kind's own name
    assert rec.stacks[1].settle == "servematrix run matrix/m.toml --select id=own  (on b200)"


def test_every_cell_at_risk_still_answers_and_says_so():
    against = {"kind": "advisory", "stance": "at-risk", "text": "at-risk: advisory X", "headline": "advisory X"}
    rows = [Row.of({**_open("only", "baseline", []), "evidence_model": [against]})]
    (rec,) = recommend(rows)
    assert rec.stacks == () and [p.cell_id for p in rec.picks] == ["only"]
    from servematrix.report.recommend import render_text

    text = render_text([rec], rows)
    assert "evidence against it: the best of them, at risk" in text and "at risk: advisory X" in text


def test_failing_cells_are_summarised_by_cause_with_their_fix():
    (rec,) = recommend(ROWS)
    causes = {c.cls: (len(c.cells), c.fixed) for c in rec.causes}
    assert causes["dynamo-untraceable"] == (1, 1) and causes["dependency-version"][0] == 1


def test_the_product_answer_fits_one_screen(capsys):
    assert main(["recommend", "matrix/glm5-nvfp4.toml"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 60
    assert out.index("NVIDIA B200 (b200, matrix/glm5-nvfp4.toml):") < out.index("failing:")
    assert main(["recommend", "--all", "matrix/glm5-nvfp4.toml"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 60


def test_cells_whose_check_could_not_run_are_said_by_cause_never_picked_nor_failing():
    """sglang 0.5.18's lock pins a placeholder sdist (the real uv output): its cells are neither a pick nor a
    failure, and the answer says how many, which releases and why, instead of leaving them out silently."""
    from pathlib import Path

    from servematrix.report.recommend import render_text

    stub = (Path(__file__).parents[2] / "fixtures" / "logs" / "uv-install-wheel-stub-cuda-tile.txt").read_text()
    placeholder = {**_row("h", "baseline", "error:import-check", sglang="0.5.18"), "excerpt": stub, "engine": "sglang"}
    host = {**_row("i", "baseline", "error:import-check", sglang="0.5.19"), "excerpt": "timed out", "engine": "sglang"}
    rows = [Row.of(r) for r in [*ROWS, placeholder, host]]
    (rec,) = recommend(rows)
    assert {"h", "i"}.isdisjoint({s.cell_id for s in (*rec.stacks, *rec.held)} | {n.cell_id for n in rec.failing})
    assert sorted(release for _, release in rec.undecided) == ["0.5.18", "0.5.19"]
    text = render_text([rec], rows)
    assert "not decided here" in text
    assert "1 cell(s) (0.5.18): the lock pins cuda-tile 1.6.0rc5, a placeholder sdist" in text
    assert "1 cell(s) (0.5.19): error:import-check" in text
    assert ", 2 not decided: why" in render_markdown(rows)
