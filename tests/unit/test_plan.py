"""Planning a sweep: server reuse across rates, one baseline per sweep, resume, estimates."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import ConfigError, JobConfig, LoadConfig, RepeatsConfig, SpecConfig
from pipeline.identity import point_hash, server_key
from pipeline.run.estimate import estimate_here
from pipeline.run.plan import ServerLine, describe, plan_sweep


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
    assert estimate_here(three, on_gpu=False).wall_s > estimate_here(one, on_gpu=False).wall_s > 60
    lines = [ServerLine("vLLM", "0.32.0", ("vllm", "--port", "<free port>"), {"A": "1"})] * len(three.groups)
    cost = estimate_here(three, on_gpu=False)
    text = describe(three, lines, cost.points_s, cost.lines())
    assert "server 3/3 speculative (ngram k=5)" in text and "point ngram-k5-r2" in text
    assert "3 server start(s), 6 measured point(s)" in text and "--port <free port>" in text


def test_repeats_share_servers_and_pair_with_their_own_baseline_repeat() -> None:
    jobs = [dataclasses.replace(job, repeats=RepeatsConfig(count=3)) for job in _grid([3], [1.0, 2.0])]
    plan = plan_sweep(jobs)
    assert len(plan.groups) == 2  # still one baseline and one speculative server
    assert [len(g.points) for g in plan.groups] == [6, 6]
    by_hash = {p.hash: p for p in plan.points}
    for point in plan.groups[1].points:
        base = by_hash[point.baseline_hash]
        assert base.job.repeat == point.job.repeat and base.job.load == point.job.load
    assert {p.label for p in plan.groups[1].points} >= {"ngram-k3-r1", "ngram-k3-r1-rep1", "ngram-k3-r2-rep2"}
    assert len({p.hash for p in plan.points}) == 12  # each repeat is its own point (and resumes alone)


def test_cold_and_warm_cache_share_a_server_off_needs_its_own() -> None:
    from pipeline.config import EngineConfig

    jobs = [dataclasses.replace(JobConfig(), engine=EngineConfig(prefix_cache=p)) for p in ("cold", "warm", "off")]
    cold, warm, off = (server_key(j) for j in jobs)
    assert cold == warm != off
    assert len({point_hash(j) for j in jobs}) == 3  # still three points


def test_restart_gives_every_repeat_fresh_servers() -> None:
    jobs = [dataclasses.replace(job, repeats=RepeatsConfig(count=2, restart=True)) for job in _grid([3], [1.0, 2.0])]
    plan = plan_sweep(jobs)
    assert [g.label for g in plan.groups] == ["01-baseline", "02-baseline-rep1", "03-ngram-k3", "04-ngram-k3-rep1"]
    assert all({p.job.repeat for p in g.points} == {int(g.label.endswith("rep1"))} for g in plan.groups)
    by_hash = {p.hash: p for p in plan.points}
    for point in plan.points:
        if point.baseline_hash:
            assert by_hash[point.baseline_hash].job.repeat == point.job.repeat


def test_aa_pairs_each_baseline_with_an_identical_twin_server() -> None:
    jobs = [dataclasses.replace(job, aa=True) for job in _grid([0], [1.0, 4.0], method="none")]
    plan = plan_sweep(jobs)
    assert [g.label for g in plan.groups] == ["01-baseline", "02-baseline-twin"]
    base, twin = plan.groups
    assert [p.job.spec.method for p in twin.points] == ["none", "none"]
    assert [p.baseline_hash for p in twin.points] == [p.hash for p in base.points]
    assert server_key(base.points[0].job) != server_key(twin.points[0].job)
    assert {p.label for p in twin.points} == {"baseline-twin-r1", "baseline-twin-r4"}


def test_aa_with_speculation_is_refused() -> None:
    from pipeline.validate import validate

    with pytest.raises(ConfigError, match="aa=true compares two servers without speculation; set spec=none"):
        validate(dataclasses.replace(JobConfig(), aa=True))
