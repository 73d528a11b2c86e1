"""The paired gate's power, false alarms and failure handling, measured by its own decision
(``paired.judge_night``) on simulated nights; the real nights' pair spread; and the history
mode's change points.

    python benchmarks/gate_power.py --simulate [--nights-from FILE] [--quick]
    python benchmarks/gate_power.py --real 1 --aa-only --results FILE   # one real A/A night, appended
    python benchmarks/gate_power.py --nights-from FILE                  # the real nights' spread, then the simulation

**Real nights** (``--real N``): N A/A nights (the reference is the candidate's own build) and,
without ``--aa-only``, N nights whose candidate is slowed by about 15 % (``tests.cluster.stutter``
pauses the candidate's own servers 13 % of the time). Each is a real ``python -m pipeline.sweep``
with ``gate.mode=paired`` on one server configuration (the baseline at 2 req/s, 16 requests of 32
tokens per window, float32), ``--pairs`` pairs (the default design's). Each night is appended to
``--results`` as one JSON line as soon as it ends (its exit code, wall time, summary line, every
per-pair log ratio re-read from its store with the gate's own functions, and the CPU), so a long
calibration runs in chunks under a CPU lock. ``--nights-from`` reads such a file: each A/A night's
pair spread of the median TPOT (sd of its pairs' log ratios, pairs - 1 df), pooled over the
nights, with its chi-square 95 % interval; the simulation then uses it.

**The simulation** builds each night as the product does (``NightWindow`` holding ``Sample``
windows of 16 requests of 32 tokens: per-request TPOT with a prompt effect both builds share,
request noise, and a per-server offset sized so that the pairs' log ratios of the median TPOT
have the given spread) and judges it with ``paired.judge_night``. Its scenarios:

- **the default design** at the measured spread: nights passed, insufficient and failed per number
  of pairs and true slowdown, and the power the design states (``paired.power_of``) beside the
  simulated one;
- **the real spread**: each night's true spread drawn from the real nights' measured value (its
  chi-square distribution): false alarms, detection of ``gate.detect``, and the power the nights
  state for themselves (from their spread's upper bound) against the simulated power;
- **lost pairs**: a pair whose candidate (or reference) windows were never recorded;
- **a crashing candidate**: 2 points x 16 requests, 40 % slower, failing every request after the
  sixth at one point in pairs 2-4 (or with that window missing): 120 of 200 such nights passed
  before the gate counted them;
- **one-sided failures**: two requests a window failed by the reference only, or by the candidate
  only, on unchanged builds.

It exits 1 when a crashing candidate passes more than 5 % of nights, when the power the default
design states misses the simulated power at ``gate.detect`` by more than 5 points, or when unchanged
nights fail more often than alpha allows (the exact 95 % interval's lower end above it); 0
otherwise. The last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.analysis import change_points, paired
from pipeline.analysis.paired import NightWindow
from pipeline.analysis.samples import Sample
from pipeline.config import GateConfig

REQUESTS, TOKENS, RATE = 16, 32, 2.0  # a window of the real nights: 16 requests of 32 tokens at 2 req/s
TPOT_S = 0.040  # the baseline's median TPOT there (s): the scale only, the ratios do not depend on it
PROMPT_SD, REQUEST_SD = 0.10, 0.05  # log sd of a prompt's own effect (both builds) and of one request's
ACCEPTANCE, ACCEPTANCE_SD = 2.4, 0.02  # a speculative point's acceptance length, and its pair spread (log)
CRASH_PASSES, POWER_GAP = 0.05, 0.05  # the exit code's limits


# ---- nights built as the product builds them -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Night:
    """One simulated night's layout and truth."""

    pairs: int
    slowdown: float  # the candidate's true slowdown, e.g. 0.15
    server_sd: float  # log sd of one server's start-to-start offset
    points: tuple[str, ...] = ("baseline-r1",)  # "ngram..." points are speculative (acceptance length)
    # What went wrong: (build, pair, point) -> requests answered before the server died (0: its
    # window was never recorded); and failures of a build at every window: build -> requests failed.
    crash: tuple[tuple[str, int, str, int], ...] = ()
    fails: tuple[tuple[str, int], ...] = ()


