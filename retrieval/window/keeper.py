"""A session's recent window, kept within budget by pruning and compaction (see
`retrieval.window.compaction`), its state stored as summary versions in SQL.

The window is read with the session (`load`), then kept within the room a turn's plan
leaves it (`keep_within_budget`), which only computes the next summary version: the
caller decides whether to store it (a turn does, a preview does not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from retrieval.prompt.budget import ContextBudget
from retrieval.prompt.layout import ContextAssembler
from retrieval.prompt.render import note_of
from retrieval.window.compaction import WindowPolicy, plan_compaction
from retrieval.window.summarizers import Summarizer
from storage.errors import ConflictError
from storage.records import Fact, Summary, Turn
from storage.sessions import TurnState
from storage.summaries import SummaryRepository


@dataclass(frozen=True, slots=True)
class WindowConfig:
    max_messages: int = 100
    eviction_chunk: int = 20
    # A compaction leaves the window at most this share of its room (its low-water mark).
    # The compacting turn's prompt is computed afresh from the summary on (about the
    # low-water window's tokens), and the window then grows for (1 - share) of its
    # room before the next one: spread over those turns, that recomputation is
    # share / (1 - share) times what the turns add themselves. At 0.5 it is once as
    # much, and the window holds three quarters of its room verbatim on average over a
    # cycle; shedding a quarter (0.75) would cost three times as much, compacting twice as
    # often; 0.25 a third as much, but with five eighths of the room verbatim.
    low_water: float = 0.5


@dataclass(frozen=True, slots=True)
class WindowView:
    """The window as a summary version leaves it: of the messages after the version's
    `through_seq` (`loaded`), those it does not prune."""

    summary: Summary
    loaded: tuple[Turn, ...]
    # A version computed for this view and not stored yet (None: the loaded one).
    new_summary: Summary | None = None

    @property
    def turns(self) -> tuple[Turn, ...]:
        pruned = set(self.summary.pruned_seqs or ())
        return tuple(
            t for t in self.loaded if t.seq > self.summary.through_seq and t.seq not in pruned
        )

    @property
    def pruned_message_ids(self) -> tuple[int, ...]:
        pruned = set(self.summary.pruned_seqs or ())
        return tuple(
            t.id for t in self.loaded if t.seq > self.summary.through_seq and t.seq in pruned
        )

    @property
    def last_seq(self) -> int:
        return max([self.summary.through_seq, *(t.seq for t in self.loaded)])

    @property
    def shown_ids(self) -> set[int]:
        """Turns in view, and the past turns their kept contexts show."""
        return {t.id for t in self.turns} | {
            i for t in self.turns for i in (t.context_note_ids or ())
        }


def current_notes(turns: Sequence[Turn]) -> list[Turn]:
    """Turns whose kept context is of an earlier format lose it: it is not re-inserted,
    so it neither counts nor hides the memories it showed."""
    return [
        t
        if not t.context_note or note_of(t)
        else msgspec.structs.replace(
            t,
            context_note=None,
            context_note_tokens=0,
            context_note_ids=None,
            context_note_fact_ids=None,
        )
        for t in turns
    ]


class WindowKeeper:
    def __init__(
        self,
        summaries: SummaryRepository,
        summarizer: Summarizer,
        assembler: ContextAssembler,
        config: WindowConfig,
    ) -> None:
        self._summaries = summaries
        self._summarizer = summarizer
        self._assembler = assembler
        self._config = config

    @staticmethod
    def load(state: TurnState) -> WindowView:
        """The window as a turn's state read it: the messages after its summary version,
        oldest first."""
        return WindowView(state.summary, tuple(current_notes(state.window)))

    async def keep_within_budget(
        self,
        view: WindowView,
        *,
        budget: ContextBudget,
        room: int,
        pinned: Sequence[Fact],
        content_tokens: int,
    ) -> WindowView:
        """The window pruned and compacted if it is over `room` (what the prompt leaves it
        this turn) or over its message count, with the new summary version it needs
        (`new_summary`, not stored: see `store`).

        A compaction brings the window down to its low-water mark: the configured share
        of `room`, and never more than a window that fits with every other section at its
        full share, so the prompt of the compacting turn, with its grown summary and
        whatever it retrieves, keeps the whole window.
        """
        summary = view.summary
        at_full_shares = await self._assembler.window_budget_at_full_shares(
            budget, await self._assembler.fit_facts(pinned, budget), content_tokens
        )
        policy = WindowPolicy(
            max_messages=self._config.max_messages,
            eviction_chunk=self._config.eviction_chunk,
            token_budget=room,
            low_water_tokens=max(0, min(int(room * self._config.low_water), at_full_shares)),
        )
        pruned_before = frozenset(summary.pruned_seqs or ())
        plan = plan_compaction(view.loaded, pruned_before, policy, self._assembler.message_tokens)
        if not plan.evicted and plan.pruned_seqs == pruned_before:
            return view
        text = summary.text
        if plan.evicted:
            limit = budget.share(budget.summary_share)
            text = await self._summarizer.summarize(summary.text, plan.evicted, limit)
        new = Summary(
            session_id=summary.session_id,
            version=summary.version + 1,
            through_seq=plan.through_seq or summary.through_seq,
            pruned_seqs=sorted(plan.pruned_seqs),
            text=text,
            summarizer=self._summarizer.name if plan.evicted else summary.summarizer,
            token_count=await self._assembler.count_tokens(text) if text else 0,
            # The prefix changes here anyway: the system message takes up every pinned fact.
            pinned_fact_ids=sorted(f.id for f in pinned),
        )
        return WindowView(new, view.loaded, new_summary=new)

    async def store(self, summary: Summary) -> None:
        """Store a computed summary version (a turn does; a preview does not)."""
        try:
            await self._summaries.add_summary(summary)
        except ConflictError:
            # Another process compacted this session first; its version stands and this
            # turn's prompt is built from an equivalent state.
            return
