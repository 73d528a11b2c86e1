"""Does synthetic acceptance stand in for a real drafter, and does the engine produce the
acceptance it is told? On the real CPU engine, through the real entry point (vLLM as users run
it: no test-server shortcuts).

    .venv/bin/python benchmarks/synthetic_vs_real.py told        # L in {1, 2, 2.5, 3, 4} at k=3, and the draft itself
    .venv/bin/python benchmarks/synthetic_vs_real.py aa          # the A/A spread between server starts
    .venv/bin/python benchmarks/synthetic_vs_real.py reproduce   # the 4-layer draft, real and synthetic
    .venv/bin/python benchmarks/synthetic_vs_real.py <part> --from-sweep <name>   # re-analyse only

Run each part on its own (each starts 5-8 servers, ~10 min on 2 cores), under a lock on a
shared machine. All three keep their sweeps in one store (``--project``, default a folder under
/tmp kept between parts), so ``reproduce`` finds the A/A spread that ``aa`` measured.

**told**: the 4-layer draft (``spec=draft``) at k=3 with synthetic acceptance L = 1, 2, 2.5, 3
and 4 at 2 req/s. For each, the acceptance length from the engine's counters and its interval
(the report's) must hold the L asked for. L=2.5 is drawn (rates 1, 0.5, 0), the others are not
(vLLM's minimum-variance schedule makes an integer L exact).

**aa**: the noise-floor sweep: a baseline and its identical twin on fresh servers, 2 repeats at
1 and 8 req/s; the RMS of their log ratios is the spread between server starts.

**reproduce**: the same draft at k=3, real and with synthetic acceptance at the L it measured
(in the ``told`` sweep, ``--length-from``, or a pilot window of its own), at 1 and 8 req/s, against one baseline, 2 repeats on fresh
servers. Per rate, both speedups with their intervals, and their ratio (synthetic over real,
paired by repeat and prompt) against the A/A spread: the two must agree within
1.96 x sqrt(2) x the spread between server starts (two independent speculative servers).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.analysis import drafter_map, stats  # noqa: E402
from pipeline.analysis.samples import Sample, StatsOptions, server_spread  # noqa: E402
from pipeline.analysis.verdicts import TPOT, aa_log_ratios, measured  # noqa: E402
from pipeline.config import TrackingConfig  # noqa: E402
from pipeline.record.readers import SweepReader  # noqa: E402
from pipeline.record.tracking import resolve_store  # noqa: E402
from pipeline.record.windows import window_requests  # noqa: E402

OPTS = StatsOptions()
TOLD = (1.0, 2.0, 2.5, 3.0, 4.0)
RATES = "1,8"
COMMON = ["lossless.prompts=0", "load.num_requests=24", "workload.max_tokens=96", "hydra/launcher=basic"]


def run_sweep(project: Path, name: str, overrides: list[str]) -> float:
    cmd = [sys.executable, "-m", "pipeline.sweep", "-m", "--config-dir", str(REPO / "conf"), f"sweep_name={name}"]
    cmd += [*COMMON, *overrides]
    cmd.append(f"hydra.sweep.dir={project}/outputs/{name}")
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    wall = time.monotonic() - started
    (project / f"{name}.log").write_text(proc.stdout + proc.stderr)
    print(f"  sweep took {wall:.0f} s, exit {proc.returncode} (log: {project / f'{name}.log'})", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"the sweep {name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def load(name: str, project: Path) -> tuple[pd.DataFrame, dict[str, Sample]]:
    reader = SweepReader(resolve_store(TrackingConfig(), project).tracking_uri)
    parent = reader.find_parent(name)
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.read_csv(reader.download(parent, "summary.csv", Path(tmp)))
        requests = window_requests(reader, frame, Path(tmp))
    return frame, {run: Sample.from_requests(table, duration) for run, (table, duration) in requests.items()}


def told(args: argparse.Namespace) -> int:
    name = args.from_sweep or f"told-{time.strftime('%H%M%S')}"
    if not args.from_sweep:
        lengths = "null," + ",".join(f"{v:g}" for v in TOLD)  # null: the draft's own acceptance, too
        run_sweep(
            args.project,
            name,
            ["spec=draft", "spec.k=3", f"spec.synthetic_acceptance_length={lengths}", "load.request_rate=2"],
        )
    found = drafter_map.drafter_map(*load(name, args.project), OPTS)
    assert found is not None, "the sweep has no synthetic point"
    misses = 0
    print(f"\nthe engine accepts what it is told (sweep {name!r}, k=3, 2 req/s):")
    for curve in found.curves:
        for point in curve.points:
            print(f"  {drafter_map.told_text(curve, point)}; k_eff {point.k_effective:.2f}")
            misses += point.holds is not True
    for placed in found.placements:
        print(f"  real: {drafter_map.placement_text(placed)}")
    print(f"synthetic_vs_real told: {'ok' if not misses else f'{misses} MISS(ES)'}")
    return 1 if misses else 0


def aa(args: argparse.Namespace) -> int:
    name = args.from_sweep or f"aa-{time.strftime('%H%M%S')}"
    if not args.from_sweep:
        run_sweep(args.project, name, ["+sweep=noise_floor", "repeats.count=2", f"load.request_rate={RATES}"])
    frame, _ = load(name, args.project)
    spread = server_spread(aa_log_ratios(frame), name)
    assert spread is not None, "the A/A sweep gave fewer than 2 comparisons"
    print(
        f"\nA/A spread between fresh servers ({spread.comparisons} comparisons): {100 * spread.sd[TPOT]:.1f} % (median TPOT)"
    )
    return 0


def _pilot_length(args: argparse.Namespace) -> float:
    """The draft's own L: from the ``told`` sweep (``--length-from``), which measured it beside
    the synthetic points, or from a pilot window of its own."""
    name = args.length_from or f"pilot-{time.strftime('%H%M%S')}"
    if not args.length_from:
        run_sweep(args.project, name, ["spec=draft", "spec.k=3", "load.request_rate=1"])
    frame, _ = load(name, args.project)
    rows = measured(frame, "speculative")
    rows = rows[rows["synthetic_length"].isna()] if "synthetic_length" in rows else rows
    length = float(rows["acceptance_length"].median())
    print(f"  the draft's own acceptance length (sweep {name!r}): {length:.4f}")
    return round(length, 3)


def _speedups(frame: pd.DataFrame, samples: dict[str, Sample], rate: float) -> dict[str, tuple[list, list, float]]:
    """Per arm (real, synthetic): its baseline and own windows by repeat, and its L."""
    base = measured(frame, "baseline").set_index("point_hash")
    spec = measured(frame, "speculative")
    spec = spec[spec["request_rate"] == rate].sort_values("repeat")
    arms = {}
    for arm, rows in spec.groupby(spec["synthetic_length"].notna().map({True: "synthetic", False: "real"})):
        bases = [samples[str(base.loc[h, "run_id"])] for h in rows["baseline_hash"]]
        arms[str(arm)] = (bases, [samples[str(r)] for r in rows["run_id"]], float(rows["acceptance_length"].median()))
    return arms


def reproduce(args: argparse.Namespace) -> int:
    name = args.from_sweep or f"reproduce-{time.strftime('%H%M%S')}"
    if not args.from_sweep:
        length = _pilot_length(args)
        overrides = ["spec=draft", "spec.k=3", f"spec.synthetic_acceptance_length=null,{length}"]
        run_sweep(
            args.project, name, [*overrides, f"load.request_rate={RATES}", "repeats.count=2", "repeats.restart=true"]
        )
    frame, samples = load(name, args.project)
    aa_frame, _ = load(args.aa, args.project) if args.aa else (None, None)
    spread = server_spread(aa_log_ratios(aa_frame), args.aa) if aa_frame is not None else None
    sd = spread.sd.get(TPOT) if spread else None
    print(f"\nsynthetic reproduces real (sweep {name!r}; A/A spread {f'{100 * sd:.1f} %' if sd else 'not measured'}):")
    failures = 0
    for rate in sorted(measured(frame, "speculative")["request_rate"].unique()):
        arms = _speedups(frame, samples, float(rate))
        found = {}
        for arm, (bases, windows, length) in arms.items():
            ratio = stats.paired_ratio(TPOT, bases, windows, OPTS, np.random.default_rng([1, int(rate)]))
            found[arm] = ratio
            print(f"  {rate:g} req/s {arm:>9}: L {length:.3f}, median-TPOT speedup {ratio.text}")
        real, synthetic = arms["real"][1], arms["synthetic"][1]
        between = stats.paired_ratio(TPOT, synthetic, real, OPTS, np.random.default_rng([2, int(rate)]))
        over = found["synthetic"].estimate / found["real"].estimate  # type: ignore[operator]
        diff = abs(math.log(over))
        bound = 1.96 * math.sqrt(2) * sd if sd else None
        agree = bound is not None and diff <= bound
        failures += not agree
        print(
            f"  {rate:g} req/s: synthetic / real speedup {over:.3f} "
            f"(paired by repeat: {between.text}); |log difference| {diff:.3f} against 1.96 x sqrt(2) x A/A "
            f"{f'{bound:.3f}' if bound else '—'}: {'agree' if agree else 'DISAGREE' if bound else 'not judged'}"
        )
    print(f"synthetic_vs_real reproduce: {'ok' if not failures else f'{failures} rate(s) disagree or were not judged'}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["told", "aa", "reproduce"])
    parser.add_argument("--from-sweep", help="analyse this finished sweep (its name) instead of running one")
    parser.add_argument("--aa", help="reproduce: the A/A sweep (its name) whose spread judges the agreement")
    parser.add_argument("--length-from", help="reproduce: the told sweep (its name) that measured the draft's own L")
    parser.add_argument(
        "--project", type=Path, default=Path(tempfile.gettempdir()) / "synthetic_vs_real", help="the sweeps' store"
    )
    args = parser.parse_args()
    args.project.mkdir(parents=True, exist_ok=True)
    return {"told": told, "aa": aa, "reproduce": reproduce}[args.part](args)


if __name__ == "__main__":
    raise SystemExit(main())
