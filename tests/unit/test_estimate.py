"""The estimate a GPU user plans by: weights' download and load by size, TP, the compile cache,
the windows, GPU-hours; the model sizes it reads offline, saying what it guessed; and the
confirmation a run above run.confirm_gpu_hours needs."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from pipeline.config import EngineConfig, JobConfig, LoadConfig, ModelConfig, RunConfig, SpecConfig
from pipeline.engines import weights
from pipeline.engines.weights import Weights, draft_weights, model_weights, params_from_config, params_from_name
from pipeline.exitcode import ExitCode
from pipeline.run import estimate as est
from pipeline.run.plan import plan_sweep
from pipeline.run.plumbing import budget

# Llama-3.3-70B-Instruct's config.json, the keys that size it (the hub's published file).
LLAMA_70B = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GB = 1e9


def _jobs(
    tp: int = 8, ks: tuple[int, ...] = (3,), rates: tuple[float, ...] = (1.0,), **engine: object
) -> list[JobConfig]:
    model = ModelConfig(id="meta-llama/Llama-3.3-70B-Instruct")
    return [
        JobConfig(
            engine=EngineConfig(device="gpu", tensor_parallel_size=tp, **engine),  # type: ignore[arg-type]
            model=model,
            spec=SpecConfig(method="ngram", k=k),
            load=LoadConfig(request_rate=r, num_requests=16),
        )
        for k in ks
        for r in rates
    ]


def _facts(plan: object, size: float = 140 * GB, on_disk: bool = False, warm: bool = False, **kw: object) -> dict:
    w = Weights("meta-llama/Llama-3.3-70B-Instruct", size, "hub", on_disk)
    fields = {"starts": True, "on_gpu": True, "gpus": 8, "eager": False, "weights": w, "compile_cache_warm": warm}
    return {g.index: est.StartFacts(**(fields | kw)) for g in plan.groups}  # type: ignore[attr-defined,arg-type]


# ---- the pure estimate -----------------------------------------------------------------------


def test_a_first_70b_sweep_pays_the_download_once_and_each_configuration_compiles_once() -> None:
    plan = plan_sweep(_jobs(ks=(3, 5)))
    first = est.estimate(plan, _facts(plan))
    base, k3, k5 = first.groups
    assert base.start.download_s == pytest.approx(140 * GB / est.DOWNLOAD_BYTES_S)  # 23 min at 100 MB/s
    assert k3.start.download_s == k5.start.download_s == 0  # the nodes share the cache: fetched once
    assert base.start.load_s == k3.start.load_s == pytest.approx(140 * GB / est.LOAD_BYTES_S)
    assert base.start.compile_s == k3.start.compile_s == est.GRAPHS_S + est.COMPILE_COLD_S  # three configurations
    assert 20 * 60 < first.wall_s < 60 * 60  # the "20-45 min the first time", not the 135M model's 8
    assert first.gpu_hours == pytest.approx(sum(g.total_s for g in first.groups) * 8 / 3600)
    again = est.estimate(plan, _facts(plan, on_disk=True, warm=True))
    assert all(g.start.download_s == 0 and g.start.compile_s == est.GRAPHS_S + est.COMPILE_WARM_S for g in again.groups)
    assert again.wall_s < first.wall_s - 23 * 60


def test_a_start_past_the_startup_deadline_is_said_in_the_plan() -> None:
    """The first 70B start (~30 min, the download included) is past a 1800 s deadline: the plan
    says which server would be stopped before it is ready, and the fix; an hour is enough."""
    short = plan_sweep(_jobs(startup_timeout_s=1800))
    lines = est.estimate(short, _facts(short)).lines()
    warned = [line for line in lines if "past engine.startup_timeout_s" in line]
    assert len(warned) == 1 and "server 1 would start in ~30." in warned[0], lines
    assert "raise engine.startup_timeout_s" in warned[0]
    enough = plan_sweep(_jobs(startup_timeout_s=3600))
    assert not [line for line in est.estimate(enough, _facts(enough)).lines() if "startup_timeout_s" in line]


def test_repeated_starts_of_one_configuration_compile_cold_only_the_first_time() -> None:
    from pipeline.config import RepeatsConfig

    jobs = [dataclasses.replace(j, repeats=RepeatsConfig(count=2, restart=True)) for j in _jobs()]
    plan = plan_sweep(jobs)
    done = est.estimate(plan, _facts(plan, on_disk=True))
    colds = [g.start.compile_s == est.GRAPHS_S + est.COMPILE_COLD_S for g in done.groups]
    assert len(colds) == 4 and sum(colds) == 2  # baseline and ngram, once each


def test_size_tp_and_eager_move_the_start_as_they_should() -> None:
    plan = plan_sweep(_jobs())
    big, small = (est.estimate(plan, _facts(plan, size=s, on_disk=True)) for s in (140 * GB, 16 * GB))
    assert big.groups[0].start.load_s > small.groups[0].start.load_s
    assert est.tpot_s(_facts(plan, size=140 * GB)[1]) > est.tpot_s(_facts(plan, size=16 * GB)[1])
    tp8, tp2 = (est.estimate(plan, _facts(plan, on_disk=True, gpus=n)) for n in (8, 2))
    assert tp8.groups[0].start.startup_s - tp2.groups[0].start.startup_s == pytest.approx(6 * est.GPU_RANK_S)
    assert tp8.gpu_hours > tp2.gpu_hours
    eager = est.estimate(plan, _facts(plan, on_disk=True, eager=True))
    assert all(g.start.compile_s == 0 for g in eager.groups)


def test_windows_count_the_arrivals_and_the_cpu_holds_no_gpu_hours() -> None:
    plan = plan_sweep(_jobs(rates=(1.0, 4.0)))
    done = est.estimate(plan, _facts(plan, on_disk=True))
    slow, fast = done.groups[0].points_s.values()
    assert slow > 15 > fast  # 16 requests at 1 req/s span ~15 s; at 4 req/s ~4 s
    cpu = {i: dataclasses.replace(f, on_gpu=False, gpus=0, eager=True) for i, f in _facts(plan).items()}
    assert est.estimate(plan, cpu).gpu_hours == 0


def test_the_embedded_cpu_sweep_keeps_its_measured_start_up() -> None:
    plan = plan_sweep([JobConfig()])
    facts, _ = est.start_facts(plan, on_gpu=False)
    done = est.estimate(plan, facts)
    assert [g.start.total_s for g in done.groups] == [est.CPU_STARTUP_S["eager"] + est.STOP_S] * 2
    assert done.gpu_hours == 0 and "GPU-hours" not in done.summary()


# ---- model sizes, offline -----------------------------------------------------------------


def test_parameters_from_a_config_and_from_a_name() -> None:
    assert params_from_config(LLAMA_70B) == pytest.approx(70.55e9, rel=0.01)
    assert params_from_config({"hidden_size": 8}) is None
    assert params_from_name("meta-llama/Llama-3.3-70B-Instruct") == 70e9
    assert params_from_name("Qwen/Qwen2.5-1.5B-Instruct") == 1.5e9
    assert params_from_name("HuggingFaceTB/SmolLM2-135M-Instruct") == 135e6
    assert params_from_name("mistralai/Mixtral-8x7B-v0.1") == 56e9
    assert params_from_name("org/some-model") is None


def _snapshot(cache: Path, repo: str, files: dict[str, object]) -> Path:
    """A Hugging Face cache entry as huggingface_hub lays it out: refs/main -> snapshots/<commit>/."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("abc123")
    snap = root / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, content in files.items():
        path = snap / name
        if isinstance(content, int):
            path.write_bytes(b"\0" * content)
        else:
            path.write_text(json.dumps(content))
    return snap


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model_weights.cache_clear()
    yield tmp_path / "hub"
    model_weights.cache_clear()


