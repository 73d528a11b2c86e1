"""How well does a trace replay keep the trace's schedule, agree with `vllm bench serve`, and
what does the bundled trace say?

    .venv/bin/python benchmarks/trace_replay.py [--part lateness|agreement|speedups|all]
        [--rounds 3] [--requests 24] [--out results.json]

Three parts, one after another (never two servers at once on 2 cores):

- **lateness**: the bundled trace's schedule (its conversations included) sent by the load
  generator to benchmarks/fake_openai_server.py, which answers instantly, at time scales
  1, 0.25, 0.1, 0.05, 0.02, 0.01 and 0.005: the send lateness against the trace's due times
  (p50, p99), and the fastest scale at which the client still keeps the schedule (p99 at most
  KEEPS_MS). The fake server isolates the client: a real engine on the same cores competes for
  them (the agreement part gives the lateness next to a real server at 1x).
- **agreement**: one baseline vLLM server (embedded SmolLM2, prefix caching on, emptied before
  every replay so neither tool warms the other's cache) and two lengths-only traces in vLLM's
  timed_trace / Mooncake shape (timestamps in ms, 16-token hash blocks, 48 output tokens): the
  generated one (--requests lines, Poisson arrivals at 1 req/s, 64-448 input tokens, no shared
  prefix) and one written as a user's export would be (40 lines, four shared system-prompt
  prefixes of 8-20 blocks each, a session_id field specsweep does not replay). Each is replayed
  alternately by specsweep (workload=trace on the completions endpoint: the lines' token ids,
  ignore_eos) and by `vllm bench serve --dataset-name timed_trace`, --rounds times, the first
  tool alternating. The prompt tokens each tool sent are the server's own count
  (vllm:prompt_tokens_total) over its replay; the figure per metric is the median of the
  per-round ratios specsweep / vLLM, against the spread between rounds.
- **speedups**: `python -m pipeline.sweep -m +sweep=trace` (baseline and ngram k=3 on the
  bundled trace at time_scale 1 and 0.5) in a temporary project; the report's overall
  verdicts and its "By request type", "By conversation turn" and "Over the trace" sections.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import EngineConfig, SloConfig, SpecConfig, WorkloadConfig  # noqa: E402
from pipeline.engines import vllm  # noqa: E402
from pipeline.engines.acceptance import parse_scrape  # noqa: E402
from pipeline.engines.base import EngineServer, ServerSpec  # noqa: E402
from pipeline.engines.models import cache_root, ensure_embedded, load_tokenizer  # noqa: E402
from pipeline.engines.process import free_port  # noqa: E402
from pipeline.load import traces  # noqa: E402
from pipeline.load.client import ClientOptions  # noqa: E402
from pipeline.load.loadgen import run_window  # noqa: E402
from pipeline.load.metrics import summarize  # noqa: E402
from pipeline.load.workloads import to_requests  # noqa: E402

SERVED = "smollm2"
SCALES = (1.0, 0.25, 0.1, 0.05, 0.02, 0.01, 0.005)
KEEPS_MS = 10.0  # p99 send lateness at most this: the schedule is kept
KEYS = ("median_tpot_ms", "median_ttft_ms", "output_throughput", "median_itl_ms", "median_e2el_ms")
SECTIONS = ("## By request type", "## By conversation turn", "## Over the trace")
PROMPT_TOKENS = "vllm:prompt_tokens_total"


def _wait_port(port: int, deadline_s: float = 30.0) -> None:
    import socket

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the fake server did not listen on port {port} within {deadline_s:g} s")


def lateness() -> dict:
    port = free_port()
    fake = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "fake_openai_server.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows = {}
    try:
        _wait_port(port)
        opts = ClientOptions(base_url=f"http://127.0.0.1:{port}", model="m")
        for scale in SCALES:
            workload = WorkloadConfig(name="trace", path=traces.BUNDLED_PATH, time_scale=scale, max_tokens=16)
            replayed = traces.load_replay(workload, None)
            requests = to_requests(traces.replay_items(replayed, None, workload), workload, None)
            window = run_window(requests, list(replayed.offsets), opts)
            late = np.array([r.lateness_s for r in window.records if r.ok]) * 1e3
            rows[scale] = {
                "requests": len(requests),
                "ok": int(sum(r.ok for r in window.records)),
                "p50_ms": float(np.percentile(late, 50)),
                "p99_ms": float(np.percentile(late, 99)),
                "span_s": float(max(replayed.offsets)),
            }
            print(
                f"  scale {scale:<6g} span {rows[scale]['span_s']:7.1f} s  {rows[scale]['ok']}/{len(requests)} ok  "
                f"lateness p50 {rows[scale]['p50_ms']:6.2f} ms  p99 {rows[scale]['p99_ms']:6.2f} ms"
            )
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    kept = [s for s, r in rows.items() if r["p99_ms"] <= KEEPS_MS and r["ok"] == r["requests"]]
    fastest = min(kept) if kept else None
    print(f"  fastest scale that keeps the schedule (p99 <= {KEEPS_MS:g} ms): {fastest}")
    return {"scales": rows, "fastest_kept": fastest}


def write_lengths_trace(path: Path, count: int, seed: int) -> Path:
    rng = random.Random(seed)
    t, block = 0.0, 16
    with path.open("w") as fh:
        for i in range(count):
            length = rng.randrange(64, 449)
            hashes = [i * 1000 + j for j in range((length + block - 1) // block)]  # no shared prefix
            fh.write(
                json.dumps(
                    {"timestamp": round(t * 1000), "input_length": length, "output_length": 48, "hash_ids": hashes}
                )
                + "\n"
            )
            t += rng.expovariate(1.0)
    return path


def write_shared_trace(path: Path, seed: int, count: int = 40) -> Path:
    """A user's export: four system prompts (8-20 blocks of 16 tokens each) that most requests
    start with, each request's own text after them, Poisson arrivals at 1 req/s in ms, and a
    field of the user's own that specsweep lists and does not replay."""
    rng = random.Random(seed)
    block = 16
    prefixes = [[10_000 * (p + 1) + j for j in range(rng.randrange(8, 21))] for p in range(4)]
    t = 0.0
    with path.open("w") as fh:
        for i in range(count):
            shared = prefixes[rng.randrange(4)] if rng.random() < 0.85 else []
            own = [i * 1000 + j for j in range(rng.randrange(2, 12))]
            hashes = shared + own
            length = len(hashes) * block - rng.randrange(0, block)  # the last block partly filled
            line = {"timestamp": round(t * 1000), "input_length": length, "output_length": 48, "hash_ids": hashes}
            fh.write(json.dumps(line | {"session_id": f"s{rng.randrange(12)}"}) + "\n")
            t += rng.expovariate(1.0)
    return path


