"""Advisories: each packaged record matches the cell facts it describes and not a near miss, a malformed record is
an input error naming its file, record and key (exit 2), and the command lists the product matrix's cells."""

from __future__ import annotations

import json
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from servematrix import cli
from servematrix.advisories import ADVISORIES_DIR, CellFacts, facts_for, load_advisories, match
from servematrix.advisories.match import flag_holds
from servematrix.errors import InputError
from servematrix.planning.plan import make_plan
from tests.conftest import MATRIX, REPO

GLM = ("GlmMoeDsaForCausalLM",)
FP4 = ("--trust-remote-code", "--quantization", "modelopt_fp4")
B200 = (*FP4, "--tp", "8", "--kv-cache-dtype", "fp8_e4m3", "--moe-runner-backend", "flashinfer_trtllm",
        "--dsa-decode-backend", "trtllm", "--dsa-prefill-backend", "trtllm")  # fmt: skip
RTX = (*FP4, "--tp", "8", "--kv-cache-dtype", "bf16", "--attention-backend", "flashinfer")
RTX_FI_CUTLASS = (*RTX, "--moe-runner-backend", "flashinfer_cutlass")


def facts(sglang: str, arch: str = "sm_120", mode: str = "baseline", argv=RTX_FI_CUTLASS, **packages: str) -> CellFacts:
    pins = {"sglang": sglang, **{name.replace("_", "-"): v for name, v in packages.items()}}
    return CellFacts(sglang=sglang, packages=pins, gpu_arch=arch, mode=mode, argv=argv, architectures=GLM, env={})


# For each advisory: facts it must match (with the status it must give) and a near miss it must not match.
FIXTURES: dict[str, tuple[CellFacts, str, CellFacts]] = {
    "SMX-2026-0001": (
        facts("0.5.10", mode="piecewise", flashinfer_python="0.6.12"),
        "affected",
        facts("0.5.12", mode="piecewise", flashinfer_python="0.6.12"),  # sglang's own op wrapper
    ),
    "SMX-2026-0002": (
        facts("0.5.12", kernels="0.17.2", transformers="5.6.0"),
        "affected",
        facts("0.5.12", kernels="0.14.1", transformers="5.6.0"),  # as released
    ),
    "SMX-2026-0003": (
        facts("0.5.12", arch="sm_100", mode="piecewise", argv=B200),
        "at-risk",
        facts("0.5.14", arch="sm_100", mode="piecewise", argv=B200),
    ),
    "SMX-2026-0004": (
        facts("0.5.18", arch="sm_100", argv=B200, flashinfer_python="0.6.17"),
        "affected",
        facts("0.5.17", arch="sm_100", argv=B200, flashinfer_python="0.6.15.post1"),
    ),
    "SMX-2026-0005": (
        facts("0.5.10", flashinfer_python="0.6.12", flashinfer_cubin="0.6.7.post2"),
        "affected",
        facts("0.5.14", flashinfer_python="0.6.12", flashinfer_cubin="0.6.12"),
    ),
    "SMX-2026-0006": (
        facts("0.5.23", arch="sm_100", argv=B200, flashinfer_python="0.6.12"),
        "affected",
        facts("0.5.23", arch="sm_100", argv=B200, flashinfer_python="0.7.2"),
    ),
    "SMX-2026-0007": (
        facts("0.5.12", arch="sm_103", argv=B200),
        "at-risk",
        facts("0.5.11", arch="sm_103", argv=B200),
    ),
    "SMX-2026-0008": (
        facts("0.5.17", argv=(*RTX_FI_CUTLASS, "--dsa-decode-backend", "trtllm")),
        "affected",
        facts("0.5.17", arch="sm_100", argv=B200),  # trtllm-gen FMHA exists on SM100
    ),
    "SMX-2026-0009": (
        facts("0.5.17"),
        "at-risk",
        facts("0.5.17", arch="sm_100", argv=B200),
    ),
    "SMX-2026-0010": (
        facts("0.5.17"),
        "at-risk",
        facts("0.5.17", argv=(*RTX_FI_CUTLASS, "--disable-shared-experts-fusion")),
    ),
    "SMX-2026-0011": (
        facts("0.5.6", arch="sm_100", argv=B200),
        "affected",
        facts("0.5.9", arch="sm_100", argv=B200),
    ),
    "SMX-2026-0012": (
        facts("0.5.14", argv=(*RTX, "--moe-runner-backend", "cutlass")),
        "affected",
        facts("0.5.10", argv=(*RTX, "--moe-runner-backend", "cutlass")),  # the recipe served on 0.5.10
    ),
    "SMX-2026-0013": (
        facts("0.5.14", flashinfer_python="0.6.12"),
        "at-risk",
        facts("0.5.17", flashinfer_python="0.6.15.post1"),
    ),
    "SMX-2026-0014": (
        facts("0.5.10", arch="sm_121", flashinfer_python="0.6.3"),
        "at-risk",
        facts("0.5.17", arch="sm_121", flashinfer_python="0.6.15.post1"),
    ),
    "SMX-2026-0015": (
        facts("0.5.10", arch="sm_100", mode="piecewise", argv=B200),
        "at-risk",
        facts("0.5.10", arch="sm_100", mode="baseline", argv=B200),
    ),
    "SMX-2026-0016": (
        facts("0.5.12", arch="sm_100", mode="piecewise", argv=B200),
        "at-risk",
        replace(facts("0.5.12", arch="sm_100", mode="piecewise", argv=B200), env={"SGLANG_ENABLE_JIT_DEEPGEMM": "0"}),
    ),
}


