"""The package's shape: stages import downward, no module imports one that imports it, files stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"

# What each stage may import from the rest of the package (besides itself and the config).
ALLOWED = {
    "load": (),
    "engines": ("pipeline.load", "pipeline.record.redact"),
    "analysis": ("pipeline.engines.acceptance",),
}
CONFIG = ("pipeline.config", "pipeline.compose", "pipeline.validate")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PIPELINE.rglob("*.py"):
        name = ".".join(path.relative_to(PIPELINE.parent).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every pipeline module this file imports: at the top, inside a function, or for types only."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline")}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt in graph and not state.get(nxt):
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node):
            found = visit(node)
            if found:
                return found
    return None


def test_no_module_imports_one_that_imports_it() -> None:
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_lower_stages_import_only_below_themselves(stage: str) -> None:
    allowed = (f"pipeline.{stage}", *CONFIG, *ALLOWED[stage])
    wrong = {
        (name, target)
        for name, path in MODULES.items()
        if name.startswith(f"pipeline.{stage}.")
        for target in _imports(path)
        if target != "pipeline" and not any(target == a or target.startswith(a + ".") for a in allowed)
    }
    assert not wrong, f"pipeline/{stage}/ reaches up or across: {sorted(wrong)}"


def test_analysis_is_pure() -> None:
    """Reading MLflow is the record stage's job; analysis computes on what it is given."""
    for name, path in MODULES.items():
        if name.startswith("pipeline.analysis."):
            tree = ast.parse(path.read_text())
            roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert "mlflow" not in roots and "ray" not in roots, f"{name} imports MLflow or Ray"


def test_there_is_no_utils() -> None:
    # Modules are split by concept, not by a line count (a 400-line module that does one thing
    # beats three that share one): no size cap, but no grab-bag either.
    assert not [p for p in MODULES.values() if "util" in p.stem], "no utils modules: name a module after its one job"
