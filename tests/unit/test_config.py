from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from pipeline.compose import register_schema, to_job_config
from pipeline.config import (
    NEEDS_DRAFT_MODEL,
    REFUSES_DRAFT_MODEL,
    SPEC_METHODS,
    ConfigError,
    GateConfig,
    JobConfig,
    LoadConfig,
    RayConfig,
    SpecConfig,
)
from pipeline.validate import validate

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("sweep", "hydra", "engine_spec"))
SWEEPS = sorted(p.stem for p in (CONF.parent / "sweeps").glob("*.yaml"))


def _compose(overrides: list[str]) -> JobConfig:
    register_schema()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=[*overrides, "output_dir=/tmp/x"])
    return to_job_config(cfg)


def test_default_config_is_ngram_k3_rate1_on_embedded_model() -> None:
    job = _compose([])
    assert job.spec == SpecConfig(method="ngram", k=3, options={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    assert job.load.request_rate == 1.0 and job.model.id == "embedded:smollm2-135m"
    assert job.engine.host == "127.0.0.1"


@pytest.mark.parametrize(("group", "option"), [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))])
def test_every_config_group_option_composes(group: str, option: str) -> None:
    from omegaconf import OmegaConf

    path = CONF / group / f"{option}.yaml"
    # A trace is read at compose (its own rate is fixed there): the bundled one stands in.
    # engine=external needs the two servers' addresses, which no file can know.
    given = {
        "trace": ["workload.path=bundled"],
        "external": ["engine.url=http://10.0.0.6:8000", "engine.baseline_url=http://10.0.0.5:8000"],
    }
    job = _compose([f"{group}={option}", *given.get(option, [])])
    # Composed, and with the option's own values in the job (not the schema's defaults).
    section = getattr(job, group)
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # ${oc.env:...} as the job reads it
    assert isinstance(values, dict) and values
    if path.read_text().startswith("# @package _global_"):  # it sets other groups' keys too
        assert job.load.request_rate is not None  # workload=trace: null became the trace's own rate
        values = values[group]
    for key, value in values.items():
        if value == "???" or any(g.startswith(f"{group}.{key}=") for g in given.get(option, [])):
            continue  # mandatory, or given above: on the command line
        got = getattr(section, key)
        if isinstance(got, float) and isinstance(value, str):  # "inf"
            value = float(value)
        elif isinstance(value, list):
            got = list(got)
        assert got == value, f"{group}={option}: {key} is {got!r} in the job, {value!r} in the file"


@pytest.mark.parametrize("name", SWEEPS)
def test_every_named_sweep_composes_and_plans(name: str) -> None:
    import itertools

    from pipeline.run.plan import plan_sweep

    register_schema()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+sweep={name}"], return_hydra_config=True)
        params = dict(cfg.hydra.sweeper.params)
        assert cfg.hydra.mode.name == "MULTIRUN" and cfg.sweep_name == name and params
        grid = itertools.product(*[[f"{k}={v}" for v in str(vals).split(",")] for k, vals in params.items()])
        jobs = [
            to_job_config(compose(config_name="config", overrides=[f"+sweep={name}", *point, "output_dir=/tmp/x"]))
            for point in grid
        ]
    plan = plan_sweep(jobs)
    speculative = {(p.job.spec.method, p.job.spec.k, p.job.replica) for p in plan.points if p.role == "speculative"}
    # One server per configuration and one baseline, each once per repeat with repeats.restart.
    starts = jobs[0].repeats.count if jobs[0].repeats.restart else 1
    assert len(plan.groups) == (len(speculative) + 1) * starts


def test_resources_per_group_is_added_key_by_key_on_the_command_line() -> None:
    job = _compose(["+ray.resources_per_group.specsweep_slot=1", "gate.enabled=true"])
    assert job.ray.resources_per_group == {"specsweep_slot": 1.0} and job.gate.enabled


def test_issue_command_line_overrides_compose() -> None:
    job = _compose(["spec.method=ngram", "spec.k=5", "load.request_rate=2"])
    assert job.spec.k == 5 and job.load.request_rate == 2.0


def test_misspelled_key_fails_at_compose() -> None:
    with pytest.raises(ConfigCompositionException, match="spec.kk"):
        _compose(["spec.kk=3"])


def test_wrong_type_fails_at_compose() -> None:
    with pytest.raises(ConfigCompositionException):
        _compose(["spec.k=three"])


