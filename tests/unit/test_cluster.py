"""Ray guards, without a cluster: what it reports is passed in."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from pipeline.run.driver import LaunchError
from pipeline.run.plumbing.cluster import Need, check_feasible, check_store, probe_address


def test_gpu_request_larger_than_any_node_fails_naming_both() -> None:
    with pytest.raises(LaunchError, match=r"asks for 2 GPU\(s\).*largest node has 1.*GPU=1"):
        check_feasible([Need("02-ngram-k3", 2)], {"CPU": 16.0, "GPU": 1.0}, [1.0])
    with pytest.raises(LaunchError, match="largest node has 0"):
        check_feasible([Need("01-baseline", 1)], {"CPU": 2.0}, [0.0])
    check_feasible([Need("01-baseline", 0), Need("02-ngram-k3", 4)], {"GPU": 8.0}, [4.0, 4.0])


def test_local_store_with_remote_workers_is_refused() -> None:
    with pytest.raises(LaunchError, match="tracking.uri=http"):
        check_store("sqlite:////p/mlruns/mlflow.db", alive_nodes=3)
    check_store("sqlite:////p/mlruns/mlflow.db", alive_nodes=1)
    check_store("http://mlflow:5000", alive_nodes=3)


def test_comparisons_are_refused_across_hardware_and_pass_across_nodes_of_one_type() -> None:
    """A speculative server and its baseline resolved on different GPU models are refused; a
    paired night needs every server on one type; nodes of one type (another Ray node, the same
    GPUs) are fine."""
    import dataclasses

    from pipeline.config import JobConfig, LoadConfig, SpecConfig
    from pipeline.identity import System
    from pipeline.run.plan import plan_sweep
    from pipeline.run.resolve import Resolved, across_hardware

    plan = plan_sweep([dataclasses.replace(JobConfig(), spec=SpecConfig(k=k), load=LoadConfig()) for k in (3, 5)])
    h100, a100 = "device=gpu; gpu=NVIDIA H100; gpu_count=8", "device=gpu; gpu=NVIDIA A100; gpu_count=8"

    def on(*hardware: str) -> dict[int, Resolved]:
        return {
            g.index: Resolved(System("vllm 0.32.0", h, "m"), f"node-{g.index}")
            for g, h in zip(plan.groups, hardware, strict=True)
        }

    assert [g.role for g in plan.groups] == ["baseline", "speculative", "speculative"]
    assert across_hardware(plan, on(h100, h100, h100), one_type=False) is None  # three nodes, one type
    crossed = across_hardware(plan, on(h100, a100, h100), one_type=False)
    assert crossed is not None and "01-baseline" in crossed and "02-ngram-k3" in crossed and "A100" in crossed
    assert "ray.resources_per_group" in crossed


def test_a_loopback_tracking_address_is_refused_where_the_nodes_are_on_several_machines() -> None:
    """make nightly once gave every worker http://127.0.0.1:5000: each would write to its own machine."""
    for uri in ("http://127.0.0.1:5000", "http://localhost:5000", "http://[::1]:5000"):
        with pytest.raises(LaunchError, match="is a loopback address, but the Ray cluster's nodes are on 2 machines"):
            check_store(uri, alive_nodes=3, hosts=2)
        check_store(uri, alive_nodes=3, hosts=1)  # several nodes on one machine (the tests' clusters) reach it
    check_store("http://10.0.0.7:5000", alive_nodes=3, hosts=2)


def test_dead_address_fails_within_the_deadline() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(LaunchError, match=f"ray.address=127.0.0.1:{port} is not reachable"):
        probe_address(f"127.0.0.1:{port}", timeout_s=2.0)
    assert time.monotonic() - started < 10
    with pytest.raises(LaunchError, match="not host:port"):
        probe_address("head:port", timeout_s=1.0)


