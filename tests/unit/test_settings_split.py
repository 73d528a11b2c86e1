"""A job is three things: the server it needs, the window it measures there, and the sweep it
belongs to. The schema's roles say which setting is which; these tests keep the three records
equal to them, and keep the code that runs and records a sweep from reading a sweep-wide
setting off a job (the driver reads those once, as ``SweepSettings``, and hands them on)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipeline.config import (
    ROLE,
    ConfigError,
    JobConfig,
    LoadConfig,
    PointSettings,
    Role,
    ServerSettings,
    SloConfig,
    SweepSettings,
)

ROOT = Path(__file__).resolve().parents[2]
# What runs a sweep, records it and finishes it, and the Hydra plugins that launch it.
SCANNED = ("pipeline/run", "pipeline/record", "pipeline/finish", "hydra_plugins")
SWEEP_WIDE = frozenset(f.name for f in dataclasses.fields(SweepSettings))


def _roles(field: dataclasses.Field) -> set[Role]:
    """A top-level setting's roles: its own, or (a section without one) each of its keys'."""
    if ROLE in field.metadata:
        return {field.metadata[ROLE]}
    section = field.type if isinstance(field.type, type) else None
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
    section = type(default) if default is not None else section
    assert section is not None and dataclasses.is_dataclass(section), field.name
    return {f.metadata[ROLE] for f in dataclasses.fields(section)}


def _fields_in(roles: set[Role]) -> set[str]:
    return {f.name for f in dataclasses.fields(JobConfig) if _roles(f) <= roles}


def test_the_server_and_point_records_hold_exactly_the_settings_of_their_roles() -> None:
    server = _fields_in({Role.SERVER, Role.SERVER_ONLY})
    point = _fields_in({Role.POINT, Role.DECISION})
    assert {f.name for f in dataclasses.fields(ServerSettings)} == server
    assert {f.name for f in dataclasses.fields(PointSettings)} == point
    assert {f.name for f in dataclasses.fields(SweepSettings)} == _fields_in({Role.SWEEP}) | {"output_dir"}
    # Every setting is one job's server, its window, the sweep's or where it writes: no section mixes them.
    runtime = _fields_in({Role.RUNTIME})
    assert server | point | _fields_in({Role.SWEEP}) | runtime == {f.name for f in dataclasses.fields(JobConfig)}
    assert not (server & point) and runtime == {"output_dir", "pair_key"}


def test_a_jobs_server_and_point_settings_are_its_own_values() -> None:
    job = dataclasses.replace(JobConfig(), seed=7, repeat=2, load=LoadConfig(request_rate=4.0))
    for view in (job.server_settings, job.point_settings):
        assert all(getattr(view, f.name) == getattr(job, f.name) for f in dataclasses.fields(view))
    assert job.point_settings.load.request_rate == 4.0 and job.server_settings.seed == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.server_settings.seed = 1  # type: ignore[misc]


def test_a_sweep_has_one_slo() -> None:
    tight = dataclasses.replace(JobConfig(), slo=SloConfig(tpot_ms=50))
    assert SweepSettings.slo_of([tight, dataclasses.replace(tight, load=LoadConfig(request_rate=8.0))]) == tight.slo
    loose = dataclasses.replace(JobConfig(), slo=SloConfig(tpot_ms=100))
    with pytest.raises(ConfigError, match=r"slo\.tpot_ms differs between the sweep's jobs \(got 100, 50\)"):
        SweepSettings.slo_of([tight, loose])


# ---- No sweep-wide setting read off a job ---------------------------------------------------


def _job_names(tree: ast.AST) -> set[str]:
    """Names annotated as a JobConfig anywhere in the module (arguments and annotated assignments)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            target = node.arg if isinstance(node, ast.arg) else getattr(node.target, "id", None)
            if target and "JobConfig" in ast.unparse(node.annotation):
                found.add(target)
    return found


def _names_a_job(expr: ast.expr, annotated: set[str]) -> bool:
    """``job``, ``jobs[0]``, ``server_job``, ``point.job``, ``group.server_job``, ``job.baseline()``,
    or a name the module annotates as a JobConfig."""
    if isinstance(expr, ast.Name):
        return expr.id in {"job", "jobs", "j"} | annotated or expr.id.endswith(("_job", "_jobs"))
    if isinstance(expr, ast.Attribute):
        return expr.attr == "job" or expr.attr.endswith("_job")
    if isinstance(expr, ast.Subscript):
        return _names_a_job(expr.value, annotated)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        return _names_a_job(expr.func.value, annotated)
    return False


def sweep_reads(source: str) -> list[str]:
    """Each read of a sweep-wide setting off a job in ``source``: ``job.gate``, ``getattr(job, "aa")``."""
    tree = ast.parse(source)
    annotated = _job_names(tree)
    found = []
    for node in sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Attribute | ast.Call)), key=lambda n: (n.lineno, n.col_offset)
    ):
        if isinstance(node, ast.Attribute) and node.attr in SWEEP_WIDE and _names_a_job(node.value, annotated):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value in SWEEP_WIDE and _names_a_job(node.args[0], annotated):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_sweep_wide_setting_is_read_off_a_job_where_a_sweep_runs_records_or_finishes() -> None:
    reads = {
        str(path.relative_to(ROOT)): found
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (found := sweep_reads(path.read_text()))
    }
    assert not reads, f"read these from the SweepSettings the driver hands on (GroupTask.settings): {reads}"


def test_the_scan_finds_a_planted_read_and_passes_the_settings_own() -> None:
    planted = """
def f(point, group, jobs, settings, cfg, reference: JobConfig, seed: Point):
    point.job.gate.enabled
    jobs[0].output_dir
    group.server_job.verbose
    job.baseline().aa
    reference.repeats.count
    getattr(job, "lossless")
    settings.gate.enabled
    cfg.output_dir
    seed.job.slo
    job.load.request_rate
"""
    found = [line.split(": ", 1)[1] for line in sweep_reads(planted)]
    assert found == [
        "point.job.gate",
        "jobs[0].output_dir",
        "group.server_job.verbose",
        "job.baseline().aa",
        "reference.repeats",
        "getattr(job, 'lossless')",
    ]
