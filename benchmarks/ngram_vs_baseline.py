"""Repeat the default job (ngram k=3 against its baseline) and report the medians.

    .venv/bin/python benchmarks/ngram_vs_baseline.py --repeats 3 [extra Hydra overrides]

Each repeat is a full `python -m pipeline.sweep` run (two fresh servers) with its own seed,
so both the prompts and the machine's noise vary. The figures are read back from MLflow.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]
FIGURES = (
    ("spec_decode_acceptance_rate", "speculative", "acceptance rate (%)"),
    ("spec_decode_acceptance_length", "speculative", "acceptance length"),
    ("median_tpot_ms", "baseline", "baseline median TPOT (ms)"),
    ("median_tpot_ms", "speculative", "ngram median TPOT (ms)"),
    ("speedup_median_tpot", "speculative", "median-TPOT speedup"),
    ("speedup_p99_tpot", "speculative", "p99-TPOT speedup"),
    ("speedup_median_ttft", "speculative", "median-TTFT speedup"),
    ("output_throughput_ratio", "speculative", "output throughput ratio"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. load.request_rate=4")
    args = parser.parse_args()
    experiment = f"bench-ngram-vs-baseline-{time.strftime('%Y%m%d-%H%M%S')}"
    for seed in range(args.repeats):
        started = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "pipeline.sweep",
            f"seed={seed}",
            f"tracking.experiment={experiment}",
            *args.overrides,
        ]
        code = subprocess.run(cmd, cwd=REPO).returncode
        print(f"repeat {seed}: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            return code

    client = MlflowClient(f"sqlite:///{REPO}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    values: dict[str, list[float]] = {label: [] for _, _, label in FIGURES}
    for seed in range(args.repeats):
        by_role = {r.data.tags["role"]: r for r in runs if r.data.params.get("seed") == str(seed)}
        for key, role, label in FIGURES:
            values[label].append(by_role[role].data.metrics.get(key, float("nan")))
    print(f"\nexperiment {experiment!r}, {args.repeats} repeats, overrides {args.overrides or 'none'}")
    print(f"{'figure':<28} {'median':>9}   per repeat")
    for label, series in values.items():
        print(f"{label:<28} {statistics.median(series):9.3f}   {', '.join(f'{v:.3f}' for v in series)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
