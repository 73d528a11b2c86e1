"""Recording: MLflow runs, the journal for writes it could not take, tables and result files."""

from __future__ import annotations
