"""How long a plan takes, and how many GPU-hours it holds, before anything starts.

A server's start is its weights' download (where they are not on disk yet) and load, by size;
a start-up that grows with the tensor-parallel size; and, for a compiled server, vLLM's
torch.compile (cold the first time a configuration starts, from vLLM's compile cache after)
and its CUDA graphs. A window is its arrivals and its last request's decode. GPU-hours are
each server group's time times the GPUs its server holds.

:func:`estimate` is pure: what it is given (:class:`StartFacts`, one per group) is gathered by
:func:`start_facts`, which reads the model folders, the Hugging Face cache and vLLM's compile
cache (pipeline/engines/weights.py), and says which sizes it guessed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import JobConfig
from pipeline.engines.weights import EMBEDDED_BYTES, Weights
from pipeline.identity import server_key
from pipeline.load import traces
from pipeline.run.plan import WARMUP_MAX_TOKENS, ServerGroup, SweepPlan, point_offsets

# ---- What a start costs --------------------------------------------------------------------
# On the CPU, measured with the embedded 135M model on 2 cores: eager servers start in 31-49 s;
# compiled start-ups take ~2 min. TPOT ~40 ms per token without speculation.
CPU_STARTUP_S = {"eager": 45.0, "compiled": 130.0}
CPU_TPOT_S = 0.04
# Output tokens per second the embedded model's baseline sustains when saturated here
# (136.6 tok/s at 16 req/s in the default sweep): a saturated window takes tokens / this.
CPU_CAPACITY_TOK_S = 130.0
# On a GPU nothing is measured here (no GPU): round figures from vLLM's own start-up logs as
# users report them (vllm-project/vllm#19824, Llama-70B on 8 GPUs: ~60 s P2P check, ~15 s
# Dynamo, ~70 s torch.compile, ~60 s CUDA graphs; #20264: a cached compile takes ~8 s). A user
# checks them against their servers' logs ("Loading weights took", "torch.compile takes",
# "Graph capturing finished in"); each is printed beside what it was applied to.
GPU_STARTUP_S = 60.0  # process, imports, memory profiling, the KV cache
GPU_RANK_S = 10.0  # each tensor-parallel rank beyond the first (NCCL, the P2P check)
COMPILE_COLD_S = 90.0  # Dynamo and Inductor, the first time a server configuration starts
COMPILE_WARM_S = 10.0  # the same configuration again, from vLLM's compile cache
GRAPHS_S = 60.0  # CUDA graph capture: every compiled start, cached or not
DOWNLOAD_BYTES_S = 100e6  # from the hub to a node (~800 Mbit/s)
LOAD_BYTES_S = 1e9  # from a local disk or a fast shared volume into the server (the page cache is faster)
# Decoding reads every weight once per step: TPOT ~ weight bytes / (this x the server's GPUs),
# about half an H100's memory bandwidth; never below GPU_TPOT_FLOOR_S.
GPU_BYTES_S = 1.5e12
GPU_TPOT_FLOOR_S = 0.005
STOP_S = 5.0


@dataclass(frozen=True)
class StartFacts:
    """What a group's server start costs depend on, known before launch."""

    starts: bool  # False: engine=external's servers already run
    on_gpu: bool
    gpus: int  # what the server holds: engine.tensor_parallel_size on a GPU, 0 on the CPU
    eager: bool
    weights: Weights
    draft: Weights | None = None
    # vLLM's compile cache held compiled configurations when the sweep was planned: each
    # compiled start is then taken as warm, else the first start of each configuration is cold.
    compile_cache_warm: bool = False


@dataclass(frozen=True)
class StartEstimate:
    download_s: float
    load_s: float
    startup_s: float
    compile_s: float

    @property
    def total_s(self) -> float:
        return self.download_s + self.load_s + self.startup_s + self.compile_s


@dataclass(frozen=True)
class GroupEstimate:
    index: int
    start: StartEstimate
    warmup_s: float
    points_s: dict[str, float]  # each point's window, by hash
    gpus: int
    timeout_s: float = math.inf  # engine.startup_timeout_s: the server is stopped if not ready by then

    @property
    def total_s(self) -> float:
        return self.start.total_s + self.warmup_s + sum(self.points_s.values())

    @property
    def gpu_hours(self) -> float:
        return self.total_s * self.gpus / 3600


