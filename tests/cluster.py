"""A real two-node Ray cluster and a real ``mlflow server`` on this machine, started the way
users start them (``ray start``, ``mlflow server``), for the cluster tests and the gate's
calibration benchmark.

Two raylets on one machine are Ray's own way to test multi-node. Each node gets its own
ports, and the whole cluster its own temp dir; it is stopped by its processes (those whose
command line names that temp dir), never with ``ray stop``, which stops every Ray of the
machine. What runs on the cluster (job drivers, Ray workers, vLLM servers) is found among
the descendants of those processes, never by a name matched across the machine.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tests import procs
from tests.tmpdirs import outside_tmpdir

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
SLOT = "specsweep_slot"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(first_on_path: Path | None = None) -> dict[str, str]:
    """The environment of every Ray command: token auth on, this venv first on PATH (so a
    job's ``python`` is this environment's; ``first_on_path`` before it, a node's own tools),
    workers at normal priority, no proxies for loopback."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "PATH": f"{first_on_path}{os.pathsep}{path}" if first_on_path else path,
        "NO_PROXY": "127.0.0.1,localhost",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray starts workers at niceness 15, and a server started from a task inherits it.
        "RAY_worker_niceness": "0",
    }


@dataclass(frozen=True)
class Cluster:
    gcs: str  # host:port
    dashboard: str  # http://127.0.0.1:port
    temp_dir: Path
    head_slots: float
    worker_slots: float
    worker_node_port: int  # the joining node's raylet (--node-manager-port): what a test kills to lose it
    # What `ray start` started and left to init (see _ray): stopped with the cluster.
    started: list[psutil.Process] = field(default_factory=list, compare=False, repr=False)
    worker_gpus: int | None = None  # --num-gpus of the joining node (None: Ray's own detection)
    worker_path: Path | None = None  # a folder first on the joining node's PATH (its own nvidia-smi)

    def processes(self) -> list[psutil.Process]:
        """The cluster's own processes (GCS, raylets, dashboard, workers, ...): every
        process started on it descends from one of them."""
        return _cluster_processes(self.temp_dir)

    def join_worker(self) -> None:
        """Start the joining node (``ray start --address``) on ``worker_node_port``, and wait
        until the cluster has two alive nodes. Also what gives a lost node back: its raylet's
        port is free again once the raylet is gone."""
        low = free_port() % 5000 + 20000
        _ray(
            "start",
            f"--address={self.gcs}",
            "--num-cpus=1",
            f"--resources={json.dumps({SLOT: self.worker_slots} if self.worker_slots else {})}",
            f"--node-manager-port={self.worker_node_port}",
            f"--object-manager-port={free_port()}",
            f"--min-worker-port={low}",
            f"--max-worker-port={low + 999}",
            "--disable-usage-stats",
            "--object-store-memory=200000000",
            *([f"--num-gpus={self.worker_gpus}"] if self.worker_gpus is not None else []),
            started=self.started,
            first_on_path=self.worker_path,
        )
        _wait_nodes(self, 2)
        procs.tracker().add(*self.processes(), *self.started)  # what the cluster runs counts as this test run's


def _ray(*args: str, started: list[psutil.Process], timeout_s: float = 180, first_on_path: Path | None = None) -> None:
    """Run ``ray ARGS``; add to ``started`` the processes seen below it while it ran: what
    ``ray start`` starts and then leaves to init when it exits (some, such as Ray's client
    server, never name the cluster's temp dir)."""
    seen: dict[int, psutil.Process] = {}
    try:
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(
                [str(BIN / "ray"), *args], env=env(first_on_path), stdout=out, stderr=subprocess.STDOUT, text=True
            )
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                for child in procs.descendants(proc.pid):
                    seen.setdefault(child.pid, child)
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise subprocess.TimeoutExpired(proc.args, timeout_s)
                time.sleep(0.05)
            out.seek(0)
            output = out.read()
    finally:
        started.extend(procs.alive(seen.values()))
    if proc.returncode:
        raise RuntimeError(f"ray {' '.join(args)} failed:\n{output[-6000:]}")


