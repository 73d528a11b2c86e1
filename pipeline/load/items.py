"""What a prompt source gives and what the client sends: the types every load module shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Item:
    """One prompt as a source gives it, before it becomes a numbered request."""

    prompt: str
    category: str
    output_tokens: int | None = None  # a dataset's reference output length, where it has one
    # A chat history to send as it is (a trace's messages); the prompt is then its last turn.
    messages: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class Request:
    index: int
    prompt: str
    category: str
    max_tokens: int
    prompt_tokens: int | None = None  # by the model's own tokenizer
    messages: tuple[dict[str, str], ...] = ()  # sent instead of the prompt alone on the chat endpoint


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def vocab_size(self) -> int: ...
