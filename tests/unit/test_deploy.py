"""The deploy files parse: Kubernetes YAML with the kinds and fields the schedulers need,
systemd units (checked by systemd-analyze, which CI must have), the cron line, the script."""

from __future__ import annotations

import configparser
import functools
import gzip
import os
import re
import shutil
import subprocess
import sys
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


CRDS = {"RayCronJob": "raycronjobs", "RayCluster": "rayclusters"}  # KubeRay's kinds; the rest are Kubernetes'
MANIFESTS = sorted(p.name for p in (DEPLOY / "kubernetes").glob("*.yaml"))


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def test_every_manifest_is_checked() -> None:
    assert set(MANIFESTS) >= {
        "namespace.yaml",
        "volumes.yaml",
        "mlflow.yaml",
        "raycronjob.yaml",
        "raycronjob-paired.yaml",
        "raycluster.yaml",
        "cronjob-rayjob.yaml",
    }


@pytest.mark.parametrize("name", MANIFESTS)
def test_each_manifest_is_valid_against_its_published_schema(name: str) -> None:
    import jsonschema
    import kubernetes_validate

    for doc in _docs(name):
        if doc["kind"] not in CRDS:  # a Kubernetes kind: its own published schema, strictly
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
            continue
        schema = _crd_schema(CRDS[doc["kind"]])
        jsonschema.validate(doc["spec"], schema["properties"]["spec"])
        assert not _unknown_fields(doc, schema), _unknown_fields(doc, schema)


def test_the_strict_check_catches_a_misspelled_field() -> None:
    (doc,) = _docs("raycluster.yaml")
    doc["spec"]["workerGroupSpecs"][0]["replica"] = 2
    assert _unknown_fields(doc, _crd_schema("rayclusters")) == [".spec.workerGroupSpecs[0].replica"]


def _containers(doc: dict) -> dict[str, dict]:
    spec = doc["spec"].get("jobTemplate", {}).get("rayClusterSpec") or doc["spec"]
    groups = {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}
    return {name: g["template"]["spec"] for name, g in groups.items()}