def test_baseline_is_same_point_without_speculation() -> None:
    job = _compose(["spec=draft"])
    base = job.baseline()
    assert base.spec.method == "none" and base.spec.draft_model is None
    assert dataclasses.replace(base, spec=job.spec) == job


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"spec": SpecConfig(method="lookahead")}, "spec.method='lookahead' is not valid; choose one of: none, ngram"),
        ({"spec": SpecConfig(method="ngram", k=0)}, "spec.k=0"),
        ({"spec": SpecConfig(method="eagle")}, "needs spec.draft_model.*e.g. spec.draft_model=/path/to/the/head"),
        ({"spec": SpecConfig(method="draft")}, "needs spec.draft_model.*e.g. spec=draft"),
        ({"spec": SpecConfig(method="ngram", draft_model="x")}, "takes no spec.draft_model"),
        ({"load": LoadConfig(request_rate=0)}, "load.request_rate=0"),
        ({"load": LoadConfig(request_rate=-1)}, "must be > 0"),
        ({"load": LoadConfig(num_requests=-2)}, "load.num_requests=-2"),
        ({"load": LoadConfig(burstiness=0)}, "load.burstiness"),
        ({"gate": GateConfig(history=0)}, "gate.history=0 must be >= 1"),
        ({"gate": GateConfig(floor_median=1.5)}, "gate.floor_median=1.5 must lie in"),
        ({"ray": RayConfig(resources_per_group={"GPU": 0})}, "ray.resources_per_group.GPU=0 must be a positive"),
    ],
)
def test_invalid_configs_name_the_key_and_fix(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        validate(dataclasses.replace(JobConfig(), **change))


def test_every_method_declares_whether_it_takes_a_draft_model() -> None:
    """A new method lands in exactly one of the two: validate.py refuses or requires spec.draft_model by them."""
    assert NEEDS_DRAFT_MODEL | REFUSES_DRAFT_MODEL == set(SPEC_METHODS)
    assert not NEEDS_DRAFT_MODEL & REFUSES_DRAFT_MODEL


def test_inf_rate_is_valid() -> None:
    validate(dataclasses.replace(JobConfig(), load=LoadConfig(request_rate=float("inf"))))


def test_unknown_method_is_refused_at_compose_time() -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        _compose(["spec.method=medusa2"])


@pytest.mark.parametrize(
    ("engine", "match"),
    [
        ({"prefix_cache": "lukewarm"}, "engine.prefix_cache='lukewarm' is not valid"),
        ({"prefix_cache": "warm", "extra_args": ["--no-enable-prefix-caching"]}, "set engine.prefix_cache=off"),
        (
            {"name": "sglang", "prefix_cache": "cold", "extra_args": ["--disable-radix-cache"]},
            "engine.prefix_cache=off",
        ),
    ],
)
def test_prefix_cache_policy_is_checked_before_launch(engine: dict, match: str) -> None:
    from pipeline.config import EngineConfig

    job = dataclasses.replace(JobConfig(), engine=EngineConfig(**engine))
    with pytest.raises(ConfigError, match=match):
        validate(job)


def test_concurrency_cap_with_several_client_workers_is_refused() -> None:
    job = dataclasses.replace(JobConfig(), load=LoadConfig(max_concurrency=4, client_workers=2))
    with pytest.raises(ConfigError, match="load.client_workers=1"):
        validate(job)


def test_a_server_other_hosts_can_reach_must_be_asked_for_and_then_skips_the_dev_mode_reset() -> None:
    import dataclasses

    from pipeline.config import EngineConfig, JobConfig
    from pipeline.run.measure import resets_cache
    from pipeline.validate import is_loopback, validate

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("node-7")
    exposed = dataclasses.replace(JobConfig(), engine=EngineConfig(host="0.0.0.0"))
    with pytest.raises(ConfigError, match="engine.allow_remote=true"):
        validate(exposed)
    allowed = dataclasses.replace(exposed, engine=EngineConfig(host="0.0.0.0", allow_remote=True))
    validate(allowed)
    assert resets_cache(JobConfig()) and not resets_cache(allowed)


def test_the_nightly_measures_the_operators_model_in_its_own_experiment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSWEEP_MODEL", raising=False)
    monkeypatch.delenv("SPECSWEEP_EXPERIMENT", raising=False)
    toy = _compose(["+sweep=nightly"])
    assert toy.model.id == "embedded:smollm2-135m" and toy.tracking.experiment is None  # as before: its history
    monkeypatch.setenv("SPECSWEEP_MODEL", "meta-llama/Llama-3.1-70B-Instruct")
    monkeypatch.setenv("SPECSWEEP_EXPERIMENT", "team-a-nightly")
    theirs = _compose(["+sweep=nightly"])
    assert theirs.model.id == "meta-llama/Llama-3.1-70B-Instruct" and theirs.tracking.experiment == "team-a-nightly"


def test_the_nightly_is_paired_where_a_reference_build_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSWEEP_REFERENCE", raising=False)
    alone = _compose(["+sweep=nightly"])
    assert alone.gate.mode == "history" and alone.gate.reference == [] and alone.gate.enabled
    monkeypatch.setenv("SPECSWEEP_REFERENCE", "['engine.python=/opt/vllm-previous/bin/python']")
    beside = _compose(["+sweep=nightly"])
    assert beside.gate.mode == "paired" and beside.gate.reference == ["engine.python=/opt/vllm-previous/bin/python"]
    # What deploy/submit-nightly.sh passes the head's driver, which does not see this environment.
    monkeypatch.delenv("SPECSWEEP_REFERENCE")
    submitted = _compose(["+sweep=nightly", "gate.reference=['engine.python=/opt/vllm-previous/bin/python']"])
    assert submitted.gate.mode == "paired"


def test_declared_rules_say_the_key_the_rule_and_the_fix() -> None:
    from pipeline.config import Valid
    from pipeline.validate import declared

    assert Valid(at_least=1).problem("load.num_requests", 0) == "load.num_requests=0 must be >= 1"
    assert Valid(above=0, hint=" or null").problem("slo.tpot_ms", -5.0) == "slo.tpot_ms=-5.0 must be > 0 or null"
    assert Valid(above=0).problem("load.request_rate", float("inf")) is None  # inf sends all at once
    assert (
        Valid(positive=True).problem("load.burstiness", float("inf")) == "load.burstiness=inf must be a positive number"
    )
    assert Valid(interval="(0, 1]").problem("slo.min_goodput", 0.0) == "slo.min_goodput=0.0 must lie in (0, 1]"
    assert Valid(interval="(0, 1]").problem("slo.min_goodput", 1.0) is None
    assert Valid(interval="[0, 1)").problem("gate.floor_p99", 1.0) == "gate.floor_p99=1.0 must lie in [0, 1)"
    assert "choose one of: a, b" in (Valid(choices=("a", "b")).problem("x", "c") or "")
    assert Valid(at_least=1).problem("load.max_concurrency", None) is None  # null is its own meaning
    # Every declared default is valid, and the rules reach into every section.
    found = {key: valid.problem(key, value) for key, value, valid in declared(JobConfig())}
    assert not [k for k, p in found.items() if p], found
    assert {"load.num_requests", "gate.history", "capacity.max_probes", "seed", "workload.temperature"} <= set(found)


def _addresses(section: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every setting that holds an address (a URL, URI or Ray address, by its name), in every section."""
    from typing import get_type_hints

    hints = get_type_hints(section)  # the schema's annotations are strings (from __future__ import annotations)
    found = {}
    for field in dataclasses.fields(section):
        if dataclasses.is_dataclass(hints[field.name]):
            found |= _addresses(hints[field.name], f"{prefix}{field.name}.")
        elif field.name.rsplit("_", 1)[-1] in ("url", "uri", "address"):
            found[f"{prefix}{field.name}"] = field
    return found


def test_every_address_declares_that_it_holds_no_credential() -> None:
    """One declared rule refuses a user name or password in any address (config.Valid.address),
    each naming where the credentials go instead."""
    from pipeline.config import VALID

    found = _addresses(JobConfig)
    assert {"tracking.uri", "ray.address", "engine.url", "engine.baseline_url"} <= set(found)
    undeclared = [key for key, field in found.items() if getattr(field.metadata.get(VALID), "address", None) is None]
    assert not undeclared, f"declare valid=Valid(address=...) on {undeclared}"
    for key, field in found.items():
        rule = field.metadata[VALID]
        assert "holds a user name or password" in (rule.problem(key, "https://me:pw@host:1") or "")
        assert rule.problem(key, "host:6379" if key == "ray.address" else "https://host:1") is None
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in (
        found["tracking.uri"].metadata[VALID].problem("tracking.uri", "http://me:pw@h:5000") or ""
    )


@pytest.mark.parametrize(
    ("key", "kind", "value", "problem"),
    [
        ("engine.url", "server", "http://10.0.0.5:8000", None),
        ("engine.url", "server", "http://10.0.0.5:99999", "a port outside 1-65535"),
        ("engine.url", "server", "http://:8000", "names no host"),
        ("engine.url", "server", "ftp://10.0.0.5:21", "does not speak http or https"),
        ("tracking.uri", "store", "sqlite:////tmp/m/mlflow.db", None),
        ("tracking.uri", "store", "sqlite:relative.db", "give a sqlite:///path/to/mlflow.db"),
        ("tracking.uri", "store", "http://:5000", "names no host"),
        ("tracking.uri", "store", "http://127.0.0.1:70000", "a port outside"),
        ("tracking.uri", "store", "file:///tmp/store", "does not speak sqlite"),
        ("ray.address", "ray", "auto", None),
        ("ray.address", "ray", "10.0.0.5:6379", None),
        ("ray.address", "ray", "ray://10.0.0.5:10001", None),
        ("ray.address", "ray", "10.0.0.5", "names no host and port"),
        ("ray.address", "ray", "10.0.0.5:port", "a port outside"),
        ("ray.address", "ray", "http://10.0.0.5:8265", "does not speak ray"),
    ],
)
def test_every_address_is_parsed_whole(key: str, kind: str, value: str, problem: str | None) -> None:
    from pipeline.config import address_problem

    found = address_problem(key, value, kind)
    assert (found is None) if problem is None else (found is not None and problem in found), found
