"""Nothing measured is lost when MLflow fails: writes that cannot be made are journaled.

A :class:`JournaledTracker` stands in for :class:`~pipeline.record.tracking.Tracker`. Each write goes to
MLflow; the first that fails (the tracking server went away, or errors) starts a journal, a JSON
line per write, in the sweep's output folder, and from then on every write of that tracker is
journaled in order, so that a run is never ended before its metrics arrive. A run started while
MLflow is down gets a placeholder id, and the writes that name it are journaled with it.

:func:`replay` makes the journaled writes once MLflow answers again: at the end of the sweep,
and from ``python -m pipeline.sync <outputs dir>``. Each journal keeps, beside it, how far it was
replayed and which real run each placeholder became, so replaying twice makes nothing twice.
A replay that dies between a write and its mark finds its own run again by the tag it gave it
(:data:`JOURNAL_RUN_TAG`) instead of starting a second one; the other writes are idempotent
(a tag, a param, an artifact written again) or add one more metric value at most. A last line
cut short (the process died while writing it) is a write that never happened, and is said so.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

JOURNAL_NAME = "mlflow-journal.jsonl"
PLACEHOLDER = "pending-"
JOURNAL_RUN_TAG = "specsweep.journal_run"  # a replayed run's placeholder id: what finds it again
WRITES = (
    "start_run",
    "end_run",
    "log_params",
    "log_metrics",
    "set_tags",
    "log_text",
    "log_json",
    "log_file",
    "log_table",
)


class JournaledTracker:
    def __init__(self, tracker: Any, path: Path) -> None:
        self.tracker = tracker
        self.path = path
        self.journaled = 0  # writes in the journal, not in MLflow

    def __getattr__(self, name: str) -> Any:
        if name in WRITES:
            return lambda *args, **kwargs: self._write(name, args, kwargs)
        return getattr(self.tracker, name)  # reads (finished_points, experiment_id, store) go straight through

    def _write(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.journaled:
            try:
                return getattr(self.tracker, op)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the measurement is safe on disk; MLflow gets it later
                print(
                    f"MLflow: {op} failed ({type(exc).__name__}: {str(exc)[:300]}); this and every later write "
                    f"go to {self.path} (the sweep retries them at its end; `python -m pipeline.sync` later)",
                    file=sys.stderr,
                )
        result = PLACEHOLDER + uuid.uuid4().hex if op == "start_run" else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            header = {
                "tracking_uri": self.tracker.store.tracking_uri,
                "experiment_id": self.tracker.experiment_id,
                "artifact_root": self.tracker.store.artifact_root,
            }
            self.path.write_text(json.dumps(header) + "\n")
        with self.path.open("a") as fh:
            entry = {"op": op, "args": _encode(op, args), "kwargs": kwargs, "result": result}
            fh.write(json.dumps(entry, default=str) + "\n")
        self.journaled += 1
        return result


def _encode(op: str, args: tuple[Any, ...]) -> list[Any]:
    values = list(args)
    if op == "log_file":  # the file must still be there to replay: name it absolutely
        values[1] = str(Path(values[1]).resolve())
    if op == "log_table":
        values[1] = values[1].to_dict(orient="split")
    return values


def _decode(op: str, args: list[Any]) -> list[Any]:
    if op == "log_file":
        args[1] = Path(args[1])
    if op == "log_table":
        args[1] = pd.DataFrame(**args[1])
    return args


def journals(folder: Path) -> list[Path]:
    """The journals under a sweep's outputs; a driver's (the sweep folder's own) after its groups'."""
    found = sorted(folder.rglob(JOURNAL_NAME))
    return sorted(found, key=lambda p: len(p.relative_to(folder).parts), reverse=True)


def _progress(path: Path) -> dict[str, Any]:
    done = path.with_suffix(".synced.json")
    return json.loads(done.read_text()) if done.is_file() else {"done": 0, "ids": {}}


def placeholders(paths: Iterable[Path]) -> dict[str, str]:
    """Placeholder run id -> the run it became, over the journals' replays so far."""
    ids: dict[str, str] = {}
    for path in paths:
        ids.update(_progress(path)["ids"])
    return ids


def _entries(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A journal's header and entries. A last line that does not parse was cut short by a death
    mid-write: that write was never made, and is dropped with a word; a bad line before the
    last is a damaged journal, refused with its line number."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    header, entries = json.loads(lines[0]), []
    for number, line in enumerate(lines[1:], start=2):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number != len(lines):
                raise ValueError(
                    f"{path}: line {number} is not a journaled write ({exc}); the journal is damaged, "
                    "replay the lines before it by hand or delete it"
                ) from exc
            print(
                f"MLflow: {path}: its last line was cut short (the process died while writing it); that write is "
                "left out",
                file=sys.stderr,
            )
    return header, entries


def _save(path: Path, progress: dict[str, Any]) -> None:
    path.with_suffix(".synced.json").write_text(json.dumps(progress))


def make_tracker(header: dict[str, Any], tracking_uri: str | None = None) -> Any:
    """A tracker for the store a journal's header names (or ``tracking_uri`` instead)."""
    from pipeline.record.tracking import Store, Tracker  # MLflow: only when a journal is replayed

    return Tracker(Store(tracking_uri or header["tracking_uri"], header.get("artifact_root")), header["experiment_id"])


def replay_journal(paths: Iterable[Path], make_tracker: Any) -> tuple[int, int]:
    """Make every journaled write not made yet; returns (writes made, writes left). Stops at the
    first write that fails again, keeping the progress made."""
    paths = list(paths)
    ids = placeholders(paths)  # placeholders of one journal can be named in another (a driver's in a worker's)
    made = left = 0
    for path in paths:
        header, entries = _entries(path)
        progress = _progress(path)
        tracker = make_tracker(header)
        for i, entry in enumerate(entries[progress["done"] :], start=progress["done"]):
            args = [_real(a, ids) for a in _decode(entry["op"], entry["args"])]
            # The mark goes down before the write: a replay that finds it knows the write may
            # have been made already (the process died between the two).
            interrupted = progress.get("pending") == i
            progress["pending"] = i
            _save(path, progress)
            try:
                result = _make(tracker, entry, args, ids, interrupted)
            except Exception as exc:  # noqa: BLE001 - still down: keep what was done, say what is left
                print(
                    f"MLflow: replaying {path} stopped at write {i + 1} of {len(entries)} ({type(exc).__name__}: "
                    f"{str(exc)[:200]})",
                    file=sys.stderr,
                )
                left += len(entries) - i
                break
            if entry["result"]:
                ids[entry["result"]] = result
                progress["ids"][entry["result"]] = result
            progress["done"] = i + 1
            _save(path, progress)
            made += 1
        else:
            continue
        for later in paths[paths.index(path) + 1 :]:
            left += max(0, len(_entries(later)[1]) - _progress(later)["done"])
        break
    return made, left


def _make(tracker: Any, entry: dict[str, Any], args: list[Any], ids: Mapping[str, str], interrupted: bool) -> Any:
    """One journaled write; a run is started tagged with its placeholder, and a start that was
    interrupted first looks for the run it may already have made."""
    if entry["op"] == "start_run" and entry["result"]:
        if interrupted and (found := tracker.run_tagged(JOURNAL_RUN_TAG, entry["result"])):
            return found
        kwargs = dict(entry.get("kwargs", {}))
        if len(args) >= 2:
            args = [args[0], {**args[1], JOURNAL_RUN_TAG: entry["result"]}, *args[2:]]
        else:
            kwargs["tags"] = {**kwargs.get("tags", {}), JOURNAL_RUN_TAG: entry["result"]}
        return tracker.start_run(*args, **_real(kwargs, ids))
    return getattr(tracker, entry["op"])(*args, **_real(entry.get("kwargs", {}), ids))


def _real(value: Any, ids: Mapping[str, str]) -> Any:
    if isinstance(value, str) and value.startswith(PLACEHOLDER):
        return ids.get(value, value)
    if isinstance(value, dict):
        return {k: _real(v, ids) for k, v in value.items()}
    return value