def window(
    rng: np.random.Generator, prompt: np.ndarray, arrivals: np.ndarray, scale: float, answered: int, failing: int
) -> Sample:
    """A window of REQUESTS requests: the first ``answered`` (in arrival order) are served unless
    among the ``failing`` ones drawn at random; the rest failed, each with its scheduled time."""
    tpot = scale * np.exp(prompt + rng.normal(0, REQUEST_SD, REQUESTS))
    failed = np.zeros(REQUESTS, bool)
    failed[answered:] = True
    if failing:
        failed[rng.choice(REQUESTS, failing, replace=False)] = True
    ok = ~failed
    ttft = 4 * tpot
    e2el = ttft + (TOKENS - 1) * tpot
    return Sample(
        index=np.flatnonzero(ok),
        values={"tpot": tpot[ok], "ttft": ttft[ok], "e2el": e2el[ok]},
        itl=tuple(np.full(TOKENS - 1, v) for v in tpot[ok]),
        output_tokens=np.full(int(ok.sum()), float(TOKENS)),
        chunks=np.full(int(ok.sum()), float(TOKENS)),
        duration_s=float(np.max(arrivals + np.where(ok, e2el, 0.0))),
        failed=int(failed.sum()),
        scheduled_end_s=float(arrivals[-1]),
        failed_index=np.flatnonzero(failed),
        scheduled=arrivals[ok],
        failed_scheduled=arrivals[failed],
    )


def simulate(rng: np.random.Generator, night: Night) -> list[NightWindow]:
    """The night's windows: per point and pair, the reference's and the candidate's, on the same
    prompts and schedule, each server with its own start-to-start offset."""
    crashed = {(b, j, p): n for b, j, p, n in night.crash}
    failing = dict(night.fails)
    out = []
    for label in night.points:
        speculative = not label.startswith("baseline")
        for j in range(night.pairs):
            prompt = rng.normal(0, PROMPT_SD, REQUESTS)
            arrivals = np.cumsum(rng.exponential(1 / RATE, REQUESTS))
            for build in ("reference", "candidate"):
                answered = crashed.get((build, j, label), REQUESTS)
                if answered == 0:
                    continue  # the server died before its window was recorded
                slower = 1 + night.slowdown if build == "candidate" else 1.0
                scale = TPOT_S * slower * math.exp(rng.normal(0, night.server_sd))
                sample = window(rng, prompt, arrivals, scale, answered, failing.get(build, 0))
                metrics = {"output_throughput": sample.output_tokens.sum() / sample.duration_s}
                if speculative:
                    metrics["acceptance_length"] = ACCEPTANCE * math.exp(rng.normal(0, ACCEPTANCE_SD))
                role = "speculative" if speculative else "baseline"
                out.append(NightWindow(label, label, role, build, j, sample, metrics))
    return out


def server_sd_for(pair_sd: float, rng: np.random.Generator, draws: int = 4000) -> float:
    """The per-server offset that gives the pairs' median-TPOT log ratios a spread of ``pair_sd``:
    what the windows' own noise leaves to the servers (sd^2 = 2 server^2 + within^2)."""
    night = Night(pairs=draws, slowdown=0.0, server_sd=0.0)
    ratios = paired.point_log_ratios(simulate(rng, night), "median_tpot_ms", draws)["baseline-r1"]
    within = float(np.std(ratios, ddof=1))
    return math.sqrt(max(pair_sd**2 - within**2, 0.0) / 2)


@dataclasses.dataclass
class Tally:
    """Outcomes of simulated nights, and the power the nights stated for themselves."""

    outcomes: dict[str, int] = dataclasses.field(default_factory=lambda: {"pass": 0, "insufficient": 0, "fail": 0})
    stated: list[float] = dataclasses.field(default_factory=list)

    @property
    def nights(self) -> int:
        return sum(self.outcomes.values())

    def share(self, outcome: str) -> float:
        return self.outcomes[outcome] / self.nights

    def text(self, outcome: str) -> str:
        return rate_ci(self.outcomes[outcome], self.nights)


def judge_many(
    rng: np.random.Generator, make: Callable[[np.random.Generator], Night], nights: int, config: GateConfig
) -> Tally:
    """``nights`` simulated nights, each judged by the gate's own decision."""
    tally = Tally()
    for _ in range(nights):
        night = make(rng)
        result = paired.judge_night_as(simulate(rng, night), dataclasses.replace(config, pairs=night.pairs))
        tally.outcomes[result.overall] += 1
        if result.power is not None:
            tally.stated.append(result.power.power_at_target)
    return tally


