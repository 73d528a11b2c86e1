"""Inference engines behind one interface: build a command, run it as a managed process, read its counters."""

from __future__ import annotations