def _metadata_shim(folder: Path, version: str) -> Path:
    # vLLM's CLI looks its version up under the name "vllm", and tells its CPU build by "+cpu".
    dist = folder / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return folder


def prompt_tokens_served(url: str) -> float:
    """The server's own count of prompt tokens so far (vllm:prompt_tokens_total)."""
    return parse_scrape(httpx.get(url + "/metrics", timeout=30, trust_env=False).text).get(PROMPT_TOKENS) or 0.0


def reset_cache(url: str) -> None:
    response = httpx.post(url + "/reset_prefix_cache", timeout=60, trust_env=False)
    response.raise_for_status()


def run_ours(url: str, trace: Path, tokenizer: object, keep: Path | None = None) -> dict:
    workload = WorkloadConfig(
        name="trace", path=str(trace), endpoint="completions", ignore_eos=True, max_tokens=4096, hash_block_tokens=16
    )
    replayed = traces.load_replay(workload, None)
    requests = to_requests(traces.replay_items(replayed, tokenizer, workload), workload, tokenizer)  # type: ignore[arg-type]
    opts = ClientOptions(base_url=url, model=SERVED, endpoint="completions", ignore_eos=True)
    window = run_window(requests, list(replayed.offsets), opts)
    if keep is not None:  # the requests, beside vLLM's detailed result of the same round
        pd.DataFrame([r.as_row() for r in window.records]).to_csv(keep, index=False)
    result = summarize(window.records, window.duration_s, SloConfig(), replayed.own_mean_rate)
    late = np.array([r.lateness_s for r in window.records if r.ok]) * 1e3
    return result | {
        "lateness_p50_ms": float(np.percentile(late, 50)),
        "lateness_p99_ms": float(np.percentile(late, 99)),
        "stated_input_tokens": float(sum(line.input_length or 0 for line in replayed.lines)),
    }


