"""The benchmark client: statistics, aggregation, and SSE parsing against a FAKE streaming server."""

import json
import socket

import pytest

from servematrix.stages import bench
from servematrix.stages.bench import (
    BenchReport,
    LatencyStats,
    LevelRun,
    RequestResult,
    Spread,
    Workload,
    make_prompt,
    percentile,
    run_workload_sync,
    smoke_check_sync,
)
from tests.fakes.fake_openai_server import FakeBehavior, FakeOpenAIServer, RequestLog


@pytest.fixture
def fake():
    with FakeOpenAIServer() as srv:
        yield srv


def _workload(**kw) -> Workload:
    base = dict(concurrency=(1, 3), input_len=12, output_len=8, prompts_per_concurrency=5, warmup=2, repeats=2)
    base.update(kw)
    return Workload(**base)


def _measured(log: list[RequestLog], w: Workload) -> list[RequestLog]:
    """The server's log without warmup requests: per level, warmup requests all finish before measured ones."""
    out, pos = [], 0
    for _ in w.concurrency:
        pos += w.warmup
        out.extend(log[pos : pos + w.prompts_per_concurrency * w.repeats])
        pos += w.prompts_per_concurrency * w.repeats
    assert pos == len(log)
    return out


# ----------------------------------------------------------------------------------------- pure statistics


def test_percentile_matches_linear_interpolation():
    assert percentile([1.0], 99) == 1.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_latency_stats_and_spread():
    s = LatencyStats.of([0.1, 0.2, 0.3, 0.4])
    assert (s.count, s.mean, s.p50) == (4, pytest.approx(0.25), pytest.approx(0.25))
    assert s.p99 == pytest.approx(0.397)
    assert LatencyStats.of([]) == LatencyStats(0, None, None, None)
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(1.0, 2.0, 3.0)


def test_level_run_aggregates_only_completed_requests_and_counts_errors():
    results = [
        RequestResult(ok=True, ttft_s=0.1, itl_s=[0.01, 0.03], e2e_s=0.2, completion_tokens=3, prompt_tokens=5),
        RequestResult(ok=True, ttft_s=0.3, itl_s=[0.02], e2e_s=0.4, completion_tokens=7, prompt_tokens=5),
        RequestResult(ok=False, error="http_500", error_detail="boom"),
        RequestResult(ok=False, error="missing_usage", ttft_s=9.0, itl_s=[9.0], e2e_s=9.0),
        RequestResult(ok=False, error="http_500"),
    ]
    run = LevelRun.aggregate(4, 1, results, wall_s=2.0)
    assert (run.num_requests, run.completed, run.error_count) == (5, 2, 3)
    assert run.errors == {"http_500": 2, "missing_usage": 1}
    assert run.error_samples[0] == "http_500: boom"
    assert run.completion_tokens == 10 and run.prompt_tokens == 10
    assert run.output_tok_s == pytest.approx(5.0) and run.request_s == pytest.approx(1.0)
    assert run.ttft.mean == pytest.approx(0.2)  # the failed request's 9 s is not in the latency stats
    assert run.itl.count == 3 and run.itl.mean == pytest.approx(0.02)
    assert run.e2e.p50 == pytest.approx(0.3)


def test_prompts_are_deterministic_distinct_and_roughly_sized():
    assert make_prompt(7, 32) == make_prompt(7, 32)
    prompts = [make_prompt(i, 32) for i in range(200)]
    assert len(set(prompts)) == 200
    # distinct from the very first word, so no shared prefixes beyond the chat template
    assert len({p.split(":")[0] for p in prompts}) == 200
    assert all(28 <= len(p.split()) <= 34 for p in prompts)
    assert len(make_prompt(0, 1000).split()) == pytest.approx(1000, abs=5)


