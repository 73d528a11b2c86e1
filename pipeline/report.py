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
import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import quiet
from pipeline.acceptance import alpha_from_length
from pipeline.analysis import advisor, iplots, model, quality, search_report, stats, verdicts
from pipeline.analysis.report import ReportData, conditions, markdown, page, run_names
from pipeline.analysis.search_report import PREDICTIONS_CSV
from pipeline.analysis.stats import Sample, StatsError, StatsOptions
from pipeline.config import StatsConfig, TrackingConfig
from pipeline.tracking import SweepReader, TrackingError, resolve_store

REPORT_DIR = "report"


def load_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns the analysis reads, present even where a run lacks them (then empty)."""
    frame = frame.copy()
    for column in ("speedup_median_tpot", "speedup_median_ttft", "output_throughput_ratio", "speedup_p99_tpot",
                   "spec_decode_acceptance_rate", "acceptance_length", "acceptance_alpha", "median_tpot_ms",
                   "output_throughput", "median_ttft_ms", "median_e2el_ms"):  # fmt: skip
        if column not in frame:
            frame[column] = math.nan
    if "spec_decode_acceptance_length" in frame:  # runs from before acceptance_length existed
        frame["acceptance_length"] = frame["acceptance_length"].fillna(frame["spec_decode_acceptance_length"])
    missing = frame["acceptance_alpha"].isna() & frame["acceptance_length"].notna()
    frame.loc[missing, "acceptance_alpha"] = [
        alpha_from_length(length, int(k)) for length, k in zip(frame.loc[missing, "acceptance_length"],
                                                                frame.loc[missing, "k"], strict=True)
    ]  # fmt: skip
    return frame


def analyse(title: str, frame: pd.DataFrame, probes: list[dict], length_tests: list,
            samples: Mapping[str, Sample] | None = None, opts: StatsOptions | None = None,
            target: search_report.SloTarget | None = None, predictions: pd.DataFrame | None = None) -> ReportData:  # fmt: skip
    """Everything the report says, from the sweep table and each window's requests
    (``samples``: run id -> its requests; without them no ratio gets an interval)."""
    frame = load_frame(frame)
    samples = samples or {}
    opts = opts or StatsOptions()
    gaps = []
    if not (frame["role"] == "baseline").any():
        gaps.append("speedups, crossover and verdicts: the sweep has no baseline point")
    failed = frame[frame["status"] == "failed"]
    if not failed.empty:
        gaps.append(f"{len(failed)} failed point(s) left out: " + ", ".join(failed["point"]))
    missing = [str(p) for p, r in zip(verdicts.measured(frame)["point"], verdicts.measured(frame)["run_id"], strict=True)
               if str(r) not in samples]  # fmt: skip
    if missing:
        gaps.append("intervals: no per-request data (requests.csv) for " + ", ".join(missing))
    comparisons = verdicts.compare_points(frame, samples, opts)
    points = comparisons.table
    if not points.empty and points["request_rate"].nunique() < 2:
        gaps.append("crossover: only one request rate was measured")
    if not points.empty and points["acceptance_length"].isna().all():
        gaps.append("acceptance, alpha and the model: the engine reported no acceptance metrics")
    crossings = verdicts.crossovers(comparisons)
    fits, skipped = model.fit(points)
    gaps += [f"model: {s}" for s in skipped]
    base = verdicts.measured(frame, "baseline")
    vllm_base = base[base["engine"] == "vllm"]
    e2el = {float(r): float(g["median_e2el_ms"].median()) / 1000 for r, g in vllm_base.groupby("request_rate")}
    vllm_points = points[points["engine"] == "vllm"] if not points.empty else points

    def resolved_faster(slower: str, faster: str) -> bool:
        decision = verdicts.between_points(frame, samples, slower, faster, opts)
        return decision is not None and decision.label == "helps"

    vllm_view = verdicts.Comparisons(vllm_points, comparisons.decisions, opts)
    methods = sorted(vllm_points["method"].unique()) if not vllm_points.empty else []
    schedules = [s for m in methods if (s := advisor.k_schedule(vllm_view, e2el, m, resolved_faster))]
    if not schedules:
        gaps.append("k schedule: needs vLLM speculative points and baseline latencies")
    if not points.empty and (points["engine"] == "sglang").any():
        gaps.append("k schedule for SGLang: its adaptive-speculation tiers are not emitted (format not verified here)")
    memory = _memory_ratios(frame)
    advice = advisor.advise(comparisons, crossings, memory)
    lossless = _lossless(probes)
    if not probes:
        gaps.append("losslessness: no probe outputs in this sweep run (lossless.prompts=0, or all points resumed)")
    curves = search_report.capacity(frame, samples, target, opts) if target is not None else []
    sections = search_report.capacity_lines(curves, target, opts) if target is not None else []
    sections += search_report.predict_lines(predictions if predictions is not None else pd.DataFrame())
    lead = search_report.capacity_headline(curves, target) if target is not None else ""
    return ReportData(title, frame, points, crossings, fits, advice, schedules, lossless, length_tests, gaps,
                      conditions(frame), comparisons, _window_levels(frame, samples, opts), lead, sections,
                      curves, predictions)  # fmt: skip


def _window_levels(frame: pd.DataFrame, samples: Mapping[str, Sample], opts: StatsOptions) -> pd.DataFrame:
    """Each point's own median TPOT with its interval (the plots' error bars), repeats together."""
    data = verdicts.measured(frame)
    key = verdicts.key_column(data)
    rows = []
    for i, (_, group) in enumerate(data.groupby(key, sort=False)):
        windows = [samples.get(str(r)) for r in group["run_id"]]
        first = group.iloc[0]
        row = {c: first.get(c) for c in ("role", "engine", "method", "k", "request_rate", "setting_key", "replica")}
        row["output_throughput"] = float(group["output_throughput"].median())
        row["median_tpot_ms"] = float(group["median_tpot_ms"].median())
        row["run_ids"] = " ".join(str(r) for r in group["run_id"])
        if windows and all(w is not None for w in windows):
            level = stats.window_interval("tpot", 50, windows, opts, np.random.default_rng([opts.seed, 99, i]))  # type: ignore[arg-type]
            if level.resolved:
                row["median_tpot_ms_low"], row["median_tpot_ms_high"] = 1000 * level.low, 1000 * level.high  # type: ignore[operator]
        rows.append(row)
    return pd.DataFrame(rows)


def _memory_ratios(frame: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """Draft-model server memory over the baseline's: (lowest, median, highest) over every
    window's reading, so the rule tests a measured range, not one sample."""
    if "server_rss_mib" not in frame:
        return {}
    base = frame[frame["role"] == "baseline"]["server_rss_mib"].dropna()
    out = {}
    drafts = frame[(frame["role"] == "speculative") & (frame["method"] == "draft")]
    for (method, k), group in drafts.groupby(["method", "k"]):
        values = group["server_rss_mib"].dropna()
        if base.empty or values.empty or base.min() <= 0:
            continue
        out[f"{method} k={k}"] = (values.min() / base.max(), values.median() / base.median(), values.max() / base.min())
    return out


