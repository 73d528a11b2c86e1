"""Running a sweep: plan it, start each server group, measure its points, report progress."""

from __future__ import annotations
