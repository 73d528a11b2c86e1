"""Planning a sweep, before anything runs: which servers, which points on each, and the dry
run's text (how long it takes is pipeline/run/estimate.py's).

Pure: no server, no MLflow, no engine install is touched here. A point is one measured
window (a server configuration at one load); a group is the points that share one server.
Jobs that differ only in load share a server, and every speculative configuration of a
sweep shares one baseline server, so a k x rate grid starts k + 1 servers, not 2 x k x rate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.config import ConfigError, JobConfig, SweepSettings
from pipeline.engines import synthetic
from pipeline.engines.registry import engine_of
from pipeline.identity import point_hash, server_key
from pipeline.load import traces
from pipeline.load.loadgen import schedule

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


# ---- The dry-run text -------------------------------------------------------------------


def point_offsets(job: JobConfig) -> list[float] | tuple[float, ...]:
    """When the point's requests are due: a trace's own (scaled) timestamps, or the seeded schedule."""
    if job.workload.name == "trace":
        return traces.load_replay(job.workload, job.load.request_rate).offsets
    return schedule(job.load, job.seed + job.repeat)


def output_lengths_text(job: JobConfig) -> str:
    """The output lengths a point asks for: a trace's own (median, p90, max over its lines, a
    line without one at workload.max_tokens), else the cap every request shares."""
    workload = job.workload
    if workload.name != "trace":
        return f"up to {workload.max_tokens} tokens"
    lines = traces.load_replay(workload, job.load.request_rate).lines
    lengths = sorted(line.output_tokens or workload.max_tokens for line in lines)
    stated = sum(line.output_tokens is not None for line in lines)
    p90 = lengths[min(len(lengths) - 1, math.ceil(0.9 * len(lengths)) - 1)]
    text = (
        f"output lengths median {lengths[(len(lengths) - 1) // 2]}, p90 {p90}, max {lengths[-1]} tokens; "
        f"{stated} of {len(lines)} lines give their own"
    )
    if stated < len(lines):
        text += f", the rest workload.max_tokens={workload.max_tokens}"
    if stated and not workload.ignore_eos:
        text += "; a server may stop a request at EOS before its length: workload.ignore_eos=true keeps to them"
    return text


@dataclass(frozen=True)
class UrlLoad:
    """What a sweep sends one running server (engine=external): every request, warm-ups and
    cache primers and the losslessness probe included, and the highest rate it offers."""

    key: str  # engine.url or engine.baseline_url
    url: str
    requests: int
    peak_rate: float  # requests per second; inf: a window sent all at once


def point_peak_rate(job: JobConfig) -> float:
    """A point's highest offered rate: its rate, or a trace's busiest 10 s, scaled to it."""
    rate = job.load.request_rate
    if job.workload.name != "trace" or not math.isfinite(rate):
        return rate
    replayed = traces.load_replay(job.workload, rate)
    if not math.isfinite(replayed.own_mean_rate) or replayed.own_mean_rate <= 0:
        return math.inf
    return max(rate, replayed.own_peak_rate * rate / replayed.own_mean_rate)


def external_load(plan: SweepPlan, probe_prompts: int) -> list[UrlLoad]:
    """Per running server a sweep measures (engine=external), what it will send there."""
    from pipeline.engines.external import external_url

    loads: dict[str, UrlLoad] = {}
    for group in plan.groups:
        job = group.server_job
        if _starts_servers(job):
            continue
        key, url = external_url(job)
        windows = [len(point_offsets(p.job)) for p in group.points]
        primed = sum(windows) if job.engine.prefix_cache == "warm" else 0  # each window's prompts once more
        sent = sum(windows) + primed + job.load.warmup_requests + probe_prompts
        peak = max(point_peak_rate(p.job) for p in group.points)
        before = loads.get(url)
        if before is not None:
            sent, peak = sent + before.requests, max(peak, before.peak_rate)
        loads[url] = UrlLoad(key, url, sent, peak)
    return list(loads.values())


def external_load_text(loads: Sequence[UrlLoad]) -> str:
    """What a sweep will send each running server, one clause per URL."""
    parts = []
    for load in loads:
        peak = "all at once" if math.isinf(load.peak_rate) else f"up to {load.peak_rate:.3g} req/s"
        parts.append(f"{load.requests} requests, {peak}, to {load.url} ({load.key})")
    return "engine=external: this sweep will send " + "; ".join(parts)


@dataclass(frozen=True)
class ServerLine:
    """A group's launch, already redacted: what the dry run prints."""

    engine: str
    version: str
    args: tuple[str, ...]
    env: dict[str, str]
    ray: str = ""  # what its server group asks Ray for, under the default launcher


def describe(
    plan: SweepPlan, servers: Sequence[ServerLine], points_s: Mapping[str, float], estimate: Sequence[str]
) -> str:
    """The dry run's text: each server, its command and Ray request, its points with their
    windows' estimates (``points_s``, by hash), and the estimate's account (pipeline/run/estimate.py)."""
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
                f"{output_lengths_text(point.job)}), ~{points_s[point.hash]:.0f} s"
            )
        lines.append("")
    warm = plan.groups[0].server_job.load.warmup_requests if plan.groups else 0
    running = sum(not _starts_servers(g.server_job) for g in plan.groups)
    starts = f"{n - running} server start(s)" + (f", {running} running server(s) measured" if running else "")
    lines += [
        f"{starts}, {len(plan.points)} measured point(s); {warm} warm-up request(s) per server",
        *estimate,
    ]
    return "\n".join(lines)
