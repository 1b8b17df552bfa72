"""Prompt assembly under the engine's context window, counted with the engine's tokenizer.

Layout, chosen so that consecutive turns share the longest possible prompt prefix:

    [system prompt] [recent window, oldest first] [memories] [new user message]

The system prompt and the recent window change only by appending, so an engine with a
prefix cache reuses them; retrieved memories, which change every turn, come last,
just before the new message.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.errors import ContextTooLongError
from retrieval.protocols import ChatMessage, Engine


@dataclass(frozen=True, slots=True)
class RetrievedMemory:
    message_id: int
    session_id: str
    role: str
    name: str | None
    text: str
    score: float
    created_at: dt.datetime
    external_id: str | None
    token_count: int


@dataclass(frozen=True, slots=True)
class RecentTurn:
    message_id: int
    role: str
    name: str | None
    text: str
    token_count: int


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """Token budget: the window less the reply reserve; memories get at most a share of it."""

    context_window: int
    reply_tokens: int
    memory_share: float = 0.25


@dataclass(frozen=True, slots=True)
class SectionTokens:
    """Prompt tokens per section; they add up to the whole prompt.

    `template` is what the chat template adds beyond the messages (the reply's opening).
    """

    system: int
    memories: int
    recent: int
    new_message: int
    template: int


@dataclass(frozen=True, slots=True)
class ContextReport:
    memories: tuple[RetrievedMemory, ...]
    recent_message_ids: tuple[int, ...]
    sections: SectionTokens
    prompt_tokens: int
    context_window: int
    reply_tokens_reserved: int
    # Leading prompt tokens identical to the session's previous prompt (None: no previous
    # prompt known to this process); what a prefix cache can reuse at best.
    prefix_reuse: int | None = None


@dataclass(frozen=True, slots=True)
class AssembledContext:
    messages: tuple[ChatMessage, ...]
    report: ContextReport


MEMORY_HEADER = "Relevant memories from earlier conversations with this user (most relevant first):"


def format_memory(memory: RetrievedMemory) -> str:
    speaker = memory.name or memory.role
    stamp = memory.created_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")
    return f"- [{stamp}] {speaker}: {memory.text}"


def chat_role(role: str) -> str:
    return role if role in ("user", "assistant", "system") else "user"


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

    def assemble(
        self,
        *,
        new_message: str,
        memories: Sequence[RetrievedMemory],
        recent: Sequence[RecentTurn],
        budget: ContextBudget,
    ) -> AssembledContext:
        content_tokens = self._engine.count_tokens(new_message)
        self.check_fits(content_tokens, budget)
        available = budget.context_window - budget.reply_tokens
        fixed = self._system_tokens + self.message_tokens(content_tokens)
        chosen_memories = self._fit_memories(memories, int(available * budget.memory_share))
        memory_tokens = self._memory_section_tokens(chosen_memories)
        chosen_recent = self._fit_recent(recent, available - fixed - memory_tokens)
        messages = self._layout(new_message, chosen_memories, chosen_recent)
        prompt_tokens = self._engine.count_prompt_tokens(messages)
        # Estimates are per message; the exact count of the rendered prompt decides.
        while prompt_tokens > available and chosen_recent:
            chosen_recent = chosen_recent[1:]
            messages = self._layout(new_message, chosen_memories, chosen_recent)
            prompt_tokens = self._engine.count_prompt_tokens(messages)
        while prompt_tokens > available and chosen_memories:
            chosen_memories = chosen_memories[:-1]
            messages = self._layout(new_message, chosen_memories, chosen_recent)
            prompt_tokens = self._engine.count_prompt_tokens(messages)
        report = ContextReport(
            memories=tuple(chosen_memories),
            recent_message_ids=tuple(t.message_id for t in chosen_recent),
            sections=self._sections(messages, len(chosen_recent), prompt_tokens),
            prompt_tokens=prompt_tokens,
            context_window=budget.context_window,
            reply_tokens_reserved=budget.reply_tokens,
        )
        return AssembledContext(messages=tuple(messages), report=report)

    def _sections(
        self, messages: Sequence[ChatMessage], num_recent: int, prompt_tokens: int
    ) -> SectionTokens:
        """Exact section sizes, as differences of whole-prompt counts of growing prefixes."""
        count = self._engine.count_prompt_tokens
        with_system = self._system_tokens
        num_first = num_recent if self._stable_layout else len(messages) - 2 - num_recent
        with_first = count(messages[: 1 + num_first])
        with_both = count(messages[:-1])
        recent, memories = with_first - with_system, with_both - with_first
        if not self._stable_layout:
            recent, memories = memories, recent
        return SectionTokens(
            system=with_system - self._template_tokens,
            recent=recent,
            memories=memories,
            new_message=prompt_tokens - with_both,
            template=self._template_tokens,
        )

    def _memory_section_tokens(self, memories: Sequence[RetrievedMemory]) -> int:
        if not memories:
            return 0
        return self.message_tokens(self._engine.count_tokens(_memory_text(memories)))

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
        new_message: str,
        memories: Sequence[RetrievedMemory],
        recent: Sequence[RecentTurn],
    ) -> list[ChatMessage]:
        history = [ChatMessage(chat_role(t.role), t.text) for t in recent]
        found = [ChatMessage("system", _memory_text(memories))] if memories else []
        ordered = history + found if self._stable_layout else found + history
        return [self._system, *ordered, ChatMessage("user", new_message)]


def _memory_text(memories: Sequence[RetrievedMemory]) -> str:
    return "\n".join([MEMORY_HEADER, *(format_memory(m) for m in memories)])
