"""specsweep: does speculative decoding make my deployment faster, at my load?"""

from __future__ import annotations

__version__ = "0.1.0"
