"""The project documents itself: no pointer outside the repository, and every link and
module path its pages name exists."""

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
