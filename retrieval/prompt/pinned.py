"""Where each pinned fact goes in a turn's prompt: the system message, or the turn's own
context, so that a fact pinned in the middle of a session never changes the prefix."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from retrieval.facts.memory import PinnedFact
from retrieval.window.keeper import WindowView


def split_pinned(
    pinned: Sequence[PinnedFact], view: WindowView, session_started: dt.datetime
) -> tuple[list[PinnedFact], list[PinnedFact], list[PinnedFact]]:
    """(in the system message, new this turn, shown by an earlier turn in the window).

    The system message carries the facts pinned as of the window's last compaction, or,
    before the session's first compaction, the facts that existed when the session
    began; facts pinned since are shown once, in a turn's own context, which the
    transcript then keeps: a new fact never changes the prompt's prefix.
    """
    if view.state.version:
        snapshot = view.state.pinned_fact_ids
    else:
        snapshot = frozenset(f.id for f in pinned if f.created_at <= session_started)
    in_notes = {i for t in view.turns for i in t.note_fact_ids}
    in_system = [f for f in pinned if f.id in snapshot]
    new = [f for f in pinned if f.id not in snapshot and f.id not in in_notes]
    shown = [f for f in pinned if f.id not in snapshot and f.id in in_notes]
    return in_system, new, shown
