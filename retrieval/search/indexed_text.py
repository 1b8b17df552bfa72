"""What is indexed for a turn: the turn itself plus what a later question will match.

A turn such as "take a look at this" means nothing alone; a question about it names the
speaker, the thing in the photo, the topic of the turn before it, or when it happened.
So the indexed text of a turn may carry its speaker, its date, an image caption and the
turns just before it in its session. Only the index sees this text: search returns the
raw turn. The recipe is part of the vectors' identity (see `TextRecipe.tag`): vectors
made from another recipe are stale and rebuilt like vectors of another model.

Windows (dense recipes only): a small sentence embedder reduces a long turn to one
vector in which a detail said in passing is lost ("... and my sister's dog Max is
sick"). A windowed recipe cuts the content into windows of a few words, renders each
like a turn of its own (speaker, date), adds the caption and the context as further
pieces, and the turn's vector is the mean of its pieces' vectors: each part of the turn
keeps its weight whatever the length of the rest.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from retrieval.text import CJK, CJK_CHAR
from storage.records import Turn

PREVIOUS_CHARS = 300

# A word of a window: a run of non-space characters outside CJK scripts, or one CJK
# character, which counts as half a word (Chinese says in about two characters what
# English says in a word).
_WORD = re.compile(f"[{CJK}]|[^\\s{CJK}]+")


@dataclass(frozen=True, slots=True)
class TextRecipe:
    speaker: bool = False
    date: bool = False
    caption: bool = False
    # How many earlier turns of the same session are added (each cut to PREVIOUS_CHARS).
    previous: int = 0
    # Words per window of the content (0: the turn is one piece; see the module docstring).
    window: int = 0

    @property
    def is_raw(self) -> bool:
        return self == TextRecipe()

    def stored_name(self, model_name: str) -> str:
        """The name stored with each vector of this recipe: the model's, and the recipe's
        tag unless raw (vectors of another recipe are refused, as another model's)."""
        return model_name if self.is_raw else f"{model_name}#{self.tag()}"

    def tag(self) -> str:
        """A stable name of the recipe; 'raw' is the turn's content alone."""
        if self.is_raw:
            return "raw"
        parts = [name for name in ("speaker", "date", "caption") if getattr(self, name)]
        parts += [f"previous{self.previous}"] if self.previous else []
        parts += [f"window{self.window}"] if self.window else []
        return "+".join(parts)


def speaker_of(turn: Turn) -> str:
    return turn.name or turn.role


def format_date(value: dt.datetime) -> str:
    return f"{value.day} {value:%B %Y}"


def own_text(recipe: TextRecipe, turn: Turn, content: str | None = None) -> str:
    """The turn (or `content`, a part of it) with its speaker, caption and date, as the
    recipe asks."""
    content = turn.content if content is None else content
    text = f"{speaker_of(turn)}: {content}" if recipe.speaker else content
    if recipe.caption and turn.image_caption:
        text += f" [image: {turn.image_caption}]"
    if recipe.date:
        text += f" (on {format_date(turn.created_at)})"
    return text


def split_windows(text: str, num_words: int) -> list[str]:
    """`text` cut into consecutive windows of `num_words` words (CJK characters count
    half; the last window takes what is left), each a slice of the original text; at
    least one window. (Windows of equal size, 6-6-5 rather than 8-8-1, measured the
    same on LoCoMo: bench/RESULTS.md.)"""
    windows: list[str] = []
    start = end = 0
    size = 0.0
    for match in _WORD.finditer(text):
        weight = 0.5 if CJK_CHAR.match(match.group()) else 1.0
        if size and size + weight > num_words:
            windows.append(text[start:end])
            size = 0.0
        if not size:
            start = match.start()
        end = match.end()
        size += weight
    if size:
        windows.append(text[start:end])
    return windows or [text]


def dense_pieces(recipe: TextRecipe, turn: Turn, previous: Sequence[Turn] = ()) -> list[str]:
    """The texts whose vectors make the turn's vector: its indexed text alone, or with a
    windowed recipe each window of the content (as the recipe renders a turn), the
    caption and the context."""
    if not recipe.window:
        return [indexed_text(recipe, turn, previous)]
    plain = TextRecipe(speaker=recipe.speaker, date=recipe.date)
    pieces = [
        own_text(plain, turn, window) for window in split_windows(turn.content, recipe.window)
    ]
    if recipe.caption and turn.image_caption:
        pieces.append(own_text(plain, turn, f"[image: {turn.image_caption}]"))
    context = context_text(recipe, previous).strip()
    if context:
        pieces.append(context)
    return pieces


def context_text(recipe: TextRecipe, previous: Sequence[Turn]) -> str:
    """The last `recipe.previous` of the turns before one (oldest first), each cut short."""
    if not recipe.previous:
        return ""
    return "".join(
        f"\n(after {speaker_of(earlier)}: {earlier.content[:PREVIOUS_CHARS]})"
        for earlier in previous[-recipe.previous :]
    )


def indexed_text(recipe: TextRecipe, turn: Turn, previous: Sequence[Turn] = ()) -> str:
    """The turn first (truncating embedders keep it), then its context."""
    return own_text(recipe, turn) + context_text(recipe, previous)


def with_earlier(turns: Sequence[Turn]) -> Iterator[tuple[Turn, list[Turn]]]:
    """Each turn with the turns before it in its own session, for turns given in order
    within each session (sessions may interleave)."""
    seen: dict[str, list[Turn]] = {}
    for turn in turns:
        earlier = seen.setdefault(turn.session_id, [])
        yield turn, earlier
        earlier.append(turn)


def indexed_parts(recipe: TextRecipe, turns: Sequence[Turn]) -> list[tuple[str, str]]:
    """(own text, context text) of turns as `with_earlier` takes them: the turns before
    one in its own session are its context."""
    return [
        (own_text(recipe, turn), context_text(recipe, earlier))
        for turn, earlier in with_earlier(turns)
    ]


def dense_texts(recipe: TextRecipe, turns: Sequence[Turn]) -> list[list[str]]:
    """The dense pieces of turns as `with_earlier` takes them, in the same order."""
    return [dense_pieces(recipe, turn, earlier) for turn, earlier in with_earlier(turns)]


def mean_of_pieces(vectors: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """One unit vector per turn from the vectors of its pieces, given in turn order
    (`counts[i]` pieces for turn i): their normalised mean; a single piece as it is."""
    if len(vectors) == len(counts):
        return vectors
    bounds = np.cumsum([0, *counts])
    means = np.add.reduceat(vectors, bounds[:-1], axis=0) / np.diff(bounds)[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return (means / np.where(norms > 0, norms, 1.0)).astype(np.float32)


async def embed_turns(
    embed: Callable[[list[str]], Awaitable[np.ndarray]],
    recipe: TextRecipe,
    turns: Sequence[Turn],
    ordered: list[Turn],
) -> np.ndarray:
    """One vector per turn of `turns` (`ordered`: them with their context, in session
    order): the normalised mean of the vectors of its dense pieces, all in one call."""
    pieces = dense_texts(recipe, ordered)
    by_id = {t.id: p for t, p in zip(ordered, pieces, strict=True)}
    wanted = [by_id[t.id] for t in turns]
    vectors = await embed([text for texts in wanted for text in texts])
    return mean_of_pieces(vectors, [len(texts) for texts in wanted])
