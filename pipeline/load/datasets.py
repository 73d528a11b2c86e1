"""Prompt files in the formats users already have, read strictly.

A malformed file is refused with its path, the line (or entry) and the field, never
skipped in silence: a benchmark that quietly dropped half its prompts would mislead.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, WorkloadConfig
from pipeline.load.items import Item, Tokenizer


class DatasetError(ConfigError):
    pass


def _field(record: Any, key: str, kind: type, where: str, *, required: bool = True) -> Any:
    """``record[key]`` checked for presence and type; ``where`` is "file:line" or "file: entry N"."""
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: expected a JSON object, found {type(record).__name__}")
    if key not in record or record[key] is None:
        if required:
            raise DatasetError(f"{where}: field {key!r} is missing")
        return None
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DatasetError(f"{where}: field {key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value


def _jsonl(path: Path) -> list[tuple[str, Any]]:
    """(``file:line``, parsed object) for every non-blank line."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                rows.append((f"{path}:{number}", json.loads(text)))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    return rows


OUTPUT_FIELDS = ("output_length", "output_tokens")  # one length, two names: vLLM's and Mooncake's, and ours


def output_length(where: str, record: dict) -> int | None:
    """A line's output length under either name (both given must agree), or None: sent as
    it is, whatever workload.max_tokens says (that is for lines that give none)."""
    given = {name: _field(record, name, int, where, required=False) for name in OUTPUT_FIELDS}
    found = {name: value for name, value in given.items() if value is not None}
    if len(set(found.values())) > 1:
        both = " and ".join(f"{name}={value}" for name, value in found.items())
        raise DatasetError(
            f"{where}: {both} disagree; they name one length (output_length as vLLM's timed_trace and Mooncake "
            f"write it, output_tokens as ours): keep one"
        )
    value = next(iter(found.values()), None)
    if value is not None and value < 1:
        raise DatasetError(f"{where}: field {next(iter(found))!r} must be >= 1, found {value}")
    return value


def read_jsonl(path: Path) -> list[Item]:
    """One object a line: ``prompt`` (required), ``output_tokens`` (or ``output_length``) and
    ``category`` (optional)."""
    items = []
    for where, record in _jsonl(path):
        prompt = _field(record, "prompt", str, where)
        if not prompt.strip():
            raise DatasetError(f"{where}: field 'prompt' is empty; every request needs text to send: drop the line")
        output = output_length(where, record)
        category = _field(record, "category", str, where, required=False) or "jsonl"
        items.append(Item(prompt, category, output))
    return items


def read_spec_bench(path: Path) -> list[Item]:
    """Spec-Bench / MT-Bench question files: ``category`` and ``turns``; the first turn is sent."""
    items = []
    for where, record in _jsonl(path):
        turns = _field(record, "turns", list, where)
        if not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise DatasetError(f"{where}: field 'turns' must be a non-empty list of strings, the first not empty")
        items.append(Item(turns[0], _field(record, "category", str, where)))
    return items


def read_sharegpt(path: Path, tokenizer: Tokenizer | None) -> list[Item]:
    """ShareGPT: the first human turn is the prompt; the reply after it sets the output length."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of conversations, found {type(data).__name__}")
    items = []
    for number, entry in enumerate(data):
        where = f"{path}: entry {number}"
        turns = _field(entry, "conversations", list, where)
        if len(turns) < 2:
            continue  # as vLLM's sampler does: a prompt without a reply has no reference length
        for i, turn in enumerate(turns[:2]):
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise DatasetError(f"{where}: conversations[{i}] needs a string field 'value'")
        prompt, reply = turns[0]["value"], turns[1]["value"]
        output = len(tokenizer.encode(reply, add_special_tokens=False)) if tokenizer is not None else None
        items.append(Item(prompt, "sharegpt", output or None, capped=True))
    if not items:
        raise DatasetError(f"{path}: no conversation with a prompt and a reply")
    return items


def read(name: str, path_text: str, tokenizer: Tokenizer | None) -> list[Item]:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise DatasetError(f"workload.path={path_text} is not a file; point it at a {name} file")
    if name == "jsonl":
        items = read_jsonl(path)
    elif name == "spec_bench":
        items = read_spec_bench(path)
    else:
        items = read_sharegpt(path, tokenizer)
    if not items:
        raise DatasetError(f"{path}: the file holds no prompts")
    return items


def random_items(workload: WorkloadConfig, count: int, rng: random.Random, tokenizer: Tokenizer) -> list[Item]:
    """Prompts of random token ids, with uniform lengths in len × [1 - ratio, 1 + ratio]."""

    def length(mean: int) -> int:
        low = max(1, round(mean * (1 - workload.random_range_ratio)))
        high = max(low, round(mean * (1 + workload.random_range_ratio)))
        return rng.randint(low, high)

    items = []
    for _ in range(count):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(length(workload.random_input_len))]
        items.append(Item(tokenizer.decode(ids), "random", length(workload.random_output_len)))
    return items
