"""The deploy files parse: Kubernetes YAML with the kinds and fields the schedulers need,
systemd units (checked by systemd-analyze, which CI must have), the cron line, the script."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


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
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "specsweep-nightly.timer")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    # A missing ExecStart binary at /opt/... is expected on a test machine; syntax errors are not.
    errors = [line for line in done.stderr.splitlines() if "Unknown" in line or "syntax" in line.lower()]
    assert not errors, done.stderr


def test_cron_line_and_submit_script() -> None:
    lines = [ln for ln in (DEPLOY / "cron" / "specsweep-nightly.cron").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]  # fmt: skip
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


def test_submit_script_passes_the_operators_model_and_experiment_as_overrides(tmp_path: Path) -> None:
    """The job's driver runs on the head, which does not see the submitter's environment."""
    import os

    seen = tmp_path / "args"
    fake_ray = tmp_path / "ray"  # records `job submit`; `job status` says no such job yet
    fake_ray.write_text(f'#!/usr/bin/env bash\n[ "$2" = submit ] && printf "%s\\n" "$@" > {seen}\n'
                        '[ "$2" = submit ] || exit 1\n')  # fmt: skip
    fake_ray.chmod(0o755)
    env = {**os.environ, "RAY_BIN": str(fake_ray), "RAY_DASHBOARD": "http://127.0.0.1:9",
           "SPECSWEEP_MODEL": "meta-llama/Llama-3.1-70B-Instruct", "SPECSWEEP_EXPERIMENT": "team-a"}  # fmt: skip
    done = subprocess.run([str(DEPLOY / "submit-nightly.sh")], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 4  # the fake dashboard never answers for the job's exit code
    args = seen.read_text().splitlines()
    assert "model.id=meta-llama/Llama-3.1-70B-Instruct" in args and "tracking.experiment=team-a" in args
    assert args[args.index("--") + 1 :][:4] == ["python", "-m", "pipeline.sweep", "+sweep=nightly"]
