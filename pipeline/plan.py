"""``dry_run=true``: what a job would start, with the exact commands, and a rough duration.

Nothing is started and no model is built; the engine, device, methods and model paths are
still checked, so a dry run fails exactly where the real run would fail before starting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from pipeline.config import JobConfig
from pipeline.job import Target, roles, schedule, server_spec
from pipeline.redact import redact_args, redact_mapping, shell_line

# Rough per-server start-up and per-token costs, measured with the embedded 135M model:
# eager CPU servers started in 31-48 s here; compiled start-ups take ~2 min (DESIGN.md).
STARTUP_S = {"cpu-eager": 45.0, "compiled": 130.0}
CPU_TPOT_S = 0.04


def estimate_s(job: JobConfig, target: Target, offsets: Sequence[float]) -> float:
    eager = job.engine.enforce_eager if job.engine.enforce_eager is not None else not target.on_gpu
    startup = STARTUP_S["cpu-eager" if eager and not target.on_gpu else "compiled"]
    # The tail: the last request's decode after its arrival, plus sequential warm-ups.
    tpot = CPU_TPOT_S if not target.on_gpu else CPU_TPOT_S / 4
    span = (offsets[-1] if offsets else 0.0) + job.workload.max_tokens * tpot
    warmup = job.load.warmup_requests * job.workload.max_tokens * tpot
    return len(roles(job)) * (startup + warmup + span)


def describe(job: JobConfig, target: Target) -> str:
    offsets = schedule(job.load, job.seed)
    lines = ["dry run: nothing was started.", ""]
    servers = roles(job)
    for i, (role, role_job) in enumerate(servers, start=1):
        spec = server_spec(target, role_job, Path(job.output_dir) / role / "server.log", port=0)
        args = list(redact_args(spec.command))
        args[args.index("--port") + 1] = "<free port>"
        label = "no speculation" if role == "baseline" else f"{job.spec.method} k={job.spec.k}"
        lines.append(f"server {i}/{len(servers)} {role} ({label}), vLLM {spec.engine_version}:")
        lines.append("  " + shell_line(args).replace("'<free port>'", "<free port>"))
        env = " ".join(f"{k}={v}" for k, v in sorted(redact_mapping(spec.env).items()))
        lines.append(f"  environment: {env}")
    rate = "all at once" if math.isinf(job.load.request_rate) else f"{job.load.request_rate:g} req/s"
    lines += [
        "",
        f"each server: {job.load.warmup_requests} warm-up + {len(offsets)} measured requests, {rate}"
        f" ({job.workload.name}, up to {job.workload.max_tokens} tokens each), arrivals over "
        f"{offsets[-1] if offsets else 0.0:.1f} s",
        f"estimated time: ~{estimate_s(job, target, offsets) / 60:.1f} min (rough: start-ups dominate on CPU)",
    ]
    return "\n".join(lines)
