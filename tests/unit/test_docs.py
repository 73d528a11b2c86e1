"""The project documents itself: no pointer outside the repository, every link and module
path its pages name exists, and docs/contributing.md's layout names every module."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Files that live outside any checkout of this repository: a design note beside it, the
# machine it was written on.
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|/work/|shared/DESIGN")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [REPO / f for f in out.splitlines() if (REPO / f).is_file() and f != "tests/unit/test_docs.py"]


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for path in _tracked():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}"
            for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line)
        ]
    assert not found, "\n".join(found)


def test_the_pages_for_users_exist() -> None:
    names = {p.name for p in PAGES}
    assert {"metrics.md", "measurement.md", "methods.md", "cluster.md"} <= names


def test_every_relative_link_and_named_module_exists() -> None:
    missing = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
                missing.append(f"{page.name}: link {target}")
        for module in set(re.findall(r"`((?:pipeline|tests|benchmarks|deploy|conf|sweeps)/[\w./-]+)`", text)):
            if not (REPO / module.split("::")[0]).exists():
                missing.append(f"{page.name}: {module}")
    assert not missing, missing


GROUPS = (
    "engine",
    "spec",
    "load",
    "workload",
    "slo",
    "tracking",
    "gate",
    "stats",
    "repeats",
    "lossless",
    "ray",
    "predict",
    "capacity",
    "model",
    "aa",
    "search",
    "run",
)


def _settings() -> set[str]:
    """Every `group.key` of the schema, and every top-level key."""
    import dataclasses

    from pipeline.config import JobConfig

    names = set()
    for f in dataclasses.fields(JobConfig):
        names.add(f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            names |= {f"{f.name}.{g.name}" for g in dataclasses.fields(default)}
    return names


def test_every_setting_a_page_names_exists() -> None:
    """A `group.key` in a page is a setting of the schema, or a name the code records (an MLflow
    tag such as gate.verdict): a renamed or imagined setting fails here."""
    settings = _settings()
    source = "\n".join(p.read_text() for p in (REPO / "pipeline").rglob("*.py"))
    pattern = re.compile(rf"`\+?((?:{'|'.join(GROUPS)})\.[a-z_]+)")
    missing = []
    for page in PAGES:
        for name in set(pattern.findall(page.read_text())):
            if name not in settings and f'"{name}' not in source:
                missing.append(f"{page.name}: {name}")
    assert not missing, sorted(missing)


def test_every_make_target_a_page_names_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    missing = []
    for page in PAGES:
        for target in set(re.findall(r"(?:`|^|\|\| |&& )make ([a-z][\w-]*)", page.read_text(), flags=re.M)):
            if target not in targets:
                missing.append(f"{page.name}: make {target}")
    assert not missing, sorted(missing)


CONTRIBUTING = REPO / "docs" / "contributing.md"
# A line of the layout block that opens an entry: a folder (``pipeline/``, ``  run/``,
# ``    search/``) at the start, indented by its depth; the lines under it go on at column 13.
ENTRY = re.compile(r"^( {0,4})([\w.-]+(?:/[\w.-]+)*/)(?:\s|$)")


def _layout_entries(text: str) -> dict[str, str]:
    """The layout block's entries: each folder's path (``pipeline/run/search/``) and its text."""
    block = text.split("```", 2)[1]
    entries: dict[str, str] = {}
    parents: dict[int, str] = {}  # indent -> the folder open at that depth
    current = ""
    for line in block.splitlines():
        found = ENTRY.match(line)
        if found:
            indent, folder = len(found.group(1)), found.group(2)
            current = parents.get(indent - 2, "") + folder if indent else folder
            parents[indent] = current
            entries[current] = ""
        if current:
            entries[current] += line + "\n"
    return entries


def _unnamed_modules(entries: dict[str, str], modules: list[str]) -> list[str]:
    """Each module (a path from the repository root) its folder's entry does not name."""
    missing = []
    for module in modules:
        folder, name = module.rsplit("/", 1)
        said = entries.get(folder + "/", "")
        if not re.search(rf"(?<![\w.]){re.escape(name)}\b", said):
            missing.append(module)
    return missing


def test_contributing_names_every_module_in_its_folders_entry() -> None:
    modules = sorted(
        str(path.relative_to(REPO))
        for root in ("pipeline", "benchmarks")
        for path in (REPO / root).rglob("*.py")
        if path.name != "__init__.py"
    )
    missing = _unnamed_modules(_layout_entries(CONTRIBUTING.read_text()), modules)
    assert not missing, f"docs/contributing.md's layout does not name these in their folder's entry: {missing}"


def test_the_module_check_reads_each_folder_on_its_own() -> None:
    layout = (
        "```\n"
        "pipeline/    sweep.py (the command)\n"
        "             config.py\n"
        "  run/       plan.py  driver.py\n"
        "    search/  kinds.py\n"
        "  load/      client.py\n"
        "benchmarks/  capacity.py\n"
        "```\n"
    )
    entries = _layout_entries(layout)
    assert set(entries) == {"pipeline/", "pipeline/run/", "pipeline/run/search/", "pipeline/load/", "benchmarks/"}
    modules = [
        "pipeline/config.py",
        "pipeline/run/plan.py",
        "pipeline/run/search/kinds.py",
        "pipeline/run/search/plan.py",  # named, but in run/'s entry, not search/'s
        "pipeline/analysis/capacity.py",  # named, but in benchmarks/'s entry
        "pipeline/load/client.py",
        "pipeline/load/sse.py",
    ]
    assert _unnamed_modules(entries, modules) == [
        "pipeline/run/search/plan.py",
        "pipeline/analysis/capacity.py",
        "pipeline/load/sse.py",
    ]
