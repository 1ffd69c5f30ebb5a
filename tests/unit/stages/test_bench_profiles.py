"""The bench's profiles, the pooling of server starts through the one aggregation, and the A/B on the metric of
the phase a mode changes. Reports come from the real client against the FAKE streaming server
(tests/fakes/fake_openai_server.py), whose per-token delay sets the figures."""

import dataclasses

import pytest

from servematrix.stages import bench
from servematrix.stages.bench import BenchReport, LevelSummary, Workload, run_workload_sync
from tests.fakes.fake_openai_server import FakeBehavior, FakeOpenAIServer


def _report(delay_s: float, *, profile: str = "decode", repeats: int = 2, ttft_delay_s: float = 0.0) -> BenchReport:
    behavior = FakeBehavior(token_delay_s=delay_s, first_token_delay_s=ttft_delay_s)
    with FakeOpenAIServer(behavior) as srv:
        w = Workload(
            concurrency=(1, 2),
            input_len=16 if profile == "decode" else 64,
            output_len=4 if profile == "decode" else 1,
            prompts_per_concurrency=3,
            warmup=1,
            repeats=repeats,
            profile=profile,
        )
        return run_workload_sync(srv.base_url, "m", w)


def test_every_repeat_stores_ttft_input_and_output_tok_s():
    report = _report(0.001)
    for level in report.levels:
        assert level.input_tok_s is not None and level.input_tok_s.min > 0
        assert level.ttft_mean_s is not None and level.ttft_mean_s.min > 0
        for run in level.runs:
            assert run.input_tok_s == pytest.approx(run.prompt_tokens / run.wall_s)
            assert run.output_tok_s > 0 and run.ttft.mean is not None


def test_a_stored_report_reads_back_to_the_same_figures():
    record = _report(0.001).to_dict()
    assert BenchReport.from_dict(record).to_dict() == record


def test_pooled_starts_are_the_aggregation_of_all_their_runs_in_every_field():
    fast, slow = _report(0.0005).to_dict(), _report(0.004, repeats=3).to_dict()
    pooled = bench.pool_starts([fast, slow])
    assert pooled is not None and pooled["starts"] == 2
    for level in pooled["levels"]:
        c = level["concurrency"]
        parts = [BenchReport.from_dict(r).level(c) for r in (fast, slow)]
        runs = [dataclasses.replace(run, start=i) for i, part in enumerate(parts, 1) for run in part.runs]
        expected = LevelSummary.of(c, runs, min_level_s=parts[0].min_level_s)
        assert [r["start"] for r in level["runs"]] == [1, 1, 2, 2, 2]
        for name in ("output_tok_s", "request_s", "wall_s", "client_cpu_s", "input_tok_s", "ttft_mean_s"):
            assert level[name] == dataclasses.asdict(getattr(expected, name)), name
        for name in ("error_count", "completion_tokens", "floor_met", "client_busy", "client_bound"):
            assert level[name] == getattr(expected, name), name
        assert level["warmup_requests"] == sum(p.warmup_requests for p in parts)
        # The spread covers both starts: the slow start's worst repeat and the fast start's best.
        assert level["output_tok_s"]["min"] == min(p.output_tok_s.min for p in parts)
        assert level["output_tok_s"]["max"] == max(p.output_tok_s.max for p in parts)
    assert pooled["duration_s"] == pytest.approx(fast["duration_s"] + slow["duration_s"])
    assert pooled["completion_tokens"] == fast["completion_tokens"] + slow["completion_tokens"]


def test_a_nested_profile_is_pooled_too():
    first = {**_report(0.001).to_dict(), "prefill": _report(0.001, profile="prefill").to_dict()}
    second = {**_report(0.002).to_dict(), "prefill": _report(0.002, profile="prefill").to_dict()}
    pooled = bench.pool_starts([first, second])
    assert pooled is not None
    assert pooled["prefill"]["starts"] == 2
    assert len(pooled["prefill"]["levels"][0]["runs"]) == 4


def _two_starts(**kw) -> dict:
    """A cell's record over two server starts, each with a decode and a prefill profile."""
    ttft = kw.pop("ttft_delay_s", 0.0)
    starts = [
        {**_report(0.001).to_dict(), "prefill": _report(0.0, profile="prefill", ttft_delay_s=ttft, **kw).to_dict()}
        for _ in range(2)
    ]
    pooled = bench.pool_starts(starts)
    assert pooled is not None
    return pooled


