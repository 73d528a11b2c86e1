"""gate.mode=paired on the real engine: a candidate slowed about 6x (its own servers paused 85 %
of the time, the reference's left alone) fails the night with exit 1 and names the point, and the
night says which pair it lost where a candidate server crashed mid-window (killed: no config value
makes a real engine crash). The smallest grid that exercises the path: one server configuration
(the baseline) and four pairs of fresh servers, the first pair's candidate killed, so that three
pairs (two degrees of freedom) decide. A night that lost a pair and measured nothing slower is
insufficient, never a pass: that rule is the unit tests' (simulated nights with failures and lost
windows, tests/unit/test_paired_gate.py). As two nights (the slowed one of three pairs, 363 s on 2
AVX2 cores; an A/A one of three pairs, one crashed, 258 s) this took 47 s more than the one night
(574 s); an earlier fold of the crash into a night of three pairs left the slowdown two pairs
(one degree of freedom), which on a loaded 2-core machine came out insufficient rather than failed.

That an unchanged (A/A) night passes is not asserted here: one real A/A night is one draw of a rule
whose false-alarm rate is what matters, and a test of it would cost four server starts (a fifth of
this suite's real-engine time went to it). The rule's pass on A/A nights is the unit tests'
(tests/unit/test_paired_gate.py, simulated nights with a known truth), its false-alarm rate on real
nights is ``benchmarks/gate_power.py --real``'s, and a real unchanged night passing the gate
end to end is the cluster's (tests/integration/test_cluster.py, history mode).

Why 6x and not the 1.15x the gate is built for: a few pairs detect 1.15x only some of the time
(a 2-core machine's pair spread is 6-10 %), so a test asserting it would fail some of its runs;
how often real nights catch 1.15x is what ``benchmarks/gate_power.py --real`` measures. The pause
itself varies from pair to pair (a server is paused once it answers /health), and at 2x a spread
of 0.2 in the pairs' log ratios is caught 93 % of the time at three pairs; at 4x, all but never
missed on this machine. On CI a 2x pause was measured as +62 % with a pair spread of 41 %, and
missed; the pause is 6.7x nominal so that even that spread leaves the bound far above the floor.
The test's floor is 10 % (the default is 1 %)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.cluster import candidate_server, crash_nth, paired_night_args, stutter
from tests.integration.conftest import FAST_START, read_until, start_sweep

pytestmark = pytest.mark.integration

# 10 requests of 16 tokens a window (the benchmark's nights send 16 of 32): the pair's median over
# five or more paired requests is what the decision needs, a median TPOT over 15 steps a request
# shows a 6x pause as plainly as one over 31, and the slowed night's windows are several times as long.
FLOOR = [
    "gate.decision_floor=0.10",
    "gate.detect=4",  # three pairs see only large slowdowns: refused unless said (about 0.7x more here)
    "load.num_requests=10",
    "workload.max_tokens=16",
    *(f"+engine.env.{k}={v}" for k, v in FAST_START.items()),
]


def _night(project: Path, name: str, pairs: int, slow: bool, crash: int | None = None) -> tuple[int, str, list[int]]:
    """A paired night; ``slow``: the candidate's servers paused 85 % of the time; ``crash``: the
    candidate's nth server (from 1) killed mid-window."""
    night = [*paired_night_args(pairs=pairs), *FLOOR]
    proc = start_sweep([f"hydra.run.dir={project}/{name}", f"sweep_name={name}", *night], project)
    seen: list[str] = []

    crashed: list[int] = []
    try:
        with ExitStack() as faults:
            if slow:
                faults.enter_context(stutter(lambda: [proc.pid], paused=0.85, only=candidate_server))
            if crash is not None:
                crashed = faults.enter_context(crash_nth(lambda: [proc.pid], crash, only=candidate_server))
            read_until(proc, None, seen, timeout_s=1800)
        return proc.wait(timeout=60), "".join(seen), crashed
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_slowed_candidate_fails_the_paired_night_naming_the_point_and_the_pair_its_crash_lost(
    tmp_path: Path, no_leftover_servers: None
) -> None:
    code, out, crashed = _night(tmp_path, "slowed-night", pairs=4, slow=True, crash=1)
    assert code == 1, out[-3000:]
    assert crashed, "the candidate's server was never killed"
    assert "Regression gate (paired): ❌ regression" in out
    # ABBA: the first candidate server is pair 1's second; its window was never recorded, and
    # the night fails on the three pairs it did measure (a lost pair never hides a slowdown).
    assert "3 of 4 planned pair(s) measured, 1 lost (pair 1: baseline-r2: no candidate window was recorded)" in out
    assert "Power: this night's design (3 pairs" in out
    assert "Gated and regressed: median_tpot_ms; slowest point(s): baseline-r2" in out
