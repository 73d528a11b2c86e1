"""Ray guards, without a cluster: what it reports is passed in."""

from __future__ import annotations

import os
import socket
import time

import pytest

from pipeline.cluster import Need, check_feasible, check_store, probe
from pipeline.driver import LaunchError


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


def test_dead_address_fails_within_the_deadline() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(LaunchError, match=f"ray.address=127.0.0.1:{port} is not reachable"):
        probe(f"127.0.0.1:{port}", timeout_s=2.0)
    assert time.monotonic() - started < 10
    with pytest.raises(LaunchError, match="not host:port"):
        probe("head:port", timeout_s=1.0)


def test_local_ray_starts_its_workers_at_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray's workers default to niceness 15, and a server started from a task inherits it.
    import ray

    from pipeline import cluster
    from pipeline.config import RayConfig

    seen: dict[str, str | None] = {}
    monkeypatch.delenv(cluster.WORKER_NICENESS, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(niceness=os.environ.get(cluster.WORKER_NICENESS)))
    assert cluster.connect(RayConfig()) is True
    assert seen == {"niceness": "0"}
