"""engine=external against scripted servers: what is read, what is said when it cannot be.

The real-engine test (two vLLM servers the test starts, measured by a sweep that starts
nothing) is tests/integration/test_external.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import EngineConfig, JobConfig, LoadConfig, SpecConfig, WorkloadConfig
from pipeline.engines.base import ServerError
from pipeline.engines.external import ExternalServer, external_spec, root, served_version, url_problem
from pipeline.load.items import Request
from pipeline.run.measure import measure
from tests.fakes import FakeServer, chat_script

FINISHED = "vllm:request_success_total"


def _job() -> JobConfig:
    return JobConfig(
        engine=EngineConfig(
            name="external", url="http://127.0.0.1:8", baseline_url="http://127.0.0.1:9", prefix_cache="as_is"
        ),
        spec=SpecConfig(method="ngram", k=3),
        load=LoadConfig(num_requests=3, request_rate=50.0, warmup_requests=0),
        workload=WorkloadConfig(max_tokens=4),
    )


def _requests(n: int) -> list[Request]:
    return [Request(index=i, prompt=f"prompt {i}", category="qa", max_tokens=4) for i in range(n)]


def _counting(server: FakeServer, per_request: int) -> None:
    """Each request the server answers moves its finished counter by ``per_request`` (2: another
    replica or client was served as well) and its speculative counters by one draft each."""
    state = {"n": 0}

    def script(body: dict) -> object:
        state["n"] += 1
        n = state["n"]
        server.metrics_text = (
            f'# TYPE {FINISHED} counter\n{FINISHED}{{finished_reason="stop"}} {per_request * n}\n'
            f"# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total {n}\n"
            f"# TYPE vllm:spec_decode_num_draft_tokens_total counter\nvllm:spec_decode_num_draft_tokens_total {3 * n}\n"
            f"# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            f"vllm:spec_decode_num_accepted_tokens_total {2 * n}\n"
        )
        return chat_script(["a", "b"], completion_tokens=2)

    server.script_for = script  # type: ignore[assignment]
    server.metrics_text = f'# TYPE {FINISHED} counter\n{FINISHED}{{finished_reason="stop"}} 0\n'


def test_the_window_acceptance_comes_from_the_servers_counters() -> None:
    server = FakeServer(lambda body: chat_script(["a"], 1))
    _counting(server, per_request=1)
    with server as url:
        m = measure(url, "m", _job(), (), _requests(3), [0.0, 0.01, 0.02], "p")
    assert m.acceptance.note is None
    assert m.acceptance.num_drafts == 3
    assert m.acceptance.acceptance_length == pytest.approx(1 + 6 / 3)


def test_counters_that_saw_other_traffic_are_not_called_the_windows() -> None:
    """Behind a load balancer, or with other clients, the counters one URL answers with are not
    the window's: the acceptance is then "not measured", and the note says why and what to do."""
    server = FakeServer(lambda body: chat_script(["a"], 1))
    _counting(server, per_request=2)
    with server as url:
        m = measure(url, "m", _job(), (), _requests(3), [0.0, 0.01, 0.02], "p")
    assert m.acceptance.source == "none"
    assert m.acceptance.num_drafts is None
    assert "finished 6 request(s) during a window that sent 3" in (m.acceptance.note or "")
    assert m.validity["window.other_requests"] == 3 and m.validity["validity.other_traffic"] == 0
    assert "load balancer" in (m.acceptance.note or "")
    assert m.summary["completed"] == 3  # the window itself is still measured


def test_a_server_without_metrics_is_measured_and_its_acceptance_is_not() -> None:
    server = FakeServer(lambda body: chat_script(["a", "b"], 2))
    server.metrics_status = 404
    with server as url:
        m = measure(url, "m", _job(), (), _requests(2), [0.0, 0.01], "p")
    assert m.acceptance.source == "none"
    assert m.acceptance.note is not None and "/metrics failed" in m.acceptance.note and "404" in m.acceptance.note
    assert m.summary["completed"] == 2


def test_an_external_server_is_checked_on_entry_and_never_stopped(tmp_path: Path) -> None:
    server = FakeServer(lambda body: chat_script(["a"], 1))
    with server as url:
        spec = external_spec(url + "/v1", "unknown", tmp_path / "server.log")
        with ExternalServer(spec) as external:
            assert external.base_url == url  # the OpenAI routes hang off the root
            assert external.healthy() and external.alive() and external.startup_s is None
        assert "not started by specsweep" in (tmp_path / "server.log").read_text()
        assert ExternalServer(spec).healthy()  # leaving the block stopped nothing
        assert served_version(url) == "unknown"  # the scripted server serves no /version
    with pytest.raises(ServerError, match="cannot be reached"):
        ExternalServer(external_spec(url, "unknown", tmp_path / "server.log")).__enter__()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://10.0.0.5:8000", None),
        ("https://serve.example.com/v1/", None),
        (None, "needs engine.url"),
        ("10.0.0.5:8000", "not an http(s) address"),
        ("http://u:p@10.0.0.5:8000", "user name or password"),
        ("http://10.0.0.5:8000/v1/chat/completions", "without a path or query"),
    ],
)
def test_url_problems(url: str | None, problem: str | None) -> None:
    found = url_problem("engine.url", url)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_root_drops_the_openai_prefix() -> None:
    assert root("http://h:1/v1/") == "http://h:1"
    assert root("http://h:1") == "http://h:1"


def test_an_api_key_from_the_environment_is_sent_as_vllm_bench_sends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.load.client import ClientOptions

    monkeypatch.setenv("OPENAI_API_KEY", "sk-sentinel")
    server = FakeServer(lambda body: chat_script(["a"], 1))
    with server as url:
        measure(url, "m", _job(), (), _requests(1), [0.0], "p")
    assert server.headers and server.headers[-1].get("Authorization") == "Bearer sk-sentinel"
    assert "sk-sentinel" not in repr(ClientOptions(base_url=url, model="m"))


def test_a_load_above_the_small_default_is_sent_to_running_servers_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the first request, what the sweep sends each URL is printed; above one request a
    second or a hundred in all, it is refused (exit 2, naming the fix) unless
    engine.external_ok_to_load=true (or a yes at a terminal). A small load goes through."""
    from pipeline.exitcode import ExitCode
    from pipeline.run.plan import external_load, plan_sweep
    from tests.in_process import sweep_in_process

    with FakeServer(lambda body: chat_script(["a"], 1)) as spec, FakeServer(lambda body: chat_script(["a"], 1)) as base:
        args = ["engine=external", f"engine.url={spec}", f"engine.baseline_url={base}", f"model.id={tmp_path}"]
        heavy = [*args, "load.request_rate=4", "load.num_requests=40"]
        assert sweep_in_process(False, tmp_path, heavy) == ExitCode.BAD_INPUT
        err = capsys.readouterr()
        assert f"46 requests, up to 4 req/s, to {spec} (engine.url)" in err.out + err.err  # 40, 2 warm-ups, 4 probes
        assert "set engine.external_ok_to_load=true to send it" in err.err
        # The dry run says the same and sends nothing.
        assert sweep_in_process(False, tmp_path, [*heavy, "dry_run=true"]) == ExitCode.OK
        assert f"to {base} (engine.baseline_url)" in capsys.readouterr().out
    job = _job()
    loads = external_load(plan_sweep([job]), probe_prompts=4)
    assert {(load.key, load.requests, load.peak_rate) for load in loads} == {
        ("engine.url", 200 + 4, 50.0),
        ("engine.baseline_url", 200 + 4, 50.0),
    }  # 4 s of arrivals at 50/s (load.min_duration_s), no warm-up, 4 probes
