"""What a prompt source gives and what the client sends: the types every load module shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol


@dataclass(frozen=True)
class Item:
    """One prompt as a source gives it, before it becomes a numbered request."""

    prompt: str
    category: str
    output_tokens: int | None = None  # a dataset's reference output length, where it has one
    # A chat history to send as it is (a trace's messages); the prompt is then its last turn.
    messages: tuple[dict[str, str], ...] = ()
    # A turn of a trace's conversation: its id, its number, and the think time after the
    # previous turn's answer (None: the first turn, sent at its own time).
    conversation: str = ""
    turn: int = 0
    delay_s: float | None = None


@dataclass(frozen=True)
class Request:
    index: int
    prompt: str
    category: str
    max_tokens: int
    prompt_tokens: int | None = None  # by the model's own tokenizer
    messages: tuple[dict[str, str], ...] = ()  # sent instead of the prompt alone on the chat endpoint
    conversation: str = ""  # a trace's conversation id ("" for a request of its own)
    turn: int = 0
    # A later turn: the index of the previous turn, which must finish first (its answer joins
    # this turn's history), and the think time after it.
    after: int | None = None
    delay_s: float = 0.0

    def alone(self) -> Request:
        """This request as one of its own, outside its window: a conversation's later turn is
        then sent as its user text only (a warm-up, a cache primer, the losslessness probe)."""
        return replace(self, conversation="", turn=0, after=None, delay_s=0.0)


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def vocab_size(self) -> int: ...
