"""gate.mode=paired: the one-sided t over pairs, Holm, power, change points, the ABBA plan and
the night's decision, each on inputs with a known answer."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pipeline.analysis import change_points, gate_summary, paired
from pipeline.analysis.paired import NightWindow
from pipeline.analysis.samples import Sample
from pipeline.config import ConfigError, GateConfig, JobConfig, LoadConfig, SpecConfig, SweepSettings
from pipeline.finish.judge import fingerprint, recorded_config
from pipeline.run.outcomes import GroupOutcome
from pipeline.run.search import kinds, paired_night
from pipeline.run.search.strategy import Context
from pipeline.validate import validate
from tests.fakes import recorded_identity
from tests.in_process import sweep_in_process


def test_the_one_sided_t_over_pairs_agrees_with_scipys_test_and_its_interval() -> None:
    logs = [0.10, 0.12, 0.14, 0.16]  # the candidate about 14 % slower in every pair
    test = paired.one_sided_t("median_tpot_ms", logs, floor=0.01, alpha=0.05)
    expected = scipy_stats.ttest_1samp(logs, popmean=math.log1p(0.01), alternative="greater").pvalue
    assert test.p == pytest.approx(expected) and test.pairs == 4
    assert test.change == pytest.approx(math.expm1(0.13))
    assert test.low is not None and test.high is not None and test.low < test.change < test.high
    # Within the floor, or faster: no evidence of a slowdown past it.
    assert paired.one_sided_t("m", [0.00, 0.01, -0.01, 0.005], 0.01, 0.05).p > 0.5  # type: ignore[operator]
    assert paired.one_sided_t("m", [0.2], 0.01, 0.05).p is None  # one pair: no spread, no test


def test_holm_adjusts_a_family_step_down() -> None:
    tests = [paired.PairedTest(m, 4, 0.0, None, None, 0.1, p) for m, p in (("a", 0.01), ("b", 0.04), ("c", 0.03))]
    adjusted = [t.p_adjusted for t in paired.holm(tests)]
    assert adjusted == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01; max(2 x 0.03, 0.03); 0.06


def test_holm_agrees_with_statsmodels_on_random_families(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from statsmodels.stats.multitest import multipletests

    monkeypatch.setattr(gc, "collect", lambda generation=2: 0)  # its 200 collections cost 20 s here
    rng = np.random.default_rng(7)
    for size in (1, 2, 3, 5, 8):
        for _ in range(40):
            p = rng.uniform(0, 1, size) ** rng.uniform(0.5, 4)  # many small p, as a night has
            if size > 2:
                p[1] = p[0]  # ties keep their order
            expected = multipletests(p, method="holm")[1]
            assert paired.holm_adjusted(p) == pytest.approx(expected, abs=1e-12)


def test_the_power_statement_is_where_power_crosses_eighty_percent() -> None:
    sd = 0.062
    statement = paired.power_statement(sd, pairs=4, alpha=0.05, floor=0.01, target=0.15)
    bound = statement.sd_bound
    assert statement.detectable is not None
    assert paired.power_of(statement.detectable, bound, 4, 0.05, 0.01) == pytest.approx(paired.DESIGN_POWER, abs=1e-3)
    short = paired.power_statement(sd, pairs=2, alpha=0.05, floor=0.01, target=0.15)
    needed = short.pairs_for_target
    assert needed is not None and paired.power_of(0.15, short.sd_bound, needed, 0.05, 0.01) >= paired.DESIGN_POWER
    assert paired.power_of(0.15, short.sd_bound, needed - 1, 0.05, 0.01) < paired.DESIGN_POWER or needed == 2
    # A Monte Carlo of the same test agrees with statsmodels' power.
    rng = np.random.default_rng(1)
    hits = [
        paired.one_sided_t("m", rng.normal(math.log1p(0.10), sd, 4), 0.01, 0.05).p < 0.05  # type: ignore[operator]
        for _ in range(4000)
    ]
    assert np.mean(hits) == pytest.approx(paired.power_of(0.10, sd, 4, 0.05, 0.01), abs=0.03)
    assert "misses gate.detect" in paired.power_statement(0.3, 3, 0.05, 0.01, 0.15).text()


def test_the_power_statement_holds_where_scipys_noncentral_t_gives_nan() -> None:
    # The default design at the spread measured here: scipy's noncentral t is NaN far in its
    # tail (a slowdown of 5x at 5 pairs), where the search for the detectable slowdown passes.
    sd = math.log(1.063)
    assert paired.power_of(4.0, sd, 5, 0.025, 0.01) == pytest.approx(1.0)
    statement = paired.power_statement(sd, pairs=5, alpha=0.025, floor=0.01, target=0.15)
    assert statement.detectable is not None and 0.1 < statement.detectable < 0.2
    powers = [paired.power_of(x, sd, 5, 0.025, 0.01) for x in np.linspace(0.02, 9.0, 200)]
    assert all(math.isfinite(p) for p in powers) and powers == sorted(powers)


def test_a_step_is_found_at_the_night_it_began_and_a_flat_series_has_none() -> None:
    rng = np.random.default_rng(4)
    flat = 40 * np.exp(rng.normal(0, 0.03, 24))
    assert change_points.steps(flat) == []
    stepped = np.concatenate([flat[:15], 40 * 1.3 * np.exp(rng.normal(0, 0.03, 6))])
    step = change_points.last_step(stepped)
    assert step is not None and step.night == 15 and step.change == pytest.approx(0.3, abs=0.06)
    assert change_points.steps(stepped[:4]) == []  # too few nights to tell a step from a bad night


def _job(**gate: object) -> JobConfig:
    settings = {"enabled": True, "mode": "paired", "reference": ["+engine.env.BUILD=previous"], **gate}
    return dataclasses.replace(JobConfig(), gate=GateConfig(**settings), load=LoadConfig(request_rate=1.0))


def test_the_paired_plan_interleaves_both_builds_abba_on_fresh_servers() -> None:
    plan = paired_night.paired_plan([_job(pairs=4)], SweepSettings.of([_job(pairs=4)]))
    builds = [(g.server_job.build, g.server_job.repeat, g.role) for g in plan.groups]
    for role in ("baseline", "speculative"):
        mine = [(b, r) for b, r, ro in builds if ro == role]
        assert mine == [
            ("reference", 0),
            ("candidate", 0),
            ("candidate", 1),
            ("reference", 1),
            ("reference", 2),
            ("candidate", 2),
            ("candidate", 3),
            ("reference", 3),
        ]
    assert len(plan.groups) == 16 and len({g.label for g in plan.groups}) == 16  # a fresh server each
    reference = next(g for g in plan.groups if g.server_job.build == "reference")
    assert reference.server_job.engine.env == {"BUILD": "previous"} and reference.label.split("-", 1)[1].startswith(
        "ref-"
    )
    # The two builds of a pair send the same prompts: the same seed and repeat.
    # Each point names its candidate twin, whose prompts it sends (the same seed and repeat).
    candidates = {p.hash: p for g in plan.groups for p in g.points if p.job.build == "candidate"}
    for g in plan.groups:
        for p in g.points:
            twins = [
                c for c in candidates.values() if p.job.pair_key == p.job.pair_key and c.job.repeat == p.job.repeat
            ]
            twin = next(c for c in twins if paired_night.point_key(c.job) == p.job.pair_key)
            assert (twin.job.seed, twin.job.repeat, twin.pair_label) == (p.job.seed, p.job.repeat, p.pair_label)
    assert "pair 2: candidate" in paired_night.order_text(plan)


def test_paired_settings_are_refused_where_they_cannot_hold() -> None:
    for job, message in (
        (_job(enabled=False), "set gate.enabled=true"),
        (_job(reference=["load.num_requests=8"]), "would change what the pairs measure"),
        (_job(reference=["engine.pyton=/x"]), "engine.pyton is not a setting"),
        (_job(reference=["engine.max_model_len=abc"]), "cannot be applied"),
        (_job(gated=["p50_tpot"]), "names no secondary metric"),
        (dataclasses.replace(_job(), search="predict"), "use search=grid"),
        (dataclasses.replace(JobConfig(), gate=GateConfig(reference=["engine.python=/x"])), "set gate.mode=paired"),
    ):
        with pytest.raises(ConfigError, match=message):
            validate(job)
    validate(_job())


def _window(scale: float, seed: int, n: int = 30) -> Sample:
    rng = np.random.default_rng(seed)
    tpot = 0.05 * scale * np.exp(rng.normal(0, 0.04, n))
    values = {"tpot": tpot, "ttft": tpot * 4, "e2el": tpot * 64}
    return Sample(np.arange(n), values, tuple(np.full(3, v) for v in tpot), np.full(n, 64.0), np.full(n, 20.0), 10.0)


def _night(slowdown: float, pairs: int = 4, seed: int = 0) -> list[NightWindow]:
    """Two points; each pair's servers differ by a server-start effect (sd 5 %) on top."""
    rng = np.random.default_rng(seed)
    out = []
    for label in ("baseline-r1", "ngram-k3-r1"):
        for j in range(pairs):
            for build in ("reference", "candidate"):
                start = math.exp(rng.normal(0, 0.05))
                scale = start * ((1 + slowdown) if build == "candidate" else 1.0)
                metrics = {"output_throughput": 100 / scale}
                if label.startswith("ngram"):
                    metrics["acceptance_length"] = 2.4
                role = "baseline" if label.startswith("baseline") else "speculative"
                out.append(NightWindow(label, label, role, build, j, _window(scale, seed * 1000 + j), metrics))
    return out


