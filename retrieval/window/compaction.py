"""The recent window and the rolling summary of what left it.

A session's window is its messages after the summary's `through_seq`, less pruned small
talk. It only grows, by appending, until it is over its budget (its high-water marks: a
number of messages, and the tokens the rest of the prompt leaves it); then it is brought
down at once to well below (its low-water marks: whole chunks of messages fewer, a share
of those tokens): small talk goes first, and if that is not enough the oldest messages
leave in one chunk and are compacted into the next summary version. Between compactions
the prompt prefix (system prompt, pinned facts, summary, window) stays identical, and
the gap between the marks is what the window may grow by before the next compaction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval.window.smalltalk import is_small_talk
from storage.records import Turn


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """When the window is compacted and how far.

    Over `max_messages` or `token_budget` (the high-water marks), it is brought down to
    `low_water_tokens` (<= `token_budget`), and if it was over `max_messages`, by whole
    chunks of `eviction_chunk` messages to at most `max_messages`.
    """

    max_messages: int
    eviction_chunk: int
    token_budget: int
    low_water_tokens: int
    # The newest messages are never pruned.
    keep_last: int = 2


@dataclass(frozen=True, slots=True)
class Compaction:
    pruned_seqs: frozenset[int]
    evicted: tuple[Turn, ...] = ()
    newly_pruned: tuple[Turn, ...] = field(default=())

    @property
    def through_seq(self) -> int | None:
        return self.evicted[-1].seq if self.evicted else None


def plan_compaction(
    window: Sequence[Turn],
    pruned_seqs: frozenset[int],
    policy: WindowPolicy,
    message_tokens: Callable[[int], int],
) -> Compaction:
    """What leaves the window this turn: nothing while it is within its budget; else,
    down to the low-water marks, small talk (oldest first), then the oldest messages in
    one chunk."""

    def tokens(turns: Sequence[Turn]) -> int:
        return sum(message_tokens(t.prompt_tokens) for t in turns)

    pruned = {t.seq for t in window if t.seq in pruned_seqs}
    live = [t for t in window if t.seq not in pruned]
    if len(live) <= policy.max_messages and tokens(live) <= policy.token_budget:
        return Compaction(frozenset(pruned))
    max_after = _messages_after(len(live), policy)

    def over(turns: Sequence[Turn]) -> bool:
        return len(turns) > max_after or tokens(turns) > policy.low_water_tokens

    newly = _small_talk_to_prune(live, policy, max_after, message_tokens)
    pruned.update(t.seq for t in newly)
    live = [t for t in live if t.seq not in pruned]
    if not over(live):
        return Compaction(frozenset(pruned), (), tuple(newly))
    num_evicted = _num_to_evict(live, max_after, policy, message_tokens)
    evicted = tuple(live[:num_evicted])
    through = evicted[-1].seq if evicted else 0
    return Compaction(frozenset(s for s in pruned if s > through), evicted, tuple(newly))


def _messages_after(num_live: int, policy: WindowPolicy) -> int:
    """The most messages a compaction leaves: a window over `max_messages` loses whole
    chunks of `eviction_chunk` (pruned small talk included), as many as it takes."""
    if num_live <= policy.max_messages:
        return policy.max_messages
    chunk = max(1, policy.eviction_chunk)
    return num_live - math.ceil((num_live - policy.max_messages) / chunk) * chunk


def _small_talk_to_prune(
    live: Sequence[Turn],
    policy: WindowPolicy,
    max_after: int,
    message_tokens: Callable[[int], int],
) -> list[Turn]:
    """Small talk, oldest first, while what is left is over the low-water marks (more
    than `max_after` messages or `policy.low_water_tokens` tokens; the newest messages
    stay)."""
    taken: set[int] = set()
    newly: list[Turn] = []
    count = len(live)
    tokens = sum(message_tokens(t.prompt_tokens) for t in live)
    prunable = live[: max(0, len(live) - policy.keep_last)]
    for position, turn in enumerate(prunable):
        if count <= max_after and tokens <= policy.low_water_tokens:
            break
        if turn.seq in taken or not is_small_talk(turn.content):
            continue
        # An exchange of small talk goes as a whole: the reply does not dangle.
        exchange = [turn]
        following = prunable[position + 1] if position + 1 < len(prunable) else None
        if (
            turn.role == "user"
            and following is not None
            and following.role == "assistant"
            and is_small_talk(following.content)
        ):
            exchange.append(following)
        taken.update(t.seq for t in exchange)
        newly.extend(exchange)
        count -= len(exchange)
        tokens -= sum(message_tokens(t.prompt_tokens) for t in exchange)
    return newly


def _num_to_evict(
    live: Sequence[Turn],
    max_after: int,
    policy: WindowPolicy,
    message_tokens: Callable[[int], int],
) -> int:
    by_count = max(0, len(live) - max_after)
    remaining = sum(message_tokens(t.prompt_tokens) for t in live)
    by_tokens = 0
    while by_tokens < len(live) and remaining > policy.low_water_tokens:
        remaining -= message_tokens(live[by_tokens].prompt_tokens)
        by_tokens += 1
    num = min(len(live), max(by_count, by_tokens))
    # The window opens with the user's message (chat templates want a user first): an
    # assistant's message left first goes with the exchange before it.
    while 0 < num < len(live) and live[num].role == "assistant":
        num += 1
    return num
