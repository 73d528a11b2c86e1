"""Planning a sweep: server reuse across rates, one baseline per sweep, resume, estimates."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import ConfigError, JobConfig, LoadConfig, SpecConfig
from pipeline.plan import ServerLine, describe, estimate_s, plan_sweep, point_hash, server_key


def _grid(ks: list[int], rates: list[float], method: str = "ngram") -> list[JobConfig]:
    return [
        dataclasses.replace(JobConfig(), spec=SpecConfig(method=method, k=k), load=LoadConfig(request_rate=r))
        for k in ks
        for r in rates
    ]


def test_k_by_rate_grid_starts_one_server_per_k_plus_one_baseline() -> None:
    plan = plan_sweep(_grid([3, 5, 7], [1.0, 2.0]))
    assert [g.role for g in plan.groups] == ["baseline", "speculative", "speculative", "speculative"]
    assert [len(g.points) for g in plan.groups] == [2, 2, 2, 2]
    assert len(plan.points) == 8  # 6 speculative points + 2 baseline rates, not 12 baselines
    for group in plan.groups:
        assert len({server_key(p.job) for p in group.points}) == 1
        assert [p.job.load.request_rate for p in group.points] == [1.0, 2.0]
    baseline_hashes = {p.hash for p in plan.groups[0].points}
    assert {p.baseline_hash for g in plan.groups[1:] for p in g.points} == baseline_hashes


def test_each_speculative_point_pairs_with_the_baseline_at_its_own_rate() -> None:
    plan = plan_sweep(_grid([3], [1.0, 4.0]))
    by_hash = {p.hash: p for p in plan.points}
    for point in plan.groups[1].points:
        base = by_hash[point.baseline_hash]
        assert base.role == "baseline" and base.job.load == point.job.load and base.job.spec.method == "none"


def test_hash_ignores_where_and_how_a_sweep_runs_but_not_what_it_measures() -> None:
    job = JobConfig()
    moved = dataclasses.replace(job, output_dir="elsewhere", sweep_name="other", force=True)
    assert point_hash(moved) == point_hash(job)
    assert point_hash(dataclasses.replace(job, seed=1)) != point_hash(job)
    assert point_hash(dataclasses.replace(job, load=LoadConfig(request_rate=2.0))) != point_hash(job)


def test_without_skips_finished_points_and_drops_empty_groups() -> None:
    plan = plan_sweep(_grid([3, 5], [1.0, 2.0]))
    finished = [p.hash for p in plan.groups[0].points] + [plan.groups[1].points[0].hash]
    left = plan.without(finished)
    assert [g.index for g in left.groups] == [2, 3]  # the baseline server is not started again
    assert len(left.groups[0].points) == 1 and len(left.groups[1].points) == 2


def test_baseline_only_and_duplicate_jobs() -> None:
    plan = plan_sweep(_grid([0], [1.0, 1.0], method="none"))
    assert len(plan.groups) == 1 and len(plan.points) == 1


def test_empty_grid_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="expands to no jobs"):
        plan_sweep([])


def test_estimate_grows_with_servers_and_describe_lists_every_point() -> None:
    one, three = plan_sweep(_grid([3], [1.0])), plan_sweep(_grid([3, 5], [1.0, 2.0]))
    assert estimate_s(three, on_gpu=False) > estimate_s(one, on_gpu=False) > 60
    lines = [ServerLine("vLLM", "0.32.0", ("vllm", "--port", "<free port>"), {"A": "1"})] * len(three.groups)
    text = describe(three, lines, on_gpu=False)
    assert "server 3/3 speculative (ngram k=5)" in text and "point ngram-k5-r2" in text
    assert "3 server start(s), 6 measured point(s)" in text and "--port <free port>" in text


def test_repeats_share_servers_and_pair_with_their_own_baseline_repeat() -> None:
    jobs = [dataclasses.replace(job, repeats=3) for job in _grid([3], [1.0, 2.0])]
    plan = plan_sweep(jobs)
    assert len(plan.groups) == 2  # still one baseline and one speculative server
    assert [len(g.points) for g in plan.groups] == [6, 6]
    by_hash = {p.hash: p for p in plan.points}
    for point in plan.groups[1].points:
        base = by_hash[point.baseline_hash]
        assert base.job.repeat == point.job.repeat and base.job.load == point.job.load
    assert {p.label for p in plan.groups[1].points} >= {"ngram-k3-r1", "ngram-k3-r1-rep1", "ngram-k3-r2-rep2"}
    assert len({p.hash for p in plan.points}) == 12  # each repeat is its own point (and resumes alone)
