from __future__ import annotations

import pytest

from pipeline.redact import is_secret_name, redact_text, secret_values, shell_line


@pytest.mark.parametrize("name", ["engine.env.HF_TOKEN", "OPENAI_API_KEY", "api_key", "access_token", "db_password"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["workload.max_tokens", "num_speculative_tokens", "tokenizer", "prompt_tokens", "k"])
def test_token_counts_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_commands_and_text_are_masked() -> None:
    args = ["vllm", "--api-key", "sk-abcdef", "--hf-token=hf_xyz123", "--port", "8000"]
    line = shell_line(args)
    assert "sk-abcdef" not in line and "hf_xyz123" not in line and "8000" in line
    secrets = secret_values(args, {"HF_TOKEN": "hf_envtoken", "PATH": "/usr/bin"})
    text = "args: api_key=sk-abcdef token hf_envtoken path /usr/bin"
    masked = redact_text(text, secrets)
    assert "sk-abcdef" not in masked and "hf_envtoken" not in masked and "/usr/bin" in masked
