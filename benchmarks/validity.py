"""Does each validity check flag the window that breaks it, and only that one?

    .venv/bin/python benchmarks/validity.py [--part real|simulate|all] [--reps 40] [--out results.json]

**simulate**: the steady-state and overload checks calibrated on windows whose answer is known,
from a simulated continuous-batching server (tests/synthetic.py: each request streams 16 tokens/s
until the batch needs more than the server's capacity, which they then share): stable windows long
enough for their latency (false alarms of either check), stable windows shorter than their latency
("not steady" is the right answer; "overloaded" a false alarm), and rates 1.3x to 4x beyond the
capacity (the power of "overloaded"), each drawn --reps times with new Poisson arrivals.

**real**:

One baseline vLLM CPU server (the embedded SmolLM2, as `make run` starts it: prefix caching on,
emptied before each window), and windows measured by the sweep's own function
(pipeline.run.measure.measure), each judged by the checks the report runs
(pipeline.analysis.trust). Three clean windows, and six that each break one check on purpose:

- clean: 1 req/s, 20 requests of 32 tokens; the same point again (its repeat, new prompts);
  2 req/s for 10 s of short chat prompts and 16-token answers;
- client saturation: the clean 1 req/s window with a thread in the client's process that holds
  the interpreter for 100 ms at a time (sys.setswitchinterval), as a client short of CPU is;
- a rate the server cannot sustain: 12 req/s for 8 s of 96-token answers (ignore_eos);
- other traffic: the clean window while a second client sends the server a short request
  every 0.7 s;
- prefix hits under cold: the clean window's prompts again, on a server whose cache is not
  emptied first (engine.allow_remote=true skips the dev-mode reset) though cold is declared;
- a repeat on a stuttered server: a point at 1 req/s (24 requests of 32 tokens) measured twice,
  the second time with the engine core stopped for 100 ms of every 150 ms (SIGSTOP/SIGCONT);
- too short a window: 8 requests at 8 req/s (load.min_duration_s=0) of 64-token answers.

The table gives each window's checks (ok, FAIL, or - where one does not apply) and whether
exactly the check it breaks failed. The repeats check judges a point's windows together, so both
windows of the stuttered point carry its failure (the first of them ran on a quiet server). On a shared machine, run it alone: other work on its cores
is what the checks look for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.analysis import trust  # noqa: E402
from pipeline.analysis.samples import Sample  # noqa: E402
from pipeline.config import EngineConfig, JobConfig, LoadConfig, SpecConfig, WorkloadConfig  # noqa: E402
from pipeline.engines import vllm  # noqa: E402
from pipeline.engines.base import EngineServer, ServerSpec  # noqa: E402
from pipeline.engines.models import cache_root, ensure_embedded, load_tokenizer  # noqa: E402
from pipeline.engines.process import free_port  # noqa: E402
from pipeline.run.job import point_requests  # noqa: E402
from pipeline.run.measure import Measurement, measure  # noqa: E402
from tests.synthetic import batching_server  # noqa: E402

SERVED = "smollm2"
CHECKS = [c.name for c in trust.CHECKS]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    breaks: str | None  # the check it breaks on purpose; None: a clean window
    job: JobConfig
    around: Callable[[EngineServer], object] | None = None  # a context manager factory: the fault
    point: str = ""  # windows of one point (its repeats) share this


def _job(
    rate: float,
    count: int,
    tokens: int,
    *,
    min_s: float = 4.0,
    ignore_eos: bool = False,
    workload: str = "code_edit",
    **engine: object,
) -> JobConfig:
    return JobConfig(
        engine=EngineConfig(**engine),  # type: ignore[arg-type]
        spec=SpecConfig(method="none", k=0),
        load=LoadConfig(request_rate=rate, num_requests=count, min_duration_s=min_s, warmup_requests=2),
        workload=WorkloadConfig(name=workload, max_tokens=tokens, ignore_eos=ignore_eos),
    )


@contextmanager
def client_short_of_cpu(_: EngineServer) -> Iterator[None]:
    """A thread that holds the interpreter for 100 ms at a time: the client's event loop gets it
    back late, as a client whose process is short of CPU does."""
    stop = threading.Event()

    def hog() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.1)
    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(before)


@contextmanager
def another_client(server: EngineServer) -> Iterator[None]:
    """A second client that sends the server a short request every 0.7 s."""
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(trust_env=False, timeout=60) as client:
            while not stop.wait(0.7):
                body = {"model": SERVED, "prompt": "Say hello.", "max_tokens": 4}
                client.post(server.base_url + "/v1/completions", json=body)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def stuttered(server: EngineServer) -> Iterator[None]:
    """The engine core's processes stopped for 100 ms of every 150 ms (the API server keeps answering)."""
    tree = psutil.Process(server.pid).children(recursive=True)
    engine = [p for p in tree if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]
    assert engine, f"no engine core among the server's processes: {[p.name() for p in tree]}"
    stop = threading.Event()

    def stutter() -> None:
        while not stop.is_set():
            for p in engine:
                os.kill(p.pid, signal.SIGSTOP)
            time.sleep(0.1)
            for p in engine:
                os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.05)

    thread = threading.Thread(target=stutter, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for p in engine:
            os.kill(p.pid, signal.SIGCONT)


def cases() -> list[Case]:
    clean = _job(1.0, 20, 32)
    return [
        Case("clean: 1 req/s", None, clean, point="C"),
        Case("clean: its repeat", None, dataclasses.replace(clean, repeat=1), point="C"),
        Case("clean: 2 req/s, short chat", None, _job(2.0, 16, 16, min_s=10.0, workload="chat")),
        Case("client saturation", "client_lag", clean, client_short_of_cpu),
        Case("a rate the server cannot sustain", "overload", _job(12.0, 16, 96, min_s=8.0, ignore_eos=True)),
        Case("other traffic", "other_traffic", clean, another_client),
        # Right after the clean window's prompts were last sent (its repeat sent others): no reset.
        Case(
            "prefix hits under cold", "prefix_cache", dataclasses.replace(clean, engine=EngineConfig(allow_remote=True))
        ),
        # The repeats check judges a point's windows together: both carry the point's failure.
        Case("stuttered: first repeat", "repeats", _job(1.0, 24, 32), point="D"),
        Case("stuttered: second repeat", "repeats", dataclasses.replace(_job(1.0, 24, 32), repeat=1), stuttered, "D"),
        Case("too short a window", "steady_state", _job(8.0, 8, 64, min_s=0.0, ignore_eos=True)),
    ]


def start_server(work: Path) -> EngineServer:
    model_dir = str(ensure_embedded("smollm2-135m"))
    install = vllm.detect_install()
    port = free_port()
    launch = vllm.build_launch(
        install=install,
        engine=EngineConfig(prefix_cache="cold"),
        spec=SpecConfig(method="none", k=0),
        model_path=model_dir,
        draft_path=None,
        served_name=SERVED,
        port=port,
        on_gpu=False,
        seed=0,
        cache_dir=cache_root(),
    )
    spec = ServerSpec(
        engine="vllm",
        engine_version=str(install.version),
        command=tuple(launch.command),
        host="127.0.0.1",
        port=port,
        log_path=work / "server.log",
        startup_timeout_s=600,
        env=launch.env,
    )
    return EngineServer(spec)


def run(case: Case, server: EngineServer, tokenizer: object, first: bool) -> Measurement:
    sends = point_requests(case.job, tokenizer)  # type: ignore[arg-type]
    args = (server.base_url, SERVED, case.job, sends.warmup if first else (), sends.requests, sends.offsets, case.name)
    if case.around is None:
        return measure(*args)
    with case.around(server):  # type: ignore[attr-defined]
        return measure(*args)


def judged(cases_run: list[tuple[Case, Measurement]]) -> pd.DataFrame:
    rows = []
    samples, frame_rows = {}, []
    for i, (case, m) in enumerate(cases_run):
        facts = m.summary | m.prefix_cache.as_metrics() | m.validity
        found = trust.judge_window(facts, case.job.engine.prefix_cache)
        kept = {
            k: v for k, v in facts.items() if k.startswith(("window.", "validity.", "prefix_cache", "send_lateness"))
        }
        rows.append(
            {"window": case.name, "breaks": case.breaks or "-", "facts": kept} | {n: found.get(n) for n in CHECKS}
        )
        if case.point:
            run = f"run{i}"
            table = pd.DataFrame([r.as_row() for r in m.window.records])
            samples[run] = Sample.from_requests(table, m.summary["duration"])
            frame_rows.append(
                {
                    "run_id": run,
                    "point": case.name,
                    "role": "speculative",
                    "point_key": case.point,
                    "point_hash": run,
                    "baseline_hash": "",
                    "repeat": case.job.repeat,
                    "status": "finished",
                }  # fmt: skip
            )
    repeats = trust.repeat_findings(pd.DataFrame(frame_rows), samples, None)
    for row, (case, _) in zip(rows, cases_run, strict=True):
        row["repeats"] = repeats.get(case.point) if case.point else None
    return pd.DataFrame(rows)


def _cell(found: object) -> str:
    return "-" if found is None else ("ok" if found.ok else "FAIL")  # type: ignore[attr-defined]


def table(frame: pd.DataFrame) -> tuple[str, bool]:
    names = {"offered_rate": "rate", "steady_state": "steady", "overload": "overload", "client_lag": "client",
             "other_traffic": "other", "prefix_cache": "prefix", "failed": "failed", "synchronized": "sync",
             "repeats": "repeats"}  # fmt: skip
    lines = [f"{'window':<34} {'breaks':<14} " + " ".join(f"{names[n]:>8}" for n in CHECKS) + "  as expected"]
    all_ok = True
    for _, row in frame.iterrows():
        failed = {n for n in CHECKS if row[n] is not None and not row[n].ok}
        expected = {row["breaks"]} if row["breaks"] != "-" else set()
        ok = failed == expected
        all_ok &= ok
        cells = " ".join(f"{_cell(row[n]):>8}" for n in CHECKS)
        lines.append(
            f"{row['window']:<34} {row['breaks']:<14} {cells}  {'yes' if ok else 'NO: ' + ', '.join(sorted(failed))}"
        )
    return "\n".join(lines), all_ok


# (name, rate, seconds of arrivals, output tokens, capacity tokens/s, the right answer)
SCENARIOS = (
    ("stable, long (T = 15 W)", 2.0, 60.0, 64, 2000.0, "steady"),
    ("stable, 90 % of capacity (T = 15 W)", 6.0, 60.0, 64, 427.0, "steady"),
    ("stable, short (T = W / 4)", 8.0, 1.0, 64, 2000.0, "not steady"),
    ("stable, short (T = W)", 4.0, 4.0, 64, 2000.0, "not steady"),
    ("1.3x capacity, 8 s", 8.0, 8.0, 64, 512.0 / 1.3, "overloaded"),
    ("2x capacity, 8 s", 8.0, 8.0, 64, 256.0, "overloaded"),
    ("4x capacity, 4 s", 16.0, 4.0, 64, 256.0, "overloaded"),
    ("2x capacity, 16 s", 4.0, 16.0, 64, 128.0, "overloaded"),
)


def _answer(found: dict) -> str:
    if "overload" in found and not found["overload"].ok:
        return "overloaded"
    if "steady_state" in found:
        return "steady" if found["steady_state"].ok else "not steady"
    return "not judged"


def simulate(reps: int) -> dict:
    """Each scenario drawn ``reps`` times: how often each answer came out."""
    out = {}
    print(f"  {'scenario':<38} {'truth':<11} {'steady':>7} {'not steady':>11} {'overloaded':>11} {'not judged':>11}")
    for name, rate, seconds, tokens, capacity, truth in SCENARIOS:
        counts = dict.fromkeys(("steady", "not steady", "overloaded", "not judged"), 0)
        for rep in range(reps):
            rng = np.random.default_rng([rep, int(rate * 100)])
            sends = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 3) + 20))
            sends = sends[sends < seconds]
            records = batching_server(sends, tokens, 16.0, capacity, dt=0.01)
            shape = trust.WindowShape(rate, False, False, max(r.end_s for r in records))
            facts = trust.window_facts(records, shape) | {"target_request_rate": rate, "failed": 0.0}
            counts[_answer(trust.judge_window(facts))] += 1
        out[name] = {"truth": truth, **{k: v / reps for k, v in counts.items()}}
        print(
            f"  {name:<38} {truth:<11} "
            + " ".join(
                f"{counts[k] / reps:>{w}.2f}"
                for k, w in (("steady", 7), ("not steady", 11), ("overloaded", 11), ("not judged", 11))
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("real", "simulate", "all"), default="all")
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    record: dict = {}
    if args.part in ("simulate", "all"):
        print("simulate: the steady-state and overload checks on windows of a known answer")
        record["simulate"] = simulate(args.reps)
    all_ok = True
    if args.part in ("real", "all"):
        print("real: windows on the CPU engine that each break one check on purpose, and clean ones")
        record["real"], all_ok = real()
    if args.out:
        args.out.write_text(json.dumps(record, indent=2))
    return 0 if all_ok else 1


def real() -> tuple[dict, bool]:
    work = Path(tempfile.mkdtemp(prefix="validity-"))
    tokenizer = load_tokenizer(str(ensure_embedded("smollm2-135m")))
    started = time.monotonic()
    done: list[tuple[Case, Measurement]] = []
    with start_server(work) as server:
        print(f"server ready in {time.monotonic() - started:.0f} s")
        for i, case in enumerate(cases()):
            t0 = time.monotonic()
            m = run(case, server, tokenizer, first=i == 0)
            done.append((case, m))
            print(f"  {case.name}: {int(m.summary['completed'])} requests in {time.monotonic() - t0:.0f} s")
    frame = judged(done)
    text, all_ok = table(frame)
    print(text)
    for _, row in frame.iterrows():
        for name in CHECKS:
            if row[name] is not None and not row[name].ok:
                print(f"  {row['window']}: {name}: {row[name].text}")
    print(f"every broken window flagged by its own check only, the clean ones by none: {all_ok}")
    print(f"(wall {time.monotonic() - started:.0f} s; the CPU: {os.cpu_count()} cores)")
    rows = [
        {"window": r["window"], "breaks": r["breaks"], "facts": r["facts"]}
        | {n: None if r[n] is None else {"ok": r[n].ok, "text": r[n].text} for n in CHECKS}
        for _, r in frame.iterrows()
    ]
    for i, (_, m) in enumerate(done):  # each window's requests, to judge again offline
        pd.DataFrame([r.as_row() for r in m.window.records]).to_csv(work / f"window{i}.csv", index=False)
    print(f"(each window's requests: {work}/window*.csv)")
    return {"rows": rows, "all_as_expected": all_ok}, all_ok


if __name__ == "__main__":
    raise SystemExit(main())
