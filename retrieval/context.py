"""Prompt assembly under the engine's context window, counted with the engine's tokenizer.

Layout, chosen so that consecutive turns share the longest possible prompt prefix:

    [system prompt + pinned facts + summary] [recent window, oldest first]
    [memories] [knowledge] [new user message]

The system prompt, pinned facts and summary change only when the facts do or the window
is compacted, and the recent window changes only by appending, so an engine with a
prefix cache reuses them; retrieved memories and knowledge chunks, which change every
turn, come last, just before the new message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.errors import ContextTooLongError
from retrieval.facts.service import PinnedFact, fact_order
from retrieval.protocols import ChatMessage, Engine
from retrieval.sections import (
    FACTS_HEADER,
    KNOWLEDGE_HEADER,
    MEMORY_HEADER,
    SUMMARY_HEADER,
    AssembledContext,
    ContextBudget,
    ContextReport,
    RecentTurn,
    RetrievedKnowledge,
    RetrievedMemory,
    SectionTokens,
    chat_role,
    format_fact,
    format_knowledge,
    format_memory,
    knowledge_text,
    memory_text,
    new_facts_text,
)


@dataclass(frozen=True, slots=True)
class _Selection:
    """The sections of one prompt other than the recent window, and the room they leave it."""

    system: ChatMessage
    facts: tuple[PinnedFact, ...]
    new_facts: tuple[PinnedFact, ...]
    memories: tuple[RetrievedMemory, ...]
    knowledge: tuple[RetrievedKnowledge, ...]
    window_room: int


class ContextAssembler:
    def __init__(self, engine: Engine, system_prompt: str, *, stable_layout: bool = True) -> None:
        self._engine = engine
        # False puts the memories before the recent window (to measure what the layout saves).
        self._stable_layout = stable_layout
        self._system = ChatMessage("system", system_prompt)
        self._system_tokens = engine.count_prompt_tokens([self._system])
        self._template_tokens = engine.count_prompt_tokens([])
        # Template tokens around one message's content (role markers, separators).
        probe = "x"
        self._overhead = (
            engine.count_prompt_tokens([self._system, ChatMessage("user", probe)])
            - self._system_tokens
            - engine.count_tokens(probe)
        )

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
        system, chosen_facts, chosen_new = selection.system, selection.facts, selection.new_facts
        chosen_memories, chosen_knowledge = selection.memories, selection.knowledge
        chosen_recent = self._fit_recent(recent, selection.window_room)

        def layout() -> list[ChatMessage]:
            return self._layout(
                system, new_message, chosen_memories, chosen_recent, chosen_knowledge, chosen_new
            )

        messages = layout()
        prompt_tokens = self._engine.count_prompt_tokens(messages)
        # Estimates are per message; the exact count of the rendered prompt decides.
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
        chosen_ids = {f.id for f in [*chosen_facts, *chosen_new]}
        report = ContextReport(
            memories=tuple(chosen_memories),
            recent_message_ids=tuple(t.message_id for t in chosen_recent),
            sections=self._sections(
                messages,
                self._num_history_messages(chosen_recent),
                prompt_tokens,
                num_knowledge=int(bool(chosen_knowledge)),
                num_new_facts=int(bool(chosen_new)),
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

    def system_message(self, facts: Sequence[PinnedFact], summary: str) -> ChatMessage:
        """The static prompt, the pinned facts, the session summary: the prompt's prefix
        changes only when the facts or the summary do."""
        parts = [self._system.content]
        if facts:
            parts.append("\n".join([FACTS_HEADER, *(format_fact(f) for f in facts)]))
        if summary:
            parts.append(f"{SUMMARY_HEADER}\n{summary}")
        if len(parts) == 1:
            return self._system
        return ChatMessage("system", "\n\n".join(parts))

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
        system = self.system_message(chosen_facts, summary)
        content_tokens = self._engine.count_tokens(new_message)
        fixed = self._engine.count_prompt_tokens([system]) + self.message_tokens(content_tokens)
        chosen_memories = self._fit_memories(memories, budget.share(budget.memory_share))
        chosen_knowledge = self._fit_knowledge(knowledge, budget.share(budget.knowledge_share))
        per_turn = self._memory_section_tokens(chosen_memories)
        per_turn += self._knowledge_section_tokens(chosen_knowledge)
        if chosen_new:
            per_turn += self.message_tokens(self._engine.count_tokens(new_facts_text(chosen_new)))
        return _Selection(
            system=system,
            facts=tuple(chosen_facts),
            new_facts=tuple(chosen_new),
            memories=tuple(chosen_memories),
            knowledge=tuple(chosen_knowledge),
            window_room=budget.available - fixed - per_turn,
        )

    def window_budget_at_full_shares(
        self, budget: ContextBudget, facts: Sequence[PinnedFact], content_tokens: int
    ) -> int:
        """Tokens the recent window may hold with the summary, memories and knowledge at
        their full shares: a window this size fits whatever the turn retrieves and
        however the summary grows (the most a compaction may leave)."""
        system = self._engine.count_prompt_tokens([self.system_message(facts, "")])
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
        num_recent: int,
        prompt_tokens: int,
        num_knowledge: int = 0,
        num_new_facts: int = 0,
    ) -> SectionTokens:
        """Exact section sizes, as differences of whole-prompt counts of growing prefixes."""
        count = self._engine.count_prompt_tokens
        with_static = self._system_tokens
        system = messages[0].content
        cut = system.find(f"\n\n{SUMMARY_HEADER}")
        with_facts = (
            count([ChatMessage("system", system[:cut])]) if cut >= 0 else count(messages[:1])
        )
        with_system = count(messages[:1])
        num_memories = len(messages) - 2 - num_recent - num_knowledge - num_new_facts
        # Stable: [system] [recent] [new facts] [memories] [knowledge] [new message];
        # otherwise the per-turn part comes before [recent].
        start = 1 + num_recent if self._stable_layout else 1
        with_recent = count(messages[:start])
        with_new_facts = count(messages[: start + num_new_facts])
        with_memories = count(messages[: start + num_new_facts + num_memories])
        with_knowledge = count(messages[: start + num_new_facts + num_memories + num_knowledge])
        recent = with_recent - with_system
        if not self._stable_layout:
            recent = count(messages[:-1]) - with_knowledge
        return SectionTokens(
            system=with_static - self._template_tokens,
            facts=with_facts - with_static + with_new_facts - with_recent,
            summary=with_system - with_facts,
            recent=recent,
            memories=with_memories - with_new_facts,
            new_message=prompt_tokens - count(messages[:-1]),
            template=self._template_tokens,
            knowledge=with_knowledge - with_memories,
        )

    def _memory_section_tokens(self, memories: Sequence[RetrievedMemory]) -> int:
        if not memories:
            return 0
        return self.message_tokens(self._engine.count_tokens(memory_text(memories)))

    def _fit_memories(
        self, memories: Sequence[RetrievedMemory], limit: int
    ) -> list[RetrievedMemory]:
        chosen: list[RetrievedMemory] = []
        used = self.message_tokens(self._engine.count_tokens(MEMORY_HEADER))
        for memory in memories:
            cost = self._engine.count_tokens(format_memory(memory)) + 1
            if used + cost > limit:
                continue
            chosen.append(memory)
            used += cost
        return chosen

    def _knowledge_section_tokens(self, chunks: Sequence[RetrievedKnowledge]) -> int:
        if not chunks:
            return 0
        return self.message_tokens(self._engine.count_tokens(knowledge_text(chunks)))

    def _fit_knowledge(
        self, chunks: Sequence[RetrievedKnowledge], limit: int
    ) -> list[RetrievedKnowledge]:
        """The best chunks that fit the knowledge share, best first."""
        chosen: list[RetrievedKnowledge] = []
        used = self.message_tokens(self._engine.count_tokens(KNOWLEDGE_HEADER))
        for chunk in chunks:
            cost = self._engine.count_tokens(format_knowledge(chunk)) + 1
            if used + cost > limit:
                continue
            chosen.append(chunk)
            used += cost
        return chosen

    def _fit_recent(self, recent: Sequence[RecentTurn], limit: int) -> list[RecentTurn]:
        """The newest turns that fit, oldest first."""
        chosen: list[RecentTurn] = []
        used = 0
        for turn in reversed(recent):
            cost = self.message_tokens(turn.token_count)
            if used + cost > limit:
                break
            chosen.append(turn)
            used += cost
        chosen.reverse()
        return chosen

    def _layout(
        self,
        system: ChatMessage,
        new_message: str,
        memories: Sequence[RetrievedMemory],
        recent: Sequence[RecentTurn],
        knowledge: Sequence[RetrievedKnowledge] = (),
        new_facts: Sequence[PinnedFact] = (),
    ) -> list[ChatMessage]:
        found = self.turn_context(memories, knowledge, new_facts)
        if not self._stable_layout:
            history = [ChatMessage(chat_role(t.role), t.text) for t in recent]
            return [system, *found, *history, ChatMessage("user", new_message)]
        history = []
        for turn in recent:
            history += [ChatMessage("system", note) for note in turn.note]
            history.append(ChatMessage(chat_role(turn.role), turn.text))
        return [system, *history, *found, ChatMessage("user", new_message)]

    def _num_history_messages(self, recent: Sequence[RecentTurn]) -> int:
        if not self._stable_layout:
            return len(recent)
        return len(recent) + sum(len(t.note) for t in recent)

    def turn_context(
        self,
        memories: Sequence[RetrievedMemory],
        knowledge: Sequence[RetrievedKnowledge],
        new_facts: Sequence[PinnedFact] = (),
    ) -> list[ChatMessage]:
        """This turn's context, as the messages just before the new message."""
        found = [ChatMessage("system", new_facts_text(new_facts))] if new_facts else []
        if memories:
            found.append(ChatMessage("system", memory_text(memories)))
        if knowledge:
            found.append(ChatMessage("system", knowledge_text(knowledge)))
        return found