def _cluster_processes(temp_dir: Path) -> list[psutil.Process]:
    """This user's processes whose command line names ``temp_dir`` (made by mkdtemp for this
    cluster alone) or a path inside it. ``ray start`` leaves its daemons to init, so they
    are no one's descendants: the scan finds them by that marker alone, which no process of
    another cluster, or of another user, carries."""
    names = re.compile(r"(?<![\w./-])" + re.escape(str(temp_dir)) + r"(?![\w.-])")
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            if proc.info["uids"].real == uid and any(names.search(part) for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
    return found


def stop_cluster(temp_dir: Path, started: Iterable[psutil.Process] = ()) -> None:
    """Stop the cluster's processes, what runs below them (Ray's agents, workers, and any
    server left), and ``started``: what ``ray start`` started (see :func:`_ray`)."""
    found = _cluster_processes(temp_dir)
    tree = {p.pid: p for p in [*found, *procs.descendants(*found), *procs.alive(started)]}
    targets = list(tree.values())
    for proc in targets:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    # Ray's daemons exit within a second or two of SIGTERM; what lingers past 5 s is killed (a
    # test cluster keeps nothing worth a graceful shutdown).
    _, alive = psutil.wait_procs(targets, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


@contextmanager
def ray_cluster(
    head_slots: float = 1,
    worker_slots: float = 1,
    head_gpus: int | None = None,
    worker_gpus: int | None = None,
    head_path: Path | None = None,
    worker_path: Path | None = None,
) -> Iterator[Cluster]:
    """Head and one joining node; each offers ``specsweep_slot`` as given (0: none), the GPUs
    given (``--num-gpus``; None: Ray's own detection), and the folder given first on its PATH
    (its own tools: the job drivers of the head, the workers of the joining node)."""
    temp_dir = outside_tmpdir("ssray")  # a short path: Ray's sockets live under it
    port, dash = free_port(), free_port()
    head_res = json.dumps({SLOT: head_slots} if head_slots else {})
    # `ray start --head` with token auth needs a token and does not make one (ray.init does):
    # on a fresh machine, create ~/.ray/auth_token first. Its output is the token: not shown.
    made = subprocess.run(
        [str(BIN / "ray"), "get-auth-token", "--generate"], env=env(), capture_output=True, timeout=120
    )
    if made.returncode:
        raise RuntimeError(f"ray get-auth-token --generate failed (exit {made.returncode})")
    cluster = Cluster(
        f"127.0.0.1:{port}",
        f"http://127.0.0.1:{dash}",
        temp_dir,
        head_slots,
        worker_slots,
        free_port(),
        worker_gpus=worker_gpus,
        worker_path=worker_path,
    )
    started = cluster.started
    try:
        _ray(
            "start",
            "--head",
            f"--port={port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            "--num-cpus=1",
            f"--resources={head_res}",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
            "--object-store-memory=200000000",
            "--include-dashboard=true",
            *([f"--num-gpus={head_gpus}"] if head_gpus is not None else []),
            started=started,
            first_on_path=head_path,
        )
        cluster.join_worker()
        yield cluster
    finally:
        stop_cluster(temp_dir, started)
        shutil.rmtree(temp_dir, ignore_errors=True)  # Ray's sessions and logs: nothing left in /tmp


def _wait_nodes(cluster: Cluster, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            nodes = httpx.get(f"{cluster.dashboard}/nodes?view=summary", headers=auth_headers(), timeout=5).json()
            alive = [n for n in nodes["data"]["summary"] if n.get("raylet", {}).get("state") == "ALIVE"]
            if len(alive) >= count:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(2)
    raise RuntimeError(f"the Ray cluster at {cluster.gcs} did not reach {count} alive nodes in {timeout_s:g} s")


def auth_headers() -> dict[str, str]:
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class TrackingServer:
    uri: str
    root: Path
    pid: int


@contextmanager
def mlflow_server(root: Path, port: int | None = None, admin_password: str | None = None) -> Iterator[TrackingServer]:
    """``mlflow server`` with a SQLite store and proxied artifacts, as the README starts it
    (``port``: the same one again, to restart a server that a test stopped). With
    ``admin_password``, behind MLflow's basic-auth app, as ``make tracking-server-auth`` starts it."""
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = (root / "server.log").open("a")
    auth = ["--app-name", "basic-auth"] if admin_password else []
    auth_env = (
        {
            "MLFLOW_AUTH_CONFIG_PATH": str(REPO / "deploy" / "mlflow" / "basic_auth.ini"),
            "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
        }
        if admin_password
        else {}
    )
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            *auth,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env() | auth_env,
        start_new_session=True,
        cwd=root,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
        yield TrackingServer(uri, root, proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it had died already
            pass
        log.close()


def submit(
    cluster: Cluster,
    submission_id: str,
    working_dir: Path,
    entrypoint: list[str],
    timeout_s: float = 1500,
    wait: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``ray job submit``, waiting for the job unless ``wait`` is false; its own exit code is 0 or 1."""
    return subprocess.run(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            cluster.dashboard,
            "--submission-id",
            submission_id,
            "--working-dir",
            str(working_dir),
            *([] if wait else ["--no-wait"]),
            "--",
            *entrypoint,
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def wait_job(cluster: Cluster, submission_id: str, timeout_s: float = 900) -> dict:
    """The job's details once it has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        details = job_details(cluster, submission_id)
        if details.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
            return details
        time.sleep(3)
    raise AssertionError(f"job {submission_id} still {details.get('status')} after {timeout_s:g} s")


def job_logs(cluster: Cluster, submission_id: str) -> str:
    response = httpx.get(f"{cluster.dashboard}/api/jobs/{submission_id}/logs", headers=auth_headers(), timeout=30)
    return str(response.json().get("logs", ""))


def raylet_of(pid: int) -> psutil.Process | None:
    """The raylet above a process: the Ray node it runs on."""
    try:
        for parent in psutil.Process(pid).parents():
            if parent.name() == "raylet":
                return parent
    except psutil.Error:
        pass
    return None


def job_details(cluster: Cluster, submission_id: str) -> dict:
    return httpx.get(f"{cluster.dashboard}/api/jobs/{submission_id}", headers=auth_headers(), timeout=10).json()


API_SERVER = "vllm.entrypoints.openai.api_server"


class Ready(set[int]):
    """The API servers that have answered /health. Each check runs in a thread of its own, with
    a generous timeout: on a loaded 2-core machine a serving API server can take seconds to
    answer, and the inline 0.5 s check used before missed servers that were already busy, so a
    "slowed" candidate was sometimes never paused. A check that blocked the caller's loop
    instead would stop it pausing the servers that are ready."""

    def __init__(self) -> None:
        super().__init__()
        self._asking: set[int] = set()
        self._lock = threading.Lock()

    def ask(self, pid: int, port: str) -> None:
        with self._lock:
            if pid in self or pid in self._asking:
                return
            self._asking.add(pid)
        threading.Thread(target=self._check, args=(pid, port), daemon=True).start()

    def _check(self, pid: int, port: str) -> None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200:
                with self._lock:
                    self.add(pid)
        except httpx.HTTPError:
            pass
        finally:
            with self._lock:
                self._asking.discard(pid)


def engine_pids(
    roots: Iterable[procs.Root], ready: Ready, only: Callable[[psutil.Process], bool] = lambda p: True
) -> list[int]:
    """Every process of every vLLM server below ``roots`` (a cluster's processes, or a
    sweep's) that has answered /health (``ready`` asks, and remembers them): the API server and
    all it spawned (the engine core and the model worker, which on the CPU runs the steps).
    Servers still starting are left alone, and so is every server that is not below ``roots``."""
    pids = set()
    for proc in procs.matching(roots, API_SERVER):
        try:
            if not only(proc):  # e.g. the servers of one build of a paired night
                continue
            if proc.pid not in ready:
                args = proc.cmdline()
                ready.ask(proc.pid, args[args.index("--port") + 1])
                continue
            pids |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
        except (psutil.Error, ValueError, IndexError):
            continue
    return sorted(pids)


@contextmanager
def stutter(
    roots: Callable[[], Iterable[procs.Root]],
    paused: float,
    period_s: float = 0.5,
    only: Callable[[psutil.Process], bool] = lambda p: True,
) -> Iterator[None]:
    """Pause every ready vLLM server below ``roots()`` (``Cluster.processes``: the servers the
    cluster runs) for ``paused`` of each period (SIGSTOP, then SIGCONT): a real slowdown of
    the real engine, of a known size (it serves about 1 / (1 - paused) times slower), that no
    config value shows, so the point's fingerprint stays the same (``only``: the servers to slow,
    of those, e.g. one build's). Busy processes beside the
    server were tried first: on this machine they slowed it by 0-18 %, unpredictably."""
    done = threading.Event()
    ready = Ready()

    def signal_all(pids: list[int], sig: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def loop() -> None:
        while not done.is_set():
            pids = engine_pids(roots(), ready, only)
            signal_all(pids, signal.SIGSTOP)
            done.wait(paused * period_s)
            signal_all(pids, signal.SIGCONT)
            done.wait((1 - paused) * period_s)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        signal_all(engine_pids(roots(), ready, only), signal.SIGCONT)


ENGINE_CORE = "VLLM::EngineCore"  # the engine core's process title: the process that runs the steps


def served(port: str) -> float:
    """Requests a vLLM server has answered (its own counter); 0 where it does not answer."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


@contextmanager
def crash_nth(
    roots: Callable[[], Iterable[procs.Root]],
    nth: int,
    only: Callable[[psutil.Process], bool] = lambda p: True,
    delay_s: float = 2.0,
) -> Iterator[list[int]]:
    """SIGKILL the engine core of the ``nth`` (from 1) vLLM server to start below ``roots()``
    that ``only`` selects, ``delay_s`` after it answered its first request (the window's warm-up):
    a server that crashes mid-window, as no config value can make it. The killed API server's
    pid is appended to the list it yields."""
    done, killed = threading.Event(), []

    def loop() -> None:
        seen: list[psutil.Process] = []  # the selected API servers, in the order they started
        while not done.is_set():
            for proc in procs.matching(roots(), API_SERVER):
                args = procs.cmdline(proc)
                # The API server itself, not its watchdog (whose command line holds the server's).
                if "-m" not in args or args[args.index("-m") + 1 :][:1] != [API_SERVER]:
                    continue
                try:
                    if proc.pid not in {p.pid for p in seen} and only(proc):
                        seen.append(proc)
                except psutil.Error:
                    continue
            if len(seen) >= nth:
                target = seen[nth - 1]
                args = procs.cmdline(target)
                if "--port" in args[:-1] and served(args[args.index("--port") + 1]) >= 1:
                    done.wait(delay_s)
                    procs.send(procs.matching([target.pid], ENGINE_CORE), signal.SIGKILL)
                    killed.append(target.pid)
                    return
            done.wait(0.5)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        done.set()
        thread.join()


# A paired gate's night on the smallest grid that exercises it (tests/integration/test_paired_gate.py,
# benchmarks/gate_power.py --real): the baseline only, small windows, the reference build marked by
# a variable in its servers' environment, so a slowdown can be put on the candidate's servers alone.
PAIRED_MARK = "SPECSWEEP_TEST_BUILD"


def paired_night_args(pairs: int) -> list[str]:
    return [
        "engine.dtype=float32",
        "engine.cpu_kvcache_gib=1",
        "spec=none",
        "load.num_requests=16",
        "load.request_rate=2",
        "load.warmup_requests=1",
        "workload.max_tokens=32",
        "lossless.prompts=0",
        "gate.enabled=true",
        "gate.mode=paired",
        f"gate.pairs={pairs}",
        f"gate.reference=['+engine.env.{PAIRED_MARK}=reference']",
    ]


def candidate_server(server: psutil.Process) -> bool:
    """A paired night's candidate server: one without the reference's mark."""
    return PAIRED_MARK not in server.environ()