def test_the_night_fails_on_a_fifteen_percent_slowdown_and_names_the_points_and_passes_an_aa_night() -> None:
    def judge(windows: list[NightWindow]) -> paired.PairedResult:
        return paired.judge_night(windows, 4, "median_tpot_ms", [], 0.05, 0.01, 0.15)

    slowed = judge(_night(0.15))
    assert slowed.overall == "fail" and slowed.primary.regressed and slowed.pairs == 4 and slowed.points == 2
    assert set(slowed.slower_points()) <= {"baseline-r1", "ngram-k3-r1"} and slowed.slower_points()
    assert slowed.primary.change == pytest.approx(0.15, abs=0.05)
    text = gate_summary.night_markdown(slowed, "nightly", "the previous build", 0.05)
    assert "regression" in text and "Power: this night's design (4 pairs" in text
    assert judge(_night(0.0, seed=3)).overall == "pass"
    # Acceptance length is gated on its own: a drop in L fails the night although latency holds.
    dropped = [
        dataclasses.replace(w, metrics={**w.metrics, "acceptance_length": 1.8})
        if w.build == "candidate" and "acceptance_length" in w.metrics
        else w
        for w in _night(0.0, seed=3)
    ]
    verdict = judge(dropped)
    assert verdict.overall == "fail" and [t.metric for t in verdict.gated if t.regressed] == ["acceptance_length"]
    assert judge(_night(0.0, pairs=1)).overall == "insufficient"


