"""The packing schedule as pure functions: longest first, disjoint GPUs at every moment, aligned GPU blocks,
CPU slices, and the makespan against its lower bound."""

from __future__ import annotations

import random

import pytest

from servematrix.planning.schedule import (
    Job,
    Packer,
    Span,
    choose_gpus,
    cpu_slices,
    longest_first,
    lower_bound,
    makespan,
    placement,
    shared_cpus,
    simulate,
)


def _overlapping(a: Span, b: Span) -> bool:
    return a.start_s < b.end_s and b.start_s < a.end_s


def _random_jobs(rng: random.Random, count: int, gpus: int) -> list[Job]:
    sizes = [k for k in (1, 2, 4, 8) if k <= gpus]
    return [Job(key=f"e{i}", gpus=rng.choice(sizes), estimate_s=rng.uniform(1, 100)) for i in range(count)]


def test_longest_first_and_more_gpus_first_among_equals():
    jobs = [
        Job(key="a", gpus=1, estimate_s=5),
        Job(key="b", gpus=4, estimate_s=5),
        Job(key="c", gpus=2, estimate_s=9),
        Job(key="d", gpus=1, estimate_s=1),
    ]
    assert [j.key for j in longest_first(jobs)] == ["c", "b", "a", "d"]


def test_gpus_are_chosen_in_aligned_blocks_when_one_is_free():
    assert choose_gpus({0, 1, 2, 3}, 2) == (0, 1)
    assert choose_gpus({1, 2, 3}, 2) == (2, 3)  # not 1-2: that would split both pairs
    assert choose_gpus({1, 2, 4, 5, 6, 7}, 4) == (4, 5, 6, 7)
    assert choose_gpus({1, 2, 5}, 2) == (1, 2)  # no aligned pair is free: any two
    assert choose_gpus({0, 1}, 4) is None


def test_a_shorter_job_starts_beside_a_longer_one_that_waits_for_more_gpus():
    packer = Packer([Job(key="big", gpus=4, estimate_s=10), Job(key="small", gpus=1, estimate_s=2)], gpus=4)
    assert [(j.key, g) for j, g in packer.start({1, 2, 3})] == [("small", (1,))]
    assert [j.key for j in packer.waiting] == ["big"]


def test_a_job_larger_than_the_host_is_refused():
    with pytest.raises(ValueError, match="needs 8 GPUs; this host has 4"):
        Packer([Job(key="e", gpus=8, estimate_s=1)], gpus=4)


@pytest.mark.parametrize("gpus", [2, 4, 8])
@pytest.mark.parametrize("seed", range(20))
def test_jobs_that_overlap_in_time_never_share_a_gpu(gpus, seed):
    rng = random.Random(seed)
    spans = simulate(_random_jobs(rng, 12, gpus), gpus)
    assert len(spans) == 12
    for span in spans:
        assert len(span.gpus) == span.job.gpus and set(span.gpus) <= set(range(gpus))
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if _overlapping(a, b):
                assert not set(a.gpus) & set(b.gpus), (a, b)
    assert makespan(spans) >= lower_bound(spans, gpus) - 1e-9


def test_the_lower_bound_is_gpu_seconds_over_gpus_or_the_longest_job():
    wide = [Span(job=Job(key=k, gpus=2, estimate_s=10), gpus=(0, 1), start_s=0, end_s=10) for k in "ab"]
    assert lower_bound(wide, 4) == 10  # 40 GPU-seconds / 4 = 10 = the longest job
    long_one = [Span(job=Job(key="a", gpus=1, estimate_s=30), gpus=(0,), start_s=0, end_s=30)]
    assert lower_bound(long_one, 4) == 30
    many = [Span(job=Job(key=str(i), gpus=1, estimate_s=5), gpus=(0,), start_s=0, end_s=5) for i in range(16)]
    assert lower_bound(many, 4) == 20


def test_a_mixed_matrix_packs_within_a_tenth_of_its_lower_bound():
    """The mix of the packing test: one 4-GPU job, two 2-GPU jobs, four 1-GPU jobs on 4 GPUs."""
    jobs = [Job(key="four", gpus=4, estimate_s=10)]
    jobs += [Job(key=f"two{i}", gpus=2, estimate_s=13) for i in range(2)]
    jobs += [Job(key=f"one{i}", gpus=1, estimate_s=9) for i in range(4)]
    spans = simulate(jobs, 4)
    assert makespan(spans) <= 1.1 * lower_bound(spans, 4)


def test_cpu_slices_are_disjoint_and_cover_the_cpus():
    slices = cpu_slices(list(range(16)), 4)
    assert slices == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    uneven = cpu_slices([0, 1, 2, 3, 4, 5, 6], 3)
    assert sorted(c for s in uneven for c in s) == list(range(7)) and all(uneven)
    assert not shared_cpus(range(16), 4)
    assert placement((2, 3), slices).cpus == tuple(range(8, 16))


def test_with_fewer_cpus_than_gpus_the_gpus_share_them_and_it_is_said():
    assert shared_cpus([0, 1], 4)
    assert cpu_slices([0, 1], 4) == [(0,), (0,), (1,), (1,)]