def test_workload_validation():
    with pytest.raises(ValueError):
        _workload(concurrency=())
    with pytest.raises(ValueError):
        _workload(concurrency=(0,))
    with pytest.raises(ValueError):
        _workload(api="responses")
    with pytest.raises(ValueError):
        _workload(repeats=0)
    with pytest.raises(TypeError):
        Workload((1,), 1, 1, 1, 0, 1)  # keyword-only
    assert _workload().ignore_eos is False  # transformers serve answers 422 to unknown fields


# --------------------------------------------------------------------------------------- against the fake


@pytest.mark.parametrize(
    ("usage", "send_done", "api", "nulls"),
    [
        ("final_chunk", False, "chat", False),  # transformers serve
        ("separate_chunk", True, "chat", True),  # sglang / vLLM (null fields in every chunk)
        ("final_chunk", False, "completions", False),
        ("separate_chunk", True, "completions", True),
    ],
)
def test_counts_exactly_the_servers_usage_and_excludes_warmup(fake, usage, send_done, api, nulls):
    # 3 tokens per chunk and early stops: chunk counts and max_tokens both differ from the usage counts.
    behavior = FakeBehavior(usage=usage, send_done=send_done, tokens_per_chunk=3, early_eos_mod=4, null_fields=nulls)
    fake.set_behavior(behavior)
    w = _workload(api=api)
    report = run_workload_sync(fake.base_url, "m", w)

    assert len(fake.log) == len(w.concurrency) * (w.warmup + w.prompts_per_concurrency * w.repeats)
    measured = _measured(fake.log, w)
    assert report.error_count == 0
    assert report.completion_tokens == sum(e.completion_tokens for e in measured)
    assert report.completion_tokens < sum(e.completion_tokens for e in fake.log)  # warmup had tokens too
    assert report.completion_tokens != len(measured) * w.output_len  # early stops are really counted
    for lv, c in zip(report.levels, w.concurrency, strict=True):
        assert lv.concurrency == c and lv.warmup_requests == w.warmup and len(lv.runs) == w.repeats
        assert all(r.num_requests == w.prompts_per_concurrency == r.completed for r in lv.runs)
        assert lv.completion_tokens == sum(r.completion_tokens for r in lv.runs)
    assert all(e.path.endswith("/chat/completions" if api == "chat" else "/v1/completions") for e in fake.log)


def test_request_body(fake):
    run_workload_sync(fake.base_url, "the-model", _workload(concurrency=(1,), warmup=0, repeats=1, temperature=0.5))
    body = fake.log[0].body
    assert body["model"] == "the-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8 and body["temperature"] == 0.5
    assert body["messages"][0]["role"] == "user" and "ignore_eos" not in body
    assert len({e.prompt for e in fake.log}) == len(fake.log)


@pytest.mark.parametrize("processes", [1, 3])
def test_concurrency_is_reached_and_never_exceeded(fake, processes):
    fake.set_behavior(FakeBehavior(token_delay_s=0.005))
    w = _workload(
        concurrency=(4,), prompts_per_concurrency=12, warmup=0, repeats=1, output_len=10, client_processes=processes
    )
    report = run_workload_sync(fake.base_url, "m", w)
    assert report.error_count == 0
    assert fake.state.max_in_flight == 4


def test_latencies_are_measured_from_content_chunks(fake):
    fake.set_behavior(FakeBehavior(first_token_delay_s=0.05, token_delay_s=0.01))
    w = _workload(concurrency=(1,), prompts_per_concurrency=2, warmup=0, repeats=1, output_len=5)
    run = run_workload_sync(fake.base_url, "m", w).levels[0].runs[0]
    assert run.ttft.count == 2 and run.ttft.p50 >= 0.05  # the role chunk, sent at once, is not content
    # The server sleeps 10 ms between chunks; under load, reads can bunch up on the client, so bounds are loose.
    assert run.itl.count == 2 * 4 and run.itl.mean >= 0.005
    assert run.e2e.p50 >= 0.05 + 4 * 0.01


