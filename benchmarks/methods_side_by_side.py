"""The tutorial's three methods on the default engine: n-gram, the 4-layer draft and EAGLE-3.

    .venv/bin/python benchmarks/methods_side_by_side.py build        # the head, timed (first use)
    .venv/bin/python benchmarks/methods_side_by_side.py head         # its L at k=3 and 5 on a real server
    .venv/bin/python benchmarks/methods_side_by_side.py curve        # L against training minutes
    .venv/bin/python benchmarks/methods_side_by_side.py sweep        # A/A, then the three methods
    .venv/bin/python benchmarks/methods_side_by_side.py table NAME   # the side-by-side table of a sweep

Each part prints the CPU first; on a machine others use, run one part at a time.

- ``build``: ``embedded:smollm2-135m-eagle3`` built as a sweep builds it (into the model cache),
  timed from outside; where it is already cached, the build time it recorded.
- ``head``: the cached head served by vLLM as users run it (bf16, the default KV cache) at k=3
  and k=5, on the bundled ``code_edit`` and ``chat`` prompts (seed 0, 16 each, 128 tokens, 4 at
  a time): L and the per-position rates from the server's counters, and tokens per second.
- ``curve``: the same recipe trained again into a temporary folder, the head saved at a few
  steps on the way; each saved head served by vLLM as users run it (bf16, the default KV cache)
  at k=3, the bundled ``code_edit`` and ``chat`` prompts (seed 0, 16 each, 128 tokens, 4 at a
  time), L and the per-position rates read from the server's counters. The last one is the
  recipe's whole run: its files are compared with the cached head's (the build is seeded).
- ``sweep``: ``+sweep=noise_floor`` (two baseline servers, A/A, in this project's store, so that
  the report adds the spread between server starts to every interval), then ``+sweep=methods``
  (ngram, draft and eagle3 at k=3 and 5, 1 and 8 req/s, one baseline), then ``table``.
- ``table``: per configuration and rate, L, the per-position rates, the median-TPOT speedup with
  its interval (the report's, A/A spread included where the store has one), the KV capacity
  vLLM reports against the baseline's, and the draft's or head's own weights.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.engines import eagle_head, models  # noqa: E402
from pipeline.engines.acceptance import V1_ACCEPTED, V1_DRAFTS, V1_PER_POS, parse_scrape  # noqa: E402
from pipeline.load.bundled import BUNDLED  # noqa: E402

HEAD = "smollm2-135m-eagle3"
WORKLOADS = ("code_edit", "chat")


def cpu() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name")), "?")
    simd = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    amx = ", AMX" if " amx_tile" in flags else ""
    return f"{name}, {os.cpu_count()} cores, {simd}{amx} ({platform.machine()})"


def build(_: argparse.Namespace) -> None:
    folder = models.embedded_path(HEAD)
    if (folder / models.DONE_MARKER).is_file():
        report = json.loads((folder / "specsweep-head.json").read_text())
        print(f"cached: {folder}; its build took {report['build_minutes']} min (recorded at build time)")
    else:
        started = time.monotonic()
        models.ensure_embedded(HEAD)
        print(f"built {folder} in {(time.monotonic() - started) / 60:.1f} min (the target's build included if it ran)")
        report = json.loads((folder / "specsweep-head.json").read_text())
    print(f"recipe {report['recipe']}; {report['samples']} answers, {report['training_tokens']} tokens")
    for point in report["curve"]:
        accs = " ".join(f"{point[f'acc_{i}']:.2f}" for i in range(report["recipe"]["ttt_steps"]))
        print(f"  step {point['step']:>4} at {point['minutes']:.1f} min: loss {point['loss']:.3f}, accuracy {accs}")


def serve_and_measure(head: Path | None, k: int, method: str = "eagle3", count: int = 16) -> dict[str, dict]:
    """One vLLM server (as users run it) with ``head``; per workload: L, the per-position rates
    and tokens per second, from the counters' differences over that workload's requests."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec: dict = {"method": method, "num_speculative_tokens": k} | ({"model": str(head)} if head else {})
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models.ensure_embedded(models.TARGET)),
        "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--max-model-len", "2048", "--seed", "0", "--enforce-eager", "--speculative-config", json.dumps(spec),
    ]  # fmt: skip
    env = os.environ | {"DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    log = tempfile.NamedTemporaryFile("w", prefix="methods-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() - started > 600:
                raise SystemExit(f"the server did not start; see {log.name}")
            time.sleep(1)
        out = {}
        for name in WORKLOADS:
            prompts = [i.prompt for i in BUNDLED[name](random.Random(f"{name}:0"), count)]
            before = parse_scrape(httpx.get(f"{url}/metrics").text)
            began = time.monotonic()
            with futures.ThreadPoolExecutor(4) as pool:
                tokens = sum(pool.map(lambda p: _ask(url, p), prompts))
            seconds = time.monotonic() - began
            after = parse_scrape(httpx.get(f"{url}/metrics").text)
            drafts = after.values[V1_DRAFTS] - before.values.get(V1_DRAFTS, 0.0)
            accepted = after.values[V1_ACCEPTED] - before.values.get(V1_ACCEPTED, 0.0)
            pos_after, pos_before = after.per_position.get(V1_PER_POS, {}), before.per_position.get(V1_PER_POS, {})
            out[name] = {
                "L": 1 + accepted / drafts,
                "per_position": [(pos_after[p] - pos_before.get(p, 0.0)) / drafts for p in sorted(pos_after)],
                "tokens_per_s": tokens / seconds,
            }
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _ask(url: str, prompt: str) -> int:
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "temperature": 0}
    return int(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900).json()["usage"]["completion_tokens"])


