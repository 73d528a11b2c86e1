"""Synthetic acceptance on vLLM's CPU build: the two rejection kernels, as a vLLM general plugin.

vLLM 0.32 accepts ``"rejection_sample_method": "synthetic"`` in ``--speculative-config``: each
draft token is accepted with a stated probability, whatever the drafter proposed, so the system
cost of speculation is measured at any acceptance. Its GPU Triton kernels implement it
(``vllm/v1/sample/rejection_sampler.py``: ``rejection_greedy_sample_kernel`` and
``rejection_random_sample_kernel``). vLLM-CPU replaces those kernels with C++ ones
(``vllm/platforms/cpu.py``, ``register_triton_kernel_overrides``), whose Python wrappers in
``vllm/utils/cpu_triton_utils.py`` assert ``not SYNTHETIC_MODE``: the server starts, and its
first request kills the engine.

This module is the ``vllm.general_plugins`` entry point ``specsweep_synthetic``
(``pyproject.toml``), which vLLM loads in every one of its processes before the platform
registers its kernels (``vllm/v1/worker/worker_base.py``: ``load_general_plugins()``, then
``register_triton_kernel_overrides()``). :func:`load_plugin` wraps the CPU build's two wrappers
in ``cpu_triton_utils``, the names the platform then registers, and only where the installed
build refuses synthetic mode (:func:`lacks_synthetic`); on a GPU, or on a build that
implements the mode, it changes nothing. The wrappers call the build's own kernels unchanged
unless a launch asks for synthetic mode, and then compute what the GPU kernels compute:

- a request's draft token at position ``i`` is accepted where its uniform draw is below the
  conditional rate of position ``i`` (vLLM turns the configured unconditional rates into
  conditional ones), and a padded draft id (-1) is never accepted;
- the first rejected position gets the target's token (greedy: its argmax; random sampling:
  the recovered token), and nothing after it is written;
- where every draft is accepted, the bonus token follows the last one;
- the greedy kernel writes the greedy requests only, the random kernel the others.

Imports vLLM and torch only when called: the project imports this module without either.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

# Under vLLM's own logger, whose handler writes the server's log: the line says the plugin acted.
LOG = logging.getLogger("vllm.plugins.specsweep_synthetic")

# The CPU build's wrappers, by their names in vllm.utils.cpu_triton_utils.
GREEDY = "_rejection_greedy_sample_kernel_impl"
RANDOM = "_rejection_random_sample_kernel_impl"
# Set on each wrapper: a second load of the plugin in one process wraps nothing twice.
WRAPPED = "_specsweep_synthetic"
ACTED = "specsweep: synthetic acceptance runs through the plugin's CPU rejection kernels"
WRAPPED_NOTE = "specsweep: the CPU rejection kernels are wrapped for synthetic acceptance (used only where asked for)"


@functools.cache
def _say_acted() -> None:
    """Once per process, at the first launch that asks for synthetic mode: the server's log
    then shows that its acceptance came from these kernels."""
    LOG.info(ACTED)


def accept_synthetic(
    output_token_ids: Any,
    cu_num_draft_tokens: Any,
    draft_token_ids: Any,
    uniform_probs: Any,
    conditional_rates: Any,
    rows: Any,
    rejected_ids: Any,
    bonus_token_ids: Any,
    max_spec_len: int,
) -> None:
    """Synthetic acceptance for the requests ``rows`` (a bool per request), written into
    ``output_token_ids`` ([requests, max_spec_len + 1]) as the GPU kernels write it.
    ``rejected_ids`` holds, per draft token, what a rejection at that position emits."""
    import torch

    cu = cu_num_draft_tokens.to(torch.int64)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - starts
    positions = torch.arange(max_spec_len, dtype=torch.int64, device=cu.device)
    drafted = positions[None, :] < counts[:, None]  # [requests, max_spec_len]
    num_tokens = int(draft_token_ids.shape[0])
    flat = (starts[:, None] + positions[None, :]).clamp(max=max(num_tokens - 1, 0))
    rates = torch.zeros(max_spec_len, dtype=torch.float64, device=cu.device)
    known = min(max_spec_len, int(conditional_rates.shape[0]))
    rates[:known] = conditional_rates[:known].to(torch.float64)
    if num_tokens:
        drafts = draft_token_ids.to(torch.int64)[flat]
        accepted = drafted & (uniform_probs.to(torch.float64)[flat] < rates[None, :]) & (drafts >= 0)
        rejected = rejected_ids.to(torch.int64)[flat]
    else:
        drafts = rejected = torch.zeros_like(flat)
        accepted = torch.zeros_like(drafted)
    # Accepted up to the first rejection: the running product stops at the first zero.
    taken = torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)  # [requests]
    every = taken == counts
    width = max_spec_len + 1
    slots = torch.arange(width, dtype=torch.int64, device=cu.device)[None, :]
    drafts = torch.cat([drafts, drafts.new_zeros(drafts.shape[0], 1)], dim=1)
    rejected = torch.cat([rejected, rejected.new_zeros(rejected.shape[0], 1)], dim=1)
    bonus = bonus_token_ids.reshape(-1).to(torch.int64)[:, None].expand(-1, width)
    values = torch.where(slots < taken[:, None], drafts, torch.where(every[:, None], bonus, rejected))
    written = (slots <= taken[:, None]) & rows.to(torch.bool)[:, None]
    output_token_ids[written] = values[written].to(output_token_ids.dtype)


def _greedy_rows(is_greedy: Any, requests: int) -> Any:
    import torch

    return torch.ones(requests, dtype=torch.bool) if is_greedy is None else is_greedy.to(torch.bool).cpu()


def wrap_greedy(original: Any) -> Any:
    """The CPU build's greedy wrapper, with synthetic mode as the GPU kernel has it."""

    def greedy(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        target_argmax,
        bonus_token_ids,
        is_greedy,
        max_spec_len,
        uniform_probs=None,
        synthetic_conditional_rates=None,
        SYNTHETIC_MODE=False,  # the kernel's own parameter name
    ):
        if not SYNTHETIC_MODE:
            return original(
                output_token_ids,
                cu_num_draft_tokens,
                draft_token_ids,
                target_argmax,
                bonus_token_ids,
                is_greedy,
                max_spec_len,
                uniform_probs,
                synthetic_conditional_rates,
                SYNTHETIC_MODE,
            )
        _say_acted()
        rows = _greedy_rows(is_greedy, output_token_ids.shape[0])
        accept_synthetic(
            output_token_ids,
            cu_num_draft_tokens,
            draft_token_ids,
            uniform_probs,
            synthetic_conditional_rates,
            rows,
            target_argmax,
            bonus_token_ids,
            max_spec_len,
        )
        return None

    setattr(greedy, WRAPPED, original)
    return greedy


