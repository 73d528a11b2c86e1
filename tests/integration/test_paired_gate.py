"""gate.mode=paired on the real engine: a candidate slowed about 6x (its own servers paused 85 %
of the time, the reference's left alone) fails the night with exit 1 and names the point, and
one of its servers, killed mid-window, loses its pair: the summary says 3 of 4 planned pairs were
measured and why the fourth was lost, and the regression the other three show still fails the
night (a lost pair never hides one, and never makes a pass). The smallest grid that exercises the
path: one server configuration (the baseline) and four pairs of fresh servers, the crash folded
into the same night (three pairs would leave two, one degree of freedom, too few to fail on).

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
    "gate.detect=1",  # a few pairs see only large slowdowns: the night's power line says what
    "load.num_requests=10",
    "workload.max_tokens=16",
    *(f"+engine.env.{k}={v}" for k, v in FAST_START.items()),
]


def _night(project: Path, name: str, pairs: int) -> tuple[int, str, list[int]]:
    """A night whose candidate is slowed and whose second candidate server crashes mid-window."""
    night = [*paired_night_args(pairs=pairs), *FLOOR]
    proc = start_sweep([f"hydra.run.dir={project}/{name}", f"sweep_name={name}", *night], project)
    seen: list[str] = []

    try:
        with (
            stutter(lambda: [proc.pid], paused=0.85, only=candidate_server),
            crash_nth(lambda: [proc.pid], 2, only=candidate_server) as crashed,
        ):
            read_until(proc, None, seen, timeout_s=1800)
        return proc.wait(timeout=60), "".join(seen), crashed
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_slowed_candidate_fails_the_paired_night_naming_the_point_and_a_lost_pair_is_said(
    tmp_path: Path, no_leftover_servers: None
) -> None:
    code, out, crashed = _night(tmp_path, "slowed-night", pairs=4)
    assert crashed, "the second candidate server was never killed"
    assert code == 1, out[-3000:]  # the regression stands over the failed point beside it
    assert "Regression gate (paired): ❌ regression" in out
    # ABBA: the second candidate server is pair 2's first; its window was never recorded.
    assert "3 of 4 planned pair(s) measured, 1 lost (pair 2: baseline-r2: no candidate window was recorded)" in out
    assert "Power: this night's design (3 pairs" in out
    assert "Gated and regressed: median_tpot_ms; slowest point(s): baseline-r2" in out