@dataclass(frozen=True)
class TimeEstimate:
    groups: tuple[GroupEstimate, ...]
    notes: tuple[str, ...] = ()  # what was guessed, and what the figures assume

    @property
    def wall_s(self) -> float:
        """One server after another; less where the groups run side by side on a cluster."""
        return sum(g.total_s for g in self.groups)

    @property
    def gpu_hours(self) -> float:
        return sum(g.gpu_hours for g in self.groups)

    @property
    def points_s(self) -> dict[str, float]:
        """Each point's window, by hash."""
        return {h: s for g in self.groups for h, s in g.points_s.items()}

    def summary(self) -> str:
        """One line: the wall time and, where servers hold GPUs, the GPU-hours."""
        text = f"~{self.wall_s / 60:.1f} min"
        if self.gpu_hours > 0:
            text += f", ~{self.gpu_hours:.1f} GPU-hours"
        return text

    def lines(self) -> list[str]:
        """The account: the total, each group's start and windows, then what was guessed."""
        out = [f"estimated time: {self.summary()}, one server after another (rough):"]
        for g in self.groups:
            s = g.start
            parts = [f"start ~{s.total_s / 60:.1f} min"]
            parts += [f"{name} {value / 60:.1f}" for name, value in _start_parts(s) if value]
            out.append(
                f"  server {g.index}: {parts[0]}"
                + (f" ({', '.join(parts[1:])} min)" if parts[1:] else "")
                + f", windows ~{(g.warmup_s + sum(g.points_s.values())) / 60:.1f} min"
                + (f", {g.gpus} GPU(s): ~{g.gpu_hours:.2f} GPU-hours" if g.gpus else "")
            )
            if s.total_s > g.timeout_s:
                # The deadline counts from the process's start, download included.
                out.append(
                    f"  ! server {g.index} would start in ~{s.total_s / 60:.1f} min, past engine.startup_timeout_s="
                    f"{g.timeout_s:g} s: it would be stopped before it is ready; raise engine.startup_timeout_s"
                )
        return out + [f"  {note}" for note in self.notes]


def _start_parts(s: StartEstimate) -> list[tuple[str, float]]:
    return [("download", s.download_s), ("load", s.load_s), ("start-up", s.startup_s), ("compile", s.compile_s)]


# ---- The pure estimate ----------------------------------------------------------------------


def tpot_s(facts: StartFacts) -> float:
    """Decode time per token without speculation (an upper bound for a speculative server)."""
    if not facts.on_gpu:
        return CPU_TPOT_S
    weights = (facts.weights.bytes or 0.0) + ((facts.draft.bytes or 0.0) if facts.draft else 0.0)
    return max(GPU_TPOT_FLOOR_S, weights / (GPU_BYTES_S * max(facts.gpus, 1)))


def point_estimate_s(job: JobConfig, facts: StartFacts) -> float:
    """Arrivals plus the last request's decode; speculation is assumed no faster (an upper bound)."""
    offsets = point_offsets(job)
    span = offsets[-1] if offsets and math.isfinite(offsets[-1]) else 0.0
    lengths = _output_lengths(job, len(offsets))
    unsaturated = span + max(lengths, default=0) * tpot_s(facts)
    if facts.on_gpu:
        return unsaturated
    return max(unsaturated, sum(lengths) / CPU_CAPACITY_TOK_S)


def _output_lengths(job: JobConfig, count: int) -> list[int]:
    """Each request's output length: a trace line's own, else workload.max_tokens."""
    if job.workload.name == "trace":
        return [
            line.output_tokens or job.workload.max_tokens
            for line in traces.load_replay(job.workload, job.load.request_rate).lines
        ]
    return [job.workload.max_tokens] * count


def start_estimate(facts: StartFacts, *, fetched: float, compile_cold: bool) -> StartEstimate:
    """One server start. ``fetched``: the bytes it downloads first (its models not on disk that no
    earlier start fetched); ``compile_cold``: vLLM compiles it without a cached graph."""
    if not facts.starts:
        return StartEstimate(0.0, 0.0, 0.0, 0.0)
    size = sum(w.bytes or 0.0 for w in (facts.weights, facts.draft) if w is not None)
    if not facts.on_gpu:  # measured with the embedded model, whose load it includes
        startup = CPU_STARTUP_S["eager" if facts.eager else "compiled"] + STOP_S
        return StartEstimate(fetched / DOWNLOAD_BYTES_S, max(size - EMBEDDED_BYTES, 0.0) / LOAD_BYTES_S, startup, 0.0)
    startup = GPU_STARTUP_S + GPU_RANK_S * max(facts.gpus - 1, 0) + STOP_S
    compiled = 0.0 if facts.eager else GRAPHS_S + (COMPILE_COLD_S if compile_cold else COMPILE_WARM_S)
    return StartEstimate(fetched / DOWNLOAD_BYTES_S, size / LOAD_BYTES_S, startup, compiled)


