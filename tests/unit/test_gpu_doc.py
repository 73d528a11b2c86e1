"""Every sweep command in docs/gpu.md runs to its dry run here, on a machine without a GPU,
as written (its `-m` where the page puts it, the environment it sets before the command), and
prints the GPU servers' commands, Ray requests and estimate it promises. A command the page runs
for real (without dry_run=true) is planned here with dry_run=true added; on the stand-in GPU
cluster (tests/integration/test_gpu_cluster.py) it runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pipeline.engines.weights import model_weights
from tests.in_process import sweep_in_process

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpu.md"
SWEEP = ["python", "-m", "pipeline.sweep"]


def _commands() -> list[tuple[dict[str, str], list[str]]]:
    """The sweep commands of the page's bash blocks, continuations joined: the variables set
    before each (VAR=value python ...) and its arguments; also after `ray job submit ... --`."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            at = next((i for i in range(len(words)) if words[i : i + 3] == SWEEP), None)
            if at is None:
                continue
            before = words[:at]
            env = dict(w.split("=", 1) for w in before if re.fullmatch(r"[A-Z_]+=.*", w)) if "--" not in before else {}
            found.append((env, words[at + 3 :]))
    return found


def _argv(args: list[str]) -> tuple[bool, list[str]]:
    """Hydra's command line as the entry point parses it: `-m` must come before the overrides
    (argparse stops at the first override, and a later `-m` is an error: "unrecognized arguments")."""
    multirun = bool(args) and args[0] in ("-m", "--multirun")
    rest = args[1:] if multirun else args
    assert "-m" not in rest and "--multirun" not in rest, f"-m after an override is refused by Hydra: {args}"
    return multirun, rest


def test_the_page_has_its_commands() -> None:
    commands = _commands()
    assert len(commands) >= 4
    assert any("dry_run=true" not in args for _, args in commands)  # the run, not only its plan


@pytest.mark.parametrize(("env", "args"), _commands(), ids=lambda a: " ".join(a)[:60] if isinstance(a, list) else "")
def test_each_command_dry_runs_and_shows_the_gpu_plan(
    env: dict[str, str],
    args: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel")  # as the page's `export HF_TOKEN=...`
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the estimate's sizes, as on a machine without the hub
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    model_weights.cache_clear()
    multirun, overrides = _argv(args)
    multirun = multirun or "+sweep=nightly" in overrides
    if "dry_run=true" not in overrides:
        overrides = [*overrides, "dry_run=true"]
    code = sweep_in_process(multirun, tmp_path, overrides)
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "dry run: nothing was started." in out.out
    assert "--tensor-parallel-size 8" in out.out and "8 GPU" in out.out  # Ray asks for the TP size
    assert "hf_sentinel" not in out.out + out.err
    assert re.search(r"estimated time: ~[\d.]+ min, ~[\d.]+ GPU-hours", out.out)
    assert "past engine.startup_timeout_s" not in out.out  # the page's allowance covers its first download
    if "spec=ngram,eagle3_70b" in " ".join(args) and "load.request_rate=1,4,16" in args:
        assert "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B" in out.out and "3 server start(s)" in out.out
        assert "guessed from its name" in out.out  # said, as the page shows
        revision = next((a.split("=", 1)[1] for a in args if a.startswith("model.revision=")), None)
        if revision:
            assert f"--revision {revision} --tokenizer-revision {revision}" in out.out
            assert "--gpu-memory-utilization 0.85" in out.out


def test_the_estimates_the_page_quotes_are_the_ones_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = DOC.read_text()
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_weights.cache_clear()
    for env, args in _commands():
        multirun, overrides = _argv(args)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if "dry_run=true" not in overrides:
            continue
        assert sweep_in_process(multirun or "+sweep=nightly" in overrides, tmp_path, overrides) == 0
        out = capsys.readouterr().out
        summary = re.search(r"estimated time: (~[\d.]+ min, ~[\d.]+ GPU-hours)", out).group(1)
        assert summary in text, f"the page does not quote {summary}"


def test_a_real_gpu_run_above_the_budget_needs_its_confirmation() -> None:
    """The page's real run names run.confirmed=true: its estimate is above the default budget."""
    real = [args for _, args in _commands() if "dry_run=true" not in args]
    assert real and all("run.confirmed=true" in args for args in real)


def test_the_nightly_grid_is_the_documented_one_and_a_models_own_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sweep_in_process(True, tmp_path, ["+sweep=nightly", "dry_run=true"]) == 0
    default = capsys.readouterr().out
    labels = set(re.findall(r"point (\S+): 32 requests", default))
    assert labels == {"baseline-r1", "baseline-r4", "ngram-k3-r1", "ngram-k3-r4"} and "(code_edit," in default
    own = ["+sweep=nightly", "engine.device=gpu", "model.id=meta-llama/Llama-3.3-70B-Instruct"]
    own += ["engine.tensor_parallel_size=8", "spec=eagle3_70b", "spec.k=3", "load.request_rate=2,8", "dry_run=true"]
    assert sweep_in_process(True, tmp_path, own) == 0
    labels = set(re.findall(r"point (\S+): 32 requests", capsys.readouterr().out))
    assert labels == {"baseline-r2", "baseline-r8", "eagle3-k3-r2", "eagle3-k3-r8"}
