"""What is indexed for a turn: the turn itself plus what a later question will match.

A turn such as "take a look at this" means nothing alone; a question about it names the
speaker, the thing in the photo, the topic of the turn before it, or when it happened.
So the indexed text of a turn may carry its speaker, its date, an image caption and the
turns just before it in its session. Only the index sees this text: search returns the
raw turn. The recipe is part of the vectors' identity (see `TextRecipe.tag`): vectors
made from another recipe are stale and rebuilt like vectors of another model.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

PREVIOUS_CHARS = 300


@dataclass(frozen=True, slots=True)
class TurnText:
    """The parts of a stored turn that may go into its indexed text."""

    session_id: str
    seq: int
    role: str
    name: str | None
    content: str
    created_at: dt.datetime
    image_caption: str | None = None


@dataclass(frozen=True, slots=True)
class TextRecipe:
    speaker: bool = False
    date: bool = False
    caption: bool = False
    # How many earlier turns of the same session are added (each cut to PREVIOUS_CHARS).
    previous: int = 0

    @property
    def is_raw(self) -> bool:
        return self == TextRecipe()

    def tag(self) -> str:
        """A stable name of the recipe; 'raw' is the turn's content alone."""
        if self.is_raw:
            return "raw"
        parts = [name for name in ("speaker", "date", "caption") if getattr(self, name)] + (
            [f"previous{self.previous}"] if self.previous else []
        )
        return "+".join(parts)


def speaker_of(turn: TurnText) -> str:
    return turn.name or turn.role


def format_date(value: dt.datetime) -> str:
    return f"{value.day} {value:%B %Y}"


def own_text(recipe: TextRecipe, turn: TurnText) -> str:
    """The turn with its speaker, caption and date, as the recipe asks."""
    text = f"{speaker_of(turn)}: {turn.content}" if recipe.speaker else turn.content
    if recipe.caption and turn.image_caption:
        text += f" [image: {turn.image_caption}]"
    if recipe.date:
        text += f" (on {format_date(turn.created_at)})"
    return text


def context_text(recipe: TextRecipe, previous: Sequence[TurnText]) -> str:
    """The last `recipe.previous` of the turns before one (oldest first), each cut short."""
    if not recipe.previous:
        return ""
    return "".join(
        f"\n(after {speaker_of(earlier)}: {earlier.content[:PREVIOUS_CHARS]})"
        for earlier in previous[-recipe.previous :]
    )


def indexed_text(recipe: TextRecipe, turn: TurnText, previous: Sequence[TurnText] = ()) -> str:
    """The turn first (truncating embedders keep it), then its context."""
    return own_text(recipe, turn) + context_text(recipe, previous)


def indexed_parts(recipe: TextRecipe, turns: Sequence[TurnText]) -> list[tuple[str, str]]:
    """(own text, context text) of turns given in order within each session (sessions may
    interleave): the turns before one in its own session are its context."""
    parts = []
    seen: dict[str, list[TurnText]] = {}
    for turn in turns:
        earlier = seen.setdefault(turn.session_id, [])
        parts.append((own_text(recipe, turn), context_text(recipe, earlier)))
        earlier.append(turn)
    return parts


def indexed_texts(recipe: TextRecipe, turns: Sequence[TurnText]) -> list[str]:
    """Indexed texts (own text then context) of turns, as `indexed_parts` orders them."""
    return [own + context for own, context in indexed_parts(recipe, turns)]
