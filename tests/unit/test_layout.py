"""The package's shape: strict layers, each importing only its own and the layers below; no
module imports one that imports it; no grab-bag modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
# The sweep's other entry point: Hydra imports the sweeper and the launcher by this namespace.
PLUGINS = ROOT / "hydra_plugins"
BENCHMARKS = ROOT / "benchmarks"  # scripts, outside the layers, named apart from the package's modules

# The layers, top first: a module imports modules of its own layer and of the layers below,
# never above. Every module of the package belongs to one; there is no list of exceptions.
LAYERS = (
    # The commands and Hydra's plugins, and the checks of a command line before anything runs.
    (
        "hydra_plugins.specsweep_launcher",
        "pipeline.sweep",
        "pipeline.gate",
        "pipeline.report",
        "pipeline.sync",
        "pipeline.ui",
        "pipeline.compose",
        "pipeline.validate",
    ),
    ("pipeline.run",),  # a sweep in motion
    ("pipeline.finish",),  # after a sweep: its report and its gate
    ("pipeline.record",),  # MLflow, the journal, result files
    ("pipeline.analysis",),  # pure computation on what it is given
    ("pipeline.engines",),  # the servers
    ("pipeline.load",),  # requests, schedules, the client
    (
        "pipeline.config",
        "pipeline.schema",
        "pipeline.identity",
        "pipeline.measures",
        "pipeline.exitcode",
        "pipeline.startup",
        "pipeline.redact",
    ),
)


def _layer(module: str) -> int | None:
    for depth, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return depth
    return None


def _modules() -> dict[str, Path]:
    found = {}
    for path in [*PIPELINE.rglob("*.py"), *PLUGINS.rglob("*.py")]:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


MODULES = _modules()
OURS = ("pipeline", "hydra_plugins")


def _imports(path: Path) -> set[str]:
    """Every module of ours this file imports: at the top, inside a function, or for types only."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(OURS):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(OURS)}
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


def test_every_module_has_a_layer() -> None:
    assert not [m for m in MODULES if m != "pipeline" and _layer(m) is None]


def test_no_module_imports_a_layer_above_its_own() -> None:
    wrong = sorted(
        (name, target)
        for name in MODULES
        if name != "pipeline"
        for target in _imports(MODULES[name])
        if target != "pipeline" and (_layer(target) or 0) < (_layer(name) or 0)
    )
    assert not wrong, f"imports that reach up a layer: {wrong}"


def test_the_layer_check_finds_an_upward_import() -> None:
    assert _layer("pipeline.record.tracking") == 3 and _layer("pipeline.run.driver") == 1
    assert _layer("pipeline.analysis.stats") > _layer("pipeline.record.windows")  # record reads into analysis's types


BASE = LAYERS[-1]
# Sub-packages with a narrower rule than their layer's, as each one's docstring states it (the
# phrase quoted here is checked to be in the docstring): what each may import, its own modules
# aside. Plumbing and progress serve every part of run, so they may not reach back into it.
SUBPACKAGE_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "pipeline.run.plumbing": ("may import the base modules only", BASE),
    "pipeline.run.progress": ("may import the base modules only", BASE),
    "pipeline.run.search": (
        "may import run's plan and outcomes, record, analysis and below, never the driver, a group or finish",
        ("pipeline.run.plan", "pipeline.run.outcomes", *(m for layer in LAYERS[3:] for m in layer)),
    ),
}


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _subpackage_breaches(imports: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for each import a sub-package's own rule forbids."""
    return sorted(
        (name, target)
        for package, (_, allowed) in SUBPACKAGE_RULES.items()
        for name, targets in imports.items()
        if _within(name, (package,))
        for target in targets
        if target != "pipeline" and not _within(target, (package, *allowed))
    )


def test_each_sub_package_keeps_its_own_rule() -> None:
    for package, (phrase, _) in SUBPACKAGE_RULES.items():
        said = " ".join((ast.get_docstring(_tree(package)) or "").split())  # as read, not as wrapped
        assert phrase in said, f"{package}'s docstring no longer says: {phrase}"
    wrong = _subpackage_breaches({name: _imports(path) for name, path in MODULES.items()})
    assert not wrong, f"imports a sub-package's docstring forbids: {wrong}"


def test_the_sub_package_check_finds_a_planted_import() -> None:
    planted = {
        "pipeline.run.search.kinds": {"pipeline.run.plan", "pipeline.record.readers", "pipeline.run.driver"},
        "pipeline.run.search.profiles": {"pipeline.finish.judge", "pipeline.run.search.strategy"},
        "pipeline.run.progress.screen": {"pipeline.config", "pipeline.run.group"},
        "pipeline.run.plumbing.entry": {"pipeline.startup", "pipeline.run.plumbing.errors", "pipeline.load.slo"},
    }
    assert _subpackage_breaches(planted) == [
        ("pipeline.run.plumbing.entry", "pipeline.load.slo"),
        ("pipeline.run.progress.screen", "pipeline.run.group"),
        ("pipeline.run.search.kinds", "pipeline.run.driver"),
        ("pipeline.run.search.profiles", "pipeline.finish.judge"),
    ]


def test_analysis_is_pure() -> None:
    """Reading MLflow is the record stage's job; analysis computes on what it is given."""
    for name, path in MODULES.items():
        if name.startswith("pipeline.analysis."):
            tree = ast.parse(path.read_text())
            roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert "mlflow" not in roots and "ray" not in roots, f"{name} imports MLflow or Ray"


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text())


