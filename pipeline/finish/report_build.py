"""The sweep's report, from MLflow alone, so an old sweep can be analysed again: the library
under ``python -m pipeline.report``, which the sweep's own end calls too.

The sweep table is the parent run's ``summary.csv``; the lossless probes are its
``lossless/*.json``; per-request output lengths (temperature > 0) come from the child runs'
``requests.csv``. The report goes to the parent run under ``report/`` and next to the
sweep's outputs.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.analysis import categories, drafter_map, trust
from pipeline.analysis.assemble import analyse, output_length_tests
from pipeline.analysis.figures import Figure, FigureId, FigureKey, report_figures
from pipeline.analysis.markdown import ReportData, markdown, run_names
from pipeline.analysis.report_html import page
from pipeline.analysis.samples import Sample, StatsOptions
from pipeline.analysis.search_report import PREDICTIONS_CSV
from pipeline.load.slo import SloTarget
from pipeline.record.readers import SweepReader
from pipeline.record.tracking import TrackingError
from pipeline.record.windows import window_requests, with_server_spread

REPORT_DIR = "report"


def build(
    reader: SweepReader, parent_id: str, out_dir: Path | None = None, opts: StatsOptions | None = None
) -> dict[str, Path]:
    """Analyse the sweep of ``parent_id`` from MLflow; write and log the report."""
    title = f"specsweep report: {reader.title(parent_id)}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        summary = reader.download(parent_id, "summary.csv", work)
        if summary is None:
            raise TrackingError(f"run {parent_id} has no summary.csv; it is not a finished sweep run")
        frame = pd.read_csv(summary)
        probes = []
        folder = reader.download(parent_id, "lossless", work)
        if folder is not None:
            probes = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        requests = window_requests(reader, frame, work)
        samples = {run: Sample.from_requests(table, duration) for run, (table, duration) in requests.items()}
        tests = output_length_tests(frame, {run: table for run, (table, _) in requests.items()})
        opts = with_server_spread(reader, parent_id, frame, opts or StatsOptions())
        table = reader.download(parent_id, PREDICTIONS_CSV, work)
        predictions = pd.read_csv(table) if table is not None else None
        data = analyse(
            title, frame, probes, tests, samples, opts, SloTarget.from_params(reader.params(parent_id)), predictions
        )
        data = replace(data, run_url=reader.run_url(parent_id))
        spread = opts.server_spread.for_metric("speedup_median_tpot") if opts.server_spread else None
        for run, metrics in trust.repeat_metrics(frame, trust.repeat_findings(frame, samples, spread)).items():
            reader.log_metrics(run, metrics)  # the one check judged across runs, so recorded here
        reader.log_metrics(parent_id, drafter_map.map_metrics(data.drafters))  # the break-even per load, if any
        for groups, grouping in ((data.by_type, categories.BY_CATEGORY), (data.by_turn, categories.BY_TURN)):
            if groups is not None:  # each speculative run gets its groups' ratios and L
                for run, metrics in categories.run_metrics(groups.table, grouping.prefix).items():
                    reader.log_metrics(run, metrics)
        since, trends = _since_reference(reader, parent_id, work)
    from pipeline.analysis import iplots, plots

    specs = report_figures(data)
    interactive = interactive_figures(data, specs)
    # Every figure as a PNG for the Markdown report; the HTML page draws the same ones with
    # Plotly, and only the gate's trend charts as PNGs.
    pngs = {FigureId(key): plots.png(spec) for key, spec in specs.items()} | trends
    out = (out_dir or Path(tempfile.mkdtemp())) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "report.html", "markdown": out / "report.md"}
    section = f"\n## Since the reference\n\n{since}" if since else ""
    html_section = f"<h2>Since the reference</h2><pre>{html_escape(since)}</pre></body>" if since else "</body>"
    static = {figure.title: png for figure, png in trends.items()}  # the page heads each with its title
    paths["html"].write_text(page(data, static, iplots.html(interactive)).replace("</body>", html_section))
    files = {figure: f"figure{i}.png" for i, figure in enumerate(pngs, start=1)}
    images = "".join(f"![{figure.title}]({file})\n" for figure, file in files.items())
    paths["markdown"].write_text(markdown(data) + section + (f"\n## Figures\n\n{images}" if images else ""))
    for figure, file in files.items():
        (out / file).write_bytes(pngs[figure])
        paths[figure.title] = out / file
    for path in paths.values():
        reader.log_file(parent_id, path, REPORT_DIR)
    for i, fig in enumerate(interactive.values(), start=1):  # MLflow's artifact viewer draws these
        reader.log_figure(parent_id, fig, f"{REPORT_DIR}/interactive/figure{i}.html")
    return paths


def _since_reference(reader: SweepReader, parent_id: str, work: Path) -> tuple[str, dict[FigureId, bytes]]:
    """The regression gate's summary and trend plots, where the gate judged this sweep."""
    folder = reader.download(parent_id, "gate", work / "gate")
    if folder is None or not (folder / "summary.md").is_file():
        return "", {}
    trends = {FigureId(FigureKey.GATE_TREND, p.stem): p.read_bytes() for p in sorted(folder.glob("trend*.png"))}
    return (folder / "summary.md").read_text(), trends


def interactive_figures(data: ReportData, specs: dict[FigureKey, Figure] | None = None) -> dict[FigureKey, Any]:
    """Every figure of the report as Plotly (the HTML page, MLflow's artifact viewer), each
    point linked to its run in the MLflow UI."""
    from pipeline.analysis import iplots

    names = run_names(data.frame)

    def url(run: str) -> str:
        return data.run_url.format(run=run)

    return {key: iplots.plotly(spec, names, url) for key, spec in (specs or report_figures(data)).items()}