def run_vllm_bench(url: str, trace: Path, count: int, model_dir: str, shim: Path, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        SERVED,
        "--tokenizer",
        model_dir,
        "--dataset-name",
        "timed_trace",
        "--dataset-path",
        str(trace),
        "--timed-trace-sec-multiplier",
        "0.001",
        "--timed-trace-chunk-hash-size",
        "16",
        "--num-prompts",
        str(count),
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--ready-check-timeout-sec",
        "0",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
        "--save-detailed",
    ]
    env = {**os.environ, "PYTHONPATH": str(shim), "VLLM_TARGET_DEVICE": "cpu"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def agreement(rounds: int, count: int, seed: int, work: Path) -> dict:
    model_dir = str(ensure_embedded("smollm2-135m"))
    tokenizer = load_tokenizer(model_dir)
    install = vllm.detect_install()
    shim = _metadata_shim(work / "shim", f"{install.version}+cpu")
    port = free_port()
    launch = vllm.build_launch(
        install=install,
        engine=EngineConfig(prefix_cache="cold"),  # prefix caching on, and the dev mode that empties it
        spec=SpecConfig(method="none", k=0),
        model_path=model_dir,
        draft_path=None,
        served_name=SERVED,
        port=port,
        on_gpu=False,
        seed=seed,
        cache_dir=cache_root(),
    )
    spec = ServerSpec(
        engine="vllm",
        engine_version=str(install.version),
        command=tuple(launch.command),
        host="127.0.0.1",
        port=port,
        log_path=work / "server.log",
        startup_timeout_s=600,
        env=launch.env,
    )
    found = {}
    with EngineServer(spec) as server:
        for name, trace in (
            ("generated", write_lengths_trace(work / "lengths.jsonl", count, seed)),
            ("shared-prefix", write_shared_trace(work / "shared.jsonl", seed)),
        ):
            print(f"  trace {name}: {trace}")
            found[name] = _agree_on(server.base_url, trace, rounds, tokenizer, model_dir, shim, work / name)
    return found


def _one_replay(tool: str, url: str, trace: Path, tokenizer: object, model_dir: str, shim: Path, out: Path) -> dict:
    """One tool's replay from an emptied prefix cache, with the prompt tokens the server counted."""
    reset_cache(url)
    before = prompt_tokens_served(url)
    if tool == "specsweep":
        result = run_ours(url, trace, tokenizer, out.with_name(out.name.replace("vllm", "specsweep") + ".csv"))
    else:
        result = run_vllm_bench(url, trace, sum(1 for _ in trace.open()), model_dir, shim, out)
    return result | {"served_prompt_tokens": prompt_tokens_served(url) - before}


def _agree_on(url: str, trace: Path, rounds: int, tokenizer: object, model_dir: str, shim: Path, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    run_ours(url, trace, tokenizer)  # a warm-up replay, unmeasured (first-request costs)
    ratios: dict[str, list[float]] = {k: [] for k in KEYS}
    tokens: list[tuple[float, float, float]] = []
    late: list[tuple[float, float]] = []
    print(f"  {'round':<6} {'tool':<10} " + " ".join(f"{k:>18}" for k in (*KEYS, "prompt tokens")))
    for r in range(rounds):
        results: dict[str, dict] = {}
        for tool in ("specsweep", "vllm") if r % 2 == 0 else ("vllm", "specsweep"):
            results[tool] = _one_replay(tool, url, trace, tokenizer, model_dir, shim, work / f"vllm-{r}.json")
        for tool in ("specsweep", "vllm"):
            row = [results[tool][k] for k in (*KEYS, "served_prompt_tokens")]
            print(f"  {r:<6} {tool:<10} " + " ".join(f"{v:18.2f}" for v in row))
        for k in KEYS:
            ratios[k].append(results["specsweep"][k] / results["vllm"][k])
        ours, theirs = results["specsweep"]["served_prompt_tokens"], results["vllm"]["served_prompt_tokens"]
        tokens.append((ours, theirs, results["specsweep"]["stated_input_tokens"]))
        late.append((results["specsweep"]["lateness_p50_ms"], results["specsweep"]["lateness_p99_ms"]))
        print(f"  {r:<6} {'ratio':<10} " + " ".join(f"{ratios[k][-1]:18.3f}" for k in KEYS))
    summary = {}
    for k in KEYS:
        values = ratios[k]
        within = min(values) <= 1.0 <= max(values)
        summary[k] = {
            "median_ratio": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "agrees": within,
        }
        print(
            f"  {k:<20} median ratio {summary[k]['median_ratio']:.3f} (rounds {min(values):.3f}-{max(values):.3f}; "
            f"{'1.0 within the rounds' if within else 'outside the rounds'})"
        )
    ours, theirs, stated = tokens[0]
    print(
        f"  prompt tokens the server counted: specsweep {ours:.0f}, vllm bench serve {theirs:.0f}; the trace states {stated:.0f}"
    )
    p50, p99 = statistics.median(x for x, _ in late), statistics.median(y for _, y in late)
    print(
        f"  specsweep's send lateness at 1x next to the real server: p50 {p50:.2f} ms, p99 {p99:.2f} ms (median of rounds)"
    )
    return {
        "ratios": ratios,
        "summary": summary,
        "prompt_tokens": tokens,
        "lateness_p50_ms": p50,
        "lateness_p99_ms": p99,
    }


def speedups(work: Path) -> dict:
    sweep_dir = work / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        "-m",
        "+sweep=trace",
        "force=true",
        "sweep_name=trace-bench",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    with (work / "sweep.log").open("w") as log:
        subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=3600)
    report = next(sweep_dir.rglob("report.md"), None)
    if report is None:
        raise RuntimeError(f"the sweep wrote no report.md under {sweep_dir}; see {work / 'sweep.log'}")
    text = report.read_text()
    lines = text.splitlines()
    kept = [line for line in lines if line.startswith("**Best:")]
    kept += [line for line in lines if line.startswith("| ") and "ngram" in line and "| median TPOT" in line]
    for section in SECTIONS:
        if section in text:
            body = text.split(section, 1)[1].split("\n## ", 1)[0]
            kept += [section, *[line for line in body.splitlines() if line.startswith(("-", "  -"))]]
    print("\n".join(f"  {line}" for line in kept))
    print(f"  (sweep wall time {time.monotonic() - started:.0f} s; report {report})")
    return {"report": str(report), "lines": kept, "wall_s": time.monotonic() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("lateness", "agreement", "speedups", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trace-replay-"))
    record: dict = {}
    if args.part in ("lateness", "all"):
        print("lateness: the bundled trace against an instant fake server")
        record["lateness"] = lateness()
    if args.part in ("agreement", "all"):
        print("agreement: a lengths-only trace, specsweep against vllm bench serve --dataset-name timed_trace")
        record["agreement"] = agreement(args.rounds, args.requests, args.seed, work)
    if args.part in ("speedups", "all"):
        print("speedups: +sweep=trace (baseline and ngram k=3 on the bundled trace, time_scale 1 and 0.5)")
        record["speedups"] = speedups(work)
    if args.out:
        args.out.write_text(json.dumps(record, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
