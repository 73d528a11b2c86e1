"""One benchmark sweep: ``python -m pipeline.sweep -m`` in a project folder of its own, timed
from outside, its output kept in ``<project>/<name>.log``. Shared by the benchmarks that
compare searches (predict_vs_grid.py, capacity_search.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(project: Path, name: str, args: list[str]) -> tuple[float, Path]:
    """Wall seconds and the sweep's output folder; exits naming the log if the sweep failed."""
    cmd = [
        sys.executable,
        "-m",
        "pipeline.sweep",
        "-m",
        "--config-dir",
        str(REPO / "conf"),
        f"sweep_name={name}",
        *args,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    wall = time.monotonic() - started
    (project / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{name} exited with {proc.returncode}; see {project / f'{name}.log'}")
    return wall, sorted((project / "outputs" / name).glob("*"))[-1]
