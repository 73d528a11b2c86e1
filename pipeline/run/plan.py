"""Planning a sweep, before anything runs: which servers, which points on each, how long.

Pure: no server, no MLflow, no engine install is touched here. A point is one measured
window (a server configuration at one load); a group is the points that share one server.
Jobs that differ only in load share a server, and every speculative configuration of a
sweep shares one baseline server, so a k x rate grid starts k + 1 servers, not 2 x k x rate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.config import ConfigError, JobConfig, SweepSettings
from pipeline.engines import synthetic
from pipeline.engines.registry import engine_of
from pipeline.identity import point_hash, server_key
from pipeline.load import traces
from pipeline.load.loadgen import schedule

# Rough costs, measured with the embedded 135M model on 2 cores: eager CPU servers start in
# 31-49 s; compiled start-ups take ~2 min. TPOT ~40 ms per token without speculation.
STARTUP_S = {"cpu-eager": 45.0, "compiled": 130.0}
CPU_TPOT_S = 0.04
# Output tokens per second the embedded model's baseline sustains when saturated here
# (136.6 tok/s at 16 req/s in the default sweep): a saturated window takes tokens / this.
CPU_CAPACITY_TOK_S = 130.0
STOP_S = 5.0
# Warm-up requests only need to exercise the code paths; they are capped at this many tokens.
WARMUP_MAX_TOKENS = 32


def _starts_servers(job: JobConfig) -> bool:
    return engine_of(job).starts_servers


def _server_name(role: str, job: JobConfig) -> str:
    engine = engine_of(job).run_prefix
    engine = ("ref-" if job.build == "reference" else "") + engine  # gate.mode=paired's reference build
    if job.replica:
        return engine + "baseline-twin"  # the A/A comparison's second server
    return engine + ("baseline" if role == "baseline" else f"{job.spec.method}-k{job.spec.k}{_synthetic_name(job)}")


def _synthetic_name(job: JobConfig) -> str:
    """A synthetic-acceptance server's name part: its L (or rates), so no two share a folder."""
    spec = job.spec
    if spec.synthetic_acceptance_rates is not None:
        return "-syn" + "_".join(f"{r:g}" for r in spec.synthetic_acceptance_rates)
    return f"-synL{spec.synthetic_acceptance_length:g}" if spec.synthetic_acceptance_length is not None else ""


@dataclass(frozen=True)
class Point:
    role: str  # "baseline" or "speculative"
    job: JobConfig
    hash: str
    baseline_hash: str | None = None  # the point this one is compared with (speculative only)

    @property
    def label(self) -> str:
        repeat = f"-rep{self.job.repeat}" if self.job.repeat else ""
        return f"{_server_name(self.role, self.job)}-r{self.job.load.request_rate:g}{repeat}"

    @property
    def pair_label(self) -> str:
        """gate.mode=paired: the point both builds measure in every pair (no build, no pair)."""
        return f"{_server_name(self.role, dataclasses.replace(self.job, build='candidate'))}-r{self.job.load.request_rate:g}"


@dataclass(frozen=True)
class ServerGroup:
    index: int
    role: str
    points: tuple[Point, ...]
    # A server of its own for each repeat (repeats.restart): the label then names the repeat.
    per_repeat: bool = False

    @property
    def server_job(self) -> JobConfig:
        return self.points[0].job

    @property
    def label(self) -> str:
        job = self.server_job
        restarted = f"-rep{job.repeat}" if self.per_repeat and job.repeat else ""
        return f"{self.index:02d}-{_server_name(self.role, job)}{restarted}"


@dataclass(frozen=True)
class SweepPlan:
    groups: tuple[ServerGroup, ...]

    @property
    def points(self) -> tuple[Point, ...]:
        return tuple(p for g in self.groups for p in g.points)

    def without(self, done: Iterable[str]) -> SweepPlan:
        """The plan left once the points whose hashes are in ``done`` are skipped."""
        skip = set(done)
        groups = []
        for group in self.groups:
            left = tuple(p for p in group.points if p.hash not in skip)
            if left:
                groups.append(dataclasses.replace(group, points=left))
        return SweepPlan(tuple(groups))


def plan_sweep(jobs: Sequence[JobConfig], settings: SweepSettings | None = None) -> SweepPlan:
    """Group the jobs' points by server; the baseline servers come first. ``settings``: the
    sweep's (its repeats and aa), as the driver read them once; by default read from ``jobs``."""
    if not jobs:
        raise ConfigError(
            "the sweep expands to no jobs: a sweep value list is empty; give at least one value, "
            "e.g. spec.k=3,5 load.request_rate=1,2"
        )
    settings = SweepSettings.of(jobs) if settings is None else settings
    points: dict[str, Point] = {}
    jobs = [dataclasses.replace(job, repeat=r) for job in jobs for r in range(settings.repeats.count)]
    for job in jobs:
        base = job.baseline()
        base_hash = point_hash(base)
        points.setdefault(base_hash, Point("baseline", base, base_hash))
        # An A/A twin stands where a speculative point would: compared with the baseline.
        other = dataclasses.replace(base, replica=1) if settings.aa else job if job.spec.method != "none" else None
        if other is not None:
            h = point_hash(other)
            points.setdefault(h, Point("speculative", other, h, base_hash))
    _one_external_server(points.values())
    by_server: dict[str, list[Point]] = {}
    ordered = sorted(points.values(), key=lambda p: p.role != "baseline")  # stable: grid order within a role
    for point in ordered:
        by_server.setdefault(server_key(point.job), []).append(point)
    restart = settings.repeats.restart
    groups = tuple(
        ServerGroup(i, pts[0].role, tuple(sorted(pts, key=lambda p: (p.job.load.request_rate, p.job.repeat))), restart)
        for i, pts in enumerate(by_server.values(), start=1)
    )
    return SweepPlan(groups)