def test_local_ray_starts_its_workers_at_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray's workers default to niceness 15, and a server started from a task inherits it.
    import ray

    from pipeline.config import RayConfig
    from pipeline.run.plumbing import cluster

    seen: dict[str, str | None] = {}
    monkeypatch.delenv(cluster.WORKER_NICENESS, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(
        ray, "init", lambda **kw: seen.update(niceness=os.environ.get(cluster.WORKER_NICENESS), address=kw["address"])
    )
    assert cluster.connect(RayConfig()) is True
    # "local": on a machine that ran `ray start`, Ray would otherwise join that cluster unasked.
    assert seen == {"niceness": "0", "address": "local"}


def test_resources_no_node_offers_are_refused_naming_what_the_nodes_have() -> None:
    from pipeline.run.plumbing.cluster import check_resources

    nodes = [{"CPU": 1.0, "specsweep_slot": 1.0, "node:10.0.0.1": 1.0}, {"CPU": 1.0, "GPU": 1.0}]
    check_resources({"specsweep_slot": 1}, nodes)
    check_resources({"GPU": 1}, nodes)
    check_resources({}, [])
    with pytest.raises(LaunchError, match=r"asks each server group for \{GPU=2\}.*CPU=1, GPU=1") as err:
        check_resources({"GPU": 2}, nodes)
    assert "node:" not in str(err.value)
    with pytest.raises(LaunchError, match=r"\{GPU=1, specsweep_slot=1\}"):
        check_resources({"specsweep_slot": 1, "GPU": 1}, nodes)  # both, on one node


def test_group_request_maps_cpu_and_gpu_to_rays_own_arguments() -> None:
    from pipeline.config import RayConfig
    from pipeline.run.plumbing.cluster import group_request as _request

    assert _request(RayConfig(), 2) == {"num_cpus": 1, "num_gpus": 2}
    slot = RayConfig(resources_per_group={"specsweep_slot": 1.0})
    assert _request(slot, 0) == {"num_cpus": 0, "num_gpus": 0, "resources": {"specsweep_slot": 1.0}}
    gpu = RayConfig(resources_per_group={"GPU": 1.0, "CPU": 4.0})
    assert _request(gpu, 1) == {"num_cpus": 4.0, "num_gpus": 1.0}
    # A custom resource alone on GPU servers: each group still asks for its server's GPUs
    # (tensor_parallel_size of them), or Ray would hide every GPU from it.
    labelled = RayConfig(resources_per_group={"a100_node": 1.0})
    assert _request(labelled, 4) == {"num_cpus": 0, "num_gpus": 4, "resources": {"a100_node": 1.0}}


def test_a_job_driver_joins_the_cluster_of_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from pipeline.config import RayConfig
    from pipeline.run.plumbing import cluster

    seen: dict[str, object] = {}
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    cluster.connect(RayConfig())
    assert seen["address"] == "auto"


def test_a_ray_job_driver_runs_from_a_copy_of_its_package(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # Ray unpacks the job's package again under a running driver; the driver must not read from it.
    from pipeline import sweep

    package = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    (package / "conf").mkdir(parents=True)
    (package / "conf" / "config.yaml").write_text("x: 1\n")
    monkeypatch.chdir(package)
    # setenv, then delenv: monkeypatch then records the variable's absence and restores it (a
    # delenv of an absent variable records nothing, and the copy's path would outlive the test).
    monkeypatch.setenv(sweep.STABLE_COPY_ENV, "")
    monkeypatch.delenv(sweep.STABLE_COPY_ENV)
    execs: list[list[str]] = []
    monkeypatch.setattr(sweep.os, "execv", lambda exe, argv: execs.append(argv))
    monkeypatch.setattr(sweep.sys, "argv", ["sweep.py", "+sweep=nightly"])
    sweep.run_from_a_stable_copy()
    copy = os.environ[sweep.STABLE_COPY_ENV]
    assert os.getcwd() == copy and "working_dir_files" not in copy
    assert (Path(copy) / "conf" / "config.yaml").read_text() == "x: 1\n"
    assert execs and execs[0][1:] == ["-m", "pipeline.sweep", "+sweep=nightly"]
    sweep.run_from_a_stable_copy()  # once only: the re-executed driver stays in its copy
    assert len(execs) == 1


def test_a_server_this_machine_cannot_host_is_refused_with_the_size_it_can() -> None:
    from pipeline.run.plumbing.cluster import check_local

    check_local([Need("g0", 2)], [], gpus=2, cores=2)  # two GPUs, two ranks: fits
    with pytest.raises(
        LaunchError, match=r"needs 4 GPU\(s\).*this machine has 2; lower engine.tensor_parallel_size to 2"
    ):
        check_local([Need("g0", 4)], [], gpus=2, cores=64)
    with pytest.raises(LaunchError, match="tensor_parallel_size=8 on the CPU, but this machine has 2 core"):
        check_local([Need("g1", 0)], [("g1", 8)], gpus=0, cores=2)
