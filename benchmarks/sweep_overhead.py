"""How much a sweep costs beyond its measurements, and how many servers it starts.

    .venv/bin/python benchmarks/sweep_overhead.py [--sweep k_vs_rate] [extra Hydra overrides]

Runs ``python -m pipeline.sweep +sweep=<name>`` (default: ngram k in {3,5,7} x rate in {1,2})
into a fresh MLflow experiment, times it from outside, and reads back from MLflow:
- server starts (goal for k_vs_rate: 4 = 3 speculative + 1 baseline; a per-job design starts 12);
- the sum of the measurement windows plus one start-up per server, against the wall time
  (goal: overhead within 15 %). Overhead is everything else: Python and Hydra start-up,
  Ray, model checks, warm-ups, prefix-cache resets, scrapes, server stops, MLflow writes,
  the report. The lossless probes (the report's greedy one-at-a-time answers) are a
  measurement of their own; the overhead is printed with them counted either way.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="k_vs_rate", help="a named sweep in sweeps/")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    experiment = f"bench-sweep-{args.sweep}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "pipeline.sweep", f"+sweep={args.sweep}", f"tracking.experiment={experiment}"]
    started = time.monotonic()
    code = subprocess.run([*cmd, *args.overrides], cwd=REPO).returncode
    wall = time.monotonic() - started
    if code != 0:
        print(f"the sweep exited with {code}", file=sys.stderr)
        return code

    client = MlflowClient(f"sqlite:///{REPO}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("role") == "sweep")
    children = [r for r in runs if r.data.tags.get("role") != "sweep"]
    windows = sum(r.data.metrics["duration"] for r in children)
    startups = [r.data.metrics["server_startup_s"] for r in children if "server_startup_s" in r.data.metrics]
    starts = int(parent.data.metrics["server_starts"])
    naive = 2 * sum(r.data.tags["role"] == "speculative" for r in children)
    probe = parent.data.metrics.get("lossless_probe_s", 0.0)
    useful = windows + sum(startups)
    measured = useful + probe
    print()
    print(f"sweep                       +sweep={args.sweep} {' '.join(args.overrides)}")
    print(f"points measured             {len(children)}")
    print(f"server starts               {starts} (a server per job and role would start {naive})")
    print(f"server start-up times (s)   {', '.join(f'{s:.1f}' for s in startups)}  (sum {sum(startups):.1f})")
    print(f"measurement windows (s)     {windows:.1f}")
    print(f"windows + start-ups (s)     {useful:.1f}")
    print(f"sweep wall time (s)         {wall:.1f}")
    print(f"lossless probes (s)         {probe:.1f}  (greedy answers, one at a time, for the report)")
    print(
        f"overhead, probes measured   {wall - measured:.1f} s = {100 * (wall / measured - 1):.1f} % (goal: within 15 %)"
    )
    print(f"overhead, probes as cost    {wall - useful:.1f} s = {100 * (wall / useful - 1):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
