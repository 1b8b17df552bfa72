"""Prompt assembly under the engine's context window, counted with the engine's tokenizer.

Layout, chosen so that consecutive turns share the longest possible prompt prefix and
so that the strictest chat templates take it (one system message, first; then user and
assistant alternating, a user message first and last):

    [system: prompt + pinned facts + summary]
    [recent window, oldest first: each user turn opens with the context it was sent with]
    [user: this turn's context (new facts, memories, knowledge), then the new message]

The system message changes only when the pinned facts do or the window is compacted,
and the recent window changes only by appending, so an engine with a prefix cache
reuses them; what is retrieved for this turn comes last, at the head of the new user
message, and is kept with that message so that later prompts carry it unchanged.
An engine whose chat template has no system role folds the system message into the
first user message itself (`retrieval.engines.chat_format.fold_system`), so the layout
is the same for every engine.

A turn plans its prompt once (`plan`: every section but the window fitted to its share,
and the room they leave the window), keeps its window within that room, then assembles
the plan with the window (`assemble`), checking the exact count of the whole prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from retrieval.errors import ContextTooLongError
from retrieval.knowledge.base import KnowledgeHit
from retrieval.prompt.budget import ContextBudget
from retrieval.prompt.pinned import fact_order
from retrieval.prompt.render import (
    FACTS_HEADER,
    HISTORY_OPENING,
    KNOWLEDGE_HEADER,
    MEMORY_HEADER,
    alternate,
    context_block,
    facts_text,
    format_fact,
    format_knowledge,
    format_memory,
    history_message,
    knowledge_text,
    memory_day,
    memory_text,
    new_facts_text,
    summary_text,
    with_note,
)
from retrieval.prompt.report import AssembledContext, ContextReport, SectionTokens
from retrieval.protocols import BoundedEngine, ChatMessage, Engine
from retrieval.turns import SearchHit
from storage.records import Fact, Turn

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sections:
    """What a turn's prompt may show besides its window."""

    new_message: str
    memories: Sequence[SearchHit] = ()
    knowledge: Sequence[KnowledgeHit] = ()
    # Pinned facts of the system message, and those pinned since (the turn's context).
    pinned: Sequence[Fact] = ()
    new_facts: Sequence[Fact] = ()
    summary: str = ""
    # The client's own instructions (its system message), after the service's prompt.
    instructions: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """The sections of one prompt other than the recent window, each fitted to its share,
    and the room they leave the window."""

    sections: Sections
    budget: ContextBudget
    system: str
    facts: tuple[Fact, ...]
    new_facts: tuple[Fact, ...]
    memories: tuple[SearchHit, ...]
    knowledge: tuple[KnowledgeHit, ...]
    window_room: int


