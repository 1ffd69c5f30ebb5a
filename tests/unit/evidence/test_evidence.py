"""The evidence layer: a failure observed on one GPU kind is carried to another only through a carry rule (a
Python error in code the GPU does not choose, the flags that choose it the same), and every refusal still marks
the cell at risk; a sibling's pass supports, never passes; a lane's release the product does not hold speaks to
the nearest releases it does; advisories predict or mark; no verdict a cell's own run reached is changed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from servematrix.evidence import apply, derive
from servematrix.evidence.carry import judge, load_rules
from servematrix.evidence.derive import architecture
from servematrix.store.store import Row

GPU_HOST = {"gpu_sku": "NVIDIA H100", "gpus": [{"arch": "sm_90", "name": "NVIDIA H100"}]}
OP_SCHEMA = (
    "frames that decided (raised while warming up or capturing a breakable prefill CUDA graph):\n"
    '  File ".../site-packages/torch/_ops.py", line 1269, in __call__\n'
    "RuntimeError: Unknown keyword argument 'topk_indices' for operator 'sglang::unified_attention_with_output'. "
    "Schema: sglang::unified_attention_with_output(Tensor query) -> ()\n"
)
DSA_ATTRIBUTE = (
    '  File ".../layers/attention/dsa_backend.py", line 1350, in _apply_cuda_graph_metadata\n'
    "AttributeError: 'DeepseekSparseAttnBackend' object has no attribute 'decode_cuda_graph_metadata'. Did you mean\n"
)


@pytest.fixture
def matrices(tmp_path: Path) -> dict[str, str]:
    """A product and a lane serving one architecture, and a lane serving another."""
    out = {}
    for name, arch in (("product", "GlmMoeDsaForCausalLM"), ("lane", "GlmMoeDsaForCausalLM"), ("llama", "Llama")):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text(f'{{"architectures": ["{arch}"]}}')
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[model]\nname = "{name}"\nconfig_dir = "models/{name}"\n')
        out[name] = str(path)
    architecture.cache_clear()
    return out


def _row(cell: str, matrix: str, gpu: str, mode: str, verdict: str, sglang: str = "0.5.12", **extra: object) -> Row:
    return Row.of(
        {
            "cell_id": cell,
            "env_id": f"env-{cell}",
            "engine": "sglang",
            "matrix": matrix,
            "mode": mode,
            "verdict": verdict,
            "axes": {"sglang": sglang, "torch": "pinned", "flashinfer": "pinned", "gpu": gpu},
            "argv": ["python", "-m", "sglang.launch_server"],
            "evidence": [],
            "excerpt": "",
            **extra,
        }
    )


def _failed(cell: str, matrix: str, excerpt: str, **extra: object) -> Row:
    return _row(cell, matrix, "h200", "breakable", "fail:graph-capture-failed", excerpt=excerpt, host=GPU_HOST, **extra)


def test_a_python_op_schema_error_is_carried_to_an_open_cell_of_another_kind(matrices):
    source = _failed("src", matrices["lane"], OP_SCHEMA)
    target = _row("tgt", matrices["product"], "b200", "breakable", "skipped:no-gpu")
    found = derive([source, target], advise=lambda rows: {})["tgt"]
    assert found.verdict == "predicted-fail:graph-capture-failed" and found.own_verdict == "skipped:no-gpu"
    (piece,) = found.pieces
    assert piece.stance == "predicts-fail" and piece.rule == "sglang-op-schema"
    assert "src" in piece.text and "h200" in piece.text and "_ops.py:1269 __call__" in piece.frames[0]
    assert "Schema:" not in piece.text  # the error's first sentence only


def test_the_flags_that_choose_the_code_must_match_or_the_cell_is_only_at_risk(matrices):
    source = _failed("src", matrices["lane"], OP_SCHEMA)
    argv = ["python", "-m", "sglang.launch_server", "--attention-backend", "flashinfer"]
    target = _row("tgt", matrices["product"], "rtx", "breakable", "skipped:no-gpu", argv=argv)
    found = derive([source, target], advise=lambda rows: {})["tgt"]
    assert found.verdict == "skipped:no-gpu"
    (piece,) = found.pieces
    assert piece.stance == "at-risk" and "--attention-backend (unset) there, flashinfer here" in piece.text


@pytest.mark.parametrize(
    ("excerpt", "why"),
    [
        ("RuntimeError: CUDA error: an illegal memory access was encountered\n", "kernel or device fault"),
        ('  File ".../layers/attention/flashmla_backend.py", line 3, in f\nAttributeError: x\n', "arch chooses"),
        ("ValueError: something sglang-specific\n", "not one the carry rules know"),
        ("torch.OutOfMemoryError: CUDA out of memory.\n", "kernel or device fault"),
    ],
)
def test_kernel_faults_arch_gated_paths_and_unknown_errors_are_refused(matrices, excerpt, why):
    source = _failed("src", matrices["lane"], excerpt)
    target = _row("tgt", matrices["product"], "b200", "breakable", "skipped:no-gpu")
    found = judge(source, target, load_rules())
    assert found.rule is None and why in found.why


def test_the_dsa_rule_needs_the_same_dsa_backends_nsa_and_dsa_names_alike(matrices):
    lane_argv = ["x", "--nsa-decode-backend", "flashmla_sparse", "--nsa-prefill-backend", "flashmla_sparse"]
    same = ["x", "--dsa-decode-backend", "flashmla_sparse", "--dsa-prefill-backend", "flashmla_sparse"]
    source = _failed("src", matrices["lane"], DSA_ATTRIBUTE, argv=lane_argv)
    assert judge(source, _row("a", matrices["product"], "b200", "breakable", "skipped:no-gpu", argv=same)).rule
    other = ["x", "--dsa-decode-backend", "trtllm", "--dsa-prefill-backend", "trtllm"]
    refused = judge(source, _row("b", matrices["product"], "b200", "breakable", "skipped:no-gpu", argv=other))
    assert refused.rule is None and "--dsa-prefill-backend flashmla_sparse there, trtllm here" in refused.why


def test_a_sibling_pass_supports_and_never_passes(matrices):
    source = _row("src", matrices["lane"], "h200", "baseline", "pass", host=GPU_HOST)
    target = _row("tgt", matrices["product"], "b200", "baseline", "skipped:no-gpu")
    found = derive([source, target], advise=lambda rows: {})["tgt"]
    assert found.verdict == "skipped:no-gpu" and [p.stance for p in found.pieces] == ["supports"]


def test_another_architecture_another_mode_or_a_cpu_verdict_says_nothing(matrices):
    llama = _failed("llama", matrices["llama"], OP_SCHEMA)
    piecewise = _row(
        "pw", matrices["lane"], "h200", "piecewise", "fail:graph-capture-failed", excerpt=OP_SCHEMA, host=GPU_HOST
    )
    cpu = _row("cpu", matrices["lane"], "h200", "breakable", "fail:unknown-flag", excerpt=OP_SCHEMA, host={})
    target = _row("tgt", matrices["product"], "b200", "breakable", "skipped:no-gpu")
    found = derive([llama, piecewise, cpu, target], advise=lambda rows: {})["tgt"]
    assert found.pieces == () and found.verdict == "skipped:no-gpu"


def test_a_verdict_the_cells_own_run_reached_is_never_changed(matrices):
    source = _failed("src", matrices["lane"], OP_SCHEMA)
    passed = _row("ok", matrices["product"], "b200", "breakable", "pass", host=GPU_HOST)
    predicted = _row("pf", matrices["product"], "b200", "breakable", "predicted-fail:import-dependency-conflict")
    found = derive([source, passed, predicted], advise=lambda rows: {})
    assert found["ok"].verdict == "pass" and found["pf"].verdict == "predicted-fail:import-dependency-conflict"
    assert found["pf"].pieces[0].stance == "predicts-fail"  # still shown beside its own verdict


def test_a_lane_release_the_product_lacks_speaks_to_the_nearest_releases_it_holds(matrices):
    full = _row(
        "full",
        matrices["lane"],
        "h100",
        "full",
        "fail:graph-capture-failed",
        sglang="0.5.15",
        excerpt=DSA_ATTRIBUTE,
        host=GPU_HOST,
    )
    breakable = _row("brk", matrices["lane"], "h100", "breakable", "pass", sglang="0.5.15", host=GPU_HOST)
    product = [
        _row(f"{v}-{m}", matrices["product"], "b200", m, "skipped:no-gpu", sglang=v)
        for v in ("0.5.12", "0.5.14", "0.5.17", "0.5.23")
        for m in ("breakable", "full")
    ]
    product.append(
        _row("0.5.14-full-na", matrices["product"], "b200", "full", "skipped:not-applicable", sglang="0.5.14")
    )
    product = [r for r in product if r["cell_id"] != "0.5.14-full"]
    found = derive([full, breakable, *product], advise=lambda rows: {})
    assert [p.stance for p in found["0.5.17-full"].pieces] == ["at-risk"]
    assert "0.5.17 not yet observed" in found["0.5.17-full"].pieces[0].text
    assert found["0.5.17-full"].verdict == "skipped:no-gpu"  # a nearby release is never a verdict
    # Only the nearest releases that hold the mode: 0.5.14 has no full, so 0.5.12 is the one below.
    assert not found["0.5.23-full"].pieces and found["0.5.12-full"].pieces[0].stance == "at-risk"
    assert [p.kind for p in found["0.5.14-breakable"].pieces] == ["nearby"]
    assert [p.kind for p in found["0.5.17-breakable"].pieces] == ["nearby"]
    assert not found["0.5.12-breakable"].pieces


def test_a_release_observed_in_the_mode_gets_no_nearby_note(matrices):
    """Once a GPU observed the product's own release in a mode, that observation speaks: no nearby release's note,
    and nothing says the release is not yet observed."""
    lane = [
        _row("full-15", matrices["lane"], "h100", "full", "fail:graph-capture-failed", sglang="0.5.15",
             excerpt=DSA_ATTRIBUTE, host=GPU_HOST),
        _row("full-17", matrices["lane"], "h100", "full", "fail:graph-capture-failed", sglang="0.5.17",
             excerpt=DSA_ATTRIBUTE, host=GPU_HOST),
        _row("pw-15", matrices["lane"], "h100", "piecewise", "pass", sglang="0.5.15", host=GPU_HOST),
        _row("pw-17", matrices["lane"], "h100", "piecewise", "pass", sglang="0.5.17", host=GPU_HOST),
        _row("brk-15", matrices["lane"], "h100", "breakable", "pass", sglang="0.5.15", host=GPU_HOST),
        _row("brk-17", matrices["lane"], "h100", "breakable", "interrupted", sglang="0.5.17"),
    ]  # fmt: skip
    product = [
        _row(f"{v}-{m}", matrices["product"], "b200", m, "skipped:no-gpu", sglang=v)
        for v in ("0.5.14", "0.5.17")
        for m in ("full", "piecewise", "breakable")
    ]
    found = derive([*lane, *product], advise=lambda rows: {})
    for cell in ("0.5.17-full", "0.5.17-piecewise"):
        assert [p.kind for p in found[cell].pieces] == ["sibling"], cell
        assert not any("not yet observed" in p.text or "not yet observed" in p.headline for p in found[cell].pieces)
    assert found["0.5.17-full"].pieces[0].source == "full-17"  # the release's own observation
    # A release the lane did not observe in the mode (breakable interrupted) keeps the nearest release's note.
    assert [p.kind for p in found["0.5.17-breakable"].pieces] == ["nearby"]
    assert "0.5.17 not yet observed" in found["0.5.17-breakable"].pieces[0].text
    # 0.5.14 is observed nowhere: the lane's 0.5.15 still speaks to it as the nearest release.
    assert {p.kind for c in ("0.5.14-full", "0.5.14-piecewise") for p in found[c].pieces} == {"nearby"}


def test_a_gpu_kind_is_named_by_its_card(tmp_path, matrices):
    from servematrix.evidence.derive import gpu_name

    kinds = (
        '[gpu.rtx-pro-6000]\narch = "sm_120"\ncount = 8\nsku = "NVIDIA RTX PRO 6000 Blackwell"\n'
        '[gpu.h200]\narch = "sm_90"\ncount = 1\nsku = "NVIDIA H200"\n'
        '[gpu.h200x2]\narch = "sm_90"\ncount = 2\nsku = "NVIDIA H200"\n'
        '[gpu.b200]\narch = "sm_100"\ncount = 8\n'
    )
    lane = Path(matrices["lane"])
    lane.write_text(lane.read_text() + kinds)
    gpu_name.cache_clear()
    assert gpu_name(str(lane), "rtx-pro-6000") == "NVIDIA RTX PRO 6000 Blackwell"
    assert gpu_name(str(lane), "h200") == "NVIDIA H200" and gpu_name(str(lane), "h200x2") == "NVIDIA H200 ×2"
    assert gpu_name(str(lane), "b200") == "b200"  # no sku: the kind's name, as the matrix spells it
    assert gpu_name(str(tmp_path / "missing.toml"), "rtx-pro-6000") == "rtx-pro-6000"
    source = _failed("src", str(lane), OP_SCHEMA)
    source["axes"]["gpu"] = "rtx-pro-6000"
    target = _row("tgt", matrices["product"], "b200", "breakable", "skipped:no-gpu")
    (piece,) = derive([source, target], advise=lambda rows: {})["tgt"].pieces
    assert "on NVIDIA RTX PRO 6000 Blackwell with sglang 0.5.12" in piece.text and "RTX-PRO-6000" not in piece.text
    gpu_name.cache_clear()


@dataclass(frozen=True)
class _Advisory:
    id: str
    summary: str
    source: str
    cls: str
    fixed: str
    workaround: str


@dataclass(frozen=True)
class _Match:
    advisory: _Advisory
    status: str
    why: str


def test_an_advisory_predicts_or_marks_and_is_cited(matrices):
    advisory = _Advisory("SMX-1", "known bad", "https://example.invalid/1", "no-kernel-image", "0.5.30", "use x")
    rows = [
        _row("hit", matrices["product"], "rtx", "baseline", "skipped:no-gpu"),
        _row("maybe", matrices["product"], "rtx", "breakable", "skipped:no-gpu"),
    ]
    matches = {"hit": (_Match(advisory, "affected", "sglang 0.5.12"),), "maybe": (_Match(advisory, "at-risk", "if"),)}
    found = derive(rows, advise=lambda rows: matches)
    assert found["hit"].verdict == "predicted-fail:no-kernel-image"
    assert found["hit"].pieces[0].link == "https://example.invalid/1" and "SMX-1" in found["hit"].pieces[0].text
    assert "fixed in: 0.5.30" in found["hit"].pieces[0].detail
    assert found["maybe"].verdict == "skipped:no-gpu" and found["maybe"].pieces[0].stance == "at-risk"


def test_apply_shows_the_derived_verdict_and_keeps_the_own_one(matrices):
    source = _failed("src", matrices["lane"], OP_SCHEMA)
    target = _row("tgt", matrices["product"], "b200", "breakable", "skipped:no-gpu", evidence=["load: x"])
    shown = {r["cell_id"]: r for r in apply([source, target], derive([source, target], advise=lambda r: {}))}
    assert isinstance(shown["tgt"], Row)
    assert shown["tgt"]["verdict"] == "predicted-fail:graph-capture-failed"
    assert shown["tgt"]["own_verdict"] == "skipped:no-gpu"
    assert shown["tgt"]["evidence"][0].startswith("carried from h200") and shown["tgt"]["evidence"][-1] == "load: x"
    assert target["verdict"] == "skipped:no-gpu"  # the row itself is untouched
    assert apply(list(shown.values())) == list(shown.values())  # applied once


def test_the_page_opens_with_the_answer_and_folds_long_evidence(tmp_path):
    """The published record's page: the answer section before any matrix's table, the product's first, and a
    bundle's package differences from the lock behind a toggle."""
    from servematrix.report.publish import read_record
    from servematrix.report.regressions import published_rows
    from servematrix.report.site import build_report

    rows = published_rows(read_record(Path("docs/results/latest.json")))
    html = build_report(rows, tmp_path, baseline=None, write_record=False).html.read_text(encoding="utf-8")
    assert html.index('id="answer"') < html.index('class="matrix"')
    assert html.index('id="matrix-glm5-nvfp4"') < html.index('id="matrix-h200-glm5"')
    assert "more line(s) of evidence</summary>" in html
    inline = html.split('<span class="evidence">')[1].split("</span>")[0]
    assert "differs from the lock" not in inline
    markdown = (tmp_path / "compatibility.md").read_text(encoding="utf-8")
    assert markdown.index("## Recommendation") < markdown.index("## `matrix/glm5-nvfp4.toml`")