def test_a_paired_nights_settings_come_back_from_its_parent_run() -> None:
    params = {f"gate.{k}": str(v) for k, v in dataclasses.asdict(_job(pairs=6, gated=["p99_tpot_ms"]).gate).items()}
    config, defaulted = recorded_config(params)
    assert (config.mode, config.pairs, config.gated, config.reference) == (
        "paired",
        6,
        ["p99_tpot_ms"],
        ["+engine.env.BUILD=previous"],
    )
    assert config.acceptance is True and defaulted == []
    assert recorded_config({})[0].mode == "history"  # a run from before: the history mode


def test_spec_settings_stay_the_candidates_when_only_the_engine_changes() -> None:
    job = dataclasses.replace(_job(), spec=SpecConfig(method="ngram", k=5))
    assert paired_night.reference_job(job, SweepSettings.of([job])).spec == job.spec


def test_the_dry_run_prints_the_abba_order_naming_each_server_as_reference_or_candidate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "dry_run=true",
        "gate.enabled=true",
        "gate.mode=paired",
        "gate.pairs=3",
        "gate.detect=4",  # three pairs see only a slowdown of about 2x: said, or refused
        "load.request_rate=1",
        "gate.reference=['+engine.env.BUILD=previous']",
    ]
    assert sweep_in_process(False, tmp_path, args) == 0
    out = capsys.readouterr().out
    assert "gate.mode=paired: 12 server starts, interleaved (ABBA) per configuration:" in out
    order = [m.group(1) for line in out.splitlines() if (m := re.match(r"\s*\d+\. pair \d+: (\w+)", line))]
    abba = ["reference", "candidate", "candidate", "reference", "reference", "candidate"]
    assert order == abba * 2  # per configuration (the baseline's, ngram's), the pairs alternate
    assert "nothing was started" in out