@pytest.fixture(scope="module")
def advisories():
    return {a.id: a for a in load_advisories()}


def test_there_are_at_least_15_advisories_each_with_a_fixture(advisories):
    assert len(advisories) >= 15
    assert set(advisories) == set(FIXTURES)


@pytest.mark.parametrize("advisory_id", sorted(FIXTURES))
def test_each_advisory_matches_its_fixture_and_not_the_near_miss(advisories, advisory_id):
    hit, status, miss = FIXTURES[advisory_id]
    advisory = advisories[advisory_id]
    found = match([advisory], hit)
    assert [(m.advisory.id, m.status) for m in found] == [(advisory_id, status)]
    assert found[0].why
    assert match([advisory], miss) == ()


def test_every_advisory_cites_a_public_report_and_says_what_to_do(advisories):
    signatures = tomllib.loads((REPO / "src/servematrix/data/signatures/sglang.toml").read_text())
    classes = {s["id"] for s in signatures["signature"]} | {"wrong-output"}  # the correctness check's class
    for advisory in advisories.values():
        assert advisory.source.startswith("https://github.com/"), advisory.id
        assert advisory.cls in classes, advisory.id
        assert advisory.fixed and advisory.workaround, advisory.id
        assert advisory.verdict == f"predicted-fail:{advisory.cls}"
        if advisory.certainty == "conditional":
            assert advisory.condition, advisory.id


def test_a_package_the_lock_lacks_is_not_installed():
    advisory = next(a for a in load_advisories() if a.id == "SMX-2026-0002")
    assert match([advisory], facts("0.5.10")) == ()  # no kernels in the lock


def test_unknown_architectures_make_a_match_at_risk_not_affected():
    advisory = next(a for a in load_advisories() if a.id == "SMX-2026-0011")
    found = match([advisory], replace(facts("0.5.6"), architectures=()))
    assert [m.status for m in found] == ["at-risk"]
    assert "unknown" in found[0].why


@pytest.mark.parametrize(
    ("condition", "argv", "holds"),
    [
        ("--moe-runner-backend cutlass", ("--moe-runner-backend", "cutlass"), True),
        ("--moe-runner-backend cutlass", ("--moe-runner-backend", "flashinfer_cutlass"), False),
        ("--moe-runner-backend cutlass", ("--moe-runner-backend=cutlass",), True),
        ("!--disable-shared-experts-fusion", ("--tp", "8"), True),
        ("!--disable-shared-experts-fusion", ("--disable-shared-experts-fusion",), False),
        ("--dsa-decode-backend trtllm | --nsa-decode-backend trtllm", ("--nsa-decode-backend", "trtllm"), True),
    ],
)
def test_flag_conditions(condition, argv, holds):
    assert flag_holds(condition, argv) is holds


# ------------------------------------------------------------------------------------------- malformed records


def _copy(tmp_path: Path, advisory_id: str = "SMX-2026-0001") -> tuple[Path, dict]:
    folder = tmp_path / "advisories"
    folder.mkdir()
    path = folder / f"{advisory_id}.json"
    shutil.copy(ADVISORIES_DIR / f"{advisory_id}.json", path)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d["database_specific"].pop("class"), "database_specific.class"),
        (lambda d: d["database_specific"].update(gpu_arch=["blackwell"]), "database_specific.gpu_arch"),
        (lambda d: d["affected"][0]["ranges"][0]["events"].__setitem__(1, {"fixed": "not-a-version"}), "affected[0]"),
        (lambda d: d["database_specific"].update(certainty="maybe"), "database_specific.certainty"),
        (lambda d: d.update(unknown_key=1), "unknown_key"),
    ],
)
def test_a_malformed_record_names_file_record_and_key(tmp_path, edit, key):
    path, data = _copy(tmp_path)
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as caught:
        load_advisories(path.parent)
    said = str(caught.value)
    assert str(path) in said and "SMX-2026-0001" in said and key in said


