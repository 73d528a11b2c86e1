"""Ray, guarded: a dead address fails within a deadline, and a request the cluster can never
satisfy fails at once instead of queueing forever (both are Ray 2.60's own behaviour, seen on these machines).

The checks are pure functions of what the cluster reports, so they are tested without one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline import startup
from pipeline.config import RayConfig
from pipeline.run.plumbing.errors import LaunchError, Unreachable

GCS_DEFAULT_PORT = 6379
WORKER_NICENESS = "RAY_worker_niceness"  # read by the raylet that ray.init starts
# A local Ray for this machine: no dashboard (seconds of start-up, a port), a small object
# store (the results are a few KB), and the logs of tasks forwarded to this terminal.
LOCAL_INIT = {"include_dashboard": False, "object_store_memory": 200 * 1024**2, "log_to_driver": True}


@dataclass(frozen=True)
class Need:
    label: str
    gpus: int


def check_feasible(needs: Sequence[Need], resources: Mapping[str, float], nodes_gpus: Sequence[float]) -> None:
    """Refuse a group whose server needs more GPUs than any one node has."""
    biggest = max(nodes_gpus, default=0.0)
    for need in needs:
        if need.gpus > biggest:
            have = ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU", "memory"))
            raise LaunchError(
                f"server group {need.label} asks for {need.gpus} GPU(s) on one node, but the Ray cluster's largest "
                f"node has {biggest:g} (cluster: {have or 'nothing reported'}); lower engine.tensor_parallel_size, "
                f"join a cluster with GPUs (ray.address=...), or set engine.device=cpu"
            )


def check_local(needs: Sequence[Need], tp_on_cpu: Sequence[tuple[str, int]], gpus: int, cores: int) -> None:
    """Refuse a server this machine cannot host, where the groups run here (no Ray): more GPUs
    than nvidia-smi lists, or more CPU tensor-parallel ranks than cores (vLLM's CPU backend
    binds each rank's threads to cores of its own)."""
    for need in needs:
        if need.gpus > gpus:
            raise LaunchError(
                f"server group {need.label} needs {need.gpus} GPU(s) (engine.tensor_parallel_size={need.gpus}), "
                f"but this machine has {gpus}; lower engine.tensor_parallel_size to {max(gpus, 1)}, or run the "
                f"sweep on a Ray cluster with larger nodes (hydra/launcher=ray ray.address=...)"
            )
    for label, tp in tp_on_cpu:
        if tp > cores:
            raise LaunchError(
                f"server group {label} runs engine.tensor_parallel_size={tp} on the CPU, but this machine has "
                f"{cores} core(s), one per rank at the least; lower engine.tensor_parallel_size to {cores} or less"
            )


def check_resources(request: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> None:
    """Refuse a per-group request that no single node offers: Ray would queue it forever."""
    if not request:
        return
    for node in nodes:
        if all(node.get(name, 0.0) >= amount for name, amount in request.items()):
            return
    offered = "; ".join(
        ", ".join(f"{k}={v:g}" for k, v in sorted(n.items()) if not k.startswith(("node:", "object_store")))
        for n in nodes
    )
    asked = ", ".join(f"{k}={v:g}" for k, v in sorted(request.items()))
    raise LaunchError(
        f"ray.resources_per_group asks each server group for {{{asked}}}, but no node offers that (nodes: "
        f"{offered or 'none alive'}); start nodes with `ray start --resources '{{\"specsweep_slot\": 1}}'` or "
        f"change ray.resources_per_group"
    )


def check_store(tracking_uri: str, alive_nodes: int, hosts: int = 1) -> None:
    """A SQLite file on this machine cannot be written by workers on other nodes; nor can a server
    at a loopback address, where the nodes are on other machines (``hosts``: the nodes' distinct
    addresses), each of which would reach its own 127.0.0.1."""
    from urllib.parse import urlsplit

    host = urlsplit(tracking_uri).hostname or ""
    if hosts > 1 and (host == "localhost" or host.startswith("127.") or host == "::1"):
        raise LaunchError(
            f"tracking.uri={tracking_uri} is a loopback address, but the Ray cluster's nodes are on {hosts} "
            f"machines: a worker on another one would write to its own {host}, where no tracking server runs; give "
            f"the server's own address (tracking.uri=http://<its private address>:5000, or MLFLOW_TRACKING_URI for "
            f"`make nightly` and sweeps/nightly.yaml)"
        )
    if alive_nodes > 1 and not tracking_uri.startswith(("http://", "https://", "databricks")):
        raise LaunchError(
            f"the Ray cluster has {alive_nodes} nodes but tracking uses a local store ({tracking_uri}), which workers "
            f"on other nodes cannot reach; start a tracking server they reach, behind MLflow's basic-auth app "
            f"(`make tracking-server-auth MLFLOW_HOST=<private address>`, docs/cluster.md), set "
            f"tracking.uri=http://<that address>:5000, and give the driver and every node's `ray start` "
            f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host:
        return port, GCS_DEFAULT_PORT
    try:
        return host, int(port)
    except ValueError as exc:
        raise LaunchError(f"ray.address={address!r} is not host:port (e.g. 10.0.0.5:6379) or 'auto'") from exc


def probe_address(address: str, timeout_s: float) -> None:
    """ray.init hangs on an explicit address nobody listens on; a TCP connect does not."""
    host, port = _split(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise Unreachable(
            f"ray.address={address} is not reachable within {timeout_s:g} s ({exc}); start the head with "
            f"`ray start --head --port={port}`, fix the address, or drop ray.address to start a local Ray"
        ) from exc


def connect(config: RayConfig) -> bool:
    """Join ``config.address`` or start a local Ray; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if config.address and config.address != "auto":
        probe_address(config.address, config.connect_timeout_s)
    # A driver submitted with `ray job submit` runs with RAY_ADDRESS set: it joins that cluster.
    address = config.address or ("auto" if os.environ.get("RAY_ADDRESS") else None)
    try:
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            # Ray starts its workers at niceness 15, and a server started from a task inherits
            # it: on a CPU machine the measured server then yields to Ray's own processes.
            # Ray Jobs runs drivers at 0 for the same reason; so do the workers of our local Ray.
            os.environ.setdefault(WORKER_NICENESS, "0")
            # "local": a machine that ran `ray start` (a head, a node) has a cluster Ray would
            # otherwise join unasked, and refuse there for LOCAL_INIT's object store size.
            ray.init(address="local", **LOCAL_INIT)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise Unreachable(f"cannot start or join Ray (ray.address={address}): {exc}") from exc
    # ray.init takes SIGTERM over (its handler aborts the driver: exit 134, not 143): take it back.
    startup.exit_on_sigterm()
    return True


def node_resources() -> list[dict[str, float]]:
    import ray

    return [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]


def node_hosts() -> int:
    """The distinct machines among the alive nodes (several nodes may share one, as tests run them)."""
    import ray

    return len({n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")})


def node_gpus() -> list[float]:
    return [n.get("GPU", 0.0) for n in node_resources()]


def group_request(config: RayConfig, gpus: int) -> dict[str, Any]:
    """A group's Ray resource request: ray.resources_per_group where set (CPU and GPU are
    Ray's own arguments, the rest custom resources), else one CPU and the server's GPUs. A
    request that names no GPU still asks for the server's GPUs: Ray hides every GPU from a
    task that asked for none, and the server would start without one."""
    if not config.resources_per_group:
        return {"num_cpus": 1, "num_gpus": gpus}
    custom = {k: v for k, v in config.resources_per_group.items() if k not in ("CPU", "GPU")}
    request: dict[str, Any] = {"num_cpus": config.resources_per_group.get("CPU", 0)}
    request["num_gpus"] = config.resources_per_group.get("GPU", gpus)
    return {**request, **({"resources": custom} if custom else {})}


def request_text(request: dict[str, Any]) -> str:
    """A group request as the dry run prints it: ``1 CPU, 2 GPU, a100_node=1``."""
    parts = [f"{request['num_cpus']:g} CPU", f"{request['num_gpus']:g} GPU"]
    parts += [f"{name}={amount:g}" for name, amount in sorted(request.get("resources", {}).items())]
    return ", ".join(parts)
