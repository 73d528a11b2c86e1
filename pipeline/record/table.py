"""The table printed at the end of a sweep: every point, its status and its ratios."""

from __future__ import annotations

import math
import sys

import pandas as pd
from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("median TPOT ms", "median_tpot_ms", 1),
    ("p99 TPOT ms", "p99_tpot_ms", 1),
    ("median TTFT ms", "median_ttft_ms", 1),
    ("out tok/s", "output_throughput", 1),
    ("accept %", "spec_decode_acceptance_rate", 1),
    ("accept len", "spec_decode_acceptance_length", 2),
    ("TPOT speedup", "speedup_median_tpot", 2),
    ("throughput ratio", "output_throughput_ratio", 2),
)
STATUS_STYLE = {"finished": "green", "resumed": "cyan", "failed": "red", "not run": "yellow", "predicted": "magenta"}


def _fmt(value: object, digits: int) -> str:
    if value is None or not isinstance(value, (int, float)) or math.isnan(value):
        return "—"
    return f"{value:.{digits}f}"


def render(summary: pd.DataFrame, title: str, console: Console | None = None) -> None:
    # Off a terminal (CI logs, Ray workers) rich assumes 80 columns and truncates every cell.
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=title)
    for name in ("point", "status", *(c[0] for c in COLUMNS)):
        table.add_column(name, justify="left" if name in ("point", "status") else "right")
    for row in summary.to_dict("records"):
        style = STATUS_STYLE.get(str(row["status"]), "default")
        cells = [_fmt(row.get(key), digits) for _, key, digits in COLUMNS]
        table.add_row(str(row["point"]), f"[{style}]{row['status']}[/{style}]", *cells)
    console.print(table)
    for row in summary.to_dict("records"):
        if row["status"] == "failed":
            console.print(
                f"[red]{row['point']} failed:[/red] {str(row['error']).splitlines()[0] if row['error'] else ''}"
            )
