"""Where each pinned fact goes in a turn's prompt: the system message, or the turn's own
context, so that a fact pinned in the middle of a session never changes the prefix."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.facts.memory import fact_order
from storage.records import Fact, Summary, Turn

__all__ = ["PinnedPlaces", "fact_order", "place_pinned"]


@dataclass(frozen=True, slots=True)
class PinnedPlaces:
    in_system: tuple[Fact, ...]
    # Pinned since the system message's snapshot and shown by no turn in the window yet.
    new: tuple[Fact, ...]
    # Pinned since, and shown by an earlier turn of the window (its note carries it).
    shown_before: tuple[Fact, ...]


def place_pinned(
    pinned: Sequence[Fact], summary: Summary, window: Sequence[Turn], session_started: dt.datetime
) -> PinnedPlaces:
    """The system message carries the facts pinned as of the window's last compaction, or,
    before the session's first compaction, the facts that existed when the session
    began; facts pinned since are shown once, in a turn's own context, which the
    transcript then keeps: a new fact never changes the prompt's prefix."""
    if summary.version:
        snapshot = frozenset(summary.pinned_fact_ids or ())
    else:
        snapshot = frozenset(f.id for f in pinned if f.created_at <= session_started)
    in_notes = {i for t in window for i in (t.context_note_fact_ids or ())}
    return PinnedPlaces(
        in_system=tuple(f for f in pinned if f.id in snapshot),
        new=tuple(f for f in pinned if f.id not in snapshot and f.id not in in_notes),
        shown_before=tuple(f for f in pinned if f.id not in snapshot and f.id in in_notes),
    )
