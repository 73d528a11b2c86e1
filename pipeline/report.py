"""``python -m pipeline.report <experiment name | parent run id>``: the sweep's report, from
MLflow alone, so an old sweep can be analysed again. The driver calls :func:`build` at the
end of every sweep.

The sweep table is the parent run's ``summary.csv``; the lossless probes are its
``lossless/*.json``; per-request output lengths (temperature > 0) come from the child runs'
``requests.csv``. The report goes to the parent run under ``report/`` and next to the
sweep's outputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import startup
from pipeline.analysis.samples import StatsError, StatsOptions
from pipeline.exitcode import ExitCode
from pipeline.finish.report_build import build
from pipeline.record.readers import SweepReader
from pipeline.record.tracking import TrackingError, TrackingUnreachable, command_store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="experiment (sweep) name, or a sweep's parent run id")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="folder holding mlruns/ (default: here)")
    parser.add_argument(
        "--tracking-uri", help="the MLflow server (default: $MLFLOW_TRACKING_URI, else the project's ./mlruns)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write report/ (default: ./outputs/report-<run>)"
    )
    parser.add_argument("--confidence", type=float, help="interval level (default: the sweep's stats.confidence)")
    parser.add_argument("--floor", type=float, help="practical floor, e.g. 0.02 (default: the sweep's stats.floor)")
    parser.add_argument("--resamples", type=int, help="bootstrap replicates (default: the sweep's stats.resamples)")
    parser.add_argument("--verbose", action="store_true", help="MLflow's download bars and library notices too")
    args = parser.parse_args(argv)
    startup.begin(args.verbose)
    uri = command_store(args.tracking_uri, args.project.resolve()).tracking_uri
    reader = SweepReader(uri)
    try:
        parent = reader.find_parent(args.ref)
        recorded = reader.params(parent)
        chosen = {}
        for name, cast in (("confidence", float), ("floor", float), ("resamples", int)):
            value = getattr(args, name) if getattr(args, name) is not None else recorded.get(f"stats.{name}")
            if value is not None:
                chosen[name] = cast(value)
        opts = StatsOptions(**chosen)
        paths = build(reader, parent, args.out or Path("outputs") / f"report-{parent[:8]}", opts)
    except TrackingUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.INFRA)
    except (TrackingError, StatsError) as exc:  # no such sweep, or options it cannot decide with
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.BAD_INPUT)
    print(f"report: {paths['html'].resolve()}\nsummary: {paths['markdown'].resolve()}")


if __name__ == "__main__":
    main()
