"""The correctness check (issue 35): greedy answers with top-k logprobs against the baseline's, by vLLM's
check_logprobs_close rule, against the FAKE server's deterministic fake model with injected faults; its
warm-up-until-stable and capture-time neighbours; and the accuracy probe's scoring."""

import pytest

from servematrix.stages.bench import correctness as cx
from servematrix.stages.bench.stats import drift
from servematrix.stages.bench_fake import FakeBehavior, FakeOpenAIServer


def _answers(behavior: FakeBehavior, api: str) -> dict:
    with FakeOpenAIServer(behavior) as srv:
        return cx.collect(srv.base_url, "m", api=api, concurrency=(1, 4))


@pytest.mark.parametrize("api", ["chat", "completions", "generate"])
def test_the_same_model_passes_and_garbage_tokens_fail_with_where_and_what(api):
    base = _answers(FakeBehavior(), api)
    assert all(a.has_logprobs and len(a.tokens) == cx.MAX_TOKENS for answers in base.values() for a in answers)
    same = cx.check(base, _answers(FakeBehavior(), api))
    assert same.ok and same.method == "top-k logprobs" and same.compared == 2 * len(cx.PROMPTS)

    wrong = cx.check(base, _answers(FakeBehavior(wrong_tokens_from=3), api))
    assert not wrong.ok and len(wrong.mismatches) == wrong.compared
    first = wrong.mismatches[0]
    assert first.position == 3 and first.prompt == 0 and first.concurrency == 1
    assert first.mode_token in ("<pad>", 64) and first.baseline_token != first.mode_token
    assert first.baseline_logprob == pytest.approx(-0.05) and first.mode_logprob == pytest.approx(-0.01)
    text = wrong.excerpt()
    assert "The capital of France is" in text and "position 3" in text and "not in the baseline's top-k" in text


def test_a_divergence_inside_each_others_top_k_passes():
    # A near tie decided the other way (batched numerics): the sequences part there, as vLLM allows.
    base = _answers(FakeBehavior(), "completions")
    tie = _answers(FakeBehavior(near_tie_from=2), "completions")
    assert tie[1][0].tokens[2] != base[1][0].tokens[2]
    assert cx.check(base, tie).ok


def test_without_logprobs_it_falls_back_to_greedy_text_and_says_so():
    base = _answers(FakeBehavior(no_logprobs=True), "chat")
    assert not any(a.has_logprobs for a in base[1])
    same = cx.check(base, _answers(FakeBehavior(no_logprobs=True), "chat"))
    assert same.ok and same.method == "greedy text equality (the API gave no logprobs)"
    assert "no logprobs" in same.summary()
    wrong = cx.check(base, _answers(FakeBehavior(no_logprobs=True, wrong_tokens_from=5), "chat"))
    assert not wrong.ok and "no logprobs from the API" in wrong.mismatches[0].why


def test_a_server_that_refuses_the_logprobs_fields_is_asked_again_without_them():
    behavior = FakeBehavior(reject_fields=frozenset({"logprobs", "top_logprobs"}))
    with FakeOpenAIServer(behavior) as srv:
        got = cx.collect(srv.base_url, "m", api="chat", concurrency=(1,))
        statuses = [e.status for e in srv.log]
    assert statuses[:2] == [422, 200] and statuses.count(422) == 1
    assert got[1][0].text and not got[1][0].has_logprobs


def test_an_answer_that_stops_early_fails():
    base = _answers(FakeBehavior(), "generate")
    short = {
        c: [cx.Answer(**{**a.__dict__, "tokens": a.tokens[:5], "top": a.top[:5]}) for a in v] for c, v in base.items()
    }
    result = cx.check(base, short)
    assert not result.ok and result.mismatches[0].position == 5 and "ends" in result.mismatches[0].why


def test_baseline_answers_are_stored_by_environment_model_and_prompt_set():
    base = _answers(FakeBehavior(), "generate")
    key = cx.CorrectnessKey(env_id="e1", model="m", api="generate")
    record = {"correctness": {"key": key.to_dict(), "answers": cx.answers_to_dict(base)}}
    assert cx.stored_answers(record, key) == base
    for other in (
        cx.CorrectnessKey(env_id="e2", model="m", api="generate"),
        cx.CorrectnessKey(env_id="e1", model="other", api="generate"),
        cx.CorrectnessKey(env_id="e1", model="m", api="generate", prompt_set="greedy-v2"),
    ):
        assert cx.stored_answers(record, other) is None
    assert cx.batch_concurrency([1, 32]) == len(cx.PROMPTS) and cx.batch_concurrency([1]) == 2


def test_the_arithmetic_probe_is_generated_and_scored_by_exact_match():
    problems = cx.arithmetic_prompts(4, seed=1)
    assert problems == cx.arithmetic_prompts(4, seed=1) and all(1000 <= s - 0 < 20000 for _, s in problems)
    right = [f" {s:,}." for _, s in problems]
    assert cx.score_arithmetic(right, problems) == 1.0
    assert cx.score_arithmetic([" 12", *right[1:]], problems) == 0.75
    assert cx.score_arithmetic(["", "", "", ""], problems) == 0.0


def test_drift_is_a_trend_past_the_bound_not_one_outlier():
    assert drift([53.6, 45.0, 38.0, 33.0, 31.0, 29.8])["drifting"]  # the 0.5.12 baseline's TTFT @4
    assert not drift([30.0, 31.0, 29.5, 30.5])["drifting"]
    assert not drift([30.0, 45.0, 29.0, 31.0])["drifting"]  # halves overlap: an outlier, not a trend
    assert drift([10.0])["drifting"] is None


def test_a_drifting_level_is_warmed_up_until_stable_within_its_bound_and_says_so():
    from servematrix.stages.bench import Workload, run_workload_sync

    # A bound no two repeats meet: every window drifts, so the level discards up to its bound and says so.
    w = Workload(
        concurrency=(2,), input_len=8, output_len=4, prompts_per_concurrency=3, warmup=1, repeats=2,
        drift_bound=1e-12, max_warmup_repeats=2,
    )  # fmt: skip
    with FakeOpenAIServer(FakeBehavior()) as srv:
        level = run_workload_sync(srv.base_url, "m", w).levels[0]
        sent = len(srv.log)
    assert len(level.runs) == 2 and level.warmup_repeats == 2
    (found,) = level.stability
    assert found["figure"] == "output_tok_s" and len(found["discarded"]) == 2 and found["stable"] is False
    assert sent == 1 + 3 * (2 + 2)
    assert [r.repeat for r in level.runs] == [2, 3]  # the kept repeats are the last ones measured
    # A loose bound is met at once: nothing discarded, and recorded as stable.
    loose = Workload(**{**w.__dict__, "drift_bound": 10.0})
    with FakeOpenAIServer(FakeBehavior()) as srv:
        level = run_workload_sync(srv.base_url, "m", loose).levels[0]
    assert level.warmup_repeats == 0 and level.stability[0]["stable"] is True
