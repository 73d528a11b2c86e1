"""The bundled prompt sets, built from text that ships with Python: code editing, summaries, Q&A, chat.

Acceptance depends on the kind of text, so every item carries its category. A set is a
function of a seeded generator and a count: the same seed gives the same prompts.
"""

from __future__ import annotations

import ast
import codecs
import importlib
import importlib.util
import inspect
import io
import random
import textwrap
from collections.abc import Callable, Sequence
from functools import cache

from pipeline.config import ConfigError
from pipeline.load.items import Item

# Pure-Python standard-library modules whose functions make realistic edit targets.
_CODE_MODULES = (
    "textwrap",
    "shlex",
    "fnmatch",
    "bisect",
    "heapq",
    "colorsys",
    "calendar",
    "posixpath",
    "string",
    "difflib",
    "json.encoder",
    "json.decoder",
    "html",
    "base64",
    "quopri",
    "gettext",
    "netrc",
    "mimetypes",
    "statistics",
    "fractions",
    "ipaddress",
    "csv",
    "pprint",
)
_EDIT_INSTRUCTIONS = (
    "Add type hints to every parameter and the return value of this function. Reply with the full rewritten function only.",
    "Rename the local variables of this function to clearer names, keeping its behaviour. Reply with the full function only.",
    "Add a concise docstring and inline comments to this function. Reply with the full function only.",
    "Rewrite this function so that it uses f-strings and early returns where possible. Reply with the full function only.",
)
_SUMMARY_INSTRUCTIONS = (
    "Summarise the following passage from the Python reference in three sentences.",
    "Write a one-paragraph summary of this passage for someone new to Python.",
    "List the five most important points of the following passage as bullet points.",
)
_QA_TEMPLATES = (
    "{passage}\n\nAccording to the passage above, what does the {topic} construct do, and when would you use it?",
    "{passage}\n\nBased only on the passage above, what is one common mistake people make with {topic}?",
    "Read this passage and answer: how would you explain {topic} to a colleague in two sentences?\n\n{passage}",
)
_CHAT_TEMPLATES = (
    ("creative", 'Write a short poem inspired by the saying: "{line}"'),
    ("creative", 'Write a very short story in which a programmer learns that "{line}"'),
    ("chat", 'What does "{line}" mean to you? Answer conversationally, as you would to a friend.'),
    ("chat", 'Give me three everyday examples, outside programming, of the idea "{line}"'),
)


# Modules the bundled sets never draw from, for text a draft head is trained on
# (training_items): the head is then measured on prompts it never saw.
_TRAINING_MODULES = (
    "argparse",
    "configparser",
    "urllib.parse",
    "zipfile",
    "tarfile",
    "logging",
    "optparse",
    "pathlib",
    "ftplib",
    "imaplib",
    "pydoc",
    "_pydecimal",
    "enum",
    "functools",
    "threading",
    "ast",
    "inspect",
    "http.cookiejar",
    "http.client",
    "traceback",
)


@cache
def _stdlib_functions(modules: tuple[str, ...] = _CODE_MODULES) -> tuple[str, ...]:
    sources: list[str] = []
    for name in modules:
        module = importlib.import_module(name)
        try:
            text = inspect.getsource(module)
        except (OSError, TypeError):  # a frozen or C build of the module
            continue
        lines = io.StringIO(text, newline="").readlines()  # \n, \r\n and \r only, as ast splits
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                src = textwrap.dedent(_segment(lines, node))
                if 200 <= len(src) <= 1200:
                    sources.append(src)
    return _nonempty("code_edit", "standard-library source", sources)