def test_every_package_says_what_it_may_import() -> None:
    """A package's docstring is its rule, one phrase the same everywhere ("...; may import the
    base modules only"): a reader learns what it may use before opening its modules."""
    packages = [name for name, path in MODULES.items() if path.name == "__init__.py"]
    assert "pipeline.run.search" in packages and "hydra_plugins.specsweep_launcher" in packages
    silent = [n for n in packages if not re.search(r"\bmay import\b", ast.get_docstring(_tree(n)) or "")]
    assert not silent, f"say what each may import: {silent}"


def test_there_is_no_utils() -> None:
    # Modules are split by concept, not by a line count (a 400-line module that does one thing
    # beats three that share one): no size cap, but no grab-bag either.
    assert not [p for p in MODULES.values() if "util" in p.stem], "no utils modules: name a module after its one job"


def test_no_two_modules_share_a_name() -> None:
    """``pipeline.analysis.capacity`` and ``pipeline.run.search.capacity`` would read the same in
    a traceback and an import line: every module, package and benchmark has a name of its own."""
    stems: dict[str, list[str]] = {}
    for name in MODULES:
        if name != "pipeline":
            stems.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    # The benchmarks run as scripts (``python benchmarks/x.py``), but a traceback names them too.
    for path in BENCHMARKS.glob("*.py"):
        stems.setdefault(path.stem, []).append(f"benchmarks.{path.stem}")
    assert not {stem: names for stem, names in stems.items() if len(names) > 1}


# Names that mean the same thing wherever they are defined: a command's entry point, and the
# helpers each engine's module provides behind the Engine interface (engines/vllm.py and
# engines/sglang.py each have their own build_launch, validate_spec, ...).
SAME_PART = {"main"}
PER_ENGINE = {"pipeline.engines.vllm", "pipeline.engines.sglang"}


