"""Engines behind one interface: every engine meets it, and nothing outside engines/ asks an
engine's name what to do."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipeline.config import ConfigError, EngineConfig, JobConfig
from pipeline.engines.engine import Engine
from pipeline.engines.registry import ENGINES, emits_k_schedule, engine_named, report_note

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
NAMES = {"vllm", "sglang", "external"}


def _members(protocol: type) -> set[str]:
    own = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
    return {m for m in own if not m.startswith("_")}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_meets_the_interface(name: str) -> None:
    engine = ENGINES[name]
    assert engine.name == name
    missing = [m for m in sorted(_members(Engine)) if not hasattr(engine, m)]
    assert not missing, f"{type(engine).__name__} lacks {missing}"


def test_the_registry_names_every_engine_once() -> None:
    assert set(ENGINES) == NAMES
    with pytest.raises(ConfigError, match="engine=tgi is not an engine; choose one of"):
        engine_named("tgi")


def test_what_each_engine_does_differently_comes_from_its_object() -> None:
    cold, remote = EngineConfig(), EngineConfig(host="0.0.0.0", allow_remote=True)
    assert ENGINES["vllm"].resets_cache(cold) and not ENGINES["vllm"].resets_cache(remote)  # dev mode: loopback only
    assert ENGINES["sglang"].resets_cache(remote)
    assert not ENGINES["external"].resets_cache(dataclasses.replace(cold, prefix_cache="as_is"))
    assert "generate" in ENGINES["sglang"].endpoints and "generate" not in ENGINES["vllm"].endpoints
    assert not ENGINES["external"].starts_servers and ENGINES["external"].reset_path is None
    assert emits_k_schedule("vllm") and not emits_k_schedule("sglang") and not emits_k_schedule("retired-engine")
    assert report_note("vllm") is None and "SGLang" in (report_note("sglang") or "")
    # The default engine's runs keep the names they had before there was another engine.
    assert [ENGINES[n].run_prefix for n in ("vllm", "sglang", "external")] == ["", "sglang-", "external-"]


def test_each_engine_refuses_what_is_its_own_to_refuse() -> None:
    given_url = JobConfig(engine=EngineConfig(url="http://127.0.0.1:9"))
    for name in ("vllm", "sglang"):
        with pytest.raises(ConfigError, match="engine.url is for engine=external"):
            ENGINES[name].check(dataclasses.replace(given_url, engine=dataclasses.replace(given_url.engine, name=name)))
        ENGINES[name].check(JobConfig())
    with pytest.raises(ConfigError, match="engine=external needs engine.url"):
        ENGINES["external"].check(JobConfig())


@pytest.mark.parametrize("name", ["vllm", "external"])
def test_where_the_counters_are_the_whole_story_the_window_acceptance_is_theirs(name: str) -> None:
    from pipeline.engines.acceptance import Acceptance, Scrape, WindowAcceptance

    counters = Acceptance(source="vllm-v1-counters", num_drafts=3.0, acceptance_length=2.5)
    on_scale = ENGINES[name].window_acceptance([], counters, Scrape(), "http://127.0.0.1:9")
    assert on_scale == WindowAcceptance(2.5, "vllm-v1-counters")


def test_a_dry_run_label_and_version_note_come_from_the_engine() -> None:
    from packaging.version import Version

    from pipeline.engines.engine import Target
    from pipeline.engines.sglang import RECORDED_VERSION, recorded

    target = Target(recorded("/venv/bin/python", installed=False), False, "model", None)
    note = ENGINES["sglang"].version_note(target)
    assert note == f" (not installed here: flags as recorded for SGLang {RECORDED_VERSION})"
    assert ENGINES["sglang"].label == "SGLang" and ENGINES["vllm"].label == "vLLM"
    # The flags were recorded from a real SGLang release, and the note prints it as parsed.
    assert Version(str(RECORDED_VERSION)) >= Version("0.5") and str(RECORDED_VERSION) in note
    assert JobConfig().engine.name in ENGINES


def _name_branches(path: Path, root: Path = PIPELINE.parent) -> list[str]:
    """Comparisons of a value with an engine's name, and isinstance checks of an engine's install."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value in NAMES for s in sides):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            text = ast.unparse(node)
            if any(kind in text for kind in ("VllmInstall", "SglangInstall", "ExternalInstall")):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_nothing_outside_engines_branches_on_an_engines_name() -> None:
    outside = [p for p in PIPELINE.rglob("*.py") if "engines" not in p.relative_to(PIPELINE).parts]
    found = [hit for p in outside for hit in _name_branches(p)]
    assert not found, f"ask the engine object (pipeline/engines/registry.py) instead: {found}"


def test_nothing_outside_engines_reads_sglangs_own_records() -> None:
    """A window's acceptance reaches the sweep as a WindowAcceptance, whatever served it."""
    own = ("pipeline.engines.sglang", "pipeline.engines.sglang_acceptance")
    outside = [p for p in PIPELINE.rglob("*.py") if "engines" not in p.relative_to(PIPELINE).parts]
    found = [
        f"{p.relative_to(PIPELINE.parent)}:{node.lineno}"
        for p in outside
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module in own
    ]
    assert not found, f"read WindowAcceptance (pipeline/engines/acceptance.py) instead: {found}"


def test_the_name_check_finds_a_branch(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def f(name, install):\n    return name == "sglang" or isinstance(install, SglangInstall)\n')
    assert _name_branches(probe, tmp_path) == ["probe.py:2", "probe.py:2"]


def test_extra_args_are_checked_against_the_engines_own_flags() -> None:
    from pipeline.config import ConfigError
    from pipeline.engines.engine import check_extra_args

    flags = frozenset({"--max-num-seqs", "--enable-prefix-caching", "--no-enable-prefix-caching"})
    # Values and short flags pass; vLLM's parser reads --max_num_seqs as --max-num-seqs.
    check_extra_args(["--max-num-seqs", "8", "-O3", "--max_num_seqs=4"], flags, "vLLM 0.32.0", dashes=True)
    with pytest.raises(ConfigError, match="--max_num_seqs, which the installed SGLang"):
        check_extra_args(["--max_num_seqs=4"], flags, "SGLang 0.5", dashes=False)  # SGLang's parser does not
    with pytest.raises(ConfigError, match="did you mean --max-num-seqs"):
        check_extra_args(["--max-num-seq", "8"], flags, "vLLM 0.32.0", dashes=True)
