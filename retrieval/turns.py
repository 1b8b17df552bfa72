"""A stored turn and a search hit: the one shape of a turn in this layer is storage's
record (`storage.records.Turn`); a hit is that turn with its score."""

from __future__ import annotations

from dataclasses import dataclass

from storage.records import NewTurn, Turn

__all__ = ["NewTurn", "SearchHit", "Turn"]


@dataclass(frozen=True, slots=True)
class SearchHit:
    turn: Turn
    score: float
    # What a prompt shows of a long turn, cut to the part that answers its message
    # (`retrieval.prompt.excerpt`); None: the whole turn.
    excerpt: str | None = None
