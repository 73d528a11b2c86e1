"""The deploy files parse: Kubernetes YAML with the kinds and fields the schedulers need,
systemd units (checked by systemd-analyze, which CI must have), the cron line, the script."""

from __future__ import annotations

import configparser
import functools
import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
KUBERAY = "v1.7.0"
KUBERNETES = "1.33"  # a version kubernetes-validate ships the schemas of


def test_kubernetes_manifests_parse_with_a_schedule_and_the_nightly_sweep() -> None:
    (cron,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "raycronjob.yaml").read_text()))
    assert cron["apiVersion"] == "ray.io/v1" and cron["kind"] == "RayCronJob"
    assert cron["spec"]["schedule"] == "0 2 * * *"
    assert "+sweep=nightly" in cron["spec"]["jobTemplate"]["entrypoint"]
    (job,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "cronjob-rayjob.yaml").read_text()))
    assert job["kind"] == "CronJob" and job["spec"]["concurrencyPolicy"] == "Forbid"
    container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/opt/specsweep/deploy/submit-nightly.sh"]


def test_systemd_units_parse_and_the_timer_is_persistent() -> None:
    timer = configparser.ConfigParser(strict=False)
    timer.read(DEPLOY / "systemd" / "specsweep-nightly.timer")
    assert timer["Timer"]["Persistent"] == "true" and timer["Timer"]["OnCalendar"]
    service = configparser.ConfigParser(strict=False, interpolation=None)
    service.optionxform = str  # type: ignore[assignment,method-assign]
    service.read(DEPLOY / "systemd" / "specsweep-nightly.service")
    assert service["Service"]["Type"] == "oneshot"
    assert service["Service"]["ExecStart"].endswith("deploy/submit-nightly.sh")


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        missing = "systemd-analyze is not installed: `make test` installs it (Debian's systemd package)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{missing}; under CI every test's tool must be there")
        pytest.skip(missing)
    for name in ("specsweep-nightly.service", "specsweep-nightly.timer"):
        shutil.copy(DEPLOY / "systemd" / name, tmp_path / name)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "specsweep-nightly.timer")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # A missing ExecStart binary at /opt/... is expected on a test machine; syntax errors are not.
    errors = [line for line in done.stderr.splitlines() if "Unknown" in line or "syntax" in line.lower()]
    assert not errors, done.stderr


