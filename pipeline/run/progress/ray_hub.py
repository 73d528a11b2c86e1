"""Live progress across Ray: the driver's end of the :class:`~pipeline.run.progress.events.Hub` actor.

The Ray launcher starts one hub per display (named after its channel, in the driver's job,
so it ends with the driver) and drains it into the display twice a second while the groups run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pipeline.run.progress.events import NAMESPACE, Hub, local_sink

DRAIN_EVERY_S = 0.5


def forward(channel: str) -> Callable[[], None]:
    """Start the hub and its drain; returns what stops the drain (after a last one)."""
    import ray

    try:
        # No CPU of its own: every CPU a node offers is a server group's.
        hub = ray.remote(Hub).options(name=channel, namespace=NAMESPACE, get_if_exists=True, num_cpus=0).remote()
        ray.get(hub.drain.remote(), timeout=120)  # running before any group looks it up by name
    except Exception as exc:  # noqa: BLE001 - the sweep runs without its live display
        print(f"progress: no live display from the Ray workers ({type(exc).__name__}: {exc})")
        return lambda: None
    done = threading.Event()

    def drain() -> None:
        try:
            for event in ray.get(hub.drain.remote(), timeout=30):
                sink = local_sink(channel)
                if sink is not None:
                    sink(event)
        except Exception:  # noqa: BLE001 - a lost line of progress, never a lost sweep
            pass

    def loop() -> None:
        while not done.wait(DRAIN_EVERY_S):
            drain()

    thread = threading.Thread(target=loop, name="specsweep-progress-drain", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join(timeout=5)
        drain()

    return stop
