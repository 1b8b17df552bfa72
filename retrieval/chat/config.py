"""The limits and shares of chat turns; the defaults are the service's (the settings')."""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.errors import InvalidInputError
from retrieval.text import is_blank


@dataclass(frozen=True, slots=True)
class ChatConfig:
    # The most memories a turn may show: they fill the memory section best first until
    # its budget (`memory_share` of the prompt, at most `memory_max_tokens`) is used.
    # The context notes the recent window already shows count against that budget, but a
    # turn always has `memory_min_tokens` (or the whole budget, if smaller) for its own.
    retrieval_k: int = 50
    memory_share: float = 0.25
    memory_max_tokens: int = 1_792
    memory_min_tokens: int = 384
    # A memory of this many sentences or more is shown by those that match the message
    # (`retrieval.prompt.excerpt`); 0: every memory whole.
    excerpt_min_sentences: int = 0
    facts_share: float = 0.15
    summary_share: float = 0.10
    max_content_chars: int = 32_000
    max_import_messages: int = 1_000
    # Characters of all messages of one import together: what one request may make the
    # service embed and index.
    max_import_chars: int = 400_000
    # A session's metadata, encoded as JSON.
    max_metadata_bytes: int = 16_384
    # Turns admitted at once (generating or waiting for the engine); more are refused.
    max_pending_turns: int = 8
    # Knowledge-base chunks retrieved per turn, and their share of the prompt budget.
    knowledge_k: int = 3
    knowledge_share: float = 0.2


def check_text(text: str, field: str, max_chars: int) -> None:
    """Refuse text a user sends (a message, a query) that is blank or over the limit."""
    if is_blank(text):
        raise InvalidInputError(field, f"{field} must not be empty")
    if len(text) > max_chars:
        raise InvalidInputError(
            field, f"{field} has {len(text)} characters; the limit is {max_chars}"
        )
