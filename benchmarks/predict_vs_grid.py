"""search=predict against the full grid it replaces, on the embedded model.

    .venv/bin/python benchmarks/predict_vs_grid.py [--methods ngram draft] [--ks 1,...,7]
        [--rates 1,4,inf] [--requests 12] [extra Hydra overrides]

For each method, in one fresh project (its own MLflow store), runs the grid
(``spec.k=1..7 x 3 rates``) and ``search=predict`` over the same grid, alternating which
goes first between methods so that drift on the machine does not favour one, and reports:

- server starts and wall time of each (goal: predict takes at most half the grid's time);
- the k each chooses per rate (goal: the same, or one whose grid-measured median TPOT
  interval overlaps the grid's best's);
- the prediction error per point, |predicted - measured| / measured, of L and of median
  TPOT, against the grid's measurement of the same point: for the first prediction (from
  the baseline and k_max alone) and the final one (with the confirmations as anchors)
  (goals: median L error <= 5 %, median TPOT error <= 10 %).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import sweep_runs
from mlflow.tracking import MlflowClient

METHOD_SPEC = {"ngram": "spec=ngram", "draft": "spec=draft"}


def grid_table(client: MlflowClient, project: Path, name: str) -> pd.DataFrame:
    """The grid's measured points: median TPOT with its interval (the report's window levels) and L."""
    from pipeline.analysis.samples import Sample, StatsOptions
    from pipeline.analysis.stats import window_interval

    exp = client.get_experiment_by_name(name)
    assert exp is not None
    rows = []
    opts = StatsOptions()
    for run in client.search_runs([exp.experiment_id], "tags.status = 'finished'", max_results=1000):
        path = client.download_artifacts(run.info.run_id, "requests.csv", tempfile.mkdtemp())
        sample = Sample.from_requests(pd.read_csv(path), run.data.metrics["duration"])
        level = window_interval("tpot", 50, [sample], opts)
        rows.append(
            {
                "k": int(run.data.params["spec.k"]),
                "request_rate": float(run.data.params["load.request_rate"]),
                "tpot_ms": 1000 * level.estimate,
                "tpot_ms_low": 1000 * level.low,
                "tpot_ms_high": 1000 * level.high,
                "length": run.data.metrics.get("acceptance_length", 1.0),
            }
        )
    return pd.DataFrame(rows)


def starts(client: MlflowClient, name: str) -> int:
    exp = client.get_experiment_by_name(name)
    assert exp is not None
    (parent,) = client.search_runs([exp.experiment_id], "tags.role = 'sweep'", max_results=1)
    return int(parent.data.metrics["server_starts"])


def compare(method: str, grid: pd.DataFrame, predictions: pd.DataFrame) -> dict[str, object]:
    spec = grid[grid["k"] > 0]
    out: dict[str, object] = {"choices": []}
    for rate, group in spec.groupby("request_rate"):
        best = group.loc[group["tpot_ms"].idxmin()]
        chosen = predictions[(predictions["request_rate"] == rate) & predictions["chosen"]]
        k = int(chosen["k"].iloc[0]) if not chosen.empty else None
        picked = group[group["k"] == k].iloc[0] if k is not None else None
        ok = picked is not None and (k == best["k"] or picked["tpot_ms_low"] <= best["tpot_ms_high"])
        out["choices"].append((rate, int(best["k"]), k, bool(ok)))  # type: ignore[union-attr]
    merged = predictions[predictions["predicted"]].merge(spec, on=["k", "request_rate"])
    for kind, tpot, length in (
        ("first", "predicted_tpot_ms", "predicted_length"),
        ("final", "final_tpot_ms", "final_length"),
    ):
        rows = merged.dropna(subset=[tpot]) if tpot in merged else merged.iloc[0:0]
        out[f"{kind}_tpot_errors"] = list(np.abs(rows[tpot] - rows["tpot_ms"]) / rows["tpot_ms"])
        out[f"{kind}_length_errors"] = list(np.abs(rows[length] - rows["length"]) / rows["length"])
        out[f"{kind}_rows"] = rows
    return out


def _median(values: list) -> str:
    return f"{100 * float(np.median(values)):.1f} %" if values else "—"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["ngram", "draft"], choices=sorted(METHOD_SPEC))
    parser.add_argument("--ks", default="1,2,3,4,5,6,7")
    parser.add_argument("--rates", default="1,4,inf", help="a low, a middle and a saturating rate")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both runs")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="specsweep-predict-bench-"))
    common = [
        f"spec.k={args.ks}",
        f"load.request_rate={args.rates}",
        f"load.num_requests={args.requests}",
        "load.warmup_requests=1",
        "workload.max_tokens=32",
        "engine.dtype=float32",
        "lossless.prompts=0",
        *args.overrides,
    ]
    client = MlflowClient(f"sqlite:///{project}/mlruns/mlflow.db")
    print(f"project {project}; both runs: {' '.join(common)}")
    for i, method in enumerate(args.methods):
        order = ["grid", "predict"] if i % 2 == 0 else ["predict", "grid"]
        results = {}
        for kind in order:
            name = f"{kind}-{method}"
            extra = ["search=predict"] if kind == "predict" else []
            results[kind] = sweep_runs.run(project, name, ["force=true", METHOD_SPEC[method], *common, *extra])
            print(f"{method}: {kind} done in {results[kind][0]:.0f} s", flush=True)
        grid = grid_table(client, project, f"grid-{method}")
        predictions = pd.read_csv(results["predict"][1] / "predict" / "predictions.csv")
        found = compare(method, grid, predictions)
        g_wall, p_wall = results["grid"][0], results["predict"][0]
        print(
            f"\n== {method} (k={args.ks}, rates {args.rates}, {args.requests} requests per window; order: "
            f"{' then '.join(order)})"
        )
        print(f"grid     {starts(client, f'grid-{method}')} server starts, {g_wall:.0f} s")
        print(
            f"predict  {starts(client, f'predict-{method}')} server starts, {p_wall:.0f} s "
            f"({g_wall / p_wall:.2f}x less wall time; goal >= 2x)"
        )
        for rate, best, chosen, ok in found["choices"]:  # type: ignore[union-attr]
            rate_text = "inf" if math.isinf(rate) else f"{rate:g}"
            print(
                f"  rate {rate_text:>4}: grid best k={best}, predict chose k={chosen} "
                f"({'same or inside the best interval' if ok else 'OUTSIDE the best interval'})"
            )
        for kind in ("first", "final"):
            print(
                f"  {kind:5} predictions: {len(found[f'{kind}_tpot_errors'])} points, median L error "  # type: ignore[arg-type]
                f"{_median(found[f'{kind}_length_errors'])} (goal <= 5 %), median TPOT error "  # type: ignore[arg-type]
                f"{_median(found[f'{kind}_tpot_errors'])} (goal <= 10 %)"
            )  # type: ignore[arg-type]
        rows = found["first_rows"]
        for r in rows.sort_values(["request_rate", "k"]).itertuples():  # type: ignore[union-attr]
            print(
                f"    k={r.k} @ {r.request_rate:g}: L predicted {r.predicted_length:.2f} measured {r.length:.2f}; "
                f"TPOT predicted {r.predicted_tpot_ms:.1f} [{r.predicted_tpot_ms_low:.1f}, {r.predicted_tpot_ms_high:.1f}] "
                f"measured {r.tpot_ms:.1f} [{r.tpot_ms_low:.1f}, {r.tpot_ms_high:.1f}] ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