def test_the_nights_after_a_sustained_step_leave_the_history_reference() -> None:
    from pipeline.analysis.regression import GatedRun
    from pipeline.finish.judge import after_steps

    rng = np.random.default_rng(8)
    values = [40 * math.exp(rng.normal(0, 0.02)) for _ in range(7)] + [
        52 * math.exp(rng.normal(0, 0.02)) for _ in range(3)
    ]
    runs = [
        GatedRun(f"r{i}", f"p{i}", "k", "base-r1", {"median_tpot_ms": v}, started_ms=i) for i, v in enumerate(values)
    ]
    tonight = GatedRun("now", "tonight", "k", "base-r1", {"median_tpot_ms": 52.0}, started_ms=99)
    trimmed, said = after_steps([tonight], {"k": list(reversed(runs))})
    assert [r.run_id for r in trimmed["k"]] == [f"r{i}" for i in reversed(range(7))]  # before the step only
    assert len(said) == 1 and "began at sweep run p7" in said[0] and "the 3 night(s) since" in said[0]
    # Tonight's own jump is what the gate judges, not a step: the reference keeps every night.
    flat, none = after_steps([tonight], {"k": list(reversed(runs[:7]))})
    assert none == () and len(flat["k"]) == 7
    # A step for the better: the new, faster level is the reference, so that a return to the old
    # level is seen as the slowdown it is (keeping the slower nights would hide it).
    faster = [
        GatedRun(
            r.run_id,
            r.parent_id,
            "k",
            "base-r1",
            {"median_tpot_ms": 1600 / r.values["median_tpot_ms"]},
            started_ms=r.started_ms,
        )
        for r in runs
    ]
    trimmed, said = after_steps([tonight], {"k": list(reversed(faster))})
    assert [r.run_id for r in trimmed["k"]] == ["r9", "r8", "r7"]
    assert "for the better of -2" in said[0] and "the 7 night(s) before it are left out" in said[0]
    # Throughput is higher-is-better: a step up is for the better.
    up = [
        GatedRun(
            r.run_id, r.parent_id, "k", "b", {"output_throughput": r.values["median_tpot_ms"]}, started_ms=r.started_ms
        )
        for r in runs
    ]
    trimmed, said = after_steps([tonight], {"k": list(reversed(up))})
    assert [r.run_id for r in trimmed["k"]] == ["r9", "r8", "r7"] and "for the better" in said[0]


def test_change_points_are_searched_and_trimmed_per_metric() -> None:
    from pipeline.analysis.regression import GatedRun
    from pipeline.finish.judge import after_steps

    # The median TPOT is flat; throughput alone drops by 20 % three nights ago (for the worse).
    rng = np.random.default_rng(8)
    runs = [
        GatedRun(
            f"r{i}",
            f"p{i}",
            "k",
            "base-r1",
            {
                "median_tpot_ms": 40 * math.exp(0.02 * wobble),
                "output_throughput": (100 if i < 7 else 80) * math.exp(rng.normal(0, 0.02)),
            },
            started_ms=i,
        )
        for i, wobble in enumerate((0.5, -0.3, 0.1, -0.6, 0.4, -0.2, 0.3, -0.4, 0.2, -0.1))
    ]
    tonight = GatedRun(
        "now", "tonight", "k", "base-r1", {"median_tpot_ms": 40.0, "output_throughput": 80.0}, started_ms=99
    )
    trimmed, said = after_steps([tonight], {"k": list(reversed(runs))})
    kept = {r.run_id: r.values for r in trimmed["k"]}
    # Throughput's reference leaves the nights since its step out, so the drop is not absorbed;
    # the median TPOT's keeps every night (no step in it).
    throughput = [run for run, v in kept.items() if math.isfinite(v.get("output_throughput", math.nan))]
    tpot = [run for run, v in kept.items() if math.isfinite(v.get("median_tpot_ms", math.nan))]
    assert sorted(throughput) == [f"r{i}" for i in range(7)]
    assert sorted(tpot) == sorted(f"r{i}" for i in range(10))
    assert len(said) == 1 and "output_throughput" in said[0] and "for the worse" in said[0]


