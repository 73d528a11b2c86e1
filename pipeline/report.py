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
from pathlib import Path

import pandas as pd

from pipeline.acceptance import alpha_from_length
from pipeline.analysis import advisor, model, quality, verdicts
from pipeline.analysis.report import ReportData, conditions, markdown, page
from pipeline.config import TrackingConfig
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


def analyse(title: str, frame: pd.DataFrame, probes: list[dict], length_tests: list) -> ReportData:
    frame = load_frame(frame)
    gaps = []
    if not (frame["role"] == "baseline").any():
        gaps.append("speedups, crossover and verdicts: the sweep has no baseline point")
    failed = frame[frame["status"] == "failed"]
    if not failed.empty:
        gaps.append(f"{len(failed)} failed point(s) left out: " + ", ".join(failed["point"]))
    points = verdicts.point_table(frame)
    if not points.empty and points["request_rate"].nunique() < 2:
        gaps.append("crossover: only one request rate was measured")
    if not points.empty and points["acceptance_length"].isna().all():
        gaps.append("acceptance, alpha and the model: the engine reported no acceptance metrics")
    crossings = verdicts.crossovers(points)
    fits, skipped = model.fit(points)
    gaps += [f"model: {s}" for s in skipped]
    base = verdicts.measured(frame, "baseline")
    vllm_base = base[base["engine"] == "vllm"]
    e2el = {float(r): float(g["median_e2el_ms"].median()) / 1000 for r, g in vllm_base.groupby("request_rate")}
    vllm_points = points[points["engine"] == "vllm"]
    schedules = [s for m in sorted(vllm_points["method"].unique()) if (s := advisor.k_schedule(vllm_points, e2el, m))]
    if not schedules:
        gaps.append("k schedule: needs vLLM speculative points and baseline latencies")
    if (points["engine"] == "sglang").any():
        gaps.append("k schedule for SGLang: its adaptive-speculation tiers are not emitted (format not verified here)")
    memory = _memory_ratios(frame)
    advice = advisor.advise(points, crossings, memory)
    lossless = _lossless(probes)
    if not probes:
        gaps.append("losslessness: no probe outputs in this sweep run (lossless.prompts=0, or all points resumed)")
    return ReportData(title, frame, points, crossings, fits, advice, schedules, lossless, length_tests, gaps,
                      conditions(frame))  # fmt: skip


def _memory_ratios(frame: pd.DataFrame) -> dict[str, float]:
    if "server_rss_mib" not in frame:
        return {}
    base = frame[frame["role"] == "baseline"]["server_rss_mib"].median()
    out = {}
    for (method, k), group in frame[(frame["role"] == "speculative") & (frame["method"] == "draft")].groupby(["method", "k"]):
        value = group["server_rss_mib"].median()
        if base and math.isfinite(value):
            out[f"{method} k={k}"] = value / base
    return out


def _lossless(probes: list[dict]) -> list[quality.Lossless]:
    by_group = {p["group"]: p for p in probes}
    found = []
    for probe in probes:
        base = by_group.get(probe.get("baseline_group") or "")
        if probe["role"] == "speculative" and base:
            found.append(quality.compare(probe["group"], base["group"], probe["dtype"], probe["outputs"], base["outputs"]))
    return found


def build(reader: SweepReader, parent_id: str, out_dir: Path | None = None) -> dict[str, Path]:
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
        tests = _length_tests(reader, frame, work)
        data = analyse(title, frame, probes, tests)
    figures = {
        name: png
        for name, png in (
            ("Output throughput against median TPOT", plots.throughput_vs_tpot(data.frame)),
            ("Output throughput against p99 TPOT", plots.throughput_vs_tpot(data.frame, "p99_tpot_ms")),
            ("TTFT against request rate", plots.ttft_vs_rate(data.frame)),
            ("Acceptance against k", plots.acceptance_vs_k(data.points)),
            ("Median-TPOT speedup over k x request rate", plots.speedup_heatmap(data.points)),
        )
        if png is not None
    }
    out = (out_dir or Path(tempfile.mkdtemp())) / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "report.html", "markdown": out / "report.md"}
    paths["html"].write_text(page(data, figures))
    paths["markdown"].write_text(markdown(data))
    for i, (name, png) in enumerate(figures.items(), start=1):
        figure = out / f"figure{i}.png"
        figure.write_bytes(png)
        paths[name] = figure
    for path in paths.values():
        reader.log_file(parent_id, path, REPORT_DIR)
    return paths


def _length_tests(reader: SweepReader, frame: pd.DataFrame, work: Path) -> list[tuple[str, float, float]]:
    """At temperature > 0, outputs may differ legitimately: compare the length distributions."""
    if "temperature" not in frame or not (frame["temperature"] > 0).any():
        return []
    by_hash = frame.set_index("point_hash")
    tests = []
    for row in frame[(frame["role"] == "speculative") & (frame["temperature"] > 0)].itertuples():
        if row.baseline_hash not in by_hash.index or not isinstance(row.run_id, str):
            continue
        base_run = by_hash.loc[row.baseline_hash, "run_id"]
        spec_csv = reader.download(row.run_id, "requests.csv", work / row.run_id)
        base_csv = reader.download(str(base_run), "requests.csv", work / str(base_run))
        if spec_csv and base_csv:
            result = quality.length_test(pd.read_csv(spec_csv)["output_tokens"].dropna().tolist(),
                                         pd.read_csv(base_csv)["output_tokens"].dropna().tolist())  # fmt: skip
            if result:
                tests.append((row.point, *result))
    return tests


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="experiment (sweep) name, or a sweep's parent run id")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="folder holding mlruns/ (default: here)")
    parser.add_argument("--tracking-uri", help="an MLflow server instead of the project's store")
    parser.add_argument("--out", type=Path, default=None, help="where to write report/ (default: ./outputs/report-<run>)")
    args = parser.parse_args(argv)
    uri = args.tracking_uri or resolve_store(TrackingConfig(), args.project.resolve()).tracking_uri
    reader = SweepReader(uri)
    try:
        parent = reader.find_parent(args.ref)
        paths = build(reader, parent, args.out or Path("outputs") / f"report-{parent[:8]}")
    except TrackingError as exc:
        raise SystemExit(f"error: {exc}") from exc
    print(f"report: {paths['html'].resolve()}\nsummary: {paths['markdown'].resolve()}")


if __name__ == "__main__":
    main()
