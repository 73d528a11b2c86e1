"""Every input refusal in one table: each exits 2 before any server starts, naming the fix.

Each case is composed with Hydra (a ``-m`` case's grid expanded as the sweeper expands it) and
handed to the same conversion and driver the command line calls, in this process: that is where
every refusal lives, and a case costs milliseconds, not an interpreter with MLflow. What only the
command line can show (Hydra's own refusals, exit codes, the single-run Ray check) runs as the
real entry point, ``python -m pipeline.sweep``, for the few cases in ``CLI_CASES``. A refused
secret ("sentinel") must be written nowhere.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.engines import vllm
from pipeline.exitcode import ExitCode
from tests.in_process import sweep_in_process

# (id, multirun?, overrides, what the message must say). {tmp} is the case's own folder.
CASES: list[tuple[str, bool, list[str], str]] = [
    # the method and its settings
    ("unknown-method", False, ["spec.method=lookahead"], "choose one of: none, ngram, draft"),
    ("k-zero", False, ["spec.k=0"], "spec.k=0 is not valid"),
    ("draft-without-model", False, ["spec=draft", "spec.draft_model=null"], "needs spec.draft_model"),
    ("ngram-with-draft-model", False, ["spec.draft_model=/m"], "takes no spec.draft_model"),
    ("aa-with-speculation", False, ["aa=true"], "aa=true compares two servers without speculation"),
    # synthetic acceptance: what vLLM would refuse, refused before a server starts
    (
        "synthetic-length-above-k-plus-1",
        False,
        ["spec=draft", "spec.synthetic_acceptance_length=5"],
        "must lie in [1, k+1] = [1, 4] at spec.k=3",
    ),
    (
        "synthetic-rates-increasing",
        False,
        ["spec=draft", "spec.synthetic_acceptance_rates=[0.5,0.9,0.1]"],
        "must not increase",
    ),
    ("drafter-needed-without-a-draft", True, ["search=drafter_needed", "spec.k=3"], "ngram drafts only where"),
    # models
    ("missing-model", False, ["model.id=/no/such/model"], "model path /no/such/model does not exist"),
    ("missing-draft", False, ["spec=draft", "spec.draft_model=./missing-draft"], "does not exist"),
    # engine options
    ("missing-python", False, ["engine.python=/no/such/python"], "engine.python=/no/such/python does not exist"),
    ("dtype", False, ["engine.dtype=int8"], "engine.dtype='int8' is not valid"),
    ("device", False, ["engine.device=tpu"], "engine.device='tpu' is not valid"),
    ("prefix-cache", False, ["engine.prefix_cache=lukewarm"], "engine.prefix_cache='lukewarm' is not valid"),
    ("no-cache-flag", False, ["engine.extra_args=[--no-enable-prefix-caching]"], "set engine.prefix_cache=off"),
    ("context-too-short", False, ["engine.max_model_len=16"], "leaves no room for workload.max_tokens"),
    ("generate-on-vllm", False, ["workload.endpoint=generate"], "with engine=vllm use chat or completions"),
    # SGLang here: not installed (or, installed, without a GPU); either way the way out is named
    ("sglang-on-cpu", False, ["engine=sglang"], "use engine=vllm"),
    ("exposed-host", False, ["engine.host=0.0.0.0"], "set engine.allow_remote=true to mean it"),
    ("secret-in-env", False, ["+engine.env.HF_TOKEN=hf_sentinel"], "pass engine.env_from=[HF_TOKEN] instead"),
    ("secret-in-args", False, ["engine.extra_args=[--api-key,sk-sentinel]"], "engine.env_from=[VLLM_API_KEY]"),
    ("env-from-unset", False, ["engine.env_from=[NOT_SET_ANYWHERE_42]"], "export NOT_SET_ANYWHERE_42="),
    ("revision-on-a-local-model", False, ["model.revision=v1"], "model.id=embedded:smollm2-135m is local"),
    ("revision-with-space", False, ["model.id=org/m", "model.revision='a b'"], "is not a revision"),
    # engine=external: two servers that already run
    (
        "external-no-url",
        False,
        ["engine=external", "engine.baseline_url=http://127.0.0.1:9"],
        "engine=external needs engine.url",
    ),
    (
        "external-not-http",
        False,
        ["engine=external", "engine.url=10.0.0.5:8000", "engine.baseline_url=http://127.0.0.1:9"],
        "does not speak http or https",
    ),
    (
        "external-credential",
        False,
        ["engine=external", "engine.url=http://me:sentinel@10.0.0.5:8000", "engine.baseline_url=http://127.0.0.1:9"],
        "holds a user name or password",
    ),
    (
        "external-same-url",
        False,
        ["engine=external", "engine.url=http://127.0.0.1:9", "engine.baseline_url=http://127.0.0.1:9/"],
        "are the same server",
    ),
    (
        "external-no-spec",
        False,
        ["engine=external", "engine.url=http://127.0.0.1:8", "engine.baseline_url=http://127.0.0.1:9", "spec=none"],
        "set spec to the method engine.url runs",
    ),
    (
        "external-cold-cache",
        False,
        [
            "engine=external",
            "engine.url=http://127.0.0.1:8",
            "engine.baseline_url=http://127.0.0.1:9",
            "engine.prefix_cache=cold",
        ],
        "engine.prefix_cache=as_is",
    ),
    (
        "external-extra-args",
        False,
        [
            "engine=external",
            "engine.url=http://127.0.0.1:8",
            "engine.baseline_url=http://127.0.0.1:9",
            "engine.extra_args=[--max-num-seqs,8]",
        ],
        "engine=external starts none",
    ),
    (
        "external-k-sweep",
        True,
        ["engine=external", "engine.url=http://127.0.0.1:8", "engine.baseline_url=http://127.0.0.1:9", "spec.k=3,5"],
        "runs one method and k",
    ),
    (
        "external-unreachable",
        False,
        ["engine=external", "engine.url=http://127.0.0.1:9", "engine.baseline_url=http://127.0.0.1:8"],
        "cannot be reached",
    ),
    ("url-without-external", False, ["engine.url=http://127.0.0.1:9"], "engine.url is for engine=external"),
    # every address parsed whole: its scheme, a host, a port in range (a traceback, or a dry run that passed, before)
    (
        "external-port-out-of-range",
        False,
        ["engine=external", "engine.url=http://127.0.0.1:99999", "engine.baseline_url=http://127.0.0.1:9"],
        "engine.url='http://127.0.0.1:99999' has a port outside 1-65535",
    ),
    ("tracking-uri-without-host", False, ["tracking.uri=http://:5000", "dry_run=true"], "names no host"),
    ("ray-address-without-port", True, ["ray.address=10.0.0.5"], "names no host and port"),
    (
        "as-is-without-external",
        False,
        ["engine.prefix_cache=as_is"],
        "engine.prefix_cache=as_is is for engine=external",
    ),
    # load
    ("rate-zero", False, ["load.request_rate=0"], "load.request_rate=0"),
    ("burstiness", False, ["load.burstiness=0"], "load.burstiness=0.0 must be a positive number"),
    ("no-requests", False, ["load.num_requests=0"], "load.num_requests=0 must be >= 1"),
    ("duration", False, ["load.duration_s=-1"], "load.duration_s=-1.0 must be a positive number"),
    ("concurrency", False, ["load.max_concurrency=0"], "load.max_concurrency=0 must be >= 1"),
    ("cap-with-workers", False, ["load.max_concurrency=4", "load.client_workers=2"], "set load.client_workers=1"),
    ("error-rate", False, ["load.max_error_rate=1.5"], "load.max_error_rate=1.5 must lie in [0, 1)"),
    ("window-timeout", False, ["load.window_timeout_s=0"], "load.window_timeout_s=0.0 must be a positive number"),
    # values the engine or a library would refuse later, after a server start or with a traceback
    ("negative-seed", False, ["seed=-1"], "seed=-1 must be >= 0"),
    ("negative-temperature", False, ["workload.temperature=-0.5"], "the server refuses a negative one"),
    ("zero-tensor-parallel", False, ["engine.tensor_parallel_size=0"], "engine.tensor_parallel_size=0 must be >= 1"),
    ("tensor-parallel-beyond-the-cores", False, ["engine.tensor_parallel_size=512"], "this machine has"),
    # the paired gate (docs/nightly.md)
    ("paired-without-the-gate", False, ["gate.mode=paired"], "gate.mode=paired is the regression gate's design"),
    (
        "paired-reference-typo",
        False,
        ["gate.enabled=true", "gate.mode=paired", "gate.reference=['engine.pyton=/x']"],
        "engine.pyton is not a setting of the sweep's config",
    ),
    (
        "paired-reference-changes-the-load",
        False,
        ["gate.enabled=true", "gate.mode=paired", "gate.reference=['load.num_requests=8']"],
        "would change what the pairs measure",
    ),
    (
        "extra-arg-vllm-lacks",
        False,
        ["engine.extra_args=[--max-num-seq,8]"],
        "passes --max-num-seq, which the installed vLLM 0.32.0 does not have (asked its own argument parser); "
        "did you mean --max-num-seqs",
    ),
    (
        "credential-in-tracking-uri",
        False,
        ["tracking.uri=http://me:sentinel@127.0.0.1:5000"],
        "export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
    ),
    (
        "credential-in-ray-address",
        True,
        ["ray.address=ray://me:sentinel@127.0.0.1:10001"],
        "ray.address holds a user name or password, which outputs, logs and MLflow would keep; give the address "
        "alone and Ray reads its token from RAY_AUTH_TOKEN: export it",
    ),
    # workloads and their files
    ("max-tokens", False, ["workload.max_tokens=0"], "workload.max_tokens=0 must be >= 1"),
    (
        "workload-file-missing",
        False,
        ["workload=jsonl", "workload.path=/no/such/file"],
        "workload.path=/no/such/file is not a file",
    ),
    ("workload-file-malformed", False, ["workload=jsonl", "workload.path={tmp}/bad.jsonl"], "not valid JSON"),
    (
        "workload-empty-prompt",
        False,
        ["workload=jsonl", "workload.path={tmp}/empty.jsonl"],
        "2: field 'prompt' is empty",
    ),
    ("workload-without-path", False, ["workload=jsonl", "workload.path=null"], "set workload.path=/path/to/file"),
    # traces (docs/traces.md)
    ("trace-missing-file", False, ["workload=trace", "workload.path=/no/such/trace.jsonl"], "no such file"),
    ("trace-without-path", False, ["workload=trace"], "set workload.path=/path/to/trace.jsonl"),
    ("trace-no-timestamp", False, ["workload=trace", "workload.path={tmp}/nostamp.jsonl"], "'timestamp' is missing"),
    ("trace-negative-time", False, ["workload=trace", "workload.path={tmp}/negative.jsonl"], "-2 is negative"),
    ("trace-backwards", False, ["workload=trace", "workload.path={tmp}/backwards.jsonl"], "set workload.sort=true"),
    (
        "trace-no-prompt",
        False,
        ["workload=trace", "workload.path={tmp}/noprompt.jsonl"],
        "neither 'prompt', 'messages' nor 'input_length'",
    ),
    (
        "trace-burstiness",
        False,
        ["workload=trace", "workload.path={tmp}/trace.jsonl", "load.burstiness=0.5"],
        "a trace keeps its own",
    ),
    (
        "trace-empty-slice",
        False,
        ["workload=trace", "workload.path={tmp}/trace.jsonl", "workload.start_s=100"],
        "selects no request; the trace spans 0-3 s",
    ),
    (
        "trace-rate-and-scale",
        False,
        ["workload=trace", "workload.path={tmp}/trace.jsonl", "load.request_rate=2", "workload.time_scale=0.5"],
        "both set the trace's speed",
    ),
    (
        "trace-unit",
        False,
        ["workload=trace", "workload.path={tmp}/trace.jsonl", "workload.timestamp_unit=min"],
        "choose one of: auto, s, ms",
    ),
    ("rate-null-without-trace", False, ["load.request_rate=null"], "it needs workload=trace"),
    (
        "conversation-on-completions",
        False,
        ["workload=trace", "workload.path=bundled", "workload.endpoint=completions"],
        "use workload.endpoint=chat",
    ),
    (
        "conversation-two-clients",
        False,
        ["workload=trace", "workload.path=bundled", "load.client_workers=2"],
        "use load.client_workers=1",
    ),
    ("think-time-without-trace", False, ["workload.think_time_s=2"], "needs workload=trace"),
    (
        "trace-prompt-and-messages",
        False,
        ["workload=trace", "workload.path={tmp}/both.jsonl"],
        "gives both 'prompt' and 'messages'",
    ),
    ("trace-unknown-role", False, ["workload=trace", "workload.path={tmp}/robot.jsonl"], "role 'robot'"),
    (
        "trace-two-output-lengths",
        False,
        ["workload=trace", "workload.path={tmp}/lengths.jsonl"],
        "output_length=600 and output_tokens=128 disagree",
    ),
    (
        "trace-beyond-the-context",
        False,
        ["workload=trace", "workload.path={tmp}/long.jsonl"],
        "2 line(s) of the trace ask for more tokens than engine.max_model_len=2048 holds",
    ),
    (
        "trace-messages-on-completions",
        False,
        ["workload=trace", "workload.path={tmp}/chat.jsonl", "workload.endpoint=completions"],
        "would drop all but the last message: use workload.endpoint=chat",
    ),
    ("min-duration", False, ["load.min_duration_s=-1"], "load.min_duration_s=-1.0 must be >= 0"),
    # decisions
    ("confidence", False, ["stats.confidence=1.5"], "stats.confidence=1.5 must lie in (0.5, 1)"),
    ("repeats", False, ["repeats.count=0"], "repeats.count=0 must be >= 1"),
    ("slo", False, ["slo.tpot_ms=-5"], "slo.tpot_ms=-5.0 must be > 0 or null"),
    ("gate-history", False, ["gate.history=0"], "gate.history=0 must be >= 1"),
    # Ray and tracking
    ("ray-on-a-single-run", False, ["ray.address=127.0.0.1:6379"], "add -m to run it through the Ray launcher"),
    ("ray-timeout", False, ["ray.connect_timeout_s=0"], "ray.connect_timeout_s=0.0 must be > 0"),
    ("ray-resources", False, ["+ray.resources_per_group.GPU=-1"], "must be a positive number"),
    (
        "ray-gpus-below-tp",
        False,
        ["engine.device=gpu", "engine.tensor_parallel_size=4", "+ray.resources_per_group.GPU=1", "dry_run=true"],
        "fewer than the 4 GPUs a server with engine.tensor_parallel_size=4 takes",
    ),
    ("file-store", False, ["tracking.uri=file:///tmp/specsweep-file-store"], "give a sqlite:///path/to/mlflow.db"),
    ("vllm-result-mode", False, ["tracking.vllm_result=full"], "tracking.vllm_result='full' is not valid"),
    ("progress-interval", False, ["progress_every_s=0"], "progress_every_s=0.0 must be > 0"),
    # the command line itself: what Hydra cannot compose (it says why; we exit 2 and say where to look)
    ("unknown-key", False, ["spec.kk=3"], "--cfg job` prints the config with every key"),
    ("wrong-type", False, ["spec.k=five"], "check the key and group names and the value types"),
    ("unknown-group-option", False, ["load=nosuch"], "check the key and group names"),
    ("sweep-unknown-key", True, ["spec.kk=3,5"], "Could not override 'spec.kk'"),
    ("sweep-wrong-type", True, ["spec.k=3,five"], "Error merging override spec.k=five"),
    # sweeps (-m)
    ("empty-grid", True, ["load.request_rate=range(4,1)"], "expands to no jobs"),
    ("one-bad-point", True, ["spec.k=3,0"], "spec.k=0 is not valid"),
    ("swept-sweep-setting", True, ["sweep_name=a,b"], "sweep_name is a setting of the whole sweep"),
    ("swept-slo", True, ["slo.tpot_ms=50,100"], "a sweep has one SLO, which its parent run records"),
    ("search-unknown", True, ["search=bisect"], "search='bisect' is not valid"),
    ("predict-one-k", True, ["search=predict"], "search=predict needs at least 2 values of spec.k per method"),
    ("predict-method", True, ["search=predict", "spec=eagle3", "spec.k=2,3"], "validated for spec.method in ngram"),
    ("predict-sampling", True, ["search=predict", "spec.k=2,3", "workload.temperature=0.7"], "greedy decoding only"),
    ("capacity-no-slo", True, ["search=capacity"], "search=capacity needs an SLO to search under"),
    (
        "capacity-rate-grid",
        True,
        ["search=capacity", "slo.tpot_ms=50", "load.request_rate=1,2"],
        "searches the request rate itself",
    ),
    (
        "capacity-probes",
        True,
        ["search=capacity", "slo.tpot_ms=50", "capacity.max_probes=1"],
        "capacity.max_probes=1 must be >= 2",
    ),
]


# Flags of vLLM 0.32's `vllm serve`, as its parser lists them (a few of 200).
VLLM_FLAGS = frozenset(
    {"--max-num-seqs", "--max-model-len", "--seed", "--enforce-eager", "--port", "--host", "--dtype", "--block-size"}
)


# What only the real entry point shows: Hydra refusing the command line (single run and sweep),
# the single-run Ray check, and the exit code and "error:" line of a refusal from the conversion
# and from a sweep's point, with a secret on the command line written nowhere.
CLI_CASES = {
    "unknown-key",
    "wrong-type",
    "unknown-group-option",
    "sweep-unknown-key",
    "sweep-wrong-type",
    "ray-on-a-single-run",
    "one-bad-point",
    "secret-in-env",
}


def _prepare(case: tuple[str, bool, list[str], str], root: Path) -> tuple[Path, list[str]]:
    folder = root / case[0]
    folder.mkdir()
    (folder / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    (folder / "empty.jsonl").write_text('{"prompt": "a"}\n{"prompt": "  "}\n')
    traces = {
        "trace": '{"timestamp": 0, "prompt": "a"}\n{"timestamp": 3, "prompt": "b"}\n',
        "nostamp": '{"timestamp": 0, "prompt": "a"}\n{"prompt": "b"}\n',
        "negative": '{"timestamp": -2, "prompt": "a"}\n',
        "backwards": '{"timestamp": 5, "prompt": "a"}\n{"timestamp": 1, "prompt": "b"}\n',
        "noprompt": '{"timestamp": 0, "output_tokens": 8}\n',
        "both": '{"timestamp": 0, "prompt": "a", "messages": [{"role": "user", "content": "a"}]}\n',
        "robot": '{"timestamp": 0, "messages": [{"role": "robot", "content": "beep"}]}\n',
        "lengths": '{"timestamp": 0, "prompt": "a", "output_length": 600, "output_tokens": 128}\n',
        "long": '{"timestamp": 0, "input_length": 2000, "output_length": 100, "hash_ids": [1]}\n'
        '{"timestamp": 5, "prompt": "a", "output_length": 4000}\n{"timestamp": 9, "prompt": "b"}\n',
        "chat": '{"timestamp": 0, "messages": [{"role": "system", "content": "Be brief."}, '
        '{"role": "user", "content": "Hi"}]}\n',
    }
    for name, text in traces.items():
        (folder / f"{name}.jsonl").write_text(text)
    return folder, [o.replace("{tmp}", str(folder)) for o in case[2]]


def _cli(case: tuple[str, bool, list[str], str], folder: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    where = ["-m", f"hydra.sweep.dir={folder}/multi"] if case[1] else [f"hydra.run.dir={folder}/out"]
    command = [sys.executable, "-m", "pipeline.sweep", *where, *args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def cli_refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    root = tmp_path_factory.mktemp("bad-input-cli")
    cases = [c for c in CASES if c[0] in CLI_CASES]

    def run(case: tuple[str, bool, list[str], str]) -> tuple[subprocess.CompletedProcess[str], Path]:
        folder, args = _prepare(case, root)
        return _cli(case, folder, args), folder

    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two entry points at a time
        return dict(zip([c[0] for c in cases], pool.map(run, cases), strict=True))


def _nothing_launched_or_leaked(folder: Path, output: str) -> None:
    assert "Traceback" not in output
    # Nothing was launched: a group writes its server's command before it starts it.
    assert not list(folder.rglob("server.log")) and not list(folder.rglob("server_command.txt"))
    leaked = [f for f in folder.rglob("*") if f.is_file() and f.name != "bad.jsonl" and b"sentinel" in f.read_bytes()]
    assert not leaked and "sentinel" not in output


def test_the_table_covers_every_kind_of_input() -> None:
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)
    assert CLI_CASES <= {c[0] for c in CASES}


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c[0] not in CLI_CASES or c[0] in ("one-bad-point", "secret-in-env")],
    ids=lambda c: c[0],
)
def test_bad_input_is_refused_before_any_server_starts_naming_the_fix(
    case: tuple[str, bool, list[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # vLLM's own parser costs an import of all of vLLM (~10 s): here, a few of its real flags;
    # tests/integration/test_vllm_import.py asks the installed vLLM's parser itself.
    monkeypatch.setattr(vllm, "serve_flags", lambda install: (VLLM_FLAGS, ""))
    folder, args = _prepare(case, tmp_path)
    monkeypatch.chdir(folder)  # relative paths in a case are the user's working directory's
    code = sweep_in_process(case[1], folder, args)
    out = capsys.readouterr()
    assert code == ExitCode.BAD_INPUT, out.out[-1500:] + out.err[-1500:]
    assert case[3] in out.err, out.err[-1500:]
    _nothing_launched_or_leaked(folder, out.out + out.err)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in CLI_CASES], ids=lambda c: c[0])
def test_the_command_line_exits_2_naming_the_fix(
    case: tuple[str, bool, list[str], str], cli_refusals: dict[str, tuple[subprocess.CompletedProcess[str], Path]]
) -> None:
    proc, folder = cli_refusals[case[0]]
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert case[3] in proc.stderr, proc.stderr[-1500:]
    _nothing_launched_or_leaked(folder, proc.stdout + proc.stderr)
