"""A sweep's windows read back from MLflow: per-request samples, and the server spread an A/A sweep stored.

The report, the gate and search=predict read windows through here; the numbers they
compute from them are :mod:`pipeline.analysis`'s.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from pipeline.analysis import verdicts
from pipeline.analysis.samples import Sample, ServerSpread, StatsOptions, server_spread
from pipeline.config import StatsConfig
from pipeline.identity import Identity
from pipeline.record.readers import ChildRun, SweepReader

AA_PREFIX = "aa_sd_"
AA_COUNT = "aa_comparisons"
AA_FINGERPRINT = "aa.fingerprint"  # on the A/A sweep's parent: what its spread was measured on
# The identity's parts an A/A spread is not specific to: it is the noise between two fresh
# servers of one hardware and model, whatever the settings, engine build, draft or prompts.
SPREAD_VARIES = ("settings", "engine", "draft", "data")


def measured_children(children: Sequence[ChildRun]) -> list[ChildRun]:
    """A sweep's measured windows: finished points, not search=predict's predicted ones (which
    carry no hardware tags and no requests)."""
    return [c for c in children if c.tags.get("status") == "finished" and c.tags.get("predicted") != "true"]


def spread_fingerprint(children: Sequence[ChildRun]) -> str:
    """What a spread between fresh servers depends on, as a short key: the identities' hardware
    and model (:meth:`pipeline.identity.Identity.key`, the other parts left out) and the
    windows' size (requests per window), of the sweep's measured windows. A spread measured on
    other hardware, with another model or over windows of another size is another setting's
    noise: it is not used for this sweep's comparisons. A window whose identity does not record
    its hardware or model makes the key "", which matches nothing."""
    children = measured_children(children)
    systems = sorted({Identity.from_tags(c.tags).key(without=SPREAD_VARIES) for c in children})
    if not systems or "" in systems:
        return ""
    sizes = sorted({int(c.metrics.get("completed", 0) + c.metrics.get("failed", 0)) for c in children})
    text = f"{';'.join(systems)}|{','.join(map(str, sizes))}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_server_spread(reader: SweepReader, parent_id: str, frame: pd.DataFrame, opts: StatsOptions) -> StatsOptions:
    """An A/A sweep records the spread between fresh servers on its parent run, with the
    fingerprint of what it measured; every other sweep of the store adds the newest such spread
    of its own fingerprint to its one-server comparisons."""
    key = spread_fingerprint(reader.children(parent_id))
    if verdicts.is_aa(frame):
        spread = server_spread(verdicts.aa_log_ratios(frame), reader.title(parent_id))
        if spread is not None:
            reader.log_metrics(
                parent_id, {AA_COUNT: float(spread.comparisons), **{AA_PREFIX + m: v for m, v in spread.sd.items()}}
            )
            if key:
                reader.set_tags(parent_id, {AA_FINGERPRINT: key})
        return opts
    spread = stored_server_spread(reader, key)
    return opts if spread is None else replace(opts, server_spread=spread)


def server_spread_for(reader: SweepReader, parent_id: str) -> ServerSpread | None:
    """The A/A spread between fresh servers for what this sweep measured: the one lookup the
    report, the gate and search=predict make (the newest A/A sweep of the same fingerprint)."""
    return stored_server_spread(reader, spread_fingerprint(reader.children(parent_id)))


def stored_server_spread(reader: SweepReader, fingerprint: str) -> ServerSpread | None:
    """The newest A/A spread between fresh servers recorded in the store whose fingerprint
    (:func:`spread_fingerprint`) is ``fingerprint``. There is no lookup without one: the
    newest spread from any hardware, model or window size is another setting's noise."""
    found = reader.newest_with_metric(AA_COUNT, (AA_FINGERPRINT, fingerprint)) if fingerprint else None
    if found is None:
        return None
    _, metrics, title = found
    sd = {k.removeprefix(AA_PREFIX): v for k, v in metrics.items() if k.startswith(AA_PREFIX)}
    return ServerSpread(sd, int(metrics[AA_COUNT]), title)


def window_sample(reader: SweepReader, run_id: str, duration: float, work: Path) -> Sample | None:
    """A window's requests as the statistics core resamples them, from its run's requests.csv
    (the workers that measured it may be on other nodes); None where the run has none."""
    path = reader.download(run_id, "requests.csv", work / run_id) if run_id else None
    if path is None or not math.isfinite(duration):
        return None
    return Sample.from_requests(pd.read_csv(path), duration)


def window_downloads(reader: SweepReader) -> Callable[[str, float], Sample | None]:
    """:func:`window_sample` by run id and duration, each download under one temporary folder
    of its own: what a search that computes on windows reads a resumed point's window with."""
    folder = Path(tempfile.mkdtemp(prefix="specsweep-windows-"))
    return lambda run_id, duration: window_sample(reader, run_id, duration, folder)


def stats_options(stats: StatsConfig) -> StatsOptions:
    """The sweep's decision settings. The A/A spread between fresh servers is added once the
    sweep has measured windows to fingerprint (:func:`server_spread_for`)."""
    return StatsOptions(confidence=stats.confidence, floor=stats.floor, resamples=stats.resamples)


def window_requests(reader: SweepReader, frame: pd.DataFrame, work: Path) -> dict[str, tuple[pd.DataFrame, float]]:
    """Each measured window's requests.csv and duration, by run id: what every interval resamples."""
    found = {}
    for row in verdicts.measured(frame).itertuples():
        run = str(row.run_id)
        duration = getattr(row, "duration", math.nan)
        if not run or run == "nan" or not isinstance(duration, (int, float)) or not math.isfinite(duration):
            continue
        path = reader.download(run, "requests.csv", work / run)
        if path is not None:
            found[run] = (pd.read_csv(path), float(duration))
    return found
