"""Load generation: prompt sets, open-loop arrivals, the streaming client and its per-window summary."""

from __future__ import annotations
