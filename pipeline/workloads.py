"""Prompt sets that need no download: built from text that ships with Python.

Each set is seeded: the same (name, seed, count) gives the same prompts, on any machine
with the same Python version. Acceptance depends on the kind of text, so every request
carries its category.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
import textwrap
from dataclasses import dataclass
from functools import cache

from pipeline.config import ConfigError, WorkloadConfig

# Pure-Python standard-library modules whose functions make realistic edit targets.
_CODE_MODULES = (
    "textwrap", "shlex", "fnmatch", "bisect", "heapq", "colorsys", "calendar", "posixpath",
    "string", "difflib", "json.encoder", "json.decoder", "html", "base64", "quopri",
    "gettext", "netrc", "mimetypes", "statistics", "fractions", "ipaddress", "csv", "pprint",
)  # fmt: skip
_EDIT_INSTRUCTIONS = (
    "Add type hints to every parameter and the return value of this function. Reply with the full rewritten function only.",
    "Rename the local variables of this function to clearer names, keeping its behaviour. Reply with the full function only.",
    "Add a concise docstring and inline comments to this function. Reply with the full function only.",
    "Rewrite this function so that it uses f-strings and early returns where possible. Reply with the full function only.",
)
_MIN_CHARS, _MAX_CHARS = 200, 1200


@dataclass(frozen=True)
class Request:
    index: int
    prompt: str
    category: str
    max_tokens: int


@cache
def _stdlib_functions() -> tuple[str, ...]:
    sources: list[str] = []
    for name in _CODE_MODULES:
        module = importlib.import_module(name)
        try:
            text = inspect.getsource(module)
        except (OSError, TypeError):  # a frozen or C build of the module
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                # padded=True keeps a method's first-line indent, so dedent sees it whole.
                src = textwrap.dedent(ast.get_source_segment(text, node, padded=True) or "")
                if _MIN_CHARS <= len(src) <= _MAX_CHARS:
                    sources.append(src)
    if not sources:
        raise ConfigError("no standard-library source found for the code_edit workload; is this Python stripped?")
    return tuple(sorted(set(sources)))


def _code_edit(rng: random.Random, count: int) -> list[tuple[str, str]]:
    functions = _stdlib_functions()
    picks = rng.sample(functions, k=min(count, len(functions)))
    while len(picks) < count:  # more requests than functions: repeat with other instructions
        picks.append(rng.choice(functions))
    return [(f"{rng.choice(_EDIT_INSTRUCTIONS)}\n\n```python\n{src}\n```", "code_edit") for src in picks]


WORKLOADS = {"code_edit": _code_edit}


def build_requests(workload: WorkloadConfig, count: int, seed: int, start_index: int = 0) -> list[Request]:
    if workload.name not in WORKLOADS:
        raise ConfigError(f"workload.name={workload.name!r} is not valid; choose one of: {', '.join(WORKLOADS)}")
    rng = random.Random(f"{workload.name}:{seed}")
    prompts = WORKLOADS[workload.name](rng, count)
    return [
        Request(index=start_index + i, prompt=p, category=c, max_tokens=workload.max_tokens)
        for i, (p, c) in enumerate(prompts)
    ]


def split_warmup(
    workload: WorkloadConfig, measured: int, warmup: int, seed: int
) -> tuple[list[Request], list[Request]]:
    """Warm-up prompts are drawn apart from the measured ones, so they never warm their cache."""
    both = build_requests(workload, measured + warmup, seed)
    return both[measured:], both[:measured]
