"""A turn's context, for the turn and for its preview alike: search the user's past turns
(less the window) and knowledge, place the pinned facts, plan the prompt, keep the window
within the room the plan leaves it (placing and planning again if it compacts), and
assemble.

Building has no side effect: it returns the next summary version the window needs and
the context block the message keeps, and the caller stores them (a turn) or not (a
preview).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from retrieval.chat.config import ChatConfig, check_text
from retrieval.chat.timing import StageClock
from retrieval.chat.turn_report import FoundMemories, weigh_memories
from retrieval.errors import InvalidInputError
from retrieval.facts.memory import FactMemory, fact_order
from retrieval.knowledge.base import KnowledgeBase, KnowledgeHit
from retrieval.prompt.budget import ContextBudget, max_reply_tokens
from retrieval.prompt.excerpt import with_excerpts
from retrieval.prompt.layout import ContextAssembler, Sections
from retrieval.prompt.pinned import PinnedPlaces, place_pinned
from retrieval.prompt.report import AssembledContext
from retrieval.prompt.reuse import PrefixTracker
from retrieval.protocols import Engine, SamplingParams, ScoredId
from retrieval.search.hits import turn_hits
from retrieval.search.memory import TurnMemory
from retrieval.search.trace import SearchTrace
from retrieval.stages import stage
from retrieval.turns import SearchHit
from retrieval.window.keeper import WindowKeeper, WindowView
from storage.messages import MessageRepository
from storage.records import Fact
from storage.sessions import SessionState, TurnState


@dataclass(frozen=True, slots=True)
class BuiltContext:
    context: AssembledContext
    # The window as the prompt has it; `view.new_summary` is a version to store, if any.
    view: WindowView
    # The turn's own context block, which its message keeps ("" for none).
    note: str
    note_tokens: int
    # The prompt's tokens, to measure the next prompt's reuse against.
    tokens: list[int]
    # The memories shown and left out, with their scores (for the turn's report).
    memories: FoundMemories = field(default_factory=FoundMemories)


@dataclass(frozen=True, slots=True)
class _Found:
    memories: tuple[SearchHit, ...]
    knowledge: tuple[KnowledgeHit, ...]
    places: PinnedPlaces
    # What the search ranked and returned, before the rows were read.
    trace: SearchTrace
    scored: tuple[ScoredId, ...]


class ContextBuilder:
    def __init__(
        self,
        memory: TurnMemory,
        messages: MessageRepository,
        windows: WindowKeeper,
        assembler: ContextAssembler,
        engine: Engine,
        prefixes: PrefixTracker,
        config: ChatConfig,
        *,
        facts: FactMemory | None = None,
        knowledge: KnowledgeBase | None = None,
    ) -> None:
        self._memory = memory
        self._messages = messages
        self._windows = windows
        self._assembler = assembler
        self._engine = engine
        self._prefixes = prefixes
        self._config = config
        self._facts = facts
        self._knowledge = knowledge

    def budget(self, params: SamplingParams) -> ContextBudget:
        return ContextBudget(
            context_window=self._engine.context_window,
            reply_tokens=params.max_tokens,
            memory_share=self._config.memory_share,
            memory_max_tokens=self._config.memory_max_tokens,
            facts_share=self._config.facts_share,
            summary_share=self._config.summary_share,
            knowledge_share=self._config.knowledge_share if self._knowledge else 0.0,
        )

    async def check(self, content: str, params: SamplingParams) -> int:
        """The message's tokens, after refusing one that cannot be taken (blank, too long,
        or not fitting the window with the system prompt and the reply)."""
        check_text(content, "content", self._config.max_content_chars)
        budget = self.budget(params)
        limit = max_reply_tokens(budget.context_window)
        if params.max_tokens > limit:
            raise InvalidInputError(
                "max_tokens",
                f"max_tokens is {params.max_tokens}; at most {limit} (half the "
                f"{budget.context_window}-token context window) may be reserved for the reply",
            )
        content_tokens = await self._engine.count_tokens(content)
        self._assembler.check_fits(content_tokens, budget)
        return content_tokens

    async def build(
        self,
        state: TurnState,
        view: WindowView,
        vector: np.ndarray,
        content: str,
        content_tokens: int,
        params: SamplingParams,
        clock: StageClock,
        *,
        instructions: str = "",
    ) -> BuiltContext:
        """The context a message gets in this session (see the module docstring).

        The window's room depends on what this turn retrieves, so the window is kept
        within budget after the search; a compaction changes what is in view, and the
        pinned facts' places and the plan are done again for it. The search is not: the
        turns a compaction takes out of the window are in its new summary, and stay out
        of this turn's memories as the window's turns were (the next turn may retrieve
        them).
        """
        budget = self.budget(params)
        pinned = sorted(state.pinned_facts, key=fact_order) if self._facts is not None else []
        found = await self._find(state, view, vector, content, pinned, clock)
        with stage("assemble") as assembling:
            plan = await self._assembler.plan(
                self._sections(found, view, content, instructions), self._turn_budget(budget, view)
            )
            kept = await self._windows.keep_within_budget(
                view,
                budget=budget,
                room=plan.window_room,
                pinned=pinned,
                content_tokens=content_tokens,
            )
            if kept.summary != view.summary:
                # What the kept window shows, the first view showed too: no memory repeats it.
                found = replace(found, places=_places(state, kept, pinned))
                plan = await self._assembler.plan(
                    self._sections(found, kept, content, instructions),
                    self._turn_budget(budget, kept),
                )
            assembled = await self._assembler.assemble(plan, kept.turns)
            tokens = await self._engine.prompt_tokens(assembled.messages)
            report = replace(
                assembled.report,
                pinned_facts=tuple(
                    sorted(
                        [*assembled.report.pinned_facts, *found.places.shown_before], key=fact_order
                    )
                ),
                summary_version=kept.summary.version,
                summary_through_seq=kept.summary.through_seq,
                pruned_message_ids=kept.pruned_message_ids,
                prefix_reuse=self._prefixes.reuse(state.session.id, tokens),
            )
            note = self._assembler.turn_context(report)
            assembling.record(prompt_tokens=report.prompt_tokens)
            weighed = await weigh_memories(
                found.trace,
                self._config.retrieval_k,
                found.scored,
                found.memories,
                report.memories,
            )
            return BuiltContext(
                context=replace(assembled, report=report),
                view=kept,
                note=note,
                note_tokens=await self._assembler.note_tokens(note),
                tokens=tokens,
                memories=weighed,
            )

    def _turn_budget(self, budget: ContextBudget, view: WindowView) -> ContextBudget:
        """The budget with this turn's memory room: the memory budget less the context
        notes the window already shows (memories retrieved for its earlier turns), and at
        least `memory_min_tokens` of it. A fresh session's first turn fills the whole
        budget; later turns add a few memories each, so that the window, which keeps every
        note, grows slowly and the prompt's prefix lasts."""
        full = budget.memory_tokens
        shown = sum(t.context_note_tokens for t in view.turns)
        room = max(min(self._config.memory_min_tokens, full), full - shown)
        return replace(budget, memory_max_tokens=room)

    @staticmethod
    def _sections(found: _Found, view: WindowView, content: str, instructions: str) -> Sections:
        return Sections(
            new_message=content,
            memories=found.memories,
            knowledge=found.knowledge,
            pinned=found.places.in_system,
            new_facts=found.places.new,
            summary=view.summary.text,
            instructions=instructions,
        )

    async def _find(
        self,
        state: SessionState,
        view: WindowView,
        vector: np.ndarray,
        content: str,
        pinned: Sequence[Fact],
        clock: StageClock,
    ) -> _Found:
        """This turn's memories and knowledge, and where each pinned fact goes, for the
        window as `view` has it (its turns, and the turns its context notes show, are not
        retrieved again)."""
        user = state.user
        trace = SearchTrace()
        with clock.stage("search") as searching:
            scored, found = await asyncio.gather(
                self._memory.search(
                    user.id,
                    vector,
                    self._config.retrieval_k,
                    view.shown_ids,
                    query=content,
                    version=user.memory_version,
                    trace=trace,
                ),
                self._knowledge_for(state, vector, content),
            )
            memories = with_excerpts(
                await turn_hits(self._messages, user.id, scored, content),
                content,
                self._config.excerpt_min_sentences,
            )
            searching.record(num_memories=len(memories), num_knowledge=len(found))
        return _Found(
            tuple(memories), tuple(found), _places(state, view, pinned), trace, tuple(scored)
        )

    async def _knowledge_for(
        self, state: SessionState, vector: np.ndarray, content: str
    ) -> list[KnowledgeHit]:
        if self._knowledge is None or self._config.knowledge_k <= 0:
            return []
        with stage("index_search", index="knowledge", k=self._config.knowledge_k) as searching:
            hits = await self._knowledge.search(
                state.user.tenant_id,
                state.user.id,
                await self._memory.dense_query(content, vector),
                self._config.knowledge_k,
                with_documents=(state.has_shared_knowledge, state.has_own_knowledge),
            )
            searching.record(num_hits=len(hits))
        return hits


def _places(state: SessionState, view: WindowView, pinned: Sequence[Fact]) -> PinnedPlaces:
    """Where each pinned fact goes, for the window as `view` has it."""
    return place_pinned(pinned, view.summary, view.turns, state.session.created_at)
