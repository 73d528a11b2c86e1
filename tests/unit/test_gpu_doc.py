"""Every sweep command in docs/gpu.md runs to its dry run here, on a machine without a GPU,
and prints the GPU servers' commands and Ray requests it promises."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.in_process import sweep_in_process

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpu.md"


def _commands() -> list[list[str]]:
    """The `python -m pipeline.sweep` lines of the page's bash blocks, continuations joined."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words[:3] == ["python", "-m", "pipeline.sweep"]:
                found.append(words[3:])
    return found


def test_the_page_has_its_commands() -> None:
    assert len(_commands()) >= 3


@pytest.mark.parametrize("args", _commands(), ids=lambda a: " ".join(a)[:60])
def test_each_command_dry_runs_and_shows_the_gpu_plan(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel")  # as the page's `export HF_TOKEN=...`
    assert "dry_run=true" in args  # the page shows each plan before anything runs
    multirun = "-m" in args or any(a.startswith("+sweep=nightly") for a in args)
    overrides = [a for a in args if a != "-m"]
    code = sweep_in_process(multirun, tmp_path, overrides)
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "dry run: nothing was started." in out.out
    assert "--tensor-parallel-size 8" in out.out and "8 GPU" in out.out  # Ray asks for the TP size
    assert "hf_sentinel" not in out.out + out.err
    if "spec=ngram,eagle3_70b" in " ".join(args):
        assert "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B" in out.out and "--gpu-memory-utilization 0.85" in out.out
        assert "3 server start(s)" in out.out
        revision = next(a.split("=", 1)[1] for a in args if a.startswith("model.revision="))
        assert f"--revision {revision} --tokenizer-revision {revision}" in out.out