def test_cron_line_and_submit_script() -> None:
    lines = [
        ln
        for ln in (DEPLOY / "cron" / "specsweep-nightly.cron").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert len(lines) == 1 and len(lines[0].split(None, 5)) == 6 and "submit-nightly.sh" in lines[0]
    script = DEPLOY / "submit-nightly.sh"
    assert script.stat().st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    assert "--submission-id" in script.read_text() and "nightly-$(date +%F)" in script.read_text()


def test_submit_script_exits_4_when_the_dashboard_does_not_answer() -> None:
    import os

    env = {**os.environ, "RAY_DASHBOARD": "http://127.0.0.1:9", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    done = subprocess.run([str(DEPLOY / "submit-nightly.sh")], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "http://127.0.0.1:9 does not answer" in done.stderr


def test_submit_script_passes_the_operators_model_experiment_and_reference_as_overrides(tmp_path: Path) -> None:
    """The job's driver runs on the head, which does not see the submitter's environment."""
    import os

    seen = tmp_path / "args"
    fake_ray = tmp_path / "ray"  # records `job submit`; `job status` says no such job yet
    fake_ray.write_text(
        f'#!/usr/bin/env bash\n[ "$2" = submit ] && printf "%s\\n" "$@" > {seen}\n[ "$2" = submit ] || exit 1\n'
    )
    fake_ray.chmod(0o755)
    env = {
        **os.environ,
        "RAY_BIN": str(fake_ray),
        "RAY_DASHBOARD": "http://127.0.0.1:9",
        "SPECSWEEP_MODEL": "meta-llama/Llama-3.1-70B-Instruct",
        "SPECSWEEP_EXPERIMENT": "team-a",
        "SPECSWEEP_REFERENCE": "['engine.python=/opt/vllm-previous/bin/python']",
    }
    done = subprocess.run([str(DEPLOY / "submit-nightly.sh")], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 4  # the fake dashboard never answers for the job's exit code
    args = seen.read_text().splitlines()
    assert "model.id=meta-llama/Llama-3.1-70B-Instruct" in args and "tracking.experiment=team-a" in args
    assert "gate.reference=['engine.python=/opt/vllm-previous/bin/python']" in args  # the nightly is then paired
    assert args[args.index("--") + 1 :][:4] == ["python", "-m", "pipeline.sweep", "+sweep=nightly"]


# ---- schemas: each manifest against the published schema of its kind ----------------------


@functools.cache
def _crd_schema(plural: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: the CRDs are large
    crd = yaml.load(gzip.decompress((SCHEMAS / f"kuberay-{KUBERAY}-{plural}.yaml.gz").read_bytes()), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def _unknown_fields(value: object, schema: dict, path: str = "") -> list[str]:
    """Keys the schema does not declare. A CRD's structural schema does not forbid them (the
    API server prunes them silently, which is how a misspelled field is lost), so this is the
    strict half of the check, as kubeconform -strict does it."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += _unknown_fields(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            found += _unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += _unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


MANIFESTS = {"raycronjob.yaml": "raycronjobs", "raycluster.yaml": "rayclusters", "cronjob-rayjob.yaml": None}


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_each_manifest_is_valid_against_its_published_schema(name: str) -> None:
    import jsonschema
    import kubernetes_validate

    (doc,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    plural = MANIFESTS[name]
    if plural is None:  # a Kubernetes kind: its own published schema, strictly
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        return
    schema = _crd_schema(plural)
    jsonschema.validate(doc["spec"], schema["properties"]["spec"])
    assert not _unknown_fields(doc, schema), _unknown_fields(doc, schema)


def test_the_strict_check_catches_a_misspelled_field() -> None:
    (doc,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "raycluster.yaml").read_text()))
    doc["spec"]["workerGroupSpecs"][0]["replica"] = 2
    assert _unknown_fields(doc, _crd_schema("rayclusters")) == [".spec.workerGroupSpecs[0].replica"]


def _containers(doc: dict) -> dict[str, dict]:
    spec = doc["spec"].get("jobTemplate", {}).get("rayClusterSpec") or doc["spec"]
    groups = {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}
    return {name: g["template"]["spec"] for name, g in groups.items()}


@pytest.mark.parametrize("name", ["raycronjob.yaml", "raycluster.yaml"])
def test_the_ray_clusters_follow_the_projects_rules(name: str) -> None:
    """Token auth from a Secret on every node, GPU workers sized to the tensor-parallel size
    with /dev/shm and a model volume, and the workers' Ray processes at normal priority."""
    (doc,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    spec = doc["spec"].get("jobTemplate", {}).get("rayClusterSpec") or doc["spec"]
    assert spec["authOptions"] == {"mode": "token", "secretName": "specsweep-ray-token"}
    entry = doc["spec"].get("jobTemplate", {}).get("entrypoint", "")
    tp = int(entry.split("engine.tensor_parallel_size=")[1].split()[0]) if entry else 8
    for group, pod in _containers(doc).items():
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_worker_niceness"]["value"] == "0"
        assert "value" not in env["HF_TOKEN"] and env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "specsweep-hf"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/models" in mounts
        if group != "head":
            assert container["resources"]["limits"]["nvidia.com/gpu"] == tp
            assert "/dev/shm" in mounts
            (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
            assert dshm["emptyDir"]["medium"] == "Memory"


def test_the_submitting_pod_signs_in_to_ray_with_the_clusters_token_and_names_the_model() -> None:
    (job,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "cronjob-rayjob.yaml").read_text()))
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "specsweep-ray-token", "key": "auth_token"}
    assert env["SPECSWEEP_MODEL"]["value"] and "engine.tensor_parallel_size=8" in env["SPECSWEEP_ARGS"]["value"]