def _public_names(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")}


def test_no_two_public_functions_or_classes_share_a_name() -> None:
    owners: dict[str, set[str]] = {}
    for name in MODULES:
        for public in _public_names(name) - SAME_PART:
            owners.setdefault(public, set()).add(name)
    clashes = {k: sorted(v) for k, v in owners.items() if len(v) > 1 and not v <= PER_ENGINE}
    assert not clashes, f"one name, two things: {clashes}"
    # The engines' twins are the same part, so each engine module has every one of them.
    twins = {k for k, v in owners.items() if v == PER_ENGINE}
    assert twins and all(twins <= _public_names(m) for m in PER_ENGINE)


# The figure renderers draw one specification each way (PNG, Plotly): their private helpers
# are the same part, as the engines' public twins are.
RENDERERS = {"pipeline.analysis.plots", "pipeline.analysis.iplots"}


def _private_clashes(functions: dict[str, set[str]]) -> dict[str, list[str]]:
    """Private module-level functions (by module) that share a name with another module's."""
    owners: dict[str, set[str]] = {}
    for module, names in functions.items():
        for function in names:
            owners.setdefault(function, set()).add(module)
    return {k: sorted(v) for k, v in owners.items() if len(v) > 1 and not v <= RENDERERS}


def test_no_two_private_functions_share_a_name() -> None:
    """Two ``_collect`` read alike in a traceback and a search: a private helper says what it does."""
    functions = {
        name: {
            n.name
            for n in ast.parse(path.read_text()).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_") and n.name[1] != "_"
        }
        for name, path in MODULES.items()
    }
    assert not _private_clashes(functions), f"one private name, two things: {_private_clashes(functions)}"
    planted = {"a.regression": {"_collect"}, "a.loadgen": {"_collect"}, **{m: {"_chart"} for m in RENDERERS}}
    assert _private_clashes(planted) == {"_collect": ["a.loadgen", "a.regression"]}


def _named_like_a_module(functions: dict[str, set[str]], modules: set[str]) -> list[str]:
    """Public functions (by module) that share a name with another module or package: the
    module's own name is its one job (``validate.validate``), another's is a second meaning."""
    return sorted(
        f"{owner}.{function}"
        for owner, names in functions.items()
        for function in names
        if any(m.rsplit(".", 1)[-1] == function and m != owner for m in modules)
    )


def test_no_function_is_named_like_another_module() -> None:
    """``judge`` the function and ``pipeline.finish.judge`` the module would read the same in
    an import line: a function says what it does."""
    functions = {
        name: {
            n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for name, path in MODULES.items()
    }
    functions = {name: {f for f in found if not f.startswith("_")} for name, found in functions.items()}
    assert not _named_like_a_module(functions, set(MODULES) - {"pipeline"})
    caught = _named_like_a_module({"a.regression": {"judge"}, "a.judge": {"judge"}}, {"a.judge", "a.regression"})
    assert caught == ["a.regression.judge"]


MAX_LINES = 60  # with ruff's C901 and PLR0912 at 12 (pyproject.toml): a function does one thing


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = sorted(
        f"{path.relative_to(PIPELINE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_LINES
    )
    assert not long, f"split these by what each part does: {long}"


# What a module may call while it is imported: definitions (a dataclass, Hydra's main), the
# typing and logging objects every module may make, immutable constants, and a record of the
# package's own types built as a constant. Anything else (a registry written, a handler set, a
# file read) belongs in a function an entry point calls (pipeline/startup.py).
IMPORT_TIME_CALLS = {
    "dataclass",
    "hydra.main",
    "TypeVar",
    "logging.getLogger",
    "frozenset",
    "MappingProxyType",
    "re.compile",
    "Version",
    "msgspec.json.Decoder",
    "Path",
    "str",
}
IMPORT_TIME_METHODS = {"values", "resolve"}  # a constant mapping's values; a path made absolute
OWN_CLASSES = {
    node.name
    for path in MODULES.values()
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, ast.ClassDef)
}


def _dotted(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_dotted(func.value)}.{func.attr}"
    return type(func).__name__


def _runs_at_import(statement: ast.stmt) -> list[ast.AST]:
    """The parts of a module-level statement Python evaluates on import: a definition's
    decorators, bases and defaults, not its body; nothing under ``if __name__ == "__main__"``."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*statement.decorator_list, *statement.args.defaults, *filter(None, statement.args.kw_defaults)]
    if isinstance(statement, ast.ClassDef):
        return [*statement.decorator_list, *statement.bases, *statement.keywords]
    if isinstance(statement, ast.If) and ast.unparse(statement.test) == "__name__ == '__main__'":
        return []
    return [statement]


def _import_time_calls(source: str) -> list[str]:
    """Each call made at import that is not a harmless one: its line and callee."""
    found = []
    for statement in ast.parse(source).body:
        for part in _runs_at_import(statement):
            for node in ast.walk(part):
                if not isinstance(node, ast.Call):
                    continue
                name = _dotted(node.func)
                method = isinstance(node.func, ast.Attribute) and node.func.attr in IMPORT_TIME_METHODS
                if not (name in IMPORT_TIME_CALLS or name in OWN_CLASSES or method):
                    found.append(f"{node.lineno} {name}")
    return found


def test_importing_a_module_does_nothing() -> None:
    """An import has no side effect (no registry written, no signal handler set): each entry
    point sets its process up when it runs."""
    calls = {name: found for name, path in MODULES.items() if (found := _import_time_calls(path.read_text()))}
    assert not calls, f"calls made at import: {calls}"


def test_the_import_check_finds_a_call() -> None:
    assert _import_time_calls("import x\nx.setup()\n") == ["2 x.setup"]
    assert _import_time_calls("@lru_cache()\ndef f() -> None:\n    pass\n") == ["1 lru_cache"]
    assert _import_time_calls("def f(x: int = g()) -> None:\n    pass\n") == ["1 g"]
    harmless = (
        "@dataclass(frozen=True)\nclass A:\n    x: int = field(default=1)\n"
        "LOG = logging.getLogger(__name__)\nT = TypeVar('T')\nKEYS = frozenset(M.values())\n"
        "def main() -> None:\n    run()\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    assert _import_time_calls(harmless) == []
