"""The token budget of a prompt: the engine's window less the reply, and each section's
share of it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """Token budget: the window less the reply reserve; memories get at most a share of it."""

    context_window: int
    reply_tokens: int
    memory_share: float = 0.25
    facts_share: float = 0.15
    summary_share: float = 0.10
    knowledge_share: float = 0.0

    @property
    def available(self) -> int:
        """Prompt tokens: the window less the reply reserve."""
        return self.context_window - self.reply_tokens

    def share(self, part: float) -> int:
        return int(self.available * part)


def max_reply_tokens(context_window: int) -> int:
    """The most reply tokens a turn may reserve: half the window, the rest is for context."""
    return max(1, context_window // 2)
