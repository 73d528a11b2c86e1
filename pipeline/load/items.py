"""What a prompt source gives and what the client sends: the types every load module shares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol


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
    # A lengths-only trace line: the token ids to send (exactly input_length of them), the
    # completions endpoint takes them as they are; ``prompt`` is then their text, built so that
    # the server's tokenizer counts input_length tokens on the chat endpoint (traces.py).
    prompt_ids: tuple[int, ...] = ()
    input_length: int | None = None
    # A length read from a file the source caps at workload.max_tokens (ShareGPT's reply: a
    # reference, not a length the user wrote); any other stated length is sent as it is.
    capped: bool = False


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
    prompt_ids: tuple[int, ...] = ()  # sent instead of the text on the completions endpoint (Item.prompt_ids)
    # What the source stated, for the window's check that the server kept to it: an input
    # length (a lengths-only line), and whether max_tokens is a stated output length.
    input_length: int | None = None
    stated_length: bool = False
    # Tokens of the prompt, as the server sees it, that an earlier request of the window shares:
    # the most an emptied prefix cache can serve it (analysis/trust.py); None: not counted.
    shared_prefix_tokens: int | None = None

    def alone(self) -> Request:
        """This request as one of its own, outside its window: a conversation's later turn is
        then sent as its user text only (a warm-up, a cache primer, the losslessness probe)."""
        return replace(self, conversation="", turn=0, after=None, delay_s=0.0)


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, conversation: Sequence[dict[str, str]], **kwargs: Any) -> Any: ...

    @property
    def vocab_size(self) -> int: ...