def test_ttft_speedup_is_oriented_so_that_faster_is_above_one():
    base, treat = _two_starts(ttft_delay_s=0.03), _two_starts(ttft_delay_s=0.005)
    found = bench.compare(base, treat, "prefill")
    headline = found.headline
    assert headline is not None and headline.metric == "ttft" and headline.concurrency == 1
    # two starts a side: the t-interval has about one degree of freedom; the point is the orientation
    assert headline.ratio > 2 and headline.verdict != "slower"
    assert headline.heading == "TTFT @1, 64 in"
    assert {s.metric for s in found.judged} == {"ttft", "input_tok_s"}
    assert headline.baseline_starts == headline.treatment_starts == 2
    # decode figures stand beside a prefill mode's
    assert {s.concurrency for s in found.decode} == {1, 2}
    assert all(s.metric == "output_tok_s" for s in found.decode)
    # the other way round it is a slowdown
    assert bench.compare(treat, base, "prefill").headline.ratio < 0.5


def test_decode_mode_is_judged_on_output_tok_s_at_every_level():
    base, treat = _report(0.004, repeats=3).to_dict(), _report(0.0005, repeats=3).to_dict()
    found = bench.compare(base, treat, "decode")
    assert [s.concurrency for s in found.judged] == [1, 2] and not found.decode
    assert all(s.metric == "output_tok_s" and s.ratio > 1 for s in found.judged)
    assert found.headline is not None and found.headline.concurrency == 2  # decode: the highest level


def test_one_server_start_per_mode_is_never_conclusive():
    # The spread between server starts was as large as the effects on the H200: one start measures none of it.
    base, treat = _report(0.004, repeats=3).to_dict(), _report(0.0005, repeats=3).to_dict()
    found = bench.speedup(base, treat, 2)
    assert found.ratio > 1 and found.inconclusive and found.why_inconclusive == "one server start per mode"
    assert found.range_text == "indeterminate: one server start per mode"
    pooled = bench.speedup(bench.pool_starts([base, base]), bench.pool_starts([treat, treat]), 2)
    assert not pooled.inconclusive and pooled.range_text.endswith("faster")


def test_an_interval_that_holds_one_is_indeterminate():
    base, treat = _report(0.001).to_dict(), _report(0.001).to_dict()
    base, treat = bench.pool_starts([base, base]), bench.pool_starts([treat, treat])
    # One treatment start slower than the baseline's, the other faster: the interval over starts holds 1.0.
    level = treat["levels"][0]
    median = sorted(r["output_tok_s"] for r in base["levels"][0]["runs"])[1]
    for run in level["runs"]:
        run["output_tok_s"] = median * (0.5 if run["start"] == 1 else 2)
    found = bench.speedup(base, treat, level["concurrency"])
    assert found.low < 1 < found.high and found.inconclusive
    assert "indeterminate: interval holds 1.0" in found.range_text


def test_a_record_without_the_prefill_profile_has_no_prefill_comparison():
    base, treat = _report(0.001).to_dict(), _report(0.001).to_dict()
    found = bench.compare(base, treat, "prefill")
    assert found.judged == () and found.headline is None and found.decode


def test_old_records_without_input_tok_s_still_compare():
    base, treat = ({**_report(0.002).to_dict(), "prefill": _report(0.0, profile="prefill").to_dict()} for _ in "ab")
    for record in (base, treat):
        for level in record["prefill"]["levels"]:
            for run in level["runs"]:
                del run["input_tok_s"]
    found = bench.speedup(base, treat, 1, metric="input_tok_s")
    assert found.baseline_repeats == 2 and found.ratio > 0


def test_a_mode_whose_answers_were_not_checked_is_never_called_faster():
    # A speed is judged only after the answers matched the baseline's: the ratio and interval stay, the verdict
    # does not, and no count of further starts is offered (more starts cannot check the answers).
    base, treat = _report(0.004, repeats=3).to_dict(), _report(0.0005, repeats=3).to_dict()
    base, treat = bench.pool_starts([base, base]), bench.pool_starts([treat, treat])
    judged = bench.compare(base, treat, "decode")
    assert judged.headline is not None and judged.headline.verdict == "faster"
    unjudged = bench.compare(base, treat, "decode", unjudged="output not checked against the baseline's")
    headline = unjudged.headline
    assert headline is not None and headline.verdict == "indeterminate" and headline.ratio == judged.headline.ratio
    assert (headline.low, headline.high) == (judged.headline.low, judged.headline.high)
    assert headline.range_text.endswith("indeterminate: output not checked against the baseline's")
    assert headline.starts_needed is None and headline.plan_text == ""
    assert all(s.verdict == "indeterminate" for s in unjudged.judged)
