"""Running a sweep: plan it, start each server group, measure its points, report progress; may import finish and everything below it, never an entry point."""

from __future__ import annotations
