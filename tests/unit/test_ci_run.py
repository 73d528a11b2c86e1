""".ci/run's clean-up, run for real on a stand-in `make test`: what the run left running is
stopped, and only that; its temp dir and the folders it listed outside it are removed; the
suite's exit code is the script's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

# A suite that leaves a process behind (it inherits the run's TMPDIR), makes a folder outside
# TMPDIR and lists it, as tests/tmpdirs.py does, and fails.
MAKEFILE = """
test:
\tsleep 300 & echo $$! > "$(REPORT)/left.pid"
\td=$$(mktemp -d /tmp/ssciXXXXXX) && echo "$$d" >> "$$SPECSWEEP_OUTSIDE_TMPDIR" && echo "$$d" > "$(REPORT)/outside"
\techo "$$TMPDIR" > "$(REPORT)/tmpdir"
\texit 3
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # reaped already
        return True


def test_ci_run_stops_what_its_run_left_and_removes_its_folders_and_nothing_else(tmp_path: Path) -> None:
    project, report = tmp_path / "project", tmp_path / "report"
    (project / ".ci").mkdir(parents=True)
    report.mkdir()
    shutil.copy(REPO / ".ci" / "run", project / ".ci" / "run")
    (project / "Makefile").write_text(MAKEFILE.replace("$(REPORT)", str(report)))
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # not the run's
    try:
        done = subprocess.run([str(project / ".ci" / "run")], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0, done.stdout + done.stderr  # make's failure is the script's
        assert _gone(int((report / "left.pid").read_text()))
        assert not Path((report / "outside").read_text().strip()).exists()
        assert not Path((report / "tmpdir").read_text().strip()).exists()
        assert decoy.poll() is None  # untouched
    finally:
        decoy.kill()
        decoy.wait()