def test_reasoning_deltas_count_for_latencies(fake):
    fake.set_behavior(FakeBehavior(reasoning_chunks=3, first_token_delay_s=0.05))
    w = _workload(concurrency=(1,), prompts_per_concurrency=1, warmup=0, repeats=1, output_len=6)
    run = run_workload_sync(fake.base_url, "m", w).levels[0].runs[0]
    assert run.completed == 1 and run.completion_tokens == 6
    assert run.itl.count == 5  # 3 reasoning + 3 content chunks
    assert run.ttft.p50 >= 0.05


def test_spread_and_median_across_repeats(fake):
    w = _workload(concurrency=(1, 2), repeats=3)
    report = run_workload_sync(fake.base_url, "m", w)
    for c in (1, 2):
        lv = report.level(c)
        values = sorted(r.output_tok_s for r in lv.runs)
        assert (lv.output_tok_s.min, lv.output_tok_s.median, lv.output_tok_s.max) == tuple(values)
        assert report.output_tok_s(c) == values[1]
        for r in lv.runs:
            assert r.output_tok_s == pytest.approx(r.completion_tokens / r.wall_s)
    assert report.output_tok_s(99) is None


def test_to_dict_is_json_serialisable(fake):
    messages = []
    report = run_workload_sync(fake.base_url, "m", _workload(), progress=messages.append)
    d = json.loads(json.dumps(report.to_dict()))
    assert d["workload"]["concurrency"] == [1, 3]
    assert d["completion_tokens"] == report.completion_tokens
    assert d["levels"][0]["runs"][0]["ttft"]["p99"] > 0
    assert set(d["levels"][0]["output_tok_s"]) == {"min", "median", "max"}
    assert d["client"]["processes"] == 1 and "bench_worker" in d["client"]["transport"]
    assert d["levels"][0]["runs"][0]["client_cpu_s"] > 0
    assert d["client_ceiling"] is None and d["levels"][0]["client_ceiling_tok_s"] is None
    assert d["levels"][0]["client_busy"] > 0 and isinstance(d["levels"][0]["client_bound"], bool)
    assert any("c=3 repeat 2/2" in m for m in messages)


def test_http_errors_are_counted_not_raised(fake):
    fake.set_behavior(FakeBehavior(fail_every=3))
    w = _workload(concurrency=(2,), prompts_per_concurrency=9, warmup=0, repeats=1)
    report = run_workload_sync(fake.base_url, "m", w)
    run = report.levels[0].runs[0]
    assert run.errors == {"http_500": 3} and run.completed == 6
    assert run.completion_tokens == sum(e.completion_tokens for e in fake.log if e.status == 200)
    assert "fake failure" in run.error_samples[0]


def test_warmup_errors_are_reported_separately(fake):
    fake.set_behavior(FakeBehavior(fail_every=1))
    report = run_workload_sync(fake.base_url, "m", _workload(concurrency=(1,), warmup=2, repeats=1))
    assert report.levels[0].warmup_errors == {"http_500": 2}
    assert report.levels[0].error_count == 5


def test_missing_usage_is_an_error(fake):
    fake.set_behavior(FakeBehavior(usage="none"))
    report = run_workload_sync(fake.base_url, "m", _workload(concurrency=(1,), warmup=0, repeats=1))
    run = report.levels[0].runs[0]
    assert run.errors == {"missing_usage": 5} and run.completion_tokens == 0 and run.output_tok_s == 0


def test_dropped_streams_are_errors(fake):
    fake.set_behavior(FakeBehavior(drop_every=2))
    report = run_workload_sync(fake.base_url, "m", _workload(concurrency=(1,), warmup=0, repeats=1))
    run = report.levels[0].runs[0]
    assert run.error_count == 2 and run.completed == 3
    assert set(run.errors) <= {"transport", "missing_usage"}


