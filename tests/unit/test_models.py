from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pipeline.engines import models
from pipeline.engines.models import ModelError, ensure_embedded, resolve_model


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECSWEEP_CACHE", str(tmp_path))
    return tmp_path


def test_missing_path_names_the_fix(cache: Path) -> None:
    with pytest.raises(ModelError, match="does not exist; point model.id at"):
        resolve_model(str(cache / "no-such-model"))
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./no-such-model")


def test_hub_ids_and_existing_folders_pass_through(cache: Path) -> None:
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    folder = cache / "my-model"
    folder.mkdir()
    assert resolve_model(str(folder)) == str(folder)


def test_self_means_the_target() -> None:
    assert resolve_model("self", target="/models/t") == "/models/t"
    with pytest.raises(ModelError, match="only valid as a draft"):
        resolve_model("self")


def test_unknown_embedded_name_lists_choices(cache: Path) -> None:
    with pytest.raises(ModelError, match="embedded:smollm2-135m"):
        resolve_model("embedded:gpt5")


def test_embedded_build_runs_once_under_a_lock(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    running = 0
    overlap = False

    def fake_build(out: Path) -> None:
        nonlocal running, overlap
        running += 1
        overlap = overlap or running > 1
        calls.append(time.monotonic())
        time.sleep(0.3)
        (out / "config.json").write_text("{}")
        running -= 1

    monkeypatch.setattr(models, "_build_target", fake_build)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_embedded("smollm2-135m"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and not overlap
    assert len(set(results)) == 1 and (results[0] / "config.json").is_file()
    assert ensure_embedded("smollm2-135m") == results[0]  # reused, not rebuilt
    assert len(calls) == 1


def test_failed_build_leaves_nothing_half_made(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(out: Path) -> None:
        (out / "partial.bin").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(models, "_build_target", broken)
    with pytest.raises(OSError, match="disk full"):
        ensure_embedded("smollm2-135m")
    leftovers = [p for p in (cache / "models").iterdir() if p.is_dir()]
    assert leftovers == []


def test_a_pinned_hub_revision_is_part_of_the_weights_identity(tmp_path: Path) -> None:
    from pipeline.engines.models import revision

    commit = "0123456789abcdef0123456789abcdef01234567"
    assert revision("org/model", commit) == f"org/model@{commit}"  # a full commit is its own answer
    # A branch or tag names no weights: offline and uncached, it resolves to nothing (never equal).
    assert revision("org/model", "main") == "" and revision("org/model") == ""
    assert revision(str(tmp_path), "ignored") == revision(str(tmp_path))  # a folder's files are its revision