def stated_power(slowdown: float, pair_sd: float, pairs: int, config: GateConfig, family: int = 1) -> float:
    """The power the design claims: the one-sided t's (statsmodels) at the true spread, at Holm's
    first step for a family of ``family`` (the primary alone on a baseline-only night)."""
    return paired.power_of(slowdown, pair_sd, pairs, config.alpha / family, config.decision_floor)


# ---- the real nights ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spread:
    """The pair spread of the median TPOT measured on real A/A nights: pooled sd (log), its df."""

    sd: float
    df: int
    nights: int

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The chi-square interval of the sd: sd * sqrt(df / chi2_(1 -+ a/2)(df))."""
        tail = (1 - level) / 2
        chi2 = scipy_stats.chi2
        return (
            self.sd * math.sqrt(self.df / chi2.ppf(1 - tail, self.df)),
            self.sd * math.sqrt(self.df / chi2.ppf(tail, self.df)),
        )

    def draw(self, rng: np.random.Generator) -> float:
        """A true spread the measurement is consistent with: sd * sqrt(df / chi2(df))."""
        return self.sd * math.sqrt(self.df / rng.chisquare(self.df))

    def text(self) -> str:
        low, high = self.interval()
        return (
            f"{math.expm1(self.sd):.1%} [{math.expm1(low):.1%}, {math.expm1(high):.1%}] (95 % chi-square interval; "
            f"{self.df} df from {self.nights} A/A nights)"
        )


def read_nights(path: Path) -> Spread | None:
    """The real nights in ``path`` (``--results``' JSON lines): a table of them, and the A/A
    nights' pooled pair spread of the median TPOT (None: no A/A night with two pairs)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(f"\n## Real nights ({path}, {len(records)} night(s))\n")
    machines = sorted(
        {f"{r['machine']['cpu']} ({r['machine']['cores']} cores; {', '.join(r['machine']['flags'])})" for r in records}
    )
    print("Machine: " + "; ".join(machines) + "\n")
    print("| night | pairs | exit | wall (min) | median-TPOT log ratios per pair | mean | sd |")
    print("|---|---|---|---|---|---|---|")
    squares, df, used = 0.0, 0, 0
    for r in records:
        values = [v for point in r["ratios"].get("median_tpot_ms", {}).values() for v in point]
        finite = np.array([v for v in values if v is not None and math.isfinite(v)])
        sd = float(finite.std(ddof=1)) if len(finite) >= 2 else math.nan
        print(
            f"| {r['name']} ({r['kind']}) | {r['pairs']} | {r['exit']} | {r['wall_s'] / 60:.1f} | "
            + ", ".join(f"{v:+.3f}" for v in finite)
            + f" | {finite.mean() if len(finite) else math.nan:+.3f} | {sd:.3f} |"
        )
        if r["kind"] == "aa" and len(finite) >= 2 and len(r["ratios"]["median_tpot_ms"]) == 1:
            squares += float(np.sum((finite - finite.mean()) ** 2))
            df += len(finite) - 1
            used += 1
    aa = [r for r in records if r["kind"] == "aa"]
    false = sum(r["exit"] == 1 for r in aa)
    if aa:
        print(f"\n- A/A nights failed (false alarms): {rate_ci(false, len(aa))}; exits {sorted(r['exit'] for r in aa)}")
    if not df:
        return None
    spread = Spread(math.sqrt(squares / df), df, used)
    print(f"- the A/A nights' pair spread of the median TPOT: {spread.text()}")
    return spread


# ---- the simulation's tables -------------------------------------------------------------------

SLOWDOWNS = (0.0, 0.10, 0.15, 0.20, 0.30)
PAIRS = (3, 4, 5, 6, 8, 10, 12)


def power_grid(rng: np.random.Generator, pair_sd: float, server_sd: float, nights: int, config: GateConfig) -> dict:
    """The default design (one configuration, baseline only: the primary alone in the gated
    family) per number of pairs and true slowdown: the share of nights failed, beside the power
    the design states at 15 % and at gate.detect."""
    print(
        f"\n## The default design by pairs: nights failed of {nights} simulated per cell (one configuration, "
        f"pair spread {math.expm1(pair_sd):.1%}, judged by paired.judge_night)\n"
    )
    print(
        "| pairs | "
        + " | ".join("unchanged" if s == 0 else f"{s:.0%} slower" for s in SLOWDOWNS)
        + f" | stated power at 15 % | stated at gate.detect={config.detect:g} |"
    )
    print("|---" * (len(SLOWDOWNS) + 3) + "|")
    found = {}
    for pairs in PAIRS:
        cells = []
        for slowdown in SLOWDOWNS:
            tally = judge_many(rng, lambda _r, p=pairs, s=slowdown: Night(p, s, server_sd), nights, config)
            found[(pairs, slowdown)] = tally
            cells.append(tally.text("fail"))
        print(
            f"| {pairs} | "
            + " | ".join(cells)
            + f" | {stated_power(0.15, pair_sd, pairs, config):.1%} | {stated_power(config.detect, pair_sd, pairs, config):.1%} |"
        )
    return found


def scenarios(
    rng: np.random.Generator, pair_sd: float, server_sd: float, real: Spread | None, nights: int, config: GateConfig
) -> dict[str, Tally]:
    """Each failure the gate must handle, and the real spread, as rows of one table."""
    pairs, detect = config.pairs, config.detect
    two = ("baseline-r1", "ngram-k3-r1")  # the layout: a baseline and a speculative point
    drawn = real or Spread(pair_sd, 10**6, 0)

    def from_real(slowdown: float) -> Callable[[np.random.Generator], Night]:
        # Each night's true spread drawn from what the real nights measured (chi-square).
        return lambda r: Night(pairs, slowdown, server_sd_scale(drawn.draw(r)))

    def server_sd_scale(sd: float) -> float:
        return math.sqrt(max(sd**2 - (pair_sd**2 - 2 * server_sd**2), 0.0) / 2)

    crash = tuple(("candidate", j, two[1], 6) for j in (1, 2, 3))
    gone = tuple(("candidate", j, two[1], 0) for j in (1, 2, 3))
    rows: dict[str, tuple[str, Callable[[np.random.Generator], Night]]] = {
        "unchanged": ("the default design, unchanged builds", lambda r: Night(pairs, 0.0, server_sd)),
        "detect": (f"the default design, {detect:.0%} slower", lambda r: Night(pairs, detect, server_sd)),
        "real unchanged": ("the real spread, drawn per night: unchanged", from_real(0.0)),
        "real detect": (f"the real spread, drawn per night: {detect:.0%} slower", from_real(detect)),
        "lost": (
            "lost pairs: one pair's candidate window never recorded, unchanged",
            lambda r: Night(pairs, 0.0, server_sd, crash=(("candidate", int(r.integers(pairs)), "baseline-r1", 0),)),
        ),
        "lost slowed": (
            "lost pairs: the same, 30 % slower",
            lambda r: Night(pairs, 0.30, server_sd, crash=(("candidate", int(r.integers(pairs)), "baseline-r1", 0),)),
        ),
        "crash": (
            "a crashing candidate: 2 points, 40 % slower, failing after 6 of 16 requests at one point in pairs 2-4",
            lambda r: Night(5, 0.40, server_sd, two, crash=crash),
        ),
        "crash unchanged": (
            "a crashing candidate: the same crash, otherwise as fast as the reference",
            lambda r: Night(5, 0.0, server_sd, two, crash=crash),
        ),
        "crash missing": (
            "a crashing candidate: the same, its window at that point never recorded",
            lambda r: Night(5, 0.40, server_sd, two, crash=gone),
        ),
        "reference fails": (
            "one-sided failures: the reference fails 2 of 16 requests a window, unchanged",
            lambda r: Night(pairs, 0.0, server_sd, fails=(("reference", 2),)),
        ),
        "candidate fails": (
            "one-sided failures: the candidate fails 2 of 16 requests a window, unchanged",
            lambda r: Night(pairs, 0.0, server_sd, fails=(("candidate", 2),)),
        ),
        "two pairs": (
            "gate.pairs=2 (refused unless gate.detect says so), 2x slower",
            lambda r: Night(2, 1.0, server_sd),
        ),
    }
    print(f"\n## Scenarios: {nights} simulated nights each, judged by paired.judge_night (gate.pairs={pairs})\n")
    print("| scenario | passed | insufficient | failed | power the nights state at gate.detect (mean) |")
    print("|---|---|---|---|---|")
    found = {}
    for key, (name, make) in rows.items():
        tally = judge_many(rng, make, nights, config)
        found[key] = tally
        stated = f"{np.mean(tally.stated):.1%}" if tally.stated else "—"
        print(f"| {name} | {tally.text('pass')} | {tally.text('insufficient')} | {tally.text('fail')} | {stated} |")
    return found


def rate_ci(hits: int, n: int) -> str:
    if not n:
        return "—"
    ci = scipy_stats.binomtest(hits, n).proportion_ci(method="exact")
    return f"{hits / n:.1%} [{ci.low:.1%}, {ci.high:.1%}]"


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
    parser.add_argument("--simulate", action="store_true", help="the simulation (no server starts)")
    parser.add_argument("--nights-from", type=Path, help="real nights recorded by --real: their spread is used")
    parser.add_argument(
        "--pair-sd", type=float, default=paired.PLANNED_SPREAD[0], help="the pairs' log-ratio spread (no --nights-from)"
    )
    parser.add_argument("--night-sd", type=float, default=0.075, help="the nightly series' log spread (history mode)")
    parser.add_argument("--nights", type=int, default=1000, help="simulated nights per scenario")
    parser.add_argument("--grid-nights", type=int, default=300, help="simulated nights per cell of the pairs table")
    parser.add_argument("--quick", action="store_true", help="200 nights per scenario, 80 per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", type=int, default=0, help="first run this many A/A and slowed real nights")
    parser.add_argument("--aa-only", action="store_true", help="with --real: the A/A nights alone")
    parser.add_argument(
        "--results", type=Path, default=Path("gate_power_nights.jsonl"), help="the real nights' records (appended)"
    )
    parser.add_argument("--pairs", type=int, default=GateConfig().pairs, help="pairs per real night")
    args = parser.parse_args(argv)
    if not (args.simulate or args.real or args.nights_from):
        parser.error("give --simulate, --real N or --nights-from FILE")
    if args.real:
        real_nights(args.real, args.pairs, args.results.resolve(), args.aa_only)
        if not (args.simulate or args.nights_from):
            return 0
    real = read_nights(args.nights_from) if args.nights_from else None
    pair_sd = real.sd if real is not None else args.pair_sd
    nights, grid = (200, 80) if args.quick else (args.nights, args.grid_nights)
    rng = np.random.default_rng(args.seed)
    config = GateConfig(mode="paired")
    server_sd = server_sd_for(pair_sd, rng)
    print(
        f"\nSimulated windows: {REQUESTS} requests of {TOKENS} tokens at {RATE:g} req/s; per-request TPOT with a "
        f"prompt effect (sd {PROMPT_SD}) and request noise (sd {REQUEST_SD}); per-server offset sd {server_sd:.3f} "
        f"for a pair spread of {math.expm1(pair_sd):.1%}"
        + (f" (the real nights': {real.text()})" if real is not None else " (paired.PLANNED_SPREAD)")
    )
    power_grid(rng, pair_sd, server_sd, grid, config)
    found = scenarios(rng, pair_sd, server_sd, real, nights, config)
    nights_to_detect(args.night_sd, rng)
    shrinkage_coverage(rng)
    return verdict(found, pair_sd, config)


def verdict(found: dict[str, Tally], pair_sd: float, config: GateConfig) -> int:
    """The exit code's checks, each said: a crashing candidate's passes, the design's stated
    power against the simulated one, and the false alarms of unchanged nights."""
    crash = max(found[k].share("pass") for k in ("crash", "crash unchanged", "crash missing"))
    stated = stated_power(config.detect, pair_sd, config.pairs, config)
    simulated = found["detect"].share("fail")
    unchanged = found["unchanged"]
    low = scipy_stats.binomtest(unchanged.outcomes["fail"], unchanged.nights).proportion_ci(method="exact").low
    misses = []
    if crash > CRASH_PASSES:
        misses.append(f"a crashing candidate passed {crash:.1%} of nights (at most {CRASH_PASSES:.0%})")
    if abs(stated - simulated) > POWER_GAP:
        misses.append(f"stated power {stated:.1%} against simulated {simulated:.1%} (at most {POWER_GAP:.0%} apart)")
    if low > config.alpha:
        misses.append(f"unchanged nights failed {unchanged.share('fail'):.1%} (alpha {config.alpha:g})")
    print(
        f"\ngate_power: default paired design (pairs={config.pairs}, detect={config.detect:g}, pair spread "
        f"{math.expm1(pair_sd):.1%}): detects {config.detect:.0%} in {simulated:.1%} of nights (stated "
        f"{stated:.1%}), false alarms {unchanged.share('fail'):.1%}, a crashing candidate passes {crash:.1%}: "
        + ("ok" if not misses else "MISSED: " + "; ".join(misses))
    )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