def estimate(plan: SweepPlan, facts: Mapping[int, StartFacts], notes: Sequence[str] = ()) -> TimeEstimate:
    """Every group of ``plan``, one after another, with ``facts[group.index]``. A model not on
    disk is downloaded once, by the first group that runs it (the nodes share a Hugging Face
    cache, as deploy/kubernetes/ sets up); each server configuration compiles cold once, by its
    first start, unless vLLM's compile cache was warm."""
    fetched: set[str] = set()
    compiled: set[str] = set()
    groups = []
    for group in plan.groups:
        f = facts[group.index]
        models = {w.ref: w for w in (f.weights, f.draft) if w is not None and not w.on_disk and w.ref not in fetched}
        config = server_key(dataclasses.replace(group.server_job, repeat=0))  # a restarted repeat compiles warm
        cold = not f.compile_cache_warm and config not in compiled
        start = start_estimate(f, fetched=sum(w.bytes or 0.0 for w in models.values()), compile_cold=cold)
        if f.starts:
            fetched |= set(models)
            compiled.add(config)
        groups.append(_group_estimate(group, f, start))
    return TimeEstimate(tuple(groups), tuple(notes))


def _group_estimate(group: ServerGroup, facts: StartFacts, start: StartEstimate) -> GroupEstimate:
    job = group.server_job
    warmup = job.load.warmup_requests * min(job.workload.max_tokens, WARMUP_MAX_TOKENS) * tpot_s(facts)
    points = {p.hash: point_estimate_s(p.job, facts) for p in group.points}
    gpus = facts.gpus if facts.starts else 0
    return GroupEstimate(
        group.index, start, warmup, points, gpus, job.engine.startup_timeout_s if facts.starts else math.inf
    )


# ---- What this machine knows ---------------------------------------------------------------


def start_facts(plan: SweepPlan, on_gpu: bool) -> tuple[dict[int, StartFacts], list[str]]:
    """Each group's start facts, read here: model sizes (pipeline/engines/weights.py) and the
    state of vLLM's compile cache; and the notes that say what was guessed. On a cluster these
    are this machine's caches: the nodes' are the same where they share the volumes
    (deploy/kubernetes/), else the estimate counts a download and a compile they may not need."""
    from pipeline.engines.registry import engine_of
    from pipeline.engines.vllm import compile_cache_dir
    from pipeline.engines.weights import draft_weights, model_weights

    cache = compile_cache_dir()
    entries = sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []
    facts: dict[int, StartFacts] = {}
    for group in plan.groups:
        job = group.server_job
        dtype = job.engine.dtype
        weights = model_weights(job.model.id, job.model.revision, dtype)
        draft = None
        if job.spec.method != "none" and job.spec.draft_model:
            draft = draft_weights(job.spec.method, job.spec.draft_model, weights, dtype)
        eager = job.engine.enforce_eager if job.engine.enforce_eager is not None else not on_gpu
        gpus = job.engine.tensor_parallel_size if on_gpu else 0
        facts[group.index] = StartFacts(
            engine_of(job).starts_servers, on_gpu, gpus, eager, weights, draft, compile_cache_warm=bool(entries)
        )
    return facts, _notes(facts.values(), on_gpu, cache, len(entries))


def _notes(facts: Iterable[StartFacts], on_gpu: bool, cache: Path, compiled: int) -> list[str]:
    started = [f for f in facts if f.starts]
    models = {w.ref: w for f in started for w in (f.weights, f.draft) if w is not None}
    notes = []
    for w in models.values():
        if w.bytes is None:
            notes.append(f"{w.text()}: its download and load are not counted")
        elif w.guessed:
            notes.append(f"{w.text()}: no local folder, Hugging Face cache or hub answer gave its files here")
        elif not w.on_disk:
            notes.append(f"{w.text()}: downloaded once, by its first server, at ~{DOWNLOAD_BYTES_S / 1e6:.0f} MB/s")
    if any(not f.eager for f in started):
        notes.append(
            f"vLLM's compile cache ({cache}) holds {compiled} compiled configuration(s): compiled starts taken as "
            + ("warm" if compiled else "cold the first time each server configuration starts")
        )
    if on_gpu and started:
        notes.append(
            "GPU figures are not measured here: download ~100 MB/s, load ~1 GB/s, start-up ~1 min + 10 s per "
            "extra GPU, compile ~1.5 min cold + ~1 min of CUDA graphs (pipeline/run/estimate.py); "
            "compare with your servers' logs"
        )
    return notes


def estimate_here(plan: SweepPlan, on_gpu: bool) -> TimeEstimate:
    """The estimate with what this machine knows (:func:`start_facts`)."""
    facts, notes = start_facts(plan, on_gpu)
    return estimate(plan, facts, notes)