def _digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(f.read_bytes() for f in sorted(folder.glob("*.safetensors")))).hexdigest()[:16]


def head(args: argparse.Namespace) -> None:
    folder = models.ensure_embedded(HEAD)
    print(f"{'k':>2}  " + "  ".join(f"{w + ' L':>12} {'per position':>30} {'tok/s':>6}" for w in WORKLOADS))
    for k in (3, 5):
        found = serve_and_measure(folder, k)
        cells = [
            f"{found[w]['L']:>12.3f} {' '.join(f'{p:.2f}' for p in found[w]['per_position']):>30} {found[w]['tokens_per_s']:>6.1f}"
            for w in WORKLOADS
        ]
        print(f"{k:>2}  " + "  ".join(cells), flush=True)


def curve(args: argparse.Namespace) -> None:
    recipe = eagle_head.FULL
    steps = sorted({*args.steps, recipe.steps})
    work = Path(tempfile.mkdtemp(prefix="eagle3-curve-"))
    snapshots = {s: work / f"step{s}" for s in steps}
    snapshots[recipe.steps] = work / "final"  # the whole run: saved at its end, as the cache's head is
    report = eagle_head.build_head(models.ensure_embedded(models.TARGET), work / "final", recipe, snapshots=snapshots)
    minutes = {
        s: json.loads((snapshots[s] / "specsweep-head.json").read_text())["minutes"] for s in steps if s != recipe.steps
    }
    minutes[recipe.steps] = report["build_minutes"]
    cached = models.embedded_path(HEAD)
    if (cached / models.DONE_MARKER).is_file():
        same = _digest(work / "final") == _digest(cached)
        print(f"this run's head {'==' if same else '!='} the cached head's weights (seeded build; same machine?)")
    print(f"build: {report['build_minutes']} min; L at k={args.k} on the bundled prompts (vLLM, bf16):")
    print(f"{'step':>5} {'~min':>5}  " + "  ".join(f"{w + ' L':>12} {'per position':>22}" for w in WORKLOADS))
    for step in steps:
        found = serve_and_measure(snapshots[step], args.k)
        cells = [
            f"{found[w]['L']:>12.3f} {' '.join(f'{p:.2f}' for p in found[w]['per_position']):>22}" for w in WORKLOADS
        ]
        print(f"{step:>5} {minutes[step]:>5.1f}  " + "  ".join(cells), flush=True)


