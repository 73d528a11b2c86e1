"""Temp folders a test run makes outside its own TMPDIR, listed so that .ci/run removes them.

Ray's sockets live under its temp dir, and a Unix socket path holds ~107 characters: Ray's
folders (the session's, tests/conftest.py, and each test cluster's, tests/cluster.py) get a
short path in /tmp instead of one inside the session's TMPDIR. Each is removed by whoever made
it; a run killed before that (.ci/run's timeout) still has them removed by .ci/run's exit trap,
which reads the list that ``SPECSWEEP_OUTSIDE_TMPDIR`` names.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def outside_tmpdir(prefix: str) -> Path:
    """A new folder with a short path in /tmp, added to the list that ``SPECSWEEP_OUTSIDE_TMPDIR``
    names, where it is set (.ci/run sets it)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if listed := os.environ.get("SPECSWEEP_OUTSIDE_TMPDIR"):
        with open(listed, "a") as fh:
            fh.write(f"{folder}\n")
    return folder