def wrap_random(original: Any) -> Any:
    """The CPU build's random-sampling wrapper, with synthetic mode as the GPU kernel has it."""

    def random(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
        max_spec_len,
        vocab_size,
        synthetic_conditional_rates=None,
        NO_DRAFT_PROBS=False,  # the kernel's own parameter name
        SYNTHETIC_MODE=False,
    ):
        if not SYNTHETIC_MODE:
            return original(
                output_token_ids,
                cu_num_draft_tokens,
                draft_token_ids,
                draft_probs,
                target_probs,
                bonus_token_ids,
                recovered_token_ids,
                uniform_probs,
                is_greedy,
                max_spec_len,
                vocab_size,
                synthetic_conditional_rates,
                NO_DRAFT_PROBS,
                SYNTHETIC_MODE,
            )
        _say_acted()
        rows = ~is_greedy.to("cpu").bool()
        accept_synthetic(
            output_token_ids,
            cu_num_draft_tokens,
            draft_token_ids,
            uniform_probs,
            synthetic_conditional_rates,
            rows,
            recovered_token_ids,
            bonus_token_ids,
            max_spec_len,
        )
        return None

    setattr(random, WRAPPED, original)
    return random


def lacks_synthetic(greedy: Any) -> bool:
    """Whether this build's greedy kernel refuses synthetic mode: asked once, on one request
    with one draft token. vLLM-CPU 0.32 asserts; a build that implements the mode answers."""
    import torch

    out = torch.full((1, 2), -1, dtype=torch.int32)
    one = torch.ones(1, dtype=torch.int32)
    try:
        greedy(
            out,
            one,
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, 1, dtype=torch.int64),
            None,
            1,
            torch.zeros(1, dtype=torch.float64),
            torch.ones(1, dtype=torch.float32),
            True,
        )
    except (AssertionError, NotImplementedError):
        return True
    except Exception as exc:  # noqa: BLE001 - an answer other than a refusal: the build is left as it is
        LOG.warning("specsweep: the CPU rejection kernel's synthetic mode could not be probed (%r); left as is", exc)
    return False


def load_plugin() -> None:
    """The plugin's entry point (vLLM calls it in each of its processes): on the CPU platform,
    where the installed build refuses synthetic mode, wrap its two rejection kernels before
    the platform registers them."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return  # the GPU kernels implement synthetic mode themselves
    from vllm.utils import cpu_triton_utils

    greedy, random = getattr(cpu_triton_utils, GREEDY), getattr(cpu_triton_utils, RANDOM)
    if hasattr(greedy, WRAPPED) or not lacks_synthetic(greedy):
        return
    setattr(cpu_triton_utils, GREEDY, wrap_greedy(greedy))
    setattr(cpu_triton_utils, RANDOM, wrap_random(random))
    LOG.info(WRAPPED_NOTE)
