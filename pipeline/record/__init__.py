"""Recording: MLflow runs, the journal for writes it could not take, tables and result files; may import analysis, engines, load and the base modules, never run or finish."""

from __future__ import annotations