def _segment(lines: list[str], node: ast.stmt) -> str:
    """``ast.get_source_segment(text, node, padded=True)`` over lines split once: the library
    splits the whole module again for every node, which made this workload cost ~2.5 s to
    build in every process that draws it. The first line keeps its indent as spaces, so
    dedent sees a method whole. Same bytes (tests/unit/test_workloads.py compares them)."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    head = lines[first].encode()
    if first == last:
        return head[node.col_offset : node.end_col_offset].decode()
    padding = "".join(c if c in "\f\t" else " " for c in head[: node.col_offset].decode())
    tail = lines[last].encode()[: node.end_col_offset].decode()
    return padding + head[node.col_offset :].decode() + "".join(lines[first + 1 : last]) + tail


@cache
def _reference_passages(min_chars: int, max_chars: int) -> tuple[tuple[str, str], ...]:
    """(topic, text) from the language reference that ships with Python (pydoc_data)."""
    from pydoc_data.topics import topics

    passages = [(k, v.strip()) for k, v in sorted(topics.items()) if min_chars <= len(v.strip()) <= max_chars]
    return _nonempty("summarize/qa", "pydoc_data reference passages", passages)


@cache
def _zen_lines() -> tuple[str, ...]:
    # `import this` prints the poem; read its rot13 source text instead.
    spec = importlib.util.find_spec("this")
    origin = spec.origin if spec else None
    if not origin:
        raise ConfigError("the chat workload needs the standard library's `this` module, which is missing")
    tree = ast.parse(open(origin).read())
    encoded = next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant))
    lines = codecs.decode(encoded, "rot13").splitlines()
    return _nonempty("chat", "the Zen of Python", [ln.strip() for ln in lines[2:] if ln.strip()])


def _nonempty(name: str, what: str, values: list) -> tuple:
    if not values:
        raise ConfigError(f"no {what} found for the {name} workload; is this Python stripped?")
    return tuple(sorted(set(values)))


def draw(rng: random.Random, pool: Sequence, count: int) -> list:
    """Without repeats while the pool lasts, then with: any count works on any pool."""
    picks = rng.sample(list(pool), k=min(count, len(pool)))
    picks += [rng.choice(pool) for _ in range(count - len(picks))]
    return picks


def code_edit(rng: random.Random, count: int) -> list[Item]:
    return [
        Item(f"{rng.choice(_EDIT_INSTRUCTIONS)}\n\n```python\n{src}\n```", "code_edit")
        for src in draw(rng, _stdlib_functions(), count)
    ]


def summarize_items(rng: random.Random, count: int) -> list[Item]:
    return [
        Item(f"{rng.choice(_SUMMARY_INSTRUCTIONS)}\n\n{text}", "summarize")
        for _, text in draw(rng, _reference_passages(1500, 5000), count)
    ]


def qa(rng: random.Random, count: int) -> list[Item]:
    return [
        Item(rng.choice(_QA_TEMPLATES).format(passage=text, topic=topic.replace("-", " ")), "qa")
        for topic, text in draw(rng, _reference_passages(600, 2500), count)
    ]


def chat(rng: random.Random, count: int) -> list[Item]:
    items = []
    for line in draw(rng, _zen_lines(), count):
        category, template = rng.choice(_CHAT_TEMPLATES)
        items.append(Item(template.format(line=line), category))
    return items


def mixed(rng: random.Random, count: int) -> list[Item]:
    """All four kinds, interleaved, so a window holds each in equal share."""
    sources = (code_edit, summarize_items, chat, qa)
    per_source = [source(rng, (count + len(sources) - 1 - i) // len(sources)) for i, source in enumerate(sources)]
    return [items[j] for j in range(max(map(len, per_source))) for items in per_source if j < len(items)]


@cache
def _module_summaries() -> tuple[str, ...]:
    """The first line of each training module's docstring: sayings the chat set never uses."""
    lines = []
    for name in _TRAINING_MODULES:
        doc = (importlib.import_module(name).__doc__ or "").strip()
        if doc:
            lines.append(doc.splitlines()[0].strip().rstrip("."))
    return _nonempty("training", "module docstrings", lines)


def training_items(rng: random.Random, count: int) -> list[Item]:
    """Prompts of the bundled kinds from text the bundled sets never draw: functions of other
    modules to edit, other sayings to chat about, and reference passages outside both passage
    pools' lengths, cut at a paragraph. Half code, a quarter chat, an eighth each of the rest."""
    passages = [
        (topic, text[: text.rfind("\n\n", 0, 2000)] if len(text) > 5000 else text)
        for topic, text in _reference_passages(300, 10**9)
        if not 600 <= len(text) <= 5000
    ]
    shares = (count // 2, count // 4, count // 8, count - count // 2 - count // 4 - count // 8)
    code = [
        Item(f"{rng.choice(_EDIT_INSTRUCTIONS)}\n\n```python\n{src}\n```", "code_edit")
        # Up to 800 characters: answers of 128 tokens then often finish, and prompts cost less to read.
        for src in draw(rng, [f for f in _stdlib_functions(_TRAINING_MODULES) if len(f) <= 800], shares[0])
    ]
    chats = [
        Item(rng.choice(_CHAT_TEMPLATES)[1].format(line=line), "chat")
        for line in draw(rng, _module_summaries(), shares[1])
    ]
    summaries = [
        Item(f"{rng.choice(_SUMMARY_INSTRUCTIONS)}\n\n{text}", "summarize")
        for _, text in draw(rng, passages, shares[2])
    ]
    questions = [
        Item(rng.choice(_QA_TEMPLATES).format(passage=text, topic=topic.replace("-", " ")), "qa")
        for topic, text in draw(rng, passages, shares[3])
    ]
    return code + chats + summaries + questions


BUNDLED: dict[str, Callable[[random.Random, int], list[Item]]] = {
    "code_edit": code_edit,
    "summarize": summarize_items,
    "chat": chat,
    "qa": qa,
    "mixed": mixed,
}
