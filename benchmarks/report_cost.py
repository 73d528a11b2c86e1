"""What the report's statistics cost: time to build the report of a 9-point sweep.

    .venv/bin/python benchmarks/report_cost.py                       # synthetic 9-point sweep, analysis only
    .venv/bin/python benchmarks/report_cost.py --from-sweep default  # a finished sweep, MLflow reads and plots too

The synthetic sweep has the default sweep's shape (baseline, ngram k=3 and k=5 at 3 rates:
9 points, 6 comparisons) with ``--requests`` requests per window; every ratio gets its
bootstrap interval (``stats.resamples`` = 2000), as in a real report. The median of
``--rounds`` timings is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.analysis.assemble import analyse  # noqa: E402
from pipeline.analysis.samples import Sample, StatsOptions  # noqa: E402
from pipeline.finish.report_build import build  # noqa: E402


def synthetic(requests: int, seed: int = 0) -> tuple[pd.DataFrame, dict[str, Sample]]:
    rng = np.random.default_rng(seed)
    rows, samples = [], {}
    for rate in (1.0, 4.0, 16.0):
        prompt = rng.normal(0, 0.3, requests)
        for k, speedup in ((0, 1.0), (3, 2.0 / rate**0.2), (5, 2.2 / rate**0.25)):
            role = "baseline" if k == 0 else "speculative"
            point = f"{'baseline' if k == 0 else f'ngram-k{k}'}-r{rate:g}"
            tpot = 0.04 / speedup * np.exp(prompt + rng.normal(0, 0.05, requests))
            ttft = 0.2 * np.exp(rng.normal(0, 0.1, requests))
            e2el = ttft + 127 * tpot
            samples[point] = Sample(
                np.arange(requests),
                {"tpot": tpot, "ttft": ttft, "e2el": e2el},
                tuple(np.full(40, t * 127 / 40) for t in tpot),
                np.full(requests, 128.0),
                np.full(requests, 41.0),
                requests / rate + float(e2el.max()),
                scheduled_end_s=requests / rate,
            )
            rows.append(
                {
                    "point": point,
                    "role": role,
                    "engine": "vllm",
                    "method": "ngram" if k else "none",
                    "k": k,
                    "request_rate": rate,
                    "repeat": 0,
                    "status": "finished",
                    "run_id": point,
                    "point_hash": point,
                    "point_key": point,
                    "setting_key": f"s{k > 0}{k}",
                    "replica": 0,
                    "workload": "code_edit",
                    "baseline_hash": "" if k == 0 else f"baseline-r{rate:g}",
                    "temperature": 0.0,
                    "median_tpot_ms": 1000 * float(np.median(tpot)),
                    "median_ttft_ms": 1000 * float(np.median(ttft)),
                    "median_e2el_ms": 1000 * float(np.median(e2el)),
                    "p99_tpot_ms": 1000 * float(np.percentile(tpot, 99)),
                    "output_throughput": samples[point].throughput,
                    "duration": samples[point].duration_s,
                    **({"acceptance_length": 3.0, "acceptance_alpha": 0.77} if k else {}),
                }
            )
    return pd.DataFrame(rows), samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64, help="requests per window (synthetic)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--from-sweep", help="time `python -m pipeline.report` on this finished sweep instead")
    args = parser.parse_args()
    timings = []
    if args.from_sweep:
        from pipeline.config import TrackingConfig
        from pipeline.record.readers import SweepReader
        from pipeline.record.tracking import resolve_store

        reader = SweepReader(resolve_store(TrackingConfig(), REPO).tracking_uri)
        parent = reader.find_parent(args.from_sweep)
        for _ in range(args.rounds):
            started = time.perf_counter()
            build(reader, parent, Path(tempfile.mkdtemp()))
            timings.append(time.perf_counter() - started)
        what = f"report.build of sweep {args.from_sweep!r} (MLflow reads, statistics, plots, upload)"
    else:
        frame, samples = synthetic(args.requests)
        for _ in range(args.rounds):
            started = time.perf_counter()
            analyse("cost", frame, [], [], samples, StatsOptions())
            timings.append(time.perf_counter() - started)
        what = f"analysis of a synthetic 9-point sweep, {args.requests} requests per window"
    print(
        f"{what}: median {statistics.median(timings):.2f} s over {args.rounds} rounds "
        f"(min {min(timings):.2f}, max {max(timings):.2f}); goal <= 5 s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
