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
    out = _nvidia_smi("--query-gpu=name", "--format=csv,noheader")
    return tuple(line.strip() for line in (out or "").splitlines() if line.strip())


def _nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's output, or None where it is missing or fails (no GPU, no driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def parse_compute_apps(text: str, pids: set[int]) -> float | None:
    """The device memory (MiB) that ``pids`` hold, from ``nvidia-smi --query-compute-apps=pid,
    used_memory --format=csv,noheader,nounits``: one line per process and GPU. None where none
    of them holds any (a CPU server, or the processes are not visible in this PID namespace)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if int(parts[0]) in pids:
            try:
                total += float(parts[1])
            except ValueError:  # "[N/A]" where the driver does not report it
                continue
            seen = True
    return total if seen else None


def gpu_memory_mib(pids: set[int]) -> float | None:
    """Device memory held by these processes (a server's own tree), where nvidia-smi answers.
    Host RSS cannot see it: on a GPU the weights, the draft and the KV cache live here."""
    out = _nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits") if pids else None
    return parse_compute_apps(out, pids) if out is not None else None


def resolve_device(requested: str) -> bool:
    """True for GPU. ``auto`` detects; ``gpu`` on a machine without one is refused."""
    if requested == "cpu":
        return False
    found = bool(gpu_names())
    if requested == "gpu" and not found:
        raise ConfigError("engine.device=gpu, but nvidia-smi finds no GPU here; use engine.device=cpu or auto")
    return found


def numa_nodes(status: str | None = None) -> int:
    """The NUMA nodes this process may allocate on (``Mems_allowed_list`` of /proc/self/status,
    as vLLM's CPU backend reads it); 1 where that cannot be read."""
    if status is None:
        try:
            with open("/proc/self/status") as fh:
                status = fh.read()
        except OSError:
            return 1
    for line in status.splitlines():
        if line.startswith("Mems_allowed_list:"):
            count = 0
            for part in line.split(":", 1)[1].strip().split(","):
                low, _, high = part.partition("-")
                if low.strip().isdigit():
                    count += int(high) - int(low) + 1 if high.strip().isdigit() else 1
            return max(count, 1)
    return 1


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The tags that name the hardware a point ran on; the platform string (kernel version) is left
# out so that an OS update does not orphan a history or an A/A spread.
HARDWARE_KEYS = ("hardware.device", "hardware.cpu", "hardware.cpu_count", "hardware.gpu", "hardware.gpu_count")


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


def hardware_key(on_gpu: bool) -> str:
    """The hardware a point ran on, as one string of its identity: the :data:`HARDWARE_KEYS`."""
    tags = hardware_tags(on_gpu)
    return "; ".join(f"{k.removeprefix('hardware.')}={tags[k]}" for k in HARDWARE_KEYS if k in tags)


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