def test_timeouts_are_errors(fake):
    fake.set_behavior(FakeBehavior(token_delay_s=0.2))
    w = _workload(concurrency=(2,), prompts_per_concurrency=2, warmup=0, repeats=1, timeout_s=0.3)
    run = run_workload_sync(fake.base_url, "m", w).levels[0].runs[0]
    assert run.errors == {"timeout": 2}


def test_unreachable_server_is_an_error_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    w = _workload(concurrency=(1,), prompts_per_concurrency=2, warmup=0, repeats=1)
    run = run_workload_sync(f"http://127.0.0.1:{port}", "m", w).levels[0].runs[0]
    assert run.errors == {"connect": 2}


def test_ignore_eos_is_opt_in(fake):
    fake.set_behavior(FakeBehavior(reject_fields=frozenset({"ignore_eos"})))  # as transformers serve does
    w = _workload(concurrency=(1,), warmup=0, repeats=1)
    assert run_workload_sync(fake.base_url, "m", w).error_count == 0
    report = run_workload_sync(fake.base_url, "m", _workload(concurrency=(1,), warmup=0, repeats=1, ignore_eos=True))
    assert report.levels[0].runs[0].errors == {"http_422": 5}
    assert fake.log[-1].body["ignore_eos"] is True


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_smoke_check(fake, api):
    res = smoke_check_sync(fake.base_url, "m", api=api)
    assert res.ok, res.reason
    assert res.text == " tok" * bench.SMOKE_MAX_TOKENS
    assert len(fake.log) == 2 and fake.log[0].body["temperature"] == 0.0


def test_smoke_check_failures(fake):
    fake.set_behavior(FakeBehavior(vary_text=True))
    res = smoke_check_sync(fake.base_url, "m")
    assert not res.ok and "not deterministic" in res.reason
    fake.set_behavior(FakeBehavior(tokens=0))
    res = smoke_check_sync(fake.base_url, "m")
    assert not res.ok and "no text" in res.reason
    fake.set_behavior(FakeBehavior(fail_every=1))
    res = smoke_check_sync(fake.base_url, "m")
    assert not res.ok and "http_500" in res.reason


def test_report_type():
    assert BenchReport.output_tok_s.__doc__


def test_a_workload_takes_every_bench_setting_of_the_matrix_by_name():
    from servematrix.config.spec import BenchSpec

    settings = BenchSpec(
        concurrency=[1, 8], input_len=64, output_len=16, prompts_per_concurrency=8, warmup=1, repeats=3,
        api="completions", temperature=0.5, min_level_s=2.0, starts=2, client_processes=4, client_cpus=2,
    )  # fmt: skip
    workload = bench.Workload.from_settings(settings.model_dump(), ignore_eos=True, client_cpus=(6, 7))
    assert workload == bench.Workload(
        concurrency=(1, 8), input_len=64, output_len=16, prompts_per_concurrency=8, warmup=1, repeats=3,
        api="completions", temperature=0.5, min_level_s=2.0, client_processes=4, ignore_eos=True,
        client_cpus=(6, 7), max_warmup_repeats=3,
    )  # fmt: skip


def test_a_workload_over_sglang_generate_against_the_fake_counts_every_token():
    # the fake server speaks sglang 0.5.12's /generate stream format (stages/bench_fake.py)
    from servematrix.stages import bench
    from servematrix.stages.bench_fake import FakeBehavior, FakeOpenAIServer

    with FakeOpenAIServer(FakeBehavior()) as srv:
        workload = bench.Workload(
            concurrency=(1, 4), input_len=8, output_len=12, prompts_per_concurrency=8, warmup=1, repeats=2,
            api="generate", ignore_eos=True,
        )  # fmt: skip
        report = bench.run_workload_sync(srv.base_url, "fake", workload)
        assert all(e.path == "/generate" for e in srv.log)
    for level in report.levels:
        for run in level.runs:
            assert (run.completed, run.error_count, run.completion_tokens) == (8, 0, 96)
            assert run.ttft.count == 8 and run.itl.count == 8 * 11
