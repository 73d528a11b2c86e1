"""What the job runs on: GPU presence (for the engine build and flags) and tags for MLflow."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from functools import cache

from pipeline.config import ConfigError


@cache
def gpu_names() -> tuple[str, ...]:
    """NVIDIA GPUs visible to this process, by name; empty where there are none."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


def resolve_device(requested: str) -> bool:
    """True for GPU. ``auto`` detects; ``gpu`` on a machine without one is refused."""
    if requested == "cpu":
        return False
    found = bool(gpu_names())
    if requested == "gpu" and not found:
        raise ConfigError("engine.device=gpu, but nvidia-smi finds no GPU here; use engine.device=cpu or auto")
    return found


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_tags(on_gpu: bool) -> dict[str, str]:
    tags = {
        "hardware.device": "gpu" if on_gpu else "cpu",
        "hardware.cpu": cpu_name(),
        "hardware.cpu_count": str(os.cpu_count() or 0),
        "hardware.platform": platform.platform(),
    }
    if on_gpu:
        names = gpu_names()
        tags["hardware.gpu"] = names[0] if names else "unknown"
        tags["hardware.gpu_count"] = str(len(names))
    return tags


def where_am_i() -> dict[str, str]:
    """Tags naming the node a group ran on: its host, and its Ray node id inside a Ray task."""
    tags = {"node.host": socket.gethostname()}
    try:
        import ray

        if ray.is_initialized():
            tags["node.ray_id"] = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return tags