def test_review_fixes_secrets_plus_keys_missing_nights_and_a_window_past_the_step() -> None:
    from pipeline.analysis.regression import GatedRun
    from pipeline.finish.judge import after_steps
    from pipeline.redact import redact_args

    # A secret in a reference, or a key it may not change behind a "+", is refused.
    for reference, message in ((["+engine.env.HF_TOKEN=hf_x"], "secret"), (["+engine.name=external"], "would change")):
        with pytest.raises(ConfigError, match=message):
            validate(_job(reference=reference))
    assert redact_args(["--api_key=sk-1", "--hf_token", "hf-2"]) == ["--api_key=***", "--hf_token", "***"]
    # A night without a value does not shift where a step is said to begin.
    rng = np.random.default_rng(2)
    values = [40 * math.exp(rng.normal(0, 0.02)) for _ in range(8)] + [52.0, 52.5, 51.8, 52.2]
    values[3] = math.nan
    step = change_points.last_step(values)
    assert step is not None and step.night == 8
    # The whole reference window past the step: the nights before it come from the longer series.
    runs = [GatedRun(f"r{i}", f"p{i}", "k", "b", {"median_tpot_ms": v}, started_ms=i) for i, v in enumerate(values)]
    window = list(reversed(runs[-3:]))  # the last three nights, all after the step
    trimmed, said = after_steps([runs[-1]], {"k": window}, {"k": list(reversed(runs))})
    assert said and all(r.started_ms < 8 for r in trimmed["k"]) and len(trimmed["k"]) == 3


def _failing(sample: Sample, prompts: list[int]) -> Sample:
    """The window with these prompts failed: gone from the answers, listed as failures."""
    kept = sample.with_index(np.setdiff1d(sample.index, prompts))
    return dataclasses.replace(kept, failed=len(prompts), failed_index=np.array(prompts))


def test_a_candidate_that_fails_requests_is_slower_by_them_and_fails_the_night() -> None:
    aa = _night(0.0, seed=3)
    judge = functools.partial(paired.judge_night, pairs=4, primary="median_tpot_ms", gated=[], alpha=0.05)
    assert judge(aa, floor=0.01, detect=0.15).overall == "pass"
    # A failure is a latency of +inf: failing the fastest 12 of 30 prompts moves the median up.
    ref, cand = aa[0].sample, aa[1].sample
    assert ref is not None and cand is not None
    fastest = [int(i) for i in cand.index[np.argsort(cand.values["tpot"])[:12]]]
    answered = paired.pair_log_ratio("median_tpot_ms", ref, cand.with_index(np.setdiff1d(cand.index, fastest)))
    censored = paired.pair_log_ratio("median_tpot_ms", ref, _failing(cand, fastest))
    assert censored > answered  # dropping the failures would have judged it on its slow answers only
    # Half its prompts failed: its median is past what it answered, censored (+inf), not dropped;
    # the reference's failures the other way round; both builds' alike say nothing (NaN).
    assert paired.pair_log_ratio("median_tpot_ms", ref, _failing(cand, list(range(16)))) == math.inf
    assert paired.pair_log_ratio("median_tpot_ms", _failing(ref, list(range(16))), cand) == -math.inf
    both_failed = paired.pair_log_ratio(
        "median_tpot_ms", _failing(ref, list(range(16))), _failing(cand, list(range(14, 30)))
    )
    assert math.isnan(both_failed)
    # Every candidate window fails 3 of its 30 prompts; the reference's answer them all.
    failing = [
        dataclasses.replace(w, sample=_failing(w.sample, [2, 9, 17])) if w.build == "candidate" else w for w in aa
    ]
    verdict = judge(failing, floor=0.01, detect=0.15)
    failures = next(t for t in verdict.gated if t.metric == paired.FAILURES)
    assert verdict.overall == "fail" and failures.regressed and failures.pairs == 4  # the unit is the pair
    assert "candidate failed 24, reference 0 of 240 paired prompts" in gate_summary.night_markdown(
        verdict, "n", "r", 0.05
    )
    # One server that crashed (every prompt of one candidate window failed) is one bad pair, not
    # 30 independent failures: no evidence of a worse build.
    crashed = [
        dataclasses.replace(w, sample=_failing(w.sample, list(range(30))))
        if (w.build, w.pair, w.key) == ("candidate", 1, aa[0].key)
        else w
        for w in aa
    ]
    crash = next(t for t in judge(crashed, floor=0.01, detect=0.15).gated if t.metric == paired.FAILURES)
    assert not crash.regressed and crash.p is not None and crash.p > 0.1
    # The same failures on both builds are concordant: no evidence against either.
    both = [dataclasses.replace(w, sample=_failing(w.sample, [2, 9, 17])) for w in aa]
    assert judge(both, floor=0.01, detect=0.15).overall == "pass"


