"""Does the regression gate stay quiet on noise and fail on a real slowdown?

    .venv/bin/python benchmarks/gate_calibration.py [--nights 6] [--slow-nights 3] [--duty 0.15]

On the real parts the nightly sweep uses: a two-node Ray cluster started with ``ray start``
(token auth on), a real ``mlflow server`` with proxied artifacts, and every night submitted
with ``ray job submit ... +sweep=nightly`` (gate.enabled, gate.confirm as in the file).

1. ``--nights`` unchanged nights, one after another. Each is gated at its end by the sweep
   itself against the nights before it (the first has none: exit 3). Then each is gated
   again, leave-one-out, against the other unchanged nights (up to 5): every one of those is
   an A/A trial of the gate with a full history. Any "regressed" is a false alarm.
2. ``--slow-nights`` nights with a real slowdown: processes pinned to each core
   (``--per-core``) that take a duty cycle of it (``--duty``, busy then asleep every 20 ms) at
   the servers' priority, so the engine steps take longer. Each is gated by the sweep itself (its history now holds the unchanged
   nights), and again against the unchanged nights only.
3. The smallest slowdown the default nightly window detects, from the measured spread
   between nights: the ratio whose prediction interval just clears the floor.

``--stutter 0.13 0.3`` injects the slowdown instead by pausing every engine process of the
cluster it started (SIGSTOP and SIGCONT; never another server on the machine) for that share
of each half second: its steps then take about 1 / (1 - share) as long (1.15x, 1.43x). Busy processes turned out too weak and too erratic a slowdown here.

Only the second node offers a server slot here: on 2 cores, two servers at once would share
the one core vLLM's CPU build binds, and the measurement with them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import Process
from pathlib import Path

from scipy import stats as scipy_stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.analysis.regression import GATED, REGRESSED, SUSPECT, Floors, judge_against_history  # noqa: E402
from pipeline.analysis.samples import StatsOptions  # noqa: E402
from pipeline.finish.judge import measured_points, point_runs  # noqa: E402
from pipeline.record.readers import HistoryReader  # noqa: E402
from tests import cluster  # noqa: E402

WINDOW = [
    "load.num_requests=24",
    "load.warmup_requests=1",
    "workload.max_tokens=32",
    "engine.dtype=float32",
    "lossless.prompts=1",
    "lossless.max_tokens=16",
    f"+ray.resources_per_group.{cluster.SLOT}=1",
]


def _hog(duty: float, core: int) -> None:
    os.sched_setaffinity(0, {core})
    period = 0.02
    while True:
        end = time.perf_counter() + duty * period
        while time.perf_counter() < end:
            pass
        time.sleep((1 - duty) * period)


@contextmanager
def slowdown(duty: float, per_core: int = 1) -> Iterator[None]:
    cores = sorted(os.sched_getaffinity(0)) * per_core
    hogs = [Process(target=_hog, args=(duty, core), daemon=True) for core in cores]
    for hog in hogs:
        hog.start()
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()


def night(ray_cluster: cluster.Cluster, uri: str, name: str) -> tuple[int, float, str]:
    started = time.monotonic()
    entry = ["python", "-m", "pipeline.sweep", "+sweep=nightly", f"tracking.uri={uri}", *WINDOW]
    proc = cluster.submit(ray_cluster, name, REPO, entry, timeout_s=3600)
    code = cluster.job_details(ray_cluster, name).get("driver_exit_code")
    gate_lines = [
        ln for ln in proc.stdout.splitlines() if ln.startswith(("### Regression gate", "| ")) or "regressed" in ln
    ]
    return (-1 if code is None else int(code)), time.monotonic() - started, "\n".join(gate_lines[-12:])


def parents(reader: HistoryReader) -> list[str]:
    experiment = reader.client.get_experiment_by_name("nightly")
    runs = reader.client.search_runs(
        [experiment.experiment_id], "tags.role = 'sweep'", order_by=["attributes.start_time ASC"]
    )
    return [r.info.run_id for r in runs]


def offline(reader: HistoryReader, current: str, history: list[str], work: Path) -> tuple[str, list[str]]:
    """``current`` judged against ``history`` (the same code as the gate, another history)."""
    now = point_runs(reader, current, measured_points(reader.children(current)), work)
    past: dict[str, list] = {}
    for run in history:
        for p in point_runs(reader, run, measured_points(reader.children(run)), work):
            past.setdefault(p.key, []).append(p)
    result = judge_against_history(now, past, StatsOptions(), Floors())
    flagged = [
        f"{f.label} {f.metric} {f.ratio.text} ({f.verdict})"
        for f in result.findings
        if f.verdict in (REGRESSED, SUSPECT)
    ]
    change = [
        f"{f.label} {f.metric} {(1 / f.ratio.estimate - 1) * 100:+.1f} %"
        for f in result.findings
        if f.metric == "median_tpot_ms" and f.ratio.estimate
    ]
    return result.overall, flagged + ["median TPOT vs reference (+ = slower): " + ", ".join(change)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=6)
    parser.add_argument("--slow-nights", type=int, default=3)
    parser.add_argument("--duty", type=float, default=0.15)
    parser.add_argument("--per-core", type=int, default=1, help="busy processes per core")
    parser.add_argument(
        "--stutter",
        type=float,
        nargs="*",
        default=[],
        help="instead of busy processes: pause the engines this share of the time, one night each",
    )
    parser.add_argument("--store", type=Path, help="an earlier run's mlflow folder: add to it, or only analyse it")
    parser.add_argument("--unchanged", type=int, help="with --store: how many of its first runs are unchanged")
    args = parser.parse_args()
    root = args.store.parent if args.store else Path(tempfile.mkdtemp(prefix="gatecal-"))
    with cluster.mlflow_server(root / "mlflow") as server, cluster.ray_cluster(head_slots=0, worker_slots=1) as rc:
        reader = HistoryReader(server.uri)
        print(f"cluster {rc.gcs} (2 nodes), tracking {server.uri} (store {root / 'mlflow'})\n")
        for i in range(args.nights):
            code, wall, lines = night(rc, server.uri, f"nightly-cal-{i + 1}")
            print(f"unchanged night {i + 1}: exit {code}, {wall:.0f} s\n{lines}\n", flush=True)
        unchanged = parents(reader)[: args.unchanged] if args.unchanged else parents(reader)
        for i in range(args.slow_nights):
            with slowdown(args.duty, args.per_core):
                code, wall, lines = night(rc, server.uri, f"nightly-slow-{time.time():.0f}")
            print(
                f"slow night {i + 1} ({args.per_core} process(es) per core, duty {args.duty:.0%}): exit {code}, "
                f"{wall:.0f} s\n{lines}\n",
                flush=True,
            )
        for paused in args.stutter:
            with cluster.stutter(rc.processes, paused):
                code, wall, lines = night(rc, server.uri, f"nightly-stutter-{time.time():.0f}")
            print(
                f"stutter night (engines paused {paused:.0%}, steps ~{1 / (1 - paused):.2f}x): exit {code}, "
                f"{wall:.0f} s\n{lines}\n",
                flush=True,
            )
        slow = [p for p in parents(reader) if p not in unchanged]
        work = root / "work"
        false_alarms = suspects = 0
        print("leave-one-out: each unchanged night against the others")
        for run in unchanged:
            others = [p for p in unchanged if p != run][-5:]
            overall, flagged = offline(reader, run, others, work)
            false_alarms += overall == "fail"
            suspects += any("suspect" in f for f in flagged)
            print(f"  {run[:8]}: {overall}; " + "; ".join(flagged))
        print(f"false alarms: {false_alarms}/{len(unchanged)} (suspects {suspects})\n")
        detected = 0
        print("slow nights against the last 5 unchanged nights")
        for run in slow:
            overall, flagged = offline(reader, run, unchanged[-5:], work)
            detected += overall == "fail"
            print(f"  {run[:8]}: {overall}; " + "; ".join(flagged))
        print(f"detected: {detected}/{len(slow)}\n")
        current = point_runs(reader, unchanged[-1], measured_points(reader.children(unchanged[-1])), work)
        past: dict[str, list] = {}
        for run in unchanged[:-1][-5:]:
            for p in point_runs(reader, run, measured_points(reader.children(run)), work):
                past.setdefault(p.key, []).append(p)
        result = judge_against_history(current, past, StatsOptions(), Floors())
        n = min(5, len(unchanged) - 1)
        print(f"smallest slowdown one night detects (reference: {n} nights; no multiplicity correction):")
        for metric in GATED:
            spread, df = result.spread[metric.column]
            if not df:
                continue
            floor = Floors().relative(metric, 40.0) if metric.floor == "acceptance" else Floors().relative(metric, 1)
            t = scipy_stats.t.ppf(0.975, df)
            smallest = math.exp(math.log1p(floor) + t * spread * math.sqrt(1 + math.pi / (2 * n)))
            print(
                f"  {metric.column}: spread {math.expm1(spread) * 100:.1f} % (df {df}) -> {(smallest - 1) * 100:.0f} %"
            )


if __name__ == "__main__":
    main()
