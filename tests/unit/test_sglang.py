"""SGLang: command lines for every method and option, refusals before launch, and acceptance
through SGLang's native streaming protocol (a scripted server, the real client)."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
from packaging.version import Version

from pipeline.config import ConfigError, EngineConfig, JobConfig, SpecConfig, WorkloadConfig
from pipeline.engines import sglang
from pipeline.engines.acceptance import (
    Acceptance,
    WindowAcceptance,
    alpha_from_length,
    expected_length,
    normalized,
    parse_scrape,
)
from pipeline.engines.engine import EngineNotInstalled
from pipeline.engines.registry import ENGINES
from pipeline.engines.sglang_acceptance import SglangAcceptance, server_info_accept_length, sglang_acceptance
from pipeline.load.client import ClientOptions
from pipeline.load.items import Request
from pipeline.load.loadgen import run_window
from pipeline.validate import validate
from tests.fakes import FakeServer, generate_script

INSTALL = sglang.recorded("/env/sglang/bin/python", installed=True)


def _cmd(spec: SpecConfig, draft: str | None = None, engine: EngineConfig | None = None) -> list[str]:
    sglang.validate_spec(spec, INSTALL)
    return sglang.build_launch(
        install=INSTALL,
        engine=engine or EngineConfig(name="sglang"),
        spec=spec,
        model_path="/m",
        draft_path=draft,
        served_name="served",
        port=30000,
        seed=7,
    ).command


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_baseline_command_has_metrics_and_no_speculation() -> None:
    cmd = _cmd(SpecConfig(method="none", k=0))
    assert cmd[:3] == ["/env/sglang/bin/python", "-m", "sglang.launch_server"]
    assert _flag(cmd, "--model-path") == "/m" and _flag(cmd, "--host") == "127.0.0.1"
    assert _flag(cmd, "--port") == "30000" and _flag(cmd, "--random-seed") == "7"
    assert _flag(cmd, "--context-length") == "2048" and "--enable-metrics" in cmd
    assert not [a for a in cmd if a.startswith("--speculative")]


@pytest.mark.parametrize(
    ("method", "algorithm", "draft"),
    [
        ("eagle", "EAGLE", "/head"),
        ("eagle3", "EAGLE3", "/head3"),
        ("draft", "STANDALONE", "/small"),
        ("ngram", "NGRAM", None),
        ("mtp", "NEXTN", None),
    ],
)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_every_method_maps_to_its_algorithm_with_the_default_chain(
    method: str, algorithm: str, draft: str | None, k: int
) -> None:
    cmd = _cmd(SpecConfig(method=method, k=k, draft_model=draft), draft)
    assert _flag(cmd, "--speculative-algorithm") == algorithm
    assert _flag(cmd, "--speculative-num-steps") == str(k)
    assert _flag(cmd, "--speculative-eagle-topk") == "1"
    assert _flag(cmd, "--speculative-num-draft-tokens") == str(k + 1)  # SGLang's rule at topk 1
    if draft:
        assert _flag(cmd, "--speculative-draft-model-path") == draft
    else:
        assert "--speculative-draft-model-path" not in cmd
    assert {a for a in cmd if a.startswith("--")} <= sglang.RECORDED_FLAGS


def test_tree_options_and_ngram_options_pass_through() -> None:
    cmd = _cmd(
        SpecConfig(method="eagle3", k=3, draft_model="/h", options={"eagle_topk": 4, "num_draft_tokens": 8}), "/h"
    )
    assert _flag(cmd, "--speculative-eagle-topk") == "4" and _flag(cmd, "--speculative-num-draft-tokens") == "8"
    options = {
        "min_match_window_size": 2,
        "max_match_window_size": 6,
        "min_bfs_breadth": 1,
        "max_bfs_breadth": 8,
        "match_type": "PROB",
        "branch_length": 18,
        "capacity": 100000,
    }
    cmd = _cmd(SpecConfig(method="ngram", k=4, options=options))
    for key, flag in sglang.NGRAM_OPTIONS.items():
        assert _flag(cmd, flag) == str(options[key])
    engine = EngineConfig(name="sglang", tensor_parallel_size=2, prefix_cache="off", extra_args=["--x", "1"])
    cmd = _cmd(SpecConfig(method="ngram", k=3), engine=engine)
    assert _flag(cmd, "--tp-size") == "2" and "--disable-radix-cache" in cmd and cmd[-2:] == ["--x", "1"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SpecConfig(method="medusa", k=3, draft_model="/h"), "SGLang has no method 'medusa'"),
        (SpecConfig(method="suffix", k=3), "use engine=vllm"),
        (SpecConfig(method="eagle", k=3, draft_model="/h", options={"num_draft_tokens": 6}), "conflicts with spec.k=3"),
        (
            SpecConfig(method="eagle", k=2, draft_model="/h", options={"eagle_topk": 2, "num_draft_tokens": 9}),
            "exceeds",
        ),
        (SpecConfig(method="ngram", k=3, options={"prompt_lookup_max": 4}), "not SGLang options"),
        (SpecConfig(method="draft", k=3, draft_model="/d", options={"capacity": 10}), "not SGLang options"),
    ],
)
def test_contradictions_and_missing_methods_are_refused_before_launch(spec: SpecConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sglang.validate_spec(spec, INSTALL)


def test_version_awareness_names_the_installed_version() -> None:
    old = sglang.parse_probe(
        "/py",
        {
            "version": "0.4.3",
            "flags": sorted(sglang.RECORDED_FLAGS - {"--speculative-ngram-min-match-window-size"}),
            "algorithms": ["EAGLE", "NEXTN"],
        },
    )
    assert old.flags_source == "parser" and old.version == Version("0.4.3")
    with pytest.raises(ConfigError, match=r"NGRAM, which SGLang 0.4.3 lacks \(it has: EAGLE, NEXTN\)"):
        sglang.validate_spec(SpecConfig(method="ngram", k=3), old)
    with pytest.raises(ConfigError, match="SGLang 0.4.3 has no --speculative-ngram-min-match-window-size"):
        sglang.build_launch(
            install=dataclasses.replace(old, algorithms=frozenset({"NGRAM"})),
            engine=EngineConfig(name="sglang"),
            spec=SpecConfig(method="ngram", k=3, options={"min_match_window_size": 2}),
            model_path="/m",
            draft_path=None,
            served_name="s",
            port=1,
            seed=0,
        )
    # Installed, but its parser cannot import here (no CUDA): the recorded flags, said so.
    fallback = sglang.parse_probe("/py", {"version": "0.5.23", "flags": None, "error": "no CUDA"})
    assert fallback.flags_source == "recorded" and fallback.installed


def test_missing_sglang_and_cpu_only_machines_get_the_way_out() -> None:
    with pytest.raises(EngineNotInstalled, match="SGLang is not installed.*engine.python.*engine=vllm"):
        sglang.detect_install(sys.executable)  # this venv has no sglang
    planned = sglang.detect_install(sys.executable, required=False)  # a dry run still plans
    assert planned.flags_source == "recorded" and not planned.installed
    with pytest.raises(ConfigError, match="needs a CUDA GPU.*engine=vllm.*engine.python"):
        sglang.validate_engine(EngineConfig(name="sglang"), INSTALL, on_gpu=False, python_given=False)
    sglang.validate_engine(EngineConfig(name="sglang"), INSTALL, on_gpu=False, python_given=True)
    sglang.validate_engine(EngineConfig(name="sglang"), INSTALL, on_gpu=True, python_given=False)


def test_generate_endpoint_is_sglang_only() -> None:
    job = dataclasses.replace(JobConfig(), workload=WorkloadConfig(endpoint="generate"))
    with pytest.raises(ConfigError, match="SGLang's native API"):
        validate(job)
    validate(dataclasses.replace(job, engine=EngineConfig(name="sglang"), spec=SpecConfig(method="ngram", k=3)))


# ---- acceptance ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 5, 7])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.62, 0.9, 1.0])
def test_alpha_inverts_the_expected_length(alpha: float, k: int) -> None:
    assert math.isclose(alpha_from_length(expected_length(alpha, k), k), alpha, abs_tol=1e-9)


def test_alpha_outside_the_possible_range_is_not_invented() -> None:
    assert expected_length(0.5, 3) == 1.875
    assert alpha_from_length(0.9, 3) is None and alpha_from_length(4.5, 3) is None
    assert normalized(None, 3) == {} and normalized(3.32, 3)["acceptance_alpha"] > 0.7


def test_length_above_k_plus_one_clamps_alpha_with_a_flag() -> None:
    out = normalized(4.0001, 3)  # noise or rounding above the possible 4.0
    assert out["acceptance_alpha"] == 1.0 and out["acceptance_alpha_clamped"] == 1.0
    assert "acceptance_alpha_clamped" not in normalized(3.9, 3)


def test_alpha_uses_the_effective_draft_length() -> None:
    # ngram drafts that came up short: 2.5 draft tokens per draft although k=3.
    alpha = normalized(2.5, 2.5)["acceptance_alpha"]
    assert math.isclose(expected_length(alpha, 2.5), 2.5, rel_tol=1e-9)
    assert alpha > normalized(2.5, 3)["acceptance_alpha"]


def test_server_info_both_layouts() -> None:
    assert server_info_accept_length({"avg_spec_accept_length": 2.5}) == 2.5
    assert server_info_accept_length({"internal_states": [{"avg_spec_accept_length": 3.0}, {"x": 1}]}) == 3.0
    assert server_info_accept_length({"version": "0.5.23"}) is None


@pytest.mark.parametrize("cumulative", [True, False])
def test_acceptance_through_sglang_generate_stream_end_to_end(cumulative: bool) -> None:
    # Two requests, k=3: verification steps carrying (4, 4, 2, 1) and (3, 1, 4) tokens.
    steps = {"a": [4, 4, 2, 1], "b": [3, 1, 4]}
    tokens = [f"t{i} " for i in range(11)]
    metrics = "# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length 2.9\n"
    metrics += "# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate 0.61\n"
    server = FakeServer(
        lambda body: generate_script(tokens, steps[body["text"]], gap_s=0.01, cumulative=cumulative),
        metrics_text=metrics,
    )
    server.server_info = {"internal_states": [{"avg_spec_accept_length": 3.1}]}
    requests = [Request(i, prompt, "code_edit", 11) for i, prompt in enumerate(steps)]
    with server as url:
        opts = ClientOptions(base_url=url, model="served", endpoint="generate")
        records = run_window(requests, [0.0, 0.0], opts).records
        import httpx

        after = parse_scrape(httpx.get(url + "/metrics").text)
        info = httpx.get(url + "/get_server_info").json()
        on_scale = ENGINES["sglang"].window_acceptance(records, Acceptance(source="none"), after, url)
    body = server.bodies[0]
    assert body["stream"] is True and body["sampling_params"]["max_new_tokens"] == 11 and "text" in body
    a, b = sorted(records, key=lambda r: r.index)
    assert a.ok and b.ok, (a.error, b.error)
    assert (a.output_tokens, a.spec_verify_ct, len(a.chunk_s)) == (11, 4, 4)  # one chunk per step
    assert (b.output_tokens, b.spec_verify_ct, len(b.chunk_s)) == (8, 3, 3)
    assert a.text == "".join(tokens) and a.finish_reason == "length" and a.prompt_tokens == 9
    assert math.isclose(a.tpot_s, (a.chunk_s[-1] - a.chunk_s[0]) / 10)
    result = sglang_acceptance(records, after, info)
    # Each request's first token comes from prefill, not from a verification step.
    assert result.window_length == (11 - 1 + 8 - 1) / (4 + 3)
    assert result.native_length == (11 + 8) / (4 + 3)  # SGLang's own formula: completion tokens / verify steps
    assert result.requests_counted == 2 and result.verify_steps == 7
    assert result.gauge_length == 2.9 and result.gauge_rate == 0.61 and result.since_start_length == 3.1
    cross = normalized(result.window_length, 3)
    assert math.isclose(expected_length(cross["acceptance_alpha"], 3), 17 / 7)
    metrics_out = result.as_metrics()
    assert metrics_out["sglang_spec_accept_rate_gauge"] == 61.0
    assert metrics_out["sglang_native_accept_length"] == pytest.approx(19 / 7)
    assert metrics_out["sglang_avg_spec_accept_length_since_start"] == 3.1
    # What the sweep records, through the engine interface: the per-request L, named as such.
    assert on_scale == WindowAcceptance(result.window_length, "sglang-per-request", metrics_out)
    print(
        f"sglang per-request acceptance length {result.window_length:.4f}, alpha at k=3 "
        f"{cross['acceptance_alpha']:.4f}; gauges {result.gauge_length}, {result.gauge_rate}; since start "
        f"{result.since_start_length}"
    )


def test_a_window_without_counted_requests_keeps_the_counters_source_and_gives_no_length() -> None:
    """SGLang's L comes from the per-request counts alone: without them there is none, and the
    acceptance.source tag stays the /metrics one."""
    counters = Acceptance(source="vllm-v1-counters", acceptance_length=2.0)
    assert SglangAcceptance(gauge_length=2.9).on_scale(counters) == WindowAcceptance(
        None, "vllm-v1-counters", {"sglang_spec_accept_length_gauge": 2.9}
    )