def test_a_paired_night_hands_its_servers_out_one_at_a_time_in_abba_order() -> None:
    settings = SweepSettings.of([_job(pairs=2)])
    plan = paired_night.paired_plan([_job(pairs=2)], settings)
    search = kinds.PAIRED.start(plan, Context({}, settings))
    handed, outcomes = [], []
    while (part := search.next_plan(outcomes)) is not None:
        assert len(part.groups) == 1  # a launcher given one group cannot run two builds at once
        handed.append(part.groups[0])
        outcomes = [GroupOutcome(part.groups[0].index, ())]
    assert handed == list(plan.groups) and search.finish().plan == plan
    assert len(search.finish().outcomes) == len(plan.groups)


class _Nights:
    """A HistoryReader's answers for one point measured on 10 past nights, a 30 % step for the
    worse at the 8th (no per-request data: the history mode's spread is between nights)."""

    def __init__(self, values: list[float]) -> None:
        self.values = values  # oldest first

    def past_sweeps(self, parent_id: str) -> list[str]:
        return [f"p{i}" for i in reversed(range(len(self.values)))]

    def started_ms(self, run_id: str) -> int:
        return 10**6 if run_id == "tonight" else int(run_id[1:])

    def children(self, run_id: str) -> list:
        from pipeline.record.readers import ChildRun

        value = self.values[int(run_id[1:])]
        tags = {"status": "finished", **recorded_identity("h")}
        return [ChildRun(f"c{run_id}", "base-r1", tags, {"median_tpot_ms": value, "duration": math.nan})]

    def download(self, run_id: str, name: str, work: Path) -> None:
        return None

    def pinned(self, experiment_id: str) -> None:
        return None

    def experiment_of(self, run_id: str) -> str:
        return "e"


def test_the_history_spread_is_measured_on_the_reference_side_of_a_step(tmp_path: Path) -> None:
    from pipeline.analysis.regression import GatedRun
    from pipeline.finish.judge import reference_for

    rng = np.random.default_rng(2)
    values = [40 * math.exp(rng.normal(0, 0.02)) for _ in range(7)] + [
        52 * math.exp(rng.normal(0, 0.02)) for _ in range(3)
    ]
    key = fingerprint(recorded_identity("h"))  # the key of every night's run of the point
    tonight = GatedRun("now", "tonight", key, "base-r1", {"median_tpot_ms": 52.0}, started_ms=10**6)
    ref = reference_for(_Nights(values), "tonight", [tonight], history=5, work=tmp_path)  # type: ignore[arg-type]
    assert ref.steps and [r.parent_id for r in ref.runs[key]] == ["p6", "p5", "p4", "p3", "p2"]
    # The spread comes from the same nights as the reference: the step is not in it.
    assert ref.spread_from[key] == ref.runs[key]
    assert ref.shown is not None and len(ref.shown[key]) == 5 and ref.shown[key][0].parent_id == "p9"


def test_a_gated_endpoints_interval_passes_the_floor_where_holm_rejects_it() -> None:
    # The family here is the primary and acceptance length (held level): the primary's interval
    # is shown at alpha / 2, so its lower bound clears the 1 % floor exactly where Holm's first
    # step fails the night, and a night that passes never shows an interval wholly past the floor.
    seen = set()
    for seed in range(3):
        for slowdown in (0.0, 0.08, 0.12, 0.2):
            night = paired.judge_night(_night(slowdown, seed=seed), 4, "median_tpot_ms", [], 0.05, 0.01, 0.15)
            head = night.primary
            assert head.low is not None and len(night.gated) == 2
            assert (head.low > 0.01) == head.regressed, (seed, slowdown, head)
            seen.add(head.regressed)
    assert seen == {True, False}  # both sides were tried


