"""``python -m pipeline.sync <outputs dir>``: make the MLflow writes a sweep could not make.

A sweep whose tracking server went away (or errored) goes on measuring and journals every write
it could not make (pipeline/record/journal.py); it retries them at its end. What is still left, this
command makes once the server is back. Running it again makes nothing twice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline import startup
from pipeline.exitcode import ExitCode
from pipeline.record.journal import journals, make_tracker, replay_journal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.sync", description=__doc__.splitlines()[0])
    parser.add_argument("outputs", type=Path, help="a sweep's output folder, or a folder of them (e.g. outputs/)")
    parser.add_argument("--tracking-uri", help="where to write instead of the store each journal names")
    args = parser.parse_args(argv)
    startup.begin(verbose=False)
    if not args.outputs.is_dir():
        print(
            f"error: {args.outputs} is not a folder; give a sweep's output folder, e.g. outputs/default",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    found = journals(args.outputs)
    if not found:
        print(f"nothing to sync: no {args.outputs}/**/mlflow-journal.jsonl")
        return ExitCode.OK
    made, left = replay_journal(found, lambda header: make_tracker(header, args.tracking_uri))
    print(
        f"synced {made} MLflow write(s) from {len(found)} journal(s)"
        + (f"; {left} still left: is the tracking server up? run this again" if left else "")
    )
    return ExitCode.INFRA if left else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
