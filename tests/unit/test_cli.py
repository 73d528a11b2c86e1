"""The entry point refuses bad input before any server starts, naming the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", f"hydra.run.dir={tmp_path}/out", *overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["spec.method=lookahead"], "choose one of: none, ngram, draft"),
        (["spec.k=0"], "spec.k=0 is not valid"),
        (["spec=draft", "spec.draft_model=null"], "needs spec.draft_model"),
        (["load.request_rate=0"], "load.request_rate=0"),
        (["model.id=/no/such/model"], "model path /no/such/model does not exist"),
        (["spec=draft", "spec.draft_model=./missing-draft"], "does not exist"),
        (["engine.python=/no/such/python"], "engine.python=/no/such/python does not exist"),
    ],
)
def test_bad_input_exits_2_without_starting_a_server(tmp_path: Path, overrides: list[str], message: str) -> None:
    proc = _sweep(tmp_path, *overrides)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not (tmp_path / "out" / "baseline").exists()  # no server was started


def test_misspelled_key_is_refused_by_hydra(tmp_path: Path) -> None:
    proc = _sweep(tmp_path, "spec.kk=3")
    assert proc.returncode != 0 and "spec.kk" in proc.stderr


def test_dry_run_prints_exact_commands_and_starts_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", f"hydra.run.dir={tmp_path}/out", "dry_run=true",
         "spec.k=5", "+engine.env.HF_TOKEN=hf_secret_value"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "SPECSWEEP_CACHE": str(cache)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "server 1/2 baseline" in out and "server 2/2 speculative (ngram k=5)" in out
    assert '"num_speculative_tokens":5' in out and "--port <free port>" in out
    assert "vllm.entrypoints.openai.api_server" in out and "estimated time" in out
    assert "hf_secret_value" not in out and "HF_TOKEN=***" in out
    assert not (cache / "models").exists()  # no model was built
    assert not (tmp_path / "out" / "baseline").exists() and not (tmp_path / "mlruns").exists()
