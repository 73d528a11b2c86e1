"""A full disk under the outputs: one clear message, whichever write hit it, and no traceback."""

from __future__ import annotations

import errno
from pathlib import Path

# EFBIG: a file size limit (ulimit -f) stops a write the same way a full disk does.
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
PREFIX = "the output disk is full"


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL


def message(exc: OSError, folder: Path | None = None) -> str:
    """``folder``: what was being written, where the error does not say (pandas' writes do not)."""
    path = exc.filename or folder
    where = f" writing {path}" if path else ""
    return (
        f"{PREFIX} ({exc.strerror or exc}{where}); free space on that disk, or point hydra.sweep.dir "
        f"(hydra.run.dir for a single run) at another one, and run the sweep again: it resumes"
    )
