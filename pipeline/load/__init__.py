"""Load generation: prompt sets, arrivals, the streaming client, the SLO and a window's summary; may import the base modules (config, ...) only."""

from __future__ import annotations
