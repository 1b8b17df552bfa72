"""A session's recent window, kept within budget by pruning and compaction (see
retrieval.window.compaction), with the state stored as summary versions in SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.facts.memory import PinnedFact
from retrieval.prompt.budget import ContextBudget
from retrieval.prompt.layout import ContextAssembler
from retrieval.prompt.render import is_context_block
from retrieval.protocols import Summarizer, WindowTurn
from retrieval.timeutil import as_utc
from retrieval.window.compaction import SummaryState, WindowPolicy, plan_compaction
from storage.errors import ConflictError
from storage.models import Message
from storage.repository import Store
from storage.summaries import SummaryStore


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
    state: SummaryState
    turns: tuple[WindowTurn, ...]
    pruned_message_ids: tuple[int, ...] = ()


def window_turn(row: Message) -> WindowTurn:
    """A stored message as the window shows it. A context note kept by an earlier
    version (not one block of the current format) is not re-inserted."""
    notes = row.context_note or []
    kept = len(notes) == 1 and is_context_block(notes[0])
    return WindowTurn(
        message_id=row.id,
        seq=row.seq,
        role=row.role,
        name=row.name,
        text=row.content,
        # What the message takes in a prompt, its re-inserted context included.
        token_count=row.token_count + (row.context_note_tokens if kept else 0),
        created_at=as_utc(row.created_at),
        note=notes[0] if kept else "",
        note_ids=tuple(row.context_note_ids or ()) if kept else (),
        note_fact_ids=tuple(row.context_note_fact_ids or ()) if kept else (),
    )


class WindowKeeper:
    def __init__(
        self,
        store: Store,
        summaries: SummaryStore,
        summarizer: Summarizer,
        assembler: ContextAssembler,
        config: WindowConfig,
    ) -> None:
        self._messages = store
        self._summaries = summaries
        self._summarizer = summarizer
        self._assembler = assembler
        self._config = config

    @property
    def summaries(self) -> SummaryStore:
        return self._summaries

    async def load(self, session_id: str) -> tuple[SummaryState, list[WindowTurn]]:
        """The current summary state and every message after it, oldest first."""
        row = await self._summaries.get_current_or_none(session_id)
        state = SummaryState()
        if row is not None:
            state = SummaryState(
                version=row.version,
                through_seq=row.through_seq,
                pruned_seqs=frozenset(row.pruned_seqs),
                text=row.text,
                summarizer=row.summarizer,
                token_count=row.token_count,
                pinned_fact_ids=frozenset(row.pinned_fact_ids or ()),
            )
        rows = await self._messages.list_messages(session_id, after_seq=state.through_seq)
        return state, [window_turn(r) for r in rows]

    async def keep_within_budget(
        self,
        session_id: str,
        state: SummaryState,
        window: Sequence[WindowTurn],
        *,
        budget: ContextBudget,
        room: int,
        pinned: Sequence[PinnedFact],
        content_tokens: int,
        persist: bool,
    ) -> WindowView:
        """Prune and compact if the window is over `room` (what the prompt leaves it this
        turn, see ContextAssembler.window_room) or over its message count; a turn stores
        the new summary version, a preview only computes it.

        A compaction brings the window down to its low-water mark: the configured share
        of `room`, and never more than a window that fits with every other section at its
        full share, so the prompt of the compacting turn, with its grown summary and
        whatever it retrieves, keeps the whole window.
        """
        at_full_shares = self._assembler.window_budget_at_full_shares(
            budget, self._assembler.fit_facts(pinned, budget), content_tokens
        )
        policy = WindowPolicy(
            max_messages=self._config.max_messages,
            eviction_chunk=self._config.eviction_chunk,
            token_budget=room,
            low_water_tokens=max(0, min(int(room * self._config.low_water), at_full_shares)),
        )
        plan = plan_compaction(window, state, policy, self._assembler.message_tokens)
        if not plan.evicted and plan.pruned_seqs == state.pruned_seqs:
            return view_of(state, window)
        text = state.text
        if plan.evicted:
            limit = budget.share(budget.summary_share)
            text = await self._summarizer.summarize(state.text, plan.evicted, limit)
        new_state = SummaryState(
            version=state.version + 1,
            through_seq=plan.through_seq or state.through_seq,
            pruned_seqs=plan.pruned_seqs,
            text=text,
            summarizer=self._summarizer.name if plan.evicted else state.summarizer,
            token_count=self._assembler.count_tokens(text) if text else 0,
            # The prefix changes here anyway: the system message takes up every pinned fact.
            pinned_fact_ids=frozenset(f.id for f in pinned),
        )
        if persist:
            await self._store(session_id, new_state)
        return view_of(new_state, window)

    async def _store(self, session_id: str, state: SummaryState) -> None:
        try:
            await self._summaries.add_summary(
                session_id,
                version=state.version,
                through_seq=state.through_seq,
                pruned_seqs=sorted(state.pruned_seqs),
                pinned_fact_ids=sorted(state.pinned_fact_ids),
                text=state.text,
                summarizer=state.summarizer,
                token_count=state.token_count,
            )
        except ConflictError:
            # Another process compacted this session first; its version stands and this
            # turn's prompt is built from an equivalent state.
            return


def view_of(state: SummaryState, window: Sequence[WindowTurn]) -> WindowView:
    """The window as `state` leaves it: the turns after the summary, less pruned ones."""
    live = tuple(t for t in window if t.seq > state.through_seq and t.seq not in state.pruned_seqs)
    pruned = tuple(
        t.message_id for t in window if t.seq > state.through_seq and t.seq in state.pruned_seqs
    )
    return WindowView(state, live, pruned)