def _driver_node(doc: dict) -> dict:
    """The pod template of the node a RayJob's driver lands on: the head, unless the job asks for
    entrypoint resources; then Ray 2.60 drops its head-node selector (ray/dashboard/modules/job/
    job_manager.py) and the driver goes where those resources are: a worker group that has them.
    The driver's environment is that node's."""
    job = doc["spec"].get("jobTemplate", doc["spec"])
    pods = _containers(doc)
    gpus = job.get("entrypointNumGpus", 0)
    if not (gpus or job.get("entrypointNumCpus") or job.get("entrypointResources")):
        return pods["head"]
    holding = [
        pod
        for group, pod in pods.items()
        if group != "head" and int(pod["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)) >= gpus
    ]
    assert len(holding) == 1, "one worker group holds the driver's resources"
    return holding[0]


RAY_CLUSTERS = ["raycronjob.yaml", "raycronjob-paired.yaml", "raycluster.yaml"]


@pytest.mark.parametrize("name", RAY_CLUSTERS)
def test_the_ray_clusters_follow_the_projects_rules(name: str) -> None:
    """Token auth from a Secret on every node, GPU workers sized to the tensor-parallel size
    with /dev/shm and a model volume, and the workers' Ray processes at normal priority."""
    (doc,) = _docs(name)
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
            assert container["resources"]["requests"]["nvidia.com/gpu"] == tp
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
            assert "/dev/shm" in mounts
            (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
            assert dshm["emptyDir"]["medium"] == "Memory"


def test_the_submitting_pod_signs_in_to_ray_with_the_clusters_token_and_names_the_model() -> None:
    (job,) = _docs("cronjob-rayjob.yaml")
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "specsweep-ray-token", "key": "auth_token"}
    assert env["SPECSWEEP_MODEL"]["value"] and "engine.tensor_parallel_size=8" in env["SPECSWEEP_ARGS"]["value"]


# ---- manifests a team can apply as shipped ---------------------------------------------------

NAMESPACE = "specsweep"
TRACKING = "http://specsweep-mlflow.specsweep.svc.cluster.local:5000"


def _all_docs() -> list[tuple[str, dict]]:
    return [(name, doc) for name in MANIFESTS for doc in _docs(name)]


def _pod_specs(doc: dict) -> list[dict]:
    """Every pod template a manifest holds, whatever its kind."""
    found = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if "containers" in value:
                found.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(doc.get("spec", {}))
    return found


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_one_namespace_and_a_tracking_address_that_is_its_mlflow_service() -> None:
    (namespace,) = _docs("namespace.yaml")
    assert namespace["metadata"]["name"] == NAMESPACE
    for name, doc in _all_docs():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{name}: {doc['kind']} outside {NAMESPACE}"
    (service,) = [d for d in _docs("mlflow.yaml") if d["kind"] == "Service"]
    port = service["spec"]["ports"][0]["port"]
    assert TRACKING == f"http://{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port}"
    said = []
    for name in MANIFESTS:
        text = (DEPLOY / "kubernetes" / name).read_text()
        said += [(name, u) for u in re.findall(r"(?:tracking\.uri=|value: )(http://[^\s\"']*:5000)", text)]
    assert said and all(uri == TRACKING for _, uri in said), said
    # ... and the server answers that name: MLflow refuses a Host it was not given (403).
    (deployment,) = [d for d in _docs("mlflow.yaml") if d["kind"] == "Deployment"]
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    allowed = server["command"][server["command"].index("--allowed-hosts") + 1].split(",")
    assert TRACKING.removeprefix("http://") in allowed


def test_the_mlflow_server_is_basic_auth_on_a_volume_with_its_secrets_from_kubernetes() -> None:
    docs = {d["kind"]: d for d in _docs("mlflow.yaml")}
    assert docs["ConfigMap"]["data"]["basic_auth.ini"] == (DEPLOY / "mlflow" / "basic_auth.ini").read_text()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    command = server["command"]
    assert command[:4] == ["mlflow", "server", "--app-name", "basic-auth"]
    store = command[command.index("--backend-store-uri") + 1]
    artifacts = command[command.index("--artifacts-destination") + 1]
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
    assert (
        store == "sqlite:////mlflow/mlflow.db"
        and artifacts.startswith("/mlflow/")
        and server["workingDir"] == "/mlflow"
    )
    assert claims[mounts["/mlflow"]] == docs["PersistentVolumeClaim"]["metadata"]["name"]
    env = _env(server)
    for name in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"] == "specsweep-mlflow-server"
    assert docs["Deployment"]["spec"]["strategy"]["type"] == "Recreate"  # SQLite: one writer


SECRETS = {"specsweep-mlflow-server", "specsweep-mlflow", "specsweep-ray-token", "specsweep-hf"}


def test_no_secret_is_in_a_file_and_every_secret_named_is_created_in_the_docs() -> None:
    docs_text = (DEPLOY.parent / "docs" / "gpu.md").read_text()
    for secret in SECRETS:
        assert f"kubectl -n {NAMESPACE} create secret generic {secret} " in docs_text, secret
    for name, doc in _all_docs():
        assert doc["kind"] != "Secret", name
        for pod in _pod_specs(doc):
            for container in pod["containers"]:
                for var in container.get("env", []):
                    ref = var.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert ref["name"] in SECRETS, (name, ref)
                    elif any(w in var["name"] for w in ("PASSWORD", "TOKEN", "SECRET")):
                        raise AssertionError(f"{name}: {var['name']} holds a value, not a Secret's")


def test_images_are_pinned_to_the_engine_they_hold_and_ray_matches_the_project() -> None:
    import tomllib

    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    (vllm,) = [d for d in project["optional-dependencies"]["gpu"] if d.startswith("vllm==")]
    (ray,) = [d for d in project["dependencies"] if d.startswith("ray[")]
    for name, doc in _all_docs():
        for pod in _pod_specs(doc):
            for container in pod["containers"]:
                image = container["image"]
                assert ":" in image and not image.endswith(":latest"), (name, image)
                assert f"-vllm{vllm.split('==')[1]}" in image, (name, image)
                assert ("-ref" in image) == (name == "raycronjob-paired.yaml"), (name, image)
        if doc["kind"] in CRDS:
            spec = doc["spec"].get("jobTemplate", {}).get("rayClusterSpec") or doc["spec"]
            assert spec["rayVersion"] == ray.split("==")[1]


@pytest.mark.parametrize("name", RAY_CLUSTERS)
def test_every_ray_pod_keeps_weights_compile_cache_and_outputs_on_shared_volumes(name: str) -> None:
    """vLLM's compile cache lives under SPECSWEEP_CACHE (engines/vllm.py: VLLM_CACHE_ROOT), so a
    volume there means a configuration compiles once, not every night on a new cluster."""
    (doc,) = _docs(name)
    volumes = _docs("volumes.yaml")
    shared = {d["metadata"]["name"] for d in volumes}
    for pod in _pod_specs(doc):
        (container,) = pod["containers"]
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
        mounts = {m["mountPath"]: claims.get(m["name"]) for m in container["volumeMounts"]}
        env = _env(container)
        for var in ("HF_HOME", "SPECSWEEP_CACHE", "SPECSWEEP_OUTPUTS"):
            path = env[var]["value"]
            mount = next((m for m in mounts if path == m or path.startswith(m + "/")), None)
            assert mount is not None and mounts[mount] in shared, (name, var, path)
    for claim in volumes:
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # the head and every worker at once


def _entrypoint(name: str) -> list[str]:
    """The RayCronJob's entrypoint as the shell KubeRay runs it through hands it to Python."""
    import shlex

    (doc,) = _docs(name)
    words = shlex.split(doc["spec"]["jobTemplate"]["entrypoint"])
    assert words[:4] == ["python", "-m", "pipeline.sweep", "+sweep=nightly"]
    return words[3:]


@pytest.mark.parametrize("name", ["raycronjob.yaml", "raycronjob-paired.yaml"])
def test_the_nightly_entrypoint_plans_as_shipped_within_its_own_budget(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its dry run here, in the environment of the node its driver lands on (the model and the
    experiment from there, the token, no hub), measures the model the manifest names, and its
    first night's estimate (weights downloaded, every configuration compiled cold) is under the
    budget it names, so that the night is not refused by its own run.confirm_gpu_hours."""
    import sys

    from pipeline.engines.weights import model_weights
    from tests.in_process import compose_jobs, sweep_in_process

    (doc,) = _docs(name)
    driver = _env(_driver_node(doc)["containers"][0])
    for var in ("SPECSWEEP_MODEL", "SPECSWEEP_EXPERIMENT", "SPECSWEEP_REFERENCE", "MLFLOW_TRACKING_URI"):
        if var in driver:
            monkeypatch.setenv(var, driver[var]["value"])
        else:
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_weights.cache_clear()
    args = [a.replace("/opt/vllm-previous/bin/python", sys.executable) for a in _entrypoint(name)]
    budget = float(next(a for a in args if a.startswith("run.confirm_gpu_hours=")).split("=")[1])
    overrides = [a for a in args if a != "hydra/launcher=basic"]
    code = sweep_in_process(True, tmp_path, [*overrides, "dry_run=true"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "--tensor-parallel-size 8" in out.out and "hf_sentinel" not in out.out + out.err
    # The 70B model and the team's experiment, not the toy model and "nightly" of a node without them.
    assert "--served-model-name meta-llama/Llama-3.3-70B-Instruct" in out.out and "smollm2" not in out.out
    jobs = compose_jobs([*overrides, "dry_run=true"], True, str(tmp_path / "composed"))
    assert {job.tracking.experiment for job in jobs} == {"llama70b-nightly"}
    hours = float(re.search(r"estimated time: ~[\d.]+ min, ~([\d.]+) GPU-hours", out.out).group(1))
    assert 1 < hours < budget, (hours, budget)
    if name == "raycronjob-paired.yaml":
        assert "hydra/launcher=basic" in args and doc["spec"]["jobTemplate"]["entrypointNumGpus"] == 8
        assert "gate.reference=['engine.python=/opt/vllm-previous/bin/python']" in _entrypoint(name)  # quotes kept
        assert "20 server start(s)" in out.out and "reference" in out.out


def test_the_kuberay_version_is_stated_once_and_is_the_one_checked() -> None:
    readme = (DEPLOY / "kubernetes" / "README.md").read_text()
    assert f"**KubeRay {KUBERAY.removeprefix('v')}.**" in readme and f"--version {KUBERAY.removeprefix('v')}" in readme
    elsewhere = [DEPLOY / "kubernetes" / n for n in MANIFESTS] + sorted((DEPLOY.parent / "docs").glob("*.md"))
    for path in elsewhere:
        assert not re.search(r"KubeRay\s*(>=\s*)?\d", path.read_text()), f"{path.name} names a KubeRay version"


def test_the_image_is_built_from_the_projects_own_gpu_install_and_lints_clean() -> None:
    dockerfile = DEPLOY / "docker" / "Dockerfile"
    text = dockerfile.read_text()
    assert "make install DEVICE=gpu" in text and "/opt/specsweep/.venv/bin:$PATH" in text
    assert "python3 -m venv /opt/vllm-previous" in text and '"vllm==${REFERENCE_VLLM}"' in text
    assert "SPECSWEEP_CACHE=/cache/specsweep" in text and "HF_HOME=/models/hf" in text
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert ".venv/" in ignored and "mlruns/" in ignored  # the image makes its own venv
