"""Counting a chat prompt's tokens without rendering it, where the template allows.

For templates like ChatML a prompt's token count is a constant plus, per message, a
per-role constant plus its content's own tokens. The context assembler counts many
candidate prompts per turn; with the overheads measured once, each count is a sum of
cached per-text counts instead of a tokenisation of the whole prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retrieval.protocols import ChatMessage

# A conversation mixing roles, scripts, punctuation and a second system message: if the
# additive count matches the full count here, the template is taken as additive.
PROBE = (
    ChatMessage("system", "Be brief, friendly; answer in English or 中文."),
    ChatMessage("user", "I'm Xiao Ming, 我今年6岁了. Peanuts? 我对花生过敏!"),
    ChatMessage("assistant", "Noted: no peanuts (花生) for you."),
    ChatMessage("system", "Memories:\n- [2026-01-05 10:00] user: I like tea"),
    ChatMessage("user", "What's a good snack?"),
)


@dataclass(frozen=True, slots=True)
class MessageOverhead:
    """Template tokens per role, plus the prompt's fixed part (generation prompt, BOS)."""

    per_role: dict[str, int]
    fixed: int
    count_text: Callable[[str], int]

    @classmethod
    def measure(
        cls,
        full_count: Callable[[Sequence[ChatMessage]], int],
        count_text: Callable[[str], int],
    ) -> MessageOverhead | None:
        """The overheads, or None when the template's count is not additive."""
        x = ChatMessage("system", "x")
        one = count_text("x")
        base = full_count([x])
        per_role = {"system": full_count([x, x]) - base - one}
        for role in ("user", "assistant"):
            per_role[role] = full_count([x, ChatMessage(role, "x")]) - base - one
        overhead = cls(per_role, base - per_role["system"] - one, count_text)
        if overhead.count(PROBE) != full_count(PROBE):
            return None
        return overhead

    def count(self, messages: Sequence[ChatMessage]) -> int | None:
        """The prompt's token count, or None where only a full count is exact.

        A prompt must open with a system message: templates add a default one otherwise.
        """
        if not messages or messages[0].role != "system":
            return None
        if any(m.role not in self.per_role for m in messages):
            return None
        return self.fixed + sum(
            self.per_role[m.role] + self.count_text(m.content) for m in messages
        )
