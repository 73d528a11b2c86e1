"""The comparison table printed at the end of a job."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from pipeline.job import JobResult

ROWS = (
    ("median TPOT (ms)", "median_tpot_ms", "speedup_median_tpot"),
    ("p99 TPOT (ms)", "p99_tpot_ms", "speedup_p99_tpot"),
    ("median TTFT (ms)", "median_ttft_ms", "speedup_median_ttft"),
    ("median E2EL (ms)", "median_e2el_ms", "speedup_median_e2el"),
    ("output throughput (tok/s)", "output_throughput", "output_throughput_ratio"),
    ("completed / failed", None, None),
    ("acceptance rate (%)", "spec_decode_acceptance_rate", None),
    ("acceptance length", "spec_decode_acceptance_length", None),
)


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def render(result: JobResult, console: Console | None = None) -> None:
    console = console or Console()
    base = result.baseline.measurement
    spec_role = result.speculative
    spec = spec_role.measurement if spec_role else None
    job = (spec_role or result.baseline).job
    title = f"{job.spec.method} k={job.spec.k} vs baseline @ {job.load.request_rate:g} req/s ({job.model.id})"
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("baseline", justify="right")
    table.add_column("speculative", justify="right")
    table.add_column("spec vs base", justify="right")
    comparison = result.comparison.as_metrics() if result.comparison else {}
    for label, key, ratio_key in ROWS:
        if key is None:
            cells = [
                f"{int(m.summary['completed'])} / {int(m.summary['failed'])}" if m else "FAILED" for m in (base, spec)
            ]
            table.add_row(label, *cells, "")
            continue
        values = []
        for m in (base, spec):
            metrics = {**m.summary, **m.acceptance.as_metrics()} if m else {}
            values.append(_fmt(metrics.get(key), 2 if "length" in key else 1))
        ratio = comparison.get(ratio_key) if ratio_key else None
        table.add_row(label, *values, f"{_fmt(ratio, 2)}×" if ratio is not None and not math.isnan(ratio) else "")
    console.print(table)
    for role in (result.baseline, spec_role):
        if role is not None and role.error:
            console.print(f"[red]{role.role} failed:[/red] {role.error.splitlines()[0]}")
