"""``python -m pipeline.gate <sweep name | parent run id>``: did this sweep run regress
against its reference? Also ``pin <parent run id>`` and ``unpin <sweep name | run id>``.

The decision is :mod:`pipeline.analysis.regression`'s; :mod:`pipeline.finish.judge` reads
MLflow and records the verdicts (child tags ``gate.verdict``, metrics
``gate.<metric>.ratio/low/high``, parent tags ``gate`` and ``gate.reference``,
``gate/summary.md`` and trend plots). This command sets the exit code: 0 pass or improved,
1 regression, 2 bad input, 3 insufficient data, 4 the tracking server does not answer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import startup
from pipeline.analysis.paired import PairedResult
from pipeline.analysis.regression import GateResult
from pipeline.analysis.samples import StatsOptions
from pipeline.exitcode import ExitCode
from pipeline.finish.judge import EXIT_CODES, judge_sweep, recorded_config
from pipeline.record.readers import HistoryReader
from pipeline.record.tracking import TrackingError, TrackingUnreachable, check_store_reachable, command_store


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.gate", description=__doc__.splitlines()[0])
    parser.add_argument("ref", nargs="+", help="sweep name or parent run id; or: pin <run id>; unpin <name | run id>")
    parser.add_argument("--tracking-uri", help="the MLflow server (default: $MLFLOW_TRACKING_URI, else ./mlruns)")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="folder holding mlruns/ (default: here)")
    parser.add_argument(
        "--history",
        type=int,
        default=None,
        help="past runs in the reference (default: the sweep's recorded gate.history)",
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write gate/ (default: ./outputs/gate-<run>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    startup.begin(verbose=False)
    action, refs = ("judge", args.ref) if args.ref[0] not in ("pin", "unpin") else (args.ref[0], args.ref[1:])
    if len(refs) != 1:
        parser.error(f"give exactly one sweep name or run id (got {len(refs)}): e.g. python -m pipeline.gate nightly")
    if args.history is not None and args.history < 1:
        parser.error(f"--history={args.history} must be >= 1")
    store = command_store(args.tracking_uri, args.project.resolve())
    try:
        check_store_reachable(store)
        reader = HistoryReader(store.tracking_uri)
        if action != "judge":
            return _pin(reader, action, refs[0])
        result, summary = _judge(reader, refs[0], args.history, args.out)
    except TrackingUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.INFRA
    except TrackingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(summary)
    if isinstance(result, PairedResult) and result.overall == "insufficient":
        print(f"insufficient data: {result.why_insufficient()}", file=sys.stderr)
    elif result.overall == "insufficient":
        print(
            "insufficient data: no earlier run of this sweep with the same fingerprint (point, hardware, model "
            "revision) to compare with; run the sweep again, or pin a reference with "
            "`python -m pipeline.gate pin <parent run id>`",
            file=sys.stderr,
        )
    return EXIT_CODES[result.overall]


def _pin(reader: HistoryReader, action: str, ref: str) -> int:
    """pin <run id> makes that sweep run the reference; unpin <name | run id> goes back to history."""
    run_id = ref if action == "pin" else reader.find_parent(ref)
    reader.sweep_run(run_id)
    reader.pin(run_id if action == "pin" else None, reader.experiment_of(run_id))
    print(f"{action}ned: sweep run {run_id} " + ("is now the gate's reference" if action == "pin" else ""))
    return ExitCode.OK


def _judge(
    reader: HistoryReader, ref: str, history: int | None, out: Path | None
) -> tuple[GateResult | PairedResult, str]:
    """The sweep run judged as it recorded it would be: its stats and gate settings."""
    parent = reader.find_parent(ref)
    reader.sweep_run(parent)
    recorded = reader.params(parent)
    opts = StatsOptions(
        **{
            k: cast(recorded[f"stats.{k}"])
            for k, cast in (("confidence", float), ("resamples", int))
            if f"stats.{k}" in recorded
        }
    )
    config, defaulted = recorded_config(recorded, history)
    if defaulted:
        print(
            f"note: sweep run {parent} did not record its gate settings (it ran before they were); judged "
            f"with the defaults " + ", ".join(f"gate.{n}={getattr(config, n)}" for n in defaulted),
            file=sys.stderr,
        )
    return judge_sweep(reader, parent, config, opts, out or Path("outputs") / f"gate-{parent[:8]}")


if __name__ == "__main__":
    sys.exit(main())
