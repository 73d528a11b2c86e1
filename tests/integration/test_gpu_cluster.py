"""The GPU path on a real Ray cluster, without a GPU: what a KubeRay nightly depends on.

A head with no GPU (where ``ray job submit`` runs the driver, as a RayCronJob's does; a tripwire
``nvidia-smi`` on its PATH writes down anyone who asks it), a joining node that declares two
GPUs (``ray start --num-gpus 2``) with a scripted ``nvidia-smi`` on its PATH only, and a stand-in
engine behind ``engine.python`` (tests/gpu_standin.py): it answers the install probe as PyPI's
CUDA vLLM and serves the scripted OpenAI server where vLLM's API server would start, after writing
down its command line and the GPUs Ray gave it. A real, non-dry ``engine.device=gpu`` sweep at
tensor parallelism 2, a paired night whose reference build is a second stand-in named in a
``gate.reference=[...]`` override, is submitted with the real ``ray job submit``.

Nothing here skips: a missing tool fails the test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests import cluster, gpu_standin

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TP = 2


@dataclass(frozen=True)
class Night:
    proc: object
    details: dict
    head_bin: Path
    worker_bin: Path
    candidate: gpu_standin.Engine
    reference: gpu_standin.Engine
    uri: str

    @property
    def log(self) -> str:
        return self.proc.stdout[-6000:] + self.proc.stderr[-3000:]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Night]:
    root = tmp_path_factory.mktemp("gpu-cluster")
    head_bin = gpu_standin.tripwire(root / "head-bin")
    worker_bin = gpu_standin.nvidia_smi(root / "worker-bin", gpus=TP)
    candidate = gpu_standin.engine(root / "candidate", "0.32.0")
    reference = gpu_standin.engine(root / "reference", "0.31.0")
    with (
        cluster.mlflow_server(root / "mlflow") as server,
        cluster.ray_cluster(
            head_slots=0, worker_slots=0, head_gpus=0, worker_gpus=TP, head_path=head_bin, worker_path=worker_bin
        ) as ray_cluster,
    ):
        name = f"gpu-night-{int(time.time())}"
        entry = [
            "python",
            "-m",
            "pipeline.sweep",
            "-m",
            "sweep_name=gpu-night",
            f"tracking.uri={server.uri}",
            "engine.device=gpu",
            f"engine.tensor_parallel_size={TP}",
            f"engine.python={candidate.python}",
            "spec=none",
            "load.request_rate=4",
            "load.num_requests=6",
            "load.warmup_requests=1",
            "workload.max_tokens=16",
            "lossless.prompts=0",
            "stats.resamples=200",
            "gate.enabled=true",
            "gate.mode=paired",
            "gate.pairs=4",
            # The one word a shell must hand on whole: the reference build, as a Hydra list.
            f"gate.reference=['engine.python={reference.python}']",
        ]
        proc = cluster.submit(ray_cluster, name, REPO, entry, timeout_s=1200)
        details = cluster.job_details(ray_cluster, name)
        yield Night(proc, details, head_bin, worker_bin, candidate, reference, server.uri)


def _children(uri: str) -> tuple[object, list]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("gpu-night")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"]
    assert len(parents) == 1
    return parents[0], [r for r in runs if r.data.tags.get("role") != "sweep"]


def test_the_driver_without_a_gpu_runs_the_gpu_sweep_and_never_asks_for_a_gpu(night: Night) -> None:
    # Before the driver stopped resolving groups, this very sweep was refused (exit 2): the head
    # has no GPU. It now runs to the gate's decision (pass, fail or insufficient: 0, 1 or 3).
    assert night.details["driver_exit_code"] in (0, 1, 3), night.log
    # The whole stream: the tail (night.log) is the gate's summary, and a night that lost pairs
    # says enough to push the servers' lines out of it.
    assert "server ready" in night.proc.stdout, night.log  # type: ignore[attr-defined]
    asked = [c for c in gpu_standin.calls(night.head_bin) if "pipeline" in c["parent"]]
    assert not asked, asked  # the driver, on the head, never ran nvidia-smi
    assert gpu_standin.calls(night.worker_bin), "the groups resolved their device on the GPU node"


def test_every_group_ran_on_the_gpu_node_with_its_gpus_and_the_gpu_command(night: Night) -> None:
    parent, children = _children(night.uri)
    launches = night.candidate.launches() + night.reference.launches()
    assert len(launches) == len(children) == 2 * 4  # 4 pairs, the candidate's and the reference's baseline
    for launch in launches:
        assert len(launch["cuda_visible_devices"].split(",")) == TP, launch  # Ray gave it TP GPUs
        argv = launch["argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(TP)
        assert "--enforce-eager" not in argv and not launch["cpu_env"]  # compiled, as on GPUs; no CPU settings
    nodes = {c.data.tags["node.ray_id"] for c in children}
    assert len(nodes) == 1 and night.details["driver_node_id"] not in nodes  # the GPU node, never the head
    for child in children:
        tags = child.data.tags
        assert tags["status"] == "finished", tags
        assert tags["hardware.gpu"] == gpu_standin.GPU_NAME and tags["hardware.gpu_count"] == str(TP)
        assert tags["identity.hardware"].startswith("device=gpu")
        assert tags["engine.distribution"] == "vllm"
    builds = {c.data.tags["gate.build"]: c.data.tags["identity.engine"] for c in children}
    assert builds == {"candidate": "vllm 0.32.0", "reference": "vllm 0.31.0"}


def test_the_gate_reference_override_arrived_through_the_shell_intact(night: Night) -> None:
    parent, children = _children(night.uri)
    assert parent.data.params["gate.reference"] == f"['engine.python={night.reference.python}']"
    assert parent.data.params["gate.mode"] == "paired"
    assert night.reference.launches(), "the reference build's servers ran the reference interpreter"
