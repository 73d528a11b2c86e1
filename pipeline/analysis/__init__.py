"""Sweep-level analysis: from the sweep's table (as MLflow holds it) to decisions.

Pure modules (verdicts, model, advisor, quality) compute; ``plots`` is the only matplotlib
importer; ``report`` renders. Fetching from MLflow is ``pipeline.report``'s job.
"""