def _lossless(probes: list[dict]) -> list[quality.Lossless]:
    by_group = {p["group"]: p for p in probes}
    found = []
    for probe in probes:
        base = by_group.get(probe.get("baseline_group") or "")
        if probe["role"] == "speculative" and base:
            found.append(
                quality.compare(probe["group"], base["group"], probe["dtype"], probe["outputs"], base["outputs"])
            )
    return found


def build(reader: SweepReader, parent_id: str, out_dir: Path | None = None,
          opts: StatsOptions | None = None) -> dict[str, Path]:  # fmt: skip
    """Analyse the sweep of ``parent_id`` from MLflow; write and log the report."""
    from pipeline.analysis import plots

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
        requests = _requests(reader, frame, work)
        samples = {run: Sample.from_requests(table, duration) for run, (table, duration) in requests.items()}
        tests = _length_tests(frame, {run: table for run, (table, _) in requests.items()})
        opts = _with_server_spread(reader, parent_id, frame, opts or StatsOptions())
        table = reader.download(parent_id, PREDICTIONS_CSV, work)
        predictions = pd.read_csv(table) if table is not None else None
        data = analyse(
            title, frame, probes, tests, samples, opts, search_report.slo_target(reader.params(parent_id)), predictions
        )
        data = replace(data, run_url=reader.run_url(parent_id))
        since, trends = _since_reference(reader, parent_id, work)
    interactive = _interactive(data)
    figures = {
        name: png
        for name, png in (
            ("Output throughput against median TPOT", plots.throughput_vs_tpot(data.frame, levels=data.levels)),
            ("Output throughput against p99 TPOT", plots.throughput_vs_tpot(data.frame, "p99_tpot_ms")),
            ("Median-TPOT speedup against request rate", plots.speedup_vs_rate(data.points)),
            ("TTFT against request rate", plots.ttft_vs_rate(data.frame)),
            ("Acceptance against k", plots.acceptance_vs_k(data.points)),
            ("Median-TPOT speedup over k x request rate", plots.speedup_heatmap(data.points)),
            ("Capacity under the SLO", plots.capacity_curve(data.capacity)),
            ("Median TPOT against k: measured and predicted", plots.k_curve(data.predictions)),
        )
        if png is not None
    } | trends
    out = (out_dir or Path(tempfile.mkdtemp())) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "report.html", "markdown": out / "report.md"}
    section = f"\n## Since the reference\n\n{since}" if since else ""
    html_section = f"<h2>Since the reference</h2><pre>{html_escape(since)}</pre></body>" if since else "</body>"
    static = {name: png for name, png in figures.items() if name not in interactive}
    paths["html"].write_text(page(data, static, iplots.html(interactive)).replace("</body>", html_section))
    pngs = [(name, f"figure{i}.png") for i, name in enumerate(figures, start=1)]
    images = "\n## Figures\n\n" + "\n".join(f"![{name}]({file})" for name, file in pngs) + "\n" if pngs else ""
    paths["markdown"].write_text(markdown(data) + section + images)
    for (name, file), png in zip(pngs, figures.values(), strict=True):
        (out / file).write_bytes(png)
        paths[name] = out / file
    for path in paths.values():
        reader.log_file(parent_id, path, REPORT_DIR)
    for i, fig in enumerate(interactive.values(), start=1):  # MLflow's artifact viewer draws these
        reader.log_figure(parent_id, fig, f"{REPORT_DIR}/interactive/figure{i}.html")
    return paths