def _one_external_server(points: Iterable[Point]) -> None:
    """engine=external measures one speculative server (engine.url) as it runs: a sweep over
    what would need another server (k, method, model) cannot be measured there."""
    speculative = {server_key(p.job) for p in points if p.role == "speculative" and not _starts_servers(p.job)}
    if len(speculative) > 1:
        raise ConfigError(
            "engine=external measures the one speculative server at engine.url, which runs one method and k; "
            "sweep load.request_rate (or other load settings) only, and run one sweep per speculative deployment"
        )


# ---- Time estimate and the dry-run text ------------------------------------------------


def _eager(job: JobConfig, on_gpu: bool) -> bool:
    return job.engine.enforce_eager if job.engine.enforce_eager is not None else not on_gpu


def point_offsets(job: JobConfig) -> list[float] | tuple[float, ...]:
    """When the point's requests are due: a trace's own (scaled) timestamps, or the seeded schedule."""
    if job.workload.name == "trace":
        return traces.load_replay(job.workload, job.load.request_rate).offsets
    return schedule(job.load, job.seed + job.repeat)


def point_estimate_s(job: JobConfig, on_gpu: bool) -> float:
    """Arrivals plus the last request's decode; speculation is assumed no faster (an upper bound)."""
    tpot = CPU_TPOT_S if not on_gpu else CPU_TPOT_S / 4
    offsets = point_offsets(job)
    span = offsets[-1] if offsets and math.isfinite(offsets[-1]) else 0.0
    unsaturated = span + job.workload.max_tokens * tpot
    if on_gpu:
        return unsaturated
    return max(unsaturated, len(offsets) * job.workload.max_tokens / CPU_CAPACITY_TOK_S)


def group_estimate_s(group: ServerGroup, on_gpu: bool) -> float:
    job = group.server_job
    startup = STARTUP_S["cpu-eager" if _eager(job, on_gpu) and not on_gpu else "compiled"]
    start_stop = startup + STOP_S if _starts_servers(job) else 0.0  # external: already running
    tpot = CPU_TPOT_S if not on_gpu else CPU_TPOT_S / 4
    warmup = job.load.warmup_requests * min(job.workload.max_tokens, WARMUP_MAX_TOKENS) * tpot
    return start_stop + warmup + sum(point_estimate_s(p.job, on_gpu) for p in group.points)


def estimate_s(plan: SweepPlan, on_gpu: bool) -> float:
    return sum(group_estimate_s(g, on_gpu) for g in plan.groups)


@dataclass(frozen=True)
class ServerLine:
    """A group's launch, already redacted: what the dry run prints."""

    engine: str
    version: str
    args: tuple[str, ...]
    env: dict[str, str]
    ray: str = ""  # what its server group asks Ray for, under the default launcher


def describe(plan: SweepPlan, servers: Sequence[ServerLine], on_gpu: bool) -> str:
    from pipeline.redact import shell_line

    lines = ["dry run: nothing was started.", ""]
    n = len(plan.groups)
    for group, server in zip(plan.groups, servers, strict=True):
        spec = group.server_job.spec
        what = "no speculation" if group.role == "baseline" else f"{spec.method} k={spec.k}"
        if synthetic.is_synthetic(spec):
            what += f", {synthetic.label(spec)}"
        role = group.role
        if group.server_job.replica:
            role, what = "A/A twin", "no speculation, compared as if speculative"
        if not _starts_servers(group.server_job):
            lines.append(
                f"server {group.index}/{n} {role} ({what}), already running at {server.args[-1]} "
                f"(version: {server.version}):"
            )
        else:
            lines.append(f"server {group.index}/{n} {role} ({what}), {server.engine} {server.version}:")
            lines.append("  " + shell_line(server.args).replace("'<free port>'", "<free port>"))
            lines.append("  environment: " + " ".join(f"{k}={v}" for k, v in sorted(server.env.items())))
        if server.ray:
            lines.append(f"  Ray request (the default launcher): {server.ray}")
        for point in group.points:
            load = point.job.load
            rate = "all at once" if math.isinf(load.request_rate) else f"{load.request_rate:g} req/s"
            count = len(point_offsets(point.job))
            lines.append(
                f"  - point {point.label}: {count} requests at {rate} ({point.job.workload.name}, "
                f"up to {point.job.workload.max_tokens} tokens), ~{point_estimate_s(point.job, on_gpu):.0f} s"
            )
        lines.append("")
    warm = plan.groups[0].server_job.load.warmup_requests if plan.groups else 0
    running = sum(not _starts_servers(g.server_job) for g in plan.groups)
    starts = f"{n - running} server start(s)" + (f", {running} running server(s) measured" if running else "")
    lines += [
        f"{starts}, {len(plan.points)} measured point(s); {warm} warm-up request(s) per server",
        f"estimated time: ~{estimate_s(plan, on_gpu) / 60:.1f} min (rough: start-ups dominate on CPU)",
    ]
    return "\n".join(lines)