def test_offline_a_hub_id_is_sized_from_the_cache_or_guessed_from_its_name_and_says_so(offline: Path) -> None:
    guessed = model_weights("meta-llama/Llama-3.3-70B-Instruct")
    assert (guessed.bytes, guessed.source, guessed.on_disk, guessed.guessed) == (140 * GB, "name", False, True)
    assert "guessed from its name" in guessed.text()
    assert model_weights("org/mystery").source == "unknown"
    index = {"metadata": {"total_size": 141_107_412_992}, "weight_map": {"a": "model-1.safetensors"}}
    _snapshot(offline, "org/indexed-70B", {"config.json": LLAMA_70B, "model.safetensors.index.json": index})
    from_index = model_weights("org/indexed-70B")
    assert (from_index.bytes, from_index.source, from_index.on_disk) == (
        141_107_412_992,
        "cache",
        False,
    )  # shards missing
    _snapshot(offline, "org/config-only", {"config.json": LLAMA_70B})
    from_config = model_weights("org/config-only")
    assert from_config.source == "config" and from_config.bytes == pytest.approx(141e9, rel=0.01)
    _snapshot(offline, "org/downloaded", {"config.json": LLAMA_70B, "model.safetensors": 4096})
    assert model_weights("org/downloaded") == Weights("org/downloaded", 4096, "cache", True)


