"""The inference servers: their commands, versions and counters, run as managed processes; may import load and the base modules (config, identity, redact, ...) only."""

from __future__ import annotations
