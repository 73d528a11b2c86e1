"""search=capacity for the baseline and ngram k=3, then a check of each boundary found.

    .venv/bin/python benchmarks/capacity_search.py [--tpot-ms 200] [--duration 10] [--check-duration 30]
        [extra Hydra overrides]

1. Runs ``search=capacity spec.k=3 slo.tpot_ms=<tpot>`` (a p99 TPOT SLO the baseline meets at
   about 2 req/s on the 2-core CPU) in a fresh project, and reports per configuration the
   probes, their rates, the boundary with its interval, the ratio, and the wall time.
2. Checks each boundary with windows ``--check-duration`` long (3x the search's) at the highest
   rate that met the SLO and at the lowest that missed it, on fresh servers (a plain grid at
   those rates): a boundary holds if the longer window still meets the SLO just below it and
   still misses it just above.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd
import sweep_runs
from mlflow.tracking import MlflowClient


def samples(client: MlflowClient, frame: pd.DataFrame) -> dict:
    from pipeline.analysis.samples import Sample

    found = {}
    for row in frame[frame["status"] == "finished"].itertuples():
        path = client.download_artifacts(str(row.run_id), "requests.csv", tempfile.mkdtemp())
        found[str(row.run_id)] = Sample.from_requests(pd.read_csv(path), float(row.duration))
    return found


def main() -> int:
    from pipeline.analysis import search_report
    from pipeline.analysis.capacity import window_passes
    from pipeline.analysis.samples import StatsOptions
    from pipeline.load.slo import SloTarget

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tpot-ms", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--check-duration", type=float, default=30.0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="specsweep-capacity-bench-"))
    common = [
        "load.warmup_requests=1",
        "workload.max_tokens=32",
        "engine.dtype=float32",
        "lossless.prompts=0",
        "spec.k=3",
        f"slo.tpot_ms={args.tpot_ms}",
        *args.overrides,
    ]
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    wall, out = sweep_runs.run(project, "capacity", ["search=capacity", f"load.duration_s={args.duration}", *common])
    frame = pd.read_csv(out / "summary.csv")
    target = SloTarget(tpot_s=args.tpot_ms / 1000)
    curves = search_report.capacity_curves(frame, samples(client, frame), target, StatsOptions())
    exp = client.get_experiment_by_name("capacity")
    assert exp is not None
    (parent,) = client.search_runs([exp.experiment_id], "tags.role = 'sweep'", max_results=1)
    print(f"project {project}\n== search=capacity, {target.describe()}, {args.duration:g} s windows")
    print(
        f"wall time {wall:.0f} s, {int(parent.data.metrics['server_starts'])} server starts, "
        f"{sum(len(c.probes) for c in curves)} probes"
    )
    print(search_report.capacity_headline(curves, target))
    checks: dict[str, tuple[float, float]] = {}
    for curve in curves:
        probes = ", ".join(f"{r:g} ({v:.0f} ms, {'met' if ok else 'missed'})" for r, v, ok in curve.probes)
        print(f"  {curve.label}: {len(curve.probes)} probes: {probes}")
        missed = [r for r, _, ok in curve.probes if not ok and curve.boundary.estimate and r > curve.boundary.estimate]
        if curve.boundary.estimate and missed:
            checks[curve.label] = (curve.boundary.estimate, min(missed))
    rates = sorted({r for pair in checks.values() for r in pair})
    if not rates:
        print("no bracketed boundary to check")
        return 0
    check_wall, check_out = sweep_runs.run(
        project,
        "check",
        [f"load.request_rate={','.join(f'{r:g}' for r in rates)}", f"load.duration_s={args.check_duration}", *common],
    )
    checked = pd.read_csv(check_out / "summary.csv")
    windows = samples(client, checked)
    print(
        f"== check: {args.check_duration:g} s windows at each boundary's last pass and first miss ({check_wall:.0f} s)"
    )
    for label, (below, above) in checks.items():
        role = "baseline" if label.endswith("baseline") else "speculative"
        verdicts = []
        for rate, expect in ((below, True), (above, False)):
            row = checked[(checked["role"] == role) & (checked["request_rate"] == rate)].iloc[0]
            sample = windows[str(row.run_id)]
            met = window_passes(sample, target)
            p99 = 1000 * float(pd.Series(sample.values["tpot"]).quantile(0.99))
            verdicts.append(
                f"{rate:g} req/s: p99 TPOT {p99:.0f} ms, {'met' if met else 'missed'} "
                f"({'as found' if met == expect else 'NOT as found'})"
            )
        print(f"  {label}: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