def test_invalid_json_names_the_line(tmp_path):
    path, _ = _copy(tmp_path)
    path.write_text('{\n  "id": "SMX-2026-0001",\n  oops\n}')
    with pytest.raises(InputError, match=r"SMX-2026-0001\.json:3"):
        load_advisories(path.parent)


def test_a_file_is_named_for_its_record(tmp_path):
    path, _ = _copy(tmp_path)
    path.rename(path.with_name("SMX-2026-0999.json"))
    with pytest.raises(InputError, match=r"name it SMX-2026-0001\.json"):
        load_advisories(path.parent)


def test_the_cli_exits_2_on_a_malformed_advisory(tmp_path, capsys):
    path, data = _copy(tmp_path)
    del data["database_specific"]["workaround"]
    path.write_text(json.dumps(data))
    assert cli.main(["advisories", "--advisories-dir", str(path.parent)]) == 2
    err = capsys.readouterr().err
    assert "SMX-2026-0001" in err and "database_specific.workaround" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------- the product matrix


def test_the_command_lists_the_cells_each_advisory_touches_in_the_product_matrix(capsys):
    assert cli.main(["advisories", str(MATRIX / "glm5-nvfp4.toml"), "--format", "json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert len(rows) >= 15
    # sglang 0.5.6 cannot load GLM-5: every applicable 0.5.6 cell is affected.
    plan = make_plan(MATRIX / "glm5-nvfp4.toml")
    old = {c.id for c in plan.cells if c.applicable and c.env.axes["sglang"] == "0.5.6"}
    assert old and set(rows["SMX-2026-0011"]["cells"]["affected"]) == old
    # The crossed cubin: sglang 0.5.10 and 0.5.12 with flashinfer 0.6.12 keep the release's cubin.
    crossed = set(rows["SMX-2026-0005"]["cells"]["affected"])
    assert crossed and all(
        c.env.axes["flashinfer"] == "0.6.12" and c.env.axes["sglang"] in ("0.5.10", "0.5.12")
        for c in plan.cells
        if c.id in crossed
    )
    # No advisory touches a cell that is not applicable.
    applicable = {c.id for c in plan.cells if c.applicable}
    for row in rows.values():
        assert set(row["cells"]["affected"]) | set(row["cells"]["at_risk"]) <= applicable


def test_facts_of_a_product_cell_come_from_its_lock_and_the_model_config():
    plan = make_plan(MATRIX / "glm5-nvfp4.toml", ["sglang=0.5.12", "gpu=b200", "flashinfer=pinned", "mode=baseline"])
    cell = next(c for c in plan.cells if c.env.axes.get("resolution") == "today")
    found = facts_for(plan, cell, MATRIX / "locks")
    assert found.locked and found.packages["flashinfer-python"] == "0.6.11.post1"
    assert found.architectures == GLM and found.gpu_arch == "sm_100" and found.sglang == "0.5.12"


def test_a_lock_is_read_once_per_version_of_the_file(tmp_path, monkeypatch):
    """`facts_for` asks for one lock per cell and the cells of an environment share it: parsed once for each
    (path, mtime, size), and again when the file changes; the facts are the same either way."""
    import importlib

    matching = importlib.import_module("servematrix.advisories.match")  # the module: the package exports `match`

    plan = make_plan(MATRIX / "glm5-nvfp4.toml", ["sglang=0.5.12", "gpu=b200", "flashinfer=pinned"])
    cells = [c for c in plan.cells if c.env.axes.get("resolution") == "today"]
    assert len({c.env_id for c in cells}) == 1 and len(cells) > 1  # one environment, several modes
    locks = tmp_path / "locks"
    locks.mkdir()
    lock = locks / f"{cells[0].env_id}.lock.txt"
    shutil.copy(MATRIX / "locks" / lock.name, lock)
    parsed: list[str] = []
    real = matching.parse_pins
    monkeypatch.setattr(matching, "parse_pins", lambda body: parsed.append(body) or real(body))
    matching._parsed_lock.cache_clear()
    first = [facts_for(plan, cell, locks) for cell in cells]
    assert len(parsed) == 1 and all(f.locked and f.packages == first[0].packages for f in first)
    assert first[0].packages["flashinfer-python"] == "0.6.11.post1"
    lock.write_text(lock.read_text().replace("flashinfer-python==0.6.11.post1", "flashinfer-python==0.6.11.post12"))
    again = facts_for(plan, cells[0], locks)
    assert len(parsed) == 2 and again.packages["flashinfer-python"] == "0.6.11.post12"
    lock.unlink()
    assert not facts_for(plan, cells[0], locks).locked  # no lock: the axes' pins, not a stale read


def test_the_table_without_a_matrix_lists_the_advisories(capsys):
    assert cli.main(["advisories"]) == 0
    out = capsys.readouterr().out
    assert "SMX-2026-0001" in out and out.rstrip().endswith("advisories")