def _lead(system: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", "x")]


class ContextAssembler:
    """Built with `await ContextAssembler.measured(engine, system_prompt)`: it measures
    the template's per-message overhead once."""

    def __init__(
        self,
        engine: Engine,
        system_prompt: str,
        *,
        overhead: int,
        system_tokens: int,
        stable_layout: bool = True,
    ) -> None:
        self._engine = engine
        # A lower bound of a text's tokens where the engine has one (`BoundedEngine`).
        self._min_tokens = engine.min_tokens if isinstance(engine, BoundedEngine) else None
        # False puts this turn's context in the system message, before the recent window
        # (to measure what the layout saves: the prefix then changes every turn).
        self._stable_layout = stable_layout
        self._static = system_prompt
        # Template tokens around one message's content (role markers, separators).
        self._overhead = overhead
        # The system text with the template's fixed part (generation prompt included).
        self._system_tokens = system_tokens

    @classmethod
    async def measured(
        cls, engine: Engine, system_prompt: str, *, stable_layout: bool = True
    ) -> ContextAssembler:
        lead = await engine.count_prompt_tokens(_lead(system_prompt))
        with_reply = await engine.count_prompt_tokens(
            [*_lead(system_prompt), ChatMessage("assistant", "x")]
        )
        overhead = with_reply - lead - 1
        return cls(
            engine,
            system_prompt,
            overhead=overhead,
            system_tokens=lead - 1 - overhead,
            stable_layout=stable_layout,
        )

    async def count_tokens(self, text: str) -> int:
        return await self._engine.count_tokens(text)

    def message_tokens(self, content_tokens: int) -> int:
        return content_tokens + self._overhead

    def check_fits(self, new_message_tokens: int, budget: ContextBudget) -> None:
        """Refuse a message that, with the system prompt and the reply, overflows the window."""
        need = self._system_tokens + self.message_tokens(new_message_tokens)
        if need + budget.reply_tokens > budget.context_window:
            raise ContextTooLongError(
                "content",
                f"the message takes {new_message_tokens} tokens; with the system prompt and "
                f"{budget.reply_tokens} tokens reserved for the reply it exceeds the "
                f"{budget.context_window}-token context window",
            )

    async def plan(self, sections: Sections, budget: ContextBudget) -> Plan:
        """Every section but the window, each fitted to its share, and the tokens the
        recent window may take: the prompt budget less what the other sections take this
        turn. A share a section leaves unused (no knowledge documents, a short summary,
        few memories) is the window's; `assemble` keeps a window of this size whole."""
        chosen_facts = await self.fit_facts(sections.pinned, budget)
        already = await self._facts_cost(chosen_facts)
        chosen_new = await self.fit_facts(sections.new_facts, budget, already)
        system = self.system_text(chosen_facts, sections.summary, sections.instructions)
        content_tokens = await self._engine.count_tokens(sections.new_message)
        self.check_fits(content_tokens, budget)
        fixed = await self._system_message_tokens(system) + self.message_tokens(content_tokens)
        memories = await self._fit(
            sections.memories,
            MEMORY_HEADER,
            format_memory,
            budget.memory_tokens,
            group=memory_day,
        )
        knowledge = await self._fit(
            sections.knowledge,
            KNOWLEDGE_HEADER,
            format_knowledge,
            budget.share(budget.knowledge_share),
        )
        block = context_block(chosen_new, memories, knowledge)
        return Plan(
            sections=sections,
            budget=budget,
            system=system,
            facts=tuple(chosen_facts),
            new_facts=tuple(chosen_new),
            memories=tuple(memories),
            knowledge=tuple(knowledge),
            window_room=budget.available - fixed - await self.note_tokens(block),
        )

    async def assemble(self, plan: Plan, recent: Sequence[Turn]) -> AssembledContext:
        """The prompt of a plan with the newest window turns that fit its room; the exact
        count of the rendered prompt decides (estimates are per section): past the
        budget, the oldest turns go, then the last memories, then the last chunks."""
        available = plan.budget.available
        memories, knowledge = plan.memories, plan.knowledge
        window = await self._fit_recent(recent, plan.window_room)

        def layout() -> list[ChatMessage]:
            block = context_block(plan.new_facts, memories, knowledge)
            return self.layout(plan.system, window, block, plan.sections.new_message)

        messages = layout()
        prompt_tokens = await self._engine.count_prompt_tokens(messages)
        while prompt_tokens > available and (window or memories or knowledge):
            if window:
                window = window[1:]
            elif memories:
                memories = memories[:-1]
            else:
                knowledge = knowledge[:-1]
            messages = layout()
            prompt_tokens = await self._engine.count_prompt_tokens(messages)
        report = ContextReport(
            memories=tuple(memories),
            recent_message_ids=tuple(t.id for t in window),
            sections=await self._section_tokens(
                messages, prompt_tokens, plan, window, memories, knowledge
            ),
            prompt_tokens=prompt_tokens,
            context_window=plan.budget.context_window,
            reply_tokens_reserved=plan.budget.reply_tokens,
            pinned_facts=tuple(sorted([*plan.facts, *plan.new_facts], key=fact_order)),
            facts_omitted=_omitted(plan),
            new_facts=plan.new_facts,
            knowledge=tuple(knowledge),
        )
        return AssembledContext(messages=tuple(messages), report=report)

    def system_text(self, facts: Sequence[Fact], summary: str, instructions: str = "") -> str:
        """The static prompt (with the client's instructions, if any), the pinned facts,
        the session summary: the prompt's prefix changes only when the facts, the summary
        or the instructions do."""
        parts = [self._static]
        if instructions:
            parts.append(instructions)
        if facts:
            parts.append(facts_text(facts))
        if summary:
            parts.append(summary_text(summary))
        return "\n\n".join(parts)

    def layout(
        self, system: str, recent: Sequence[Turn], block: str, new_message: str
    ) -> list[ChatMessage]:
        """The prompt's messages: the system text, the window, this turn's message opened
        by its context `block`."""
        system, block = self._place(system, block)
        turns = [history_message(t) for t in recent]
        messages = alternate([*turns, ChatMessage("user", with_note(block, new_message))])
        return [ChatMessage("system", system), *messages]

    def _place(self, system: str, block: str) -> tuple[str, str]:
        """(system text, block of the new message): the unstable layout moves the block
        into the system text."""
        if self._stable_layout or not block:
            return system, block
        return f"{system}\n\n{block}", ""

    def turn_context(self, report: ContextReport) -> str:
        """This turn's context block, as its user message carries it ("" for none): what
        the message keeps, so that later prompts re-insert it as sent."""
        if not self._stable_layout:
            return ""
        return context_block(report.new_facts, report.memories, report.knowledge)

    async def note_tokens(self, note: str) -> int:
        """What a kept context block adds to its user message (with its line break)."""
        return await self._engine.count_tokens(f"{note}\n") if note else 0

    async def _system_message_tokens(self, system: str) -> int:
        """Tokens of the system text with its template (without the first user message)."""
        return await self._engine.count_prompt_tokens(_lead(system)) - self._overhead - 1

    async def window_budget_at_full_shares(
        self, budget: ContextBudget, facts: Sequence[Fact], content_tokens: int
    ) -> int:
        """Tokens the recent window may hold with the summary, memories and knowledge at
        their full shares: a window this size fits whatever the turn retrieves and
        however the summary grows (the most a compaction may leave)."""
        system = await self._system_message_tokens(self.system_text(facts, ""))
        return (
            budget.available
            - system
            - budget.share(budget.summary_share)
            - budget.memory_tokens
            - budget.share(budget.knowledge_share)
            - self.message_tokens(content_tokens)
        )

    async def _facts_cost(self, facts: Sequence[Fact]) -> int:
        if not facts:
            return 0
        lines = [await self._engine.count_tokens(format_fact(f)) + 1 for f in facts]
        return await self._engine.count_tokens(FACTS_HEADER) + 2 + sum(lines)

    async def fit_facts(
        self, facts: Sequence[Fact], budget: ContextBudget, already: int = 0
    ) -> list[Fact]:
        """Facts in priority order while they fit (with `already` tokens of facts taken);
        one that does not fit ends the list, so a lower-priority fact never displaces a
        higher one."""
        limit = budget.share(budget.facts_share) - already
        return await self._fit(facts, FACTS_HEADER, format_fact, limit, in_order=True)

    async def _fit(
        self,
        items: Sequence[T],
        header: str,
        line: Callable[[T], str],
        limit: int,
        *,
        in_order: bool = False,
        group: Callable[[T], str] | None = None,
    ) -> list[T]:
        """The best items (memories, chunks) that fit a share under their header, best
        first; one that does not fit is skipped and a shorter one after it may still fit,
        unless `in_order` (facts), where the first that does not fit ends the list. With
        `group`, an item also pays for its group's opening line (a memory's day) where no
        item chosen before it opened that group."""
        chosen: list[T] = []
        groups: set[str] = set()
        used = await self._engine.count_tokens(header) + 2
        for item in items:
            text = line(item)
            room = limit - used
            # A text of more characters than the room may not fit: where the engine's lower
            # bound says it cannot, it is passed over without being tokenised, as its
            # exact count would have it (a nearly full section skips the other candidates).
            minimum = self._min_tokens
            if minimum is not None and room <= len(text) and minimum(text) + 1 > room:
                if in_order:
                    break
                continue
            cost = await self._engine.count_tokens(text) + 1
            opening = group(item) if group is not None else None
            if opening is not None and opening not in groups:
                cost += await self._engine.count_tokens(opening) + 1
            if used + cost > limit:
                if in_order:
                    break
                continue
            chosen.append(item)
            used += cost
            if opening is not None:
                groups.add(opening)
        return chosen

    async def _fit_recent(self, recent: Sequence[Turn], limit: int) -> list[Turn]:
        """The newest turns that fit, oldest first (a window that would open with the
        assistant's message also pays for the line that opens it instead)."""
        opening = self.message_tokens(await self._engine.count_tokens(HISTORY_OPENING))
        chosen: list[Turn] = []
        used = 0
        for turn in reversed(recent):
            cost = self.message_tokens(turn.prompt_tokens)
            if used + cost + (opening if turn.role == "assistant" else 0) > limit:
                break
            chosen.append(turn)
            used += cost
        chosen.reverse()
        return chosen

    async def _section_tokens(
        self,
        messages: Sequence[ChatMessage],
        prompt_tokens: int,
        plan: Plan,
        recent: Sequence[Turn],
        shown_memories: Sequence[SearchHit],
        shown_knowledge: Sequence[KnowledgeHit],
    ) -> SectionTokens:
        """Section sizes that add up to the prompt: each section's text in tokens, and
        `template` for what the chat template adds around the messages' contents.

        The summary is the rest of the system message after the static prompt and the
        facts; the recent window is the window's turns as their messages show them (the
        line opening a window that starts with the assistant's included); the new
        message is the rest, with the frame lines of this turn's context and the breaks
        between turns that share a message.
        """
        count = self._engine.count_tokens
        contents = [await count(m.content) for m in messages]
        static = await count(self._static)
        with_facts = await count(self.system_text(plan.facts, "")) if plan.facts else static
        new_facts = await count(new_facts_text(plan.new_facts)) if plan.new_facts else 0
        memories = await count(memory_text(shown_memories)) if shown_memories else 0
        knowledge = await count(knowledge_text(shown_knowledge)) if shown_knowledge else 0
        per_turn = new_facts + memories + knowledge
        window = sum([await count(history_message(t).content) for t in recent])
        if messages[1].content == HISTORY_OPENING:
            window += contents[1]
        in_system = 0 if self._stable_layout else per_turn
        return SectionTokens(
            system=static,
            facts=with_facts - static + new_facts,
            summary=contents[0] - with_facts - in_system,
            recent=window,
            memories=memories,
            new_message=sum(contents[1:]) - window - (per_turn - in_system),
            template=prompt_tokens - sum(contents),
            knowledge=knowledge,
        )


def _omitted(plan: Plan) -> tuple[int, ...]:
    """Pinned facts left out because the facts budget was full, lowest priority last."""
    chosen = {f.id for f in [*plan.facts, *plan.new_facts]}
    every = sorted([*plan.sections.pinned, *plan.sections.new_facts], key=fact_order)
    return tuple(f.id for f in every if f.id not in chosen)