def _interactive(data: ReportData) -> dict:
    """The figures with a Plotly twin, by the same names as their PNGs."""
    names = run_names(data.frame)

    def url(run: str) -> str:
        return data.run_url.format(run=run)

    made = {
        "Output throughput against median TPOT": iplots.throughput_vs_tpot(data.levels, names, url),
        "Median-TPOT speedup against request rate": iplots.speedup_vs_rate(data.points, names, url),
        "TTFT against request rate": iplots.ttft_vs_rate(data.frame, names, url),
        "Acceptance against k": iplots.acceptance_vs_k(data.points, names, url),
    }
    return {name: fig for name, fig in made.items() if fig is not None}


def _since_reference(reader: SweepReader, parent_id: str, work: Path) -> tuple[str, dict[str, bytes]]:
    """The regression gate's summary and trend plots, where the gate judged this sweep."""
    folder = reader.download(parent_id, "gate", work / "gate")
    if folder is None or not (folder / "summary.md").is_file():
        return "", {}
    trends = {f"Since the reference ({p.stem})": p.read_bytes() for p in sorted(folder.glob("trend*.png"))}
    return (folder / "summary.md").read_text(), trends


AA_PREFIX = "aa_sd_"
AA_COUNT = "aa_comparisons"


def _with_server_spread(reader: SweepReader, parent_id: str, frame: pd.DataFrame, opts: StatsOptions) -> StatsOptions:
    """An A/A sweep records the spread between fresh servers on its parent run; every other
    sweep of the store adds the newest such spread to its one-server comparisons."""
    if verdicts.is_aa(frame):
        spread = stats.server_spread(verdicts.aa_log_ratios(frame), reader.title(parent_id))
        if spread is not None:
            reader.log_metrics(parent_id, {AA_COUNT: float(spread.comparisons),
                                           **{AA_PREFIX + m: v for m, v in spread.sd.items()}})  # fmt: skip
        return opts
    spread = stored_server_spread(reader)
    return opts if spread is None else replace(opts, server_spread=spread)


