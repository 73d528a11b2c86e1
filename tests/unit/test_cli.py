"""The entry point refuses bad input before any server starts, naming the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.in_process import sweep_in_process


def _sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", f"hydra.run.dir={tmp_path}/out", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prints_exact_commands_and_starts_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.sweep",
            f"hydra.run.dir={tmp_path}/out",
            "dry_run=true",
            "spec.k=5",
            "engine.env_from=[HF_TOKEN]",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "SPECSWEEP_CACHE": str(cache), "HF_TOKEN": "hf_secret_value"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "server 1/2 baseline" in out and "server 2/2 speculative (ngram k=5)" in out
    assert '"num_speculative_tokens":5' in out and "--port <free port>" in out
    assert "vllm.entrypoints.openai.api_server" in out and "estimated time" in out
    assert "hf_secret_value" not in out and "HF_TOKEN=<from the environment>" in out
    assert not (cache / "models").exists()  # no model was built
    assert not (tmp_path / "out" / "01-baseline").exists() and not (tmp_path / "mlruns").exists()


def _multirun(tmp_path: Path, *overrides: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", "-m", f"hydra.sweep.dir={tmp_path}/multi", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[int, str, str]:
    """A sweep's plan as its dry run prints it, in this process (composed and driven as the
    entry point does, tests/in_process.py): the plan's logic, without an interpreter's start.
    The command line's own contract (Hydra, the sweeper, exit codes) is the subprocess tests'."""
    code = sweep_in_process(True, tmp_path, list(overrides))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_multirun_dry_run_plans_one_server_per_k_and_one_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _dry_run(tmp_path, capsys, "spec.k=3,5,7", "load.request_rate=1,2", "dry_run=true")
    assert code == 0, err[-2000:]
    assert "4 server start(s), 8 measured point(s)" in out
    assert out.count("server ") >= 4 and "server 4/4 speculative (ngram k=7)" in out
    assert "point baseline-r1" in out and "point ngram-k7-r2" in out and '"num_speculative_tokens":7' in out
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize(
    ("overrides", "message", "code"),
    [
        # Bad input (exit 2) is the table's (test_bad_input.py): these are the other exits.
        (["tracking.uri=http://127.0.0.1:9"], "does not answer", 4),  # infrastructure, not input
    ],
)
def test_multirun_refusals_outside_the_input_table(
    tmp_path: Path, overrides: list[str], message: str, code: int
) -> None:
    proc = _multirun(tmp_path, "spec.k=3", *overrides)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-3000:]
    # Nothing was launched: a group writes its server's command before it starts it.
    assert not list((tmp_path / "multi").rglob("server.log"))
    assert not list((tmp_path / "multi").rglob("server_command.txt"))


def test_multirun_dead_ray_address_fails_within_its_deadline(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    proc = _multirun(tmp_path, f"ray.address=127.0.0.1:{port}", "ray.connect_timeout_s=3")
    assert proc.returncode == 4, proc.stderr[-2000:]  # infrastructure, not input
    assert f"ray.address=127.0.0.1:{port} is not reachable within 3 s" in proc.stderr
    assert time.monotonic() - started < 90
    assert not list((tmp_path / "multi").rglob("server_command.txt"))  # nothing was launched


def test_dry_run_across_engines_prints_both_engines_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _dry_run(
        tmp_path,
        capsys,
        "engine=vllm,sglang",
        "spec=eagle3_8b,ngram",
        "spec.k=3,5",
        "model.id=meta-llama/Llama-3.1-8B-Instruct",
        "dry_run=true",
    )
    assert code == 0, err[-3000:]
    assert "10 server start(s)" in out  # a baseline per engine, 4 speculative servers per engine
    assert "-m sglang.launch_server" in out and "--speculative-algorithm EAGLE3" in out
    assert "--speculative-algorithm NGRAM --speculative-num-steps 5 --speculative-eagle-topk 1" in out
    assert "--speculative-num-draft-tokens 6" in out and "--enable-metrics" in out
    assert '"method":"eagle3"' in out and "not installed here: flags as recorded for SGLang 0.5.23" in out


def test_a_gpu_sweeps_dry_run_works_from_a_machine_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a user plans their cluster's sweep from a laptop: the GPU commands and Ray requests."""
    code, out, err = _dry_run(
        tmp_path,
        capsys,
        "engine.device=gpu",
        "engine.tensor_parallel_size=2",
        "spec.k=3",
        "+ray.resources_per_group.gpu_node=1",
        "dry_run=true",
    )
    assert code == 0, err[-3000:]
    assert "--tensor-parallel-size 2" in out and "--enforce-eager" not in out  # compiled, as on GPUs
    assert out.count("Ray request (the default launcher): 0 CPU, 2 GPU, gpu_node=1") == 2
    # Not a dry run, and its groups run in this process (no Ray cluster named): this machine is
    # where they run, and it has no GPU: refused, naming the way to a machine that has one.
    real = _dry_run(tmp_path, capsys, "engine.device=gpu", "spec.k=3", "sweep_name=real")
    assert real[0] == 2 and "needs 1 GPU(s) (engine.tensor_parallel_size=1), but this machine has 0" in real[2]
    assert "run the sweep on a Ray cluster" in real[2]


def test_your_own_method_group_sweeps_beside_ngram_as_docs_methods_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = tmp_path / "my_conf" / "spec"
    own.mkdir(parents=True)
    (own / "eagle3_70b.yaml").write_text("method: eagle3\nk: 3\ndraft_model: yuhuili/EAGLE3-LLaMA3.3-Instruct-70B\n")
    proc = _multirun(
        tmp_path,
        f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]",
        "engine.device=gpu",
        "model.id=meta-llama/Llama-3.3-70B-Instruct",
        "spec=ngram,eagle3_70b",
        "dry_run=true",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 server start(s)" in proc.stdout and '"model":"yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"' in proc.stdout
    wrong = _dry_run(tmp_path, capsys, "spec=ngram,eagle3", "spec.draft_model=/heads/x", "dry_run=true")
    assert wrong[0] == 2 and "put the draft in that method's own group" in wrong[2]


def test_the_embedded_head_with_another_model_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """spec=eagle3 is the embedded model's head: with a hub model it exits 2 naming both, in the
    dry run as in a real run, and before the head (ten minutes of training) is built."""
    for dry in ("true", "false"):
        code, _, err = _dry_run(
            tmp_path, capsys, "spec=eagle3", "model.id=meta-llama/Llama-3.1-8B-Instruct", f"dry_run={dry}"
        )
        assert code == 2, err[-2000:]
        assert "spec.draft_model=embedded:smollm2-135m-eagle3 is made for the embedded model" in err
        assert "but model.id=meta-llama/Llama-3.1-8B-Instruct" in err


def test_the_hydra_plugins_import_the_driver_only_when_a_sweep_runs() -> None:
    """Hydra imports every plugin at start-up, a refused command line included: the driver and
    what only it needs (MLflow, pandas, scipy, plotly, Ray, matplotlib) are imported once the
    command line is accepted, not by the plugins' modules."""
    heavy = ["pipeline.run.driver", "mlflow", "pandas", "scipy", "plotly", "ray", "matplotlib"]
    code = (
        "import sys, hydra_plugins.specsweep_launcher.sweeper, hydra_plugins.specsweep_launcher.ray_launcher; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