def run_sweep(project: Path, name: str, overrides: list[str]) -> None:
    cmd = [sys.executable, "-m", "pipeline.sweep", f"sweep_name={name}", *overrides]
    print("$", " ".join(cmd), flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    (project / f"{name}.log").write_text(proc.stdout + proc.stderr)
    print(f"  took {(time.monotonic() - started) / 60:.1f} min, exit {proc.returncode}", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"the sweep {name} failed; see {project / f'{name}.log'}")


def sweep(args: argparse.Namespace) -> None:
    project = args.project
    stamp = time.strftime("%H%M%S")
    if not args.skip_aa:
        run_sweep(
            project,
            f"methods-aa-{stamp}",
            ["+sweep=noise_floor", "load.request_rate=1,8", "load.num_requests=16", "repeats.count=2"],
        )
    name = f"methods-{stamp}"
    run_sweep(project, name, ["+sweep=methods", f"sweep_name={name}"])
    args.name = name
    table(args)


def table(args: argparse.Namespace) -> None:
    import pandas as pd

    from pipeline.analysis import verdicts
    from pipeline.analysis.samples import Sample, StatsOptions
    from pipeline.config import TrackingConfig
    from pipeline.record.readers import SweepReader
    from pipeline.record.tracking import resolve_store
    from pipeline.record.windows import window_requests, with_server_spread

    reader = SweepReader(resolve_store(TrackingConfig(), args.project).tracking_uri)
    parent = reader.find_parent(args.name)
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.read_csv(reader.download(parent, "summary.csv", Path(tmp)))
        requests = window_requests(reader, frame, Path(tmp))
    samples = {run: Sample.from_requests(t, d) for run, (t, d) in requests.items()}
    opts = with_server_spread(reader, parent, frame, StatsOptions())
    spread = (
        "with the A/A spread between server starts" if opts.server_spread else "within-run only (no A/A in the store)"
    )
    points = verdicts.compare_points(frame, samples, opts).table
    base = frame[frame["role"] == "baseline"]
    base_kv = base["kv_cache_size_tokens"].median() if "kv_cache_size_tokens" in base else float("nan")
    print(f"\nsweep {args.name}: median-TPOT speedup, {spread}; baseline KV cache {base_kv:,.0f} tokens")
    print(
        f"{'method':<7}{'k':>2}{'rate':>5} {'L':>5} {'per position':<24}{'TPOT speedup [interval]':<28}{'KV vs base':>10}{'own weights':>13}"
    )
    for row in points.sort_values(["method", "k", "request_rate"]).itertuples():
        got = frame[frame["point_hash"] == row.point_hash].iloc[0]
        pos = " ".join(
            f"{got[c]:.2f}"
            for c in sorted(c for c in got.index if c.startswith("spec_decode_acceptance_rate_pos_"))
            if pd.notna(got[c])
        )
        weights = (
            f"{got['draft_parameter_bytes'] / 2**20:.1f} MiB" if pd.notna(got.get("draft_parameter_bytes")) else "-"
        )
        kv = got.get("kv_cache_size_tokens", float("nan")) / base_kv
        interval = (
            f"{row.speedup_median_tpot:.3f} [{row.speedup_median_tpot_low:.3f}, {row.speedup_median_tpot_high:.3f}]"
        )
        print(
            f"{row.method:<7}{int(row.k):>2}{row.request_rate:>5g} {got.get('spec_decode_acceptance_length', float('nan')):>5.2f} "
            f"{pos:<24}{interval:<28}{kv:>10.1%}{weights:>13}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["build", "head", "curve", "sweep", "table"])
    parser.add_argument("name", nargs="?", help="table: the sweep's name")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--steps", type=int, nargs="*", default=[15, 30, 60], help="curve: steps to save the head at")
    parser.add_argument("--project", type=Path, default=REPO, help="the folder whose mlruns/ the sweeps use")
    parser.add_argument("--skip-aa", action="store_true", help="sweep: the store already holds an A/A sweep")
    args = parser.parse_args()
    print(f"CPU: {cpu()}", flush=True)
    {"build": build, "head": head, "curve": curve, "sweep": sweep, "table": table}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
