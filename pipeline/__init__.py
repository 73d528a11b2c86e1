"""specsweep: does speculative decoding make my deployment faster, at my load?

Layers, top first, each importing only its own and those below (tests/unit/test_layout.py):
the commands (sweep, gate, report, sync, ui, with compose and validate) -> run -> finish ->
record -> analysis -> engines -> load -> the base modules (config, identity, exitcode,
startup, redact). Each package's docstring says what it may import; this one may import nothing.
"""

from __future__ import annotations

__version__ = "0.1.0"
