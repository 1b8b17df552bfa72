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
first user message itself (`retrieval.engines.chat_format.fold_system`), so the layout is
the same for every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.errors import ContextTooLongError
from retrieval.facts.memory import PinnedFact, fact_order
from retrieval.prompt.budget import ContextBudget
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
    memory_text,
    new_facts_text,
    summary_text,
    with_note,
)
from retrieval.prompt.report import (
    AssembledContext,
    ContextReport,
    RecentTurn,
    RetrievedKnowledge,
    RetrievedMemory,
    SectionTokens,
)
from retrieval.protocols import ChatMessage, Engine


@dataclass(frozen=True, slots=True)
class _Selection:
    """The sections of one prompt other than the recent window, and the room they leave it."""

    system: str
    facts: tuple[PinnedFact, ...]
    new_facts: tuple[PinnedFact, ...]
    memories: tuple[RetrievedMemory, ...]
    knowledge: tuple[RetrievedKnowledge, ...]
    window_room: int


def _lead(system: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), ChatMessage("user", "x")]


class ContextAssembler:
    def __init__(self, engine: Engine, system_prompt: str, *, stable_layout: bool = True) -> None:
        self._engine = engine
        # False puts this turn's context in the system message, before the recent window
        # (to measure what the layout saves: the prefix then changes every turn).
        self._stable_layout = stable_layout
        self._static = system_prompt
        lead = engine.count_prompt_tokens(_lead(system_prompt))
        # Template tokens around one message's content (role markers, separators).
        probe = [*_lead(system_prompt), ChatMessage("assistant", "x")]
        self._overhead = engine.count_prompt_tokens(probe) - lead - 1
        # The system text with the template's fixed part (generation prompt included).
        self._system_tokens = lead - 1 - self._overhead

    def count_tokens(self, text: str) -> int:
        return self._engine.count_tokens(text)

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

    def window_room(
        self,
        *,
        new_message: str,
        memories: Sequence[RetrievedMemory],
        budget: ContextBudget,
        pinned: Sequence[PinnedFact] = (),
        summary: str = "",
        knowledge: Sequence[RetrievedKnowledge] = (),
        new_facts: Sequence[PinnedFact] = (),
    ) -> int:
        """Tokens the recent window may take in this prompt: the prompt budget less what
        the other sections take this turn, each within its share. A share a section
        leaves unused (no knowledge documents, a short summary, few memories) is the
        window's; `assemble` with the same arguments keeps a window this size whole."""
        selection = self._select(
            new_message, memories, budget, pinned, summary, knowledge, new_facts
        )
        return selection.window_room

    def assemble(
        self,
        *,
        new_message: str,
        memories: Sequence[RetrievedMemory],
        recent: Sequence[RecentTurn],
        budget: ContextBudget,
        pinned: Sequence[PinnedFact] = (),
        summary: str = "",
        knowledge: Sequence[RetrievedKnowledge] = (),
        new_facts: Sequence[PinnedFact] = (),
    ) -> AssembledContext:
        """`pinned` facts go into the system message; `new_facts` (pinned since the last
        compaction) into this turn's context, so the system message stays as it was."""
        self.check_fits(self._engine.count_tokens(new_message), budget)
        available = budget.available
        selection = self._select(
            new_message, memories, budget, pinned, summary, knowledge, new_facts
        )
        chosen_memories, chosen_knowledge = selection.memories, selection.knowledge
        chosen_recent = self._fit_recent(recent, selection.window_room)

        def layout() -> list[ChatMessage]:
            block = context_block(selection.new_facts, chosen_memories, chosen_knowledge)
            return self.layout(selection.system, chosen_recent, block, new_message)

        messages = layout()
        prompt_tokens = self._engine.count_prompt_tokens(messages)
        # Estimates are per section; the exact count of the rendered prompt decides.
        while prompt_tokens > available and chosen_recent:
            chosen_recent = chosen_recent[1:]
            messages = layout()
            prompt_tokens = self._engine.count_prompt_tokens(messages)
        while prompt_tokens > available and chosen_memories:
            chosen_memories = chosen_memories[:-1]
            messages = layout()
            prompt_tokens = self._engine.count_prompt_tokens(messages)
        while prompt_tokens > available and chosen_knowledge:
            chosen_knowledge = chosen_knowledge[:-1]
            messages = layout()
            prompt_tokens = self._engine.count_prompt_tokens(messages)
        chosen_facts, chosen_new = selection.facts, selection.new_facts
        chosen_ids = {f.id for f in [*chosen_facts, *chosen_new]}
        report = ContextReport(
            memories=tuple(chosen_memories),
            recent_message_ids=tuple(t.message_id for t in chosen_recent),
            sections=self._sections(
                messages,
                prompt_tokens,
                recent=chosen_recent,
                facts=chosen_facts,
                new_facts=chosen_new,
                memories=chosen_memories,
                knowledge=chosen_knowledge,
            ),
            prompt_tokens=prompt_tokens,
            context_window=budget.context_window,
            reply_tokens_reserved=budget.reply_tokens,
            pinned_facts=tuple(sorted([*chosen_facts, *chosen_new], key=fact_order)),
            facts_omitted=tuple(
                f.id
                for f in sorted([*pinned, *new_facts], key=fact_order)
                if f.id not in chosen_ids
            ),
            new_facts=tuple(chosen_new),
            knowledge=tuple(chosen_knowledge),
        )
        return AssembledContext(messages=tuple(messages), report=report)

    def system_text(self, facts: Sequence[PinnedFact], summary: str) -> str:
        """The static prompt, the pinned facts, the session summary: the prompt's prefix
        changes only when the facts or the summary do."""
        parts = [self._static]
        if facts:
            parts.append(facts_text(facts))
        if summary:
            parts.append(summary_text(summary))
        return "\n\n".join(parts)

    def layout(
        self, system: str, recent: Sequence[RecentTurn], block: str, new_message: str
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

    def turn_context(
        self,
        memories: Sequence[RetrievedMemory],
        knowledge: Sequence[RetrievedKnowledge],
        new_facts: Sequence[PinnedFact] = (),
    ) -> str:
        """This turn's context block, as its user message carries it ("" for none)."""
        if not self._stable_layout:
            return ""
        return context_block(new_facts, memories, knowledge)

    def note_tokens(self, note: str) -> int:
        """What a kept context block adds to its user message (with its line break)."""
        return self._engine.count_tokens(f"{note}\n") if note else 0

    def _select(
        self,
        new_message: str,
        memories: Sequence[RetrievedMemory],
        budget: ContextBudget,
        pinned: Sequence[PinnedFact],
        summary: str,
        knowledge: Sequence[RetrievedKnowledge],
        new_facts: Sequence[PinnedFact],
    ) -> _Selection:
        """Every section but the window, each fitted to its share, and what they leave."""
        chosen_facts = self.fit_facts(pinned, budget)
        chosen_new = self.fit_facts(new_facts, budget, self._facts_cost(chosen_facts))
        system = self.system_text(chosen_facts, summary)
        content_tokens = self._engine.count_tokens(new_message)
        fixed = self._system_message_tokens(system) + self.message_tokens(content_tokens)
        chosen_memories = self._fit_memories(memories, budget.share(budget.memory_share))
        chosen_knowledge = self._fit_knowledge(knowledge, budget.share(budget.knowledge_share))
        block = context_block(chosen_new, chosen_memories, chosen_knowledge)
        return _Selection(
            system=system,
            facts=tuple(chosen_facts),
            new_facts=tuple(chosen_new),
            memories=tuple(chosen_memories),
            knowledge=tuple(chosen_knowledge),
            window_room=budget.available - fixed - self.note_tokens(block),
        )

    def _system_message_tokens(self, system: str) -> int:
        """Tokens of the system text with its template (without the first user message)."""
        return self._engine.count_prompt_tokens(_lead(system)) - self._overhead - 1

    def window_budget_at_full_shares(
        self, budget: ContextBudget, facts: Sequence[PinnedFact], content_tokens: int
    ) -> int:
        """Tokens the recent window may hold with the summary, memories and knowledge at
        their full shares: a window this size fits whatever the turn retrieves and
        however the summary grows (the most a compaction may leave)."""
        system = self._system_message_tokens(self.system_text(facts, ""))
        return (
            budget.available
            - system
            - budget.share(budget.summary_share)
            - budget.share(budget.memory_share)
            - budget.share(budget.knowledge_share)
            - self.message_tokens(content_tokens)
        )

    def _facts_cost(self, facts: Sequence[PinnedFact]) -> int:
        if not facts:
            return 0
        return (
            self._engine.count_tokens(FACTS_HEADER)
            + 2
            + sum(self._engine.count_tokens(format_fact(f)) + 1 for f in facts)
        )

    def fit_facts(
        self, facts: Sequence[PinnedFact], budget: ContextBudget, already: int = 0
    ) -> list[PinnedFact]:
        """Facts in priority order while they fit (with `already` tokens of facts taken);
        one that does not fit ends the list, so a lower-priority fact never displaces a
        higher one."""
        limit = budget.share(budget.facts_share) - already
        chosen: list[PinnedFact] = []
        used = self._engine.count_tokens(FACTS_HEADER) + 2
        for fact in facts:
            cost = self._engine.count_tokens(format_fact(fact)) + 1
            if used + cost > limit:
                break
            chosen.append(fact)
            used += cost
        return chosen

    def _sections(
        self,
        messages: Sequence[ChatMessage],
        prompt_tokens: int,
        *,
        recent: Sequence[RecentTurn],
        facts: Sequence[PinnedFact],
        new_facts: Sequence[PinnedFact],
        memories: Sequence[RetrievedMemory],
        knowledge: Sequence[RetrievedKnowledge],
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
        contents = [count(m.content) for m in messages]
        static = count(self._static)
        with_facts = count(self.system_text(facts, "")) if facts else static
        new_facts_tokens = count(new_facts_text(new_facts)) if new_facts else 0
        memory_tokens = count(memory_text(memories)) if memories else 0
        knowledge_tokens = count(knowledge_text(knowledge)) if knowledge else 0
        per_turn = new_facts_tokens + memory_tokens + knowledge_tokens
        window = sum(count(history_message(t).content) for t in recent)
        if messages[1].content == HISTORY_OPENING:
            window += contents[1]
        in_system = 0 if self._stable_layout else per_turn
        return SectionTokens(
            system=static,
            facts=with_facts - static + new_facts_tokens,
            summary=contents[0] - with_facts - in_system,
            recent=window,
            memories=memory_tokens,
            new_message=sum(contents[1:]) - window - (per_turn - in_system),
            template=prompt_tokens - sum(contents),
            knowledge=knowledge_tokens,
        )

    def _fit_memories(
        self, memories: Sequence[RetrievedMemory], limit: int
    ) -> list[RetrievedMemory]:
        chosen: list[RetrievedMemory] = []
        used = self._engine.count_tokens(MEMORY_HEADER) + 2
        for memory in memories:
            cost = self._engine.count_tokens(format_memory(memory)) + 1
            if used + cost > limit:
                continue
            chosen.append(memory)
            used += cost
        return chosen

    def _fit_knowledge(
        self, chunks: Sequence[RetrievedKnowledge], limit: int
    ) -> list[RetrievedKnowledge]:
        """The best chunks that fit the knowledge share, best first."""
        chosen: list[RetrievedKnowledge] = []
        used = self._engine.count_tokens(KNOWLEDGE_HEADER) + 2
        for chunk in chunks:
            cost = self._engine.count_tokens(format_knowledge(chunk)) + 1
            if used + cost > limit:
                continue
            chosen.append(chunk)
            used += cost
        return chosen

    def _fit_recent(self, recent: Sequence[RecentTurn], limit: int) -> list[RecentTurn]:
        """The newest turns that fit, oldest first (a window that would open with the
        assistant's message also pays for the line that opens it instead)."""
        opening = self.message_tokens(self._engine.count_tokens(HISTORY_OPENING))
        chosen: list[RecentTurn] = []
        used = 0
        for turn in reversed(recent):
            cost = self.message_tokens(turn.token_count)
            if used + cost + (opening if turn.role == "assistant" else 0) > limit:
                break
            chosen.append(turn)
            used += cost
        chosen.reverse()
        return chosen
