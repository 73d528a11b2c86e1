"""Keep secrets (API keys, HF tokens) out of everything we record: commands, params, tags."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

MASK = "***"
SECRET_FLAGS = ("--api-key", "--hf-token")
# "token" followed by "s" or "izer" counts or splits text (max_tokens, tokenizer): no secret.
_SECRET_NAME = re.compile(r"api[_-]?key|secret|password|passwd|credential|token(?!s|izer)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.rsplit(".", 1)[-1]))


def flag_name(arg: str) -> str:
    """A flag as vLLM's parser reads it: ``--api_key=x`` is ``--api-key``."""
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def redact_args(args: Iterable[str]) -> list[str]:
    out = list(args)
    for i, part in enumerate(out):
        if "=" not in part and flag_name(part) in SECRET_FLAGS and i + 1 < len(out):
            out[i + 1] = MASK
        elif "=" in part and flag_name(part) in SECRET_FLAGS:
            out[i] = part.split("=", 1)[0] + "=" + MASK
    return out


def shell_line(args: Iterable[str]) -> str:
    """A command as one shell line, secrets masked: what logs and MLflow may hold."""
    return " ".join(shlex.quote(p) for p in redact_args(args))


def redact_mapping(values: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else v) for k, v in values.items()}


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """Mask known secret values wherever they appear (a server may echo its arguments)."""
    # Short values ("1", "true") would mask ordinary words; real keys and tokens are longer.
    for secret in sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def secret_values(args: Iterable[str], env: dict[str, str]) -> list[str]:
    """The values in a command and an environment that must never be recorded."""
    args = list(args)
    found = [v for k, v in env.items() if is_secret_name(k) and v]
    for i, part in enumerate(args):
        if part in SECRET_FLAGS and i + 1 < len(args):
            found.append(args[i + 1])
        elif part.startswith(tuple(f + "=" for f in SECRET_FLAGS)):
            found.append(part.split("=", 1)[1])
    return found