def _without(windows: list[NightWindow], build: str, pair: int, label: str | None = None) -> list[NightWindow]:
    """The night with one build's window(s) of one pair missing (at one point, or every point)."""
    return [w for w in windows if not (w.build == build and w.pair == pair and label in (None, w.key))]


def test_the_endpoint_averages_each_pair_over_the_points_it_has_and_keeps_censored_pairs() -> None:
    per_point = {"a": [0.1, math.nan, math.inf, math.nan, math.inf], "b": [0.2, 0.3, 0.1, math.nan, math.nan]}
    values = paired.endpoint(per_point)
    assert values[0] == pytest.approx(0.15) and values[1] == pytest.approx(0.3)  # pair 2 keeps point b
    assert values[2] == pytest.approx(0.1)  # censored at a (the night's account says so): keeps b
    assert math.isnan(values[3]) and len(values) == 5  # a pair with no point at all is lost, and counted
    assert values[4] == math.inf  # censored at every point it has: censored as a whole (ranked)


def test_a_night_that_lost_pairs_is_insufficient_and_says_how_many_were_planned_measured_and_lost() -> None:
    judge = functools.partial(paired.judge_night, pairs=5, primary="median_tpot_ms", gated=[], alpha=0.05)
    aa = _night(0.0, pairs=5, seed=3)
    assert judge(aa, floor=0.01, detect=0.15).overall == "pass"
    lost = judge(_without(aa, "candidate", 2), floor=0.01, detect=0.15)
    assert lost.overall == "insufficient" and lost.primary.pairs == 4
    assert (lost.account.planned, lost.account.measured, len(lost.account.lost)) == (5, 4, 1)
    text = gate_summary.night_markdown(lost, "nightly", "the previous build", 0.05)
    assert "4 of 5 planned pair(s) measured" in text and "pair 3" in text and "no candidate window" in text
    # One point of a pair lost: the pair keeps its other point (not deleted everywhere), and the
    # night still cannot pass on what is left of it.
    partial = judge(_without(aa, "candidate", 1, "ngram-k3-r1"), floor=0.01, detect=0.15)
    assert partial.primary.pairs == 5 and partial.account.measured == 5 and partial.overall == "insufficient"
    assert any("pair 2" in line and "ngram-k3-r1" in line for line in partial.account.partial)
    # A slowdown the pairs left show is still a failure: a lost pair never hides one.
    slowed = judge(_without(_night(0.3, pairs=5, seed=3), "reference", 4), floor=0.01, detect=0.15)
    assert slowed.overall == "fail"


def test_a_lost_pairs_reason_is_the_reason_it_has_no_ratio() -> None:
    # A server that streams its tokens in one burst measures a TPOT of 0: no ratio, and the
    # night's account says so, not that the builds' quantiles reached failed requests (it once did).
    aa = _night(0.0, pairs=4, seed=3)
    burst = [
        dataclasses.replace(
            w, sample=dataclasses.replace(w.sample, values={**w.sample.values, "tpot": w.sample.values["tpot"] * 0})
        )
        if w.pair == 1 and w.build == "reference"
        else w
        for w in aa
    ]
    verdict = paired.judge_night(
        burst, pairs=4, primary="median_tpot_ms", gated=[], alpha=0.05, floor=0.01, detect=0.15
    )
    assert verdict.overall == "insufficient" and len(verdict.account.lost) == 1
    assert "the reference build's median tpot is 0 ms" in verdict.account.lost[0], verdict.account.lost
    ref, cand = aa[0].sample, aa[1].sample
    assert ref is not None and cand is not None
    both = paired.why_no_ratio("median_tpot_ms", _failing(ref, list(range(16))), _failing(cand, list(range(14, 30))))
    assert both == "both builds' median tpot reached their failed requests"
    assert (
        paired.why_no_ratio("median_tpot_ms", ref.with_index(ref.index[:4]), cand) == "4 prompt(s) paired, fewer than 5"
    )


