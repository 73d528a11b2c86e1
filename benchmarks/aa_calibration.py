"""How often does the verdict rule cry wolf, and does it see a real effect?

    .venv/bin/python benchmarks/aa_calibration.py aa [--pairs 5] [--requests 24] [--max-tokens 64] [--workload chat]
    .venv/bin/python benchmarks/aa_calibration.py power [--repeats 3] [--requests 24] [--max-tokens 64]
    .venv/bin/python benchmarks/aa_calibration.py aa --from-sweep <experiment>   # re-analyse only

**aa** runs the noise-floor sweep (``sweeps/noise_floor.yaml``) through the real entry point:
``--pairs`` repeats with ``repeats.restart=true``, so every repeat starts a fresh baseline
server and a fresh identical twin, at 1 and 4 req/s. Each (repeat, rate) is one real A/A
comparison, decided exactly as a one-run sweep decides a speculative point (median TPOT,
the default floor and level). Any "helps" or "hurts" is a false alarm; the rate is quoted
with its Clopper-Pearson interval. Then 1,000 simulated A/A comparisons are drawn from the
measured per-request distributions (a real pair, its prompts resampled jointly) and decided
the same way: their false rate must fall inside the real one's interval.

**power** runs ngram k=3 against the baseline on ``code_edit`` at 1 req/s (a true effect of
about 2x) and at 16 req/s (saturating here, a small effect), each repeat on fresh servers.
It prints every comparison's verdict, and at 16 req/s the window size the rule says would
resolve it.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.analysis import decisions, stats  # noqa: E402
from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions, server_spread  # noqa: E402
from pipeline.analysis.verdicts import measured  # noqa: E402
from pipeline.config import TrackingConfig  # noqa: E402
from pipeline.record.readers import SweepReader  # noqa: E402
from pipeline.record.tracking import resolve_store  # noqa: E402
from pipeline.record.windows import window_requests  # noqa: E402

METRIC = "speedup_median_tpot"
OPTS = StatsOptions()


def run_sweep(project: Path, name: str, overrides: list[str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        f"sweep_name={name}",
        "lossless.prompts=0",
        *overrides,
        f"hydra.sweep.dir={project}/outputs/{name}",
    ]
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    print(f"  sweep took {time.monotonic() - started:.0f} s, exit {proc.returncode}", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:])
        raise SystemExit(f"the sweep {name} failed")


def load(name: str, project: Path = REPO) -> tuple[pd.DataFrame, dict[str, Sample]]:
    reader = SweepReader(resolve_store(TrackingConfig(), project).tracking_uri)
    parent = reader.find_parent(name)
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.read_csv(reader.download(parent, "summary.csv", Path(tmp)))
        requests = window_requests(reader, frame, Path(tmp))
    return frame, {run: Sample.from_requests(table, duration) for run, (table, duration) in requests.items()}


def pairs(frame: pd.DataFrame, samples: dict[str, Sample]) -> list[tuple[float, int, Sample, Sample]]:
    """(rate, repeat, baseline window, other window) for every measured comparison."""
    base = measured(frame, "baseline").set_index("point_hash")
    found = []
    for row in measured(frame, "speculative").itertuples():
        b = base.loc[row.baseline_hash]
        found.append((float(row.request_rate), int(row.repeat), samples[str(b["run_id"])], samples[str(row.run_id)]))
    return sorted(found, key=lambda p: (p[0], p[1]))


def one_comparison(
    base: Sample, other: Sample, metric: str = METRIC, seed: int = 0, spread: ServerSpread | None = None
) -> decisions.Decision:
    """One run, one pair of servers, decided as a report decides it; with ``spread``, the
    A/A spread between server starts is added (what a report does once a noise-floor
    sweep has run in its store)."""
    opts = replace(OPTS, server_spread=spread)
    ratio = stats.paired_ratio(metric, [base], [other], opts, np.random.default_rng(seed), shared_servers=True)
    return decisions.decide([ratio], opts, 0.10 if "p99" in metric else OPTS.floor)[0]


def log_ratio(base: Sample, other: Sample, metric: str) -> float:
    ratio = stats.paired_ratio(metric, [base], [other], OPTS)
    return math.log(ratio.estimate) if ratio.estimate else math.nan


def leave_one_out(found: list, metrics: list[str]) -> list[ServerSpread | None]:
    """For comparison i, the A/A spread measured from every other comparison: the rule is
    never tested on the data that calibrated it."""
    logs = {m: [log_ratio(b, o, m) for _, _, b, o in found] for m in metrics}
    return [
        server_spread(
            {m: [v for j, v in enumerate(values) if j != i] for m, values in logs.items()},
            f"A/A without comparison {i}",
        )
        for i in range(len(found))
    ]


def resampled(window: Sample, pos: np.ndarray) -> Sample:
    return Sample(
        np.arange(len(pos)),
        {k: v[pos] for k, v in window.values.items()},
        tuple(window.itl[i] for i in pos),
        window.output_tokens[pos],
        window.chunks[pos],
        window.duration_s,
        scheduled_end_s=window.scheduled_end_s,
    )


def simulate(
    found: list[tuple[float, int, Sample, Sample]], count: int, spreads: list | None = None, seed: int = 7
) -> tuple[int, int]:
    """A/A comparisons drawn from the measured ones: a real pair, its prompts resampled jointly."""
    rng = np.random.default_rng(seed)
    false = 0
    for i in range(count):
        which = int(rng.integers(len(found)))
        _, _, base, other = found[which]
        common, b_rows, o_rows = np.intersect1d(base.index, other.index, return_indices=True)
        pick = rng.integers(0, len(common), len(common))
        decision = one_comparison(
            resampled(base, b_rows[pick]),
            resampled(other, o_rows[pick]),
            seed=1000 + i,
            spread=spreads[which] if spreads else None,
        )
        false += decision.label in (decisions.HELPS, decisions.HURTS)
    return false, count


def compare_sims(label: str, found: list, real_false: int, spreads: list | None, count: int) -> None:
    n = len(found)
    real_ci = scipy_stats.binomtest(real_false, n).proportion_ci(confidence_level=0.95, method="exact")
    started = time.monotonic()
    sim_false, sims = simulate(found, count, spreads)
    inside = real_ci.low <= sim_false / sims <= real_ci.high
    print(
        f"  simulated A/A, {label} ({sims}, median TPOT): {rate_with_interval(sim_false, sims)}; "
        f"{'inside' if inside else 'OUTSIDE'} the real rate's interval ({time.monotonic() - started:.1f} s)"
    )


def rate_with_interval(k: int, n: int) -> str:
    ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return f"{k}/{n} = {k / n:.1%} [95% CI {ci.low:.1%}, {ci.high:.1%}]"


def aa(args: argparse.Namespace) -> None:
    name = args.from_sweep or f"aa-calibration-{time.strftime('%H%M%S')}"
    if not args.from_sweep:
        run_sweep(
            Path(tempfile.mkdtemp()),
            name,
            [
                "+sweep=noise_floor",
                f"repeats.count={args.pairs}",
                f"load.num_requests={args.requests}",
                f"workload={args.workload}",
                f"workload.max_tokens={args.max_tokens}",
            ],
        )
    frame, samples = load(name, args.project)
    found = pairs(frame, samples)
    print(f"\nA/A sweep {name!r}: {len(found)} real comparisons, {args.requests} requests per window")
    print(f"{'rate':>6} {'repeat':>6}  " + "  ".join(f"{m:<34}" for m in ("median TPOT", "median TTFT", "p99 TPOT")))
    false = {m: 0 for m in ("speedup_median_tpot", "speedup_median_ttft", "speedup_p99_tpot")}
    for rate, repeat, base, other in found:
        cells = []
        for metric in false:
            decision = one_comparison(base, other, metric)
            false[metric] += decision.label in (decisions.HELPS, decisions.HURTS)
            cells.append(f"{decision.label} {decision.ratio.text}")
        print(f"{rate:>6g} {repeat:>6}  " + "  ".join(f"{c:<34}" for c in cells))
    n = len(found)
    print("\nfalse verdicts (helps + hurts) of the one-run rule, within-run bootstrap only:")
    for metric, k in false.items():
        print(f"  {metric:<22} {rate_with_interval(k, n)}")
    compare_sims("within-run bootstrap only", found, false[METRIC], None, args.simulations)
    spreads = leave_one_out(found, list(false))
    with_spread = dict.fromkeys(false, 0)
    for i, (_, _, base, other) in enumerate(found):
        for metric in with_spread:
            decision = one_comparison(base, other, metric, spread=spreads[i])
            with_spread[metric] += decision.label in (decisions.HELPS, decisions.HURTS)
    print(
        "\nfalse verdicts with the A/A spread between servers added (leave-one-out: each comparison's spread "
        "measured from the other comparisons):"
    )
    for metric, k in with_spread.items():
        print(f"  {metric:<22} {rate_with_interval(k, n)}")
    compare_sims("with the A/A spread", found, with_spread[METRIC], spreads, args.simulations)
    everything = server_spread({m: [log_ratio(b, o, m) for _, _, b, o in found] for m in false}, name)
    if everything:
        print(
            "A/A spread between fresh servers (RMS of log ratios): "
            + ", ".join(f"{m} {100 * v:.1f} %" for m, v in everything.sd.items())
        )
    for rate in sorted({p[0] for p in found}):
        for label, spread_of in (("within-run only", lambda i: None), ("with the A/A spread", lambda i: spreads[i])):
            halves = [
                one_comparison(b, o, spread=spread_of(i)).ratio for i, (r, _, b, o) in enumerate(found) if r == rate
            ]
            floors = [decisions.smallest_resolvable(h, OPTS.floor) for h in halves if h.resolved]
            print(
                f"smallest resolvable median-TPOT speedup at {rate:g} req/s, {label}: median "
                f"{np.median(floors):.3f}x (range {min(floors):.3f}-{max(floors):.3f}) over {len(floors)} comparisons"
            )


def power(args: argparse.Namespace) -> None:
    name = args.from_sweep or f"power-{time.strftime('%H%M%S')}"
    if not args.from_sweep:
        run_sweep(
            Path(tempfile.mkdtemp()),
            name,
            [
                "-m",
                "spec=ngram",
                "spec.k=3",
                "workload=code_edit",
                "load.request_rate=1,16",
                f"repeats.count={args.repeats}",
                "repeats.restart=true",
                f"load.num_requests={args.requests}",
                f"workload.max_tokens={args.max_tokens}",
            ],
        )
    frame, samples = load(name, args.project)
    print(f"\npower sweep {name!r}: ngram k=3 against the baseline, {args.requests} requests per window")
    spread = None
    if args.spread_from:
        aa_found = pairs(*load(args.spread_from))
        spread = server_spread({METRIC: [log_ratio(b, o, METRIC) for _, _, b, o in aa_found]}, args.spread_from)
        print(f"with the A/A spread of {args.spread_from!r}: {100 * spread.sd[METRIC]:.1f} % in median TPOT")  # type: ignore[union-attr]
    for rate, repeat, base, other in pairs(frame, samples):
        decision = one_comparison(base, other, spread=spread)
        print(
            f"  {rate:>4g} req/s, repeat {repeat}: {decision.label} {decision.ratio.text}"
            + (f"; {decision.detail}" if decision.detail else "")
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["aa", "power"])
    parser.add_argument("--pairs", type=int, default=5, help="A/A repeats, each a fresh pair at 2 rates")
    parser.add_argument("--repeats", type=int, default=3, help="power: repeats on fresh servers")
    parser.add_argument("--requests", type=int, default=24, help="requests per window")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (workload.max_tokens)")
    parser.add_argument("--workload", default="code_edit", help="aa: the workload of both servers")
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--from-sweep", help="analyse this finished sweep (experiment name) instead of running one")
    parser.add_argument("--project", type=Path, default=REPO, help="with --from-sweep: the folder holding its mlruns/")
    parser.add_argument("--spread-from", help="power: add the server spread of this A/A sweep (in this repo's store)")
    args = parser.parse_args()
    (aa if args.mode == "aa" else power)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