def test_a_local_folder_is_its_files_and_float32_doubles_a_guess(offline: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    (folder / "model-00002.safetensors").write_bytes(b"\0" * 500)
    (folder / "tokenizer.json").write_text("{}")
    assert model_weights(str(folder)) == Weights(str(folder), 1500, "files", True)
    assert model_weights("org/x-8B", None, "float32").bytes == 32 * GB


def test_a_trained_head_is_not_sized_by_its_targets_name(offline: Path) -> None:
    target = model_weights("meta-llama/Llama-3.3-70B-Instruct")
    head = draft_weights("eagle3", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", target)
    assert head.source == "head" and head.bytes == pytest.approx(140 * GB * weights.HEAD_SHARE)
    assert draft_weights("draft", "self", target) is target
    assert draft_weights("draft", "meta-llama/Llama-3.2-1B-Instruct", target).bytes == 2 * GB


def test_the_gpu_plan_says_what_it_guessed(offline: Path) -> None:
    plan = plan_sweep(_jobs())
    done = est.estimate_here(plan, on_gpu=True)
    text = "\n".join(done.lines())
    assert "140 GB (guessed from its name" in text and "GPU figures are not measured here" in text
    assert "compile cache" in text and done.gpu_hours > 1


# ---- the confirmation ------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _costly() -> est.TimeEstimate:
    plan = plan_sweep(_jobs())
    return est.estimate(plan, _facts(plan))


def _ask(cost: est.TimeEstimate, run: RunConfig, stdin: io.StringIO, out: io.StringIO | None = None) -> int | None:
    return budget.ask(cost.gpu_hours, cost.summary(), cost.lines(), run, stdin, out or io.StringIO())


def test_over_the_budget_off_a_terminal_is_refused_naming_the_fix() -> None:
    out = io.StringIO()
    assert _ask(_costly(), RunConfig(confirm_gpu_hours=1), io.StringIO(), out) == ExitCode.BAD_INPUT
    said = out.getvalue()
    assert "above run.confirm_gpu_hours=1" in said and "run.confirmed=true" in said and "GPU-hours" in said
    assert "download" in said  # the account: what the hours are made of
    assert _ask(_costly(), RunConfig(confirm_gpu_hours=1, confirmed=True), io.StringIO()) is None
    assert _ask(_costly(), RunConfig(confirm_gpu_hours=100), io.StringIO()) is None


@pytest.mark.parametrize(("answer", "code"), [("y\n", None), ("yes\n", None), ("\n", ExitCode.BAD_INPUT), ("n\n", 2)])
def test_on_a_terminal_it_asks(answer: str, code: int | None) -> None:
    out = io.StringIO()
    assert _ask(_costly(), RunConfig(confirm_gpu_hours=1), _Tty(answer), out) == code
    assert "Start it? [y/N]" in out.getvalue()


def test_a_run_that_holds_no_gpu_never_asks() -> None:
    plan = plan_sweep([JobConfig()])
    facts, _ = est.start_facts(plan, on_gpu=False)
    assert _ask(est.estimate(plan, facts), RunConfig(confirm_gpu_hours=0), io.StringIO()) is None


def test_the_driver_asks_before_it_opens_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real (not dry) run over the budget stops at exit 2 before the store, the cluster or a
    server is touched (tests/in_process.py's executor fails the test if a launch is reached)."""
    from pipeline.run import driver
    from tests.in_process import sweep_in_process

    monkeypatch.setattr(driver.Sweep, "estimate", lambda self, plan: _costly())
    code = sweep_in_process(False, tmp_path, ["run.confirm_gpu_hours=2", "hydra/launcher=basic"])
    assert code == ExitCode.BAD_INPUT
    assert "above run.confirm_gpu_hours=2" in capsys.readouterr().err
    assert not (tmp_path / "mlruns").exists()  # no store was opened
    assert sweep_in_process(False, tmp_path, ["run.confirm_gpu_hours=-1"]) == ExitCode.BAD_INPUT
    assert "run.confirm_gpu_hours=-1.0 must be >= 0 of GPU-hours" in capsys.readouterr().err