def _crashing_night(rng: np.random.Generator, slowdown: float, crash_after: int | None) -> list[NightWindow]:
    """The issue's night: 2 points x 16 requests, 5 pairs, a candidate ``slowdown`` slower that
    (with ``crash_after``) fails every request after that many at one point in pairs 2-4."""
    out = []
    for label in ("baseline-r1", "ngram-k3-r1"):
        for j in range(5):
            for build in ("reference", "candidate"):
                scale = math.exp(rng.normal(0, 0.05)) * ((1 + slowdown) if build == "candidate" else 1.0)
                sample = _window(scale, int(rng.integers(1 << 30)), n=16)
                if crash_after is not None and build == "candidate" and label == "ngram-k3-r1" and j in (1, 2, 3):
                    sample = _failing(sample, list(range(crash_after, 16)))
                metrics = {"output_throughput": 100 / scale}
                role = "baseline" if label.startswith("baseline") else "speculative"
                out.append(NightWindow(label, label, role, build, j, sample, metrics))
    return out


def test_a_candidate_that_crashes_mid_window_never_passes() -> None:
    rng = np.random.default_rng(11)
    outcomes = [
        paired.judge_night(_crashing_night(rng, 0.4, 6), 5, "median_tpot_ms", [], 0.05, 0.01, 0.15).overall
        for _ in range(25)
    ]
    # 120 of 200 such nights passed before. Its pairs keep the point it did not crash at, where
    # it is 40 % slower: the night fails; one that did not show it would be insufficient, never a pass.
    assert "pass" not in outcomes and outcomes.count("fail") >= 20
    crashed = paired.judge_night(_crashing_night(rng, 0.0, 6), 5, "median_tpot_ms", [], 0.05, 0.01, 0.15)
    assert crashed.overall in ("insufficient", "fail")
    assert "pair 2 lacks ngram-k3-r1: the candidate's median tpot reached its failed requests" in crashed.account.text()
    # Its window missing instead (the server died before the window was recorded): never a pass.
    missing = [
        paired.judge_night(
            _without(
                _without(
                    _without(_crashing_night(rng, 0.4, None), "candidate", 1, "ngram-k3-r1"),
                    "candidate",
                    2,
                    "ngram-k3-r1",
                ),
                "candidate",
                3,
                "ngram-k3-r1",
            ),
            5,
            "median_tpot_ms",
            [],
            0.05,
            0.01,
            0.15,
        ).overall
        for _ in range(10)
    ]
    assert "pass" not in missing


def test_the_power_statement_sizes_from_an_upper_bound_of_the_nights_spread() -> None:
    sd, pairs = 0.064, 5
    statement = paired.power_statement(sd, pairs=pairs, alpha=0.025, floor=0.01, target=0.15)
    bound = sd * math.sqrt((pairs - 1) / scipy_stats.chi2.ppf(1 - paired.DESIGN_POWER, pairs - 1))
    assert statement.sd_bound == pytest.approx(bound)
    assert statement.detectable is not None
    assert paired.power_of(statement.detectable, bound, pairs, 0.025, 0.01) == pytest.approx(
        paired.DESIGN_POWER, abs=1e-3
    )
    # At the point estimate 5 pairs would see 15 %; at the bound they do not, and the line says so.
    assert paired.power_of(0.15, sd, pairs, 0.025, 0.01) >= paired.DESIGN_POWER
    assert not statement.met and "misses gate.detect=0.15" in statement.text()
    assert "upper bound" in statement.text()


def test_fewer_than_four_pairs_are_refused_unless_gate_detect_is_what_they_can_see() -> None:
    with pytest.raises(ConfigError, match=r"gate.pairs=3 .*gate.detect=0.15.*gate.detect=") as refused:
        validate(_job(pairs=3))
    # The message names the fix: the slowdown 3 pairs can see, which is then accepted.
    seen = float(re.search(r"set gate.detect=(\d+\.\d+)", str(refused.value)).group(1))  # type: ignore[union-attr]
    assert seen > 0.15
    validate(_job(pairs=3, detect=seen))
    assert paired.design_detectable(3, 0.05, 0.01) == pytest.approx(seen, abs=0.01)
    validate(_job(pairs=4))  # four and more pairs are the gate's own to judge each night
