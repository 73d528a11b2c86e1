"""Our method names against the vLLM this venv installs: its real SpeculativeConfig, imported.

An integration test (by its folder) because it imports vLLM's config package (~20 s on 2 cores); a
broken vLLM import fails it, where a skip would hide the break.
"""

from __future__ import annotations

import typing

from pipeline.engines.vllm import JSON_METHODS


def test_our_method_names_exist_in_installed_vllm() -> None:
    # Guards JSON_METHODS against renames in vLLM's own SpeculativeConfig.
    from vllm.config import speculative

    def flatten(tp: object) -> set[str]:
        out: set[str] = set()
        for arg in typing.get_args(tp):
            out |= flatten(arg) if typing.get_args(arg) else {arg}
        return out

    assert set(JSON_METHODS.values()) <= flatten(speculative.SpeculativeMethod)
