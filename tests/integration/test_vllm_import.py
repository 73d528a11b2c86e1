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


def test_an_extra_arg_the_installed_vllm_lacks_is_refused_by_its_own_parser() -> None:
    # The bad-input table (tests/unit/test_bad_input.py) runs this refusal on a few recorded flags;
    # here the installed vLLM's own parser is asked, as every sweep asks it.
    import pytest

    from pipeline.config import ConfigError, EngineConfig
    from pipeline.engines.vllm import check_serve_args, detect_install, serve_flags

    install = detect_install()
    flags, why = serve_flags(install)
    assert flags is not None and {"--max-num-seqs", "--max-model-len", "--speculative-config"} <= flags, why
    with pytest.raises(
        ConfigError, match="passes --max-num-seq, which the installed vLLM .* did you mean --max-num-seqs"
    ):
        check_serve_args(EngineConfig(extra_args=["--max-num-seq", "8"]), install)
    check_serve_args(EngineConfig(extra_args=["--max-num-seqs", "8"]), install)  # a real flag passes
