"""The token budget of a prompt: the engine's window less the reply, and each section's
share of it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """Token budget: the window less the reply reserve; memories get at most a share of it
    (and at most `memory_max_tokens`, so that a large window does not fill every prompt
    with retrieved turns)."""

    context_window: int
    reply_tokens: int
    memory_share: float = 0.25
    facts_share: float = 0.15
    summary_share: float = 0.10
    knowledge_share: float = 0.0
    memory_max_tokens: int | None = None

    @property
    def available(self) -> int:
        """Prompt tokens: the window less the reply reserve."""
        return self.context_window - self.reply_tokens

    def share(self, part: float) -> int:
        return int(self.available * part)

    @property
    def memory_tokens(self) -> int:
        """The most tokens the retrieved memories of a turn may take, header included."""
        share = self.share(self.memory_share)
        return share if self.memory_max_tokens is None else min(share, self.memory_max_tokens)


def max_reply_tokens(context_window: int) -> int:
    """The most reply tokens a turn may reserve: half the window, the rest is for context."""
    return max(1, context_window // 2)