def stored_server_spread(reader: SweepReader) -> stats.ServerSpread | None:
    """The newest A/A spread between fresh servers recorded anywhere in the store."""
    found = reader.newest_with_metric(AA_COUNT)
    if found is None:
        return None
    _, metrics, title = found
    sd = {k.removeprefix(AA_PREFIX): v for k, v in metrics.items() if k.startswith(AA_PREFIX)}
    return stats.ServerSpread(sd, int(metrics[AA_COUNT]), title)


def window_sample(reader: SweepReader, run_id: str, duration: float, work: Path) -> Sample | None:
    """A window's requests as the statistics core resamples them, from its run's requests.csv
    (the workers that measured it may be on other nodes); None where the run has none."""
    path = reader.download(run_id, "requests.csv", work / run_id) if run_id else None
    if path is None or not math.isfinite(duration):
        return None
    return Sample.from_requests(pd.read_csv(path), duration)


def stats_options(stats: StatsConfig, reader: SweepReader) -> StatsOptions:
    """The sweep's decision settings, with the store's newest A/A spread between fresh servers."""
    return StatsOptions(confidence=stats.confidence, floor=stats.floor, resamples=stats.resamples,
                        server_spread=stored_server_spread(reader))  # fmt: skip


def _requests(reader: SweepReader, frame: pd.DataFrame, work: Path) -> dict[str, tuple[pd.DataFrame, float]]:
    """Each measured window's requests.csv and duration, by run id: what every interval resamples."""
    found = {}
    for row in verdicts.measured(frame).itertuples():
        run = str(row.run_id)
        duration = getattr(row, "duration", math.nan)
        if not run or run == "nan" or not isinstance(duration, (int, float)) or not math.isfinite(duration):
            continue
        path = reader.download(run, "requests.csv", work / run)
        if path is not None:
            found[run] = (pd.read_csv(path), float(duration))
    return found


def _length_tests(frame: pd.DataFrame, requests: Mapping[str, pd.DataFrame]) -> list[tuple[str, float, float]]:
    """At temperature > 0, outputs may differ legitimately: compare the length distributions."""
    if "temperature" not in frame or not (frame["temperature"] > 0).any():
        return []
    by_hash = frame.set_index("point_hash")
    tests = []
    for row in frame[(frame["role"] == "speculative") & (frame["temperature"] > 0)].itertuples():
        if row.baseline_hash not in by_hash.index:
            continue
        spec, base = requests.get(str(row.run_id)), requests.get(str(by_hash.loc[row.baseline_hash, "run_id"]))
        if spec is not None and base is not None:
            result = quality.length_test(
                spec["output_tokens"].dropna().tolist(), base["output_tokens"].dropna().tolist()
            )
            if result:
                tests.append((row.point, *result))
    return tests


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="experiment (sweep) name, or a sweep's parent run id")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="folder holding mlruns/ (default: here)")
    parser.add_argument("--tracking-uri", help="an MLflow server instead of the project's store")
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write report/ (default: ./outputs/report-<run>)"
    )
    parser.add_argument("--confidence", type=float, help="interval level (default: the sweep's stats.confidence)")
    parser.add_argument("--floor", type=float, help="practical floor, e.g. 0.02 (default: the sweep's stats.floor)")
    parser.add_argument("--resamples", type=int, help="bootstrap replicates (default: the sweep's stats.resamples)")
    parser.add_argument("--verbose", action="store_true", help="MLflow's download bars and library notices too")
    args = parser.parse_args(argv)
    quiet.apply(args.verbose)
    uri = args.tracking_uri or resolve_store(TrackingConfig(), args.project.resolve()).tracking_uri
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
    except (TrackingError, StatsError) as exc:
        raise SystemExit(f"error: {exc}") from exc
    print(f"report: {paths['html'].resolve()}\nsummary: {paths['markdown'].resolve()}")


if __name__ == "__main__":
    main()
