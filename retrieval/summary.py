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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval.protocols import ChatMessage, Engine, SamplingParams, WindowTurn
from retrieval.smalltalk import is_small_talk


@dataclass(frozen=True, slots=True)
class SummaryState:
    """The current summary version of a session (version 0: nothing compacted yet)."""

    version: int = 0
    through_seq: int = 0
    pruned_seqs: frozenset[int] = frozenset()
    text: str = ""
    summarizer: str = ""
    token_count: int = 0
    # Pinned facts the system message carries (see SessionSummary.pinned_fact_ids).
    pinned_fact_ids: frozenset[int] = frozenset()


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
    evicted: tuple[WindowTurn, ...] = ()
    newly_pruned: tuple[WindowTurn, ...] = field(default=())

    @property
    def through_seq(self) -> int | None:
        return self.evicted[-1].seq if self.evicted else None


def plan_compaction(
    window: Sequence[WindowTurn],
    state: SummaryState,
    policy: WindowPolicy,
    message_tokens: Callable[[int], int],
) -> Compaction:
    """What leaves the window this turn: nothing while it is within its budget; else,
    down to the low-water marks, small talk (oldest first), then the oldest messages in
    one chunk."""

    def tokens(turns: Sequence[WindowTurn]) -> int:
        return sum(message_tokens(t.token_count) for t in turns)

    pruned = {t.seq for t in window if t.seq in state.pruned_seqs}
    live = [t for t in window if t.seq not in pruned]
    if len(live) <= policy.max_messages and tokens(live) <= policy.token_budget:
        return Compaction(frozenset(pruned))
    max_after = _messages_after(len(live), policy)

    def over(turns: Sequence[WindowTurn]) -> bool:
        return len(turns) > max_after or tokens(turns) > policy.low_water_tokens

    newly = _small_talk_to_prune(live, policy, over, pruned)
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
    live: Sequence[WindowTurn],
    policy: WindowPolicy,
    over: Callable[[Sequence[WindowTurn]], bool],
    pruned: set[int],
) -> list[WindowTurn]:
    """Small talk, oldest first, while what is left is `over` (the newest messages stay)."""
    taken = set(pruned)
    newly: list[WindowTurn] = []
    prunable = live[: max(0, len(live) - policy.keep_last)]
    for position, turn in enumerate(prunable):
        if not over([t for t in live if t.seq not in taken]):
            break
        if turn.seq in taken or not is_small_talk(turn.text):
            continue
        # An exchange of small talk goes as a whole: the reply does not dangle.
        exchange = [turn]
        following = prunable[position + 1] if position + 1 < len(prunable) else None
        if (
            turn.role == "user"
            and following is not None
            and following.role == "assistant"
            and is_small_talk(following.text)
        ):
            exchange.append(following)
        taken.update(t.seq for t in exchange)
        newly.extend(exchange)
    return newly


def _num_to_evict(
    live: Sequence[WindowTurn],
    max_after: int,
    policy: WindowPolicy,
    message_tokens: Callable[[int], int],
) -> int:
    by_count = max(0, len(live) - max_after)
    remaining = sum(message_tokens(t.token_count) for t in live)
    by_tokens = 0
    while by_tokens < len(live) and remaining > policy.low_water_tokens:
        remaining -= message_tokens(live[by_tokens].token_count)
        by_tokens += 1
    num = min(len(live), max(by_count, by_tokens))
    # The window opens with the user's message (chat templates want a user first): an
    # assistant's message left first goes with the exchange before it.
    while 0 < num < len(live) and live[num].role == "assistant":
        num += 1
    return num


# Summarizers --------------------------------------------------------------------------

_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")
_KEYWORDS = re.compile(
    r"\b(?:allerg\w*|never|always|avoid|don't|do not|can't|cannot|prefer\w*|like|love|hate|"
    r"dislike|must|need|want|plan\w*|remember|favou?rite|name|live|moved|work|birthday|"
    r"deadline|appointment|meeting|goal)\b|过敏|不要|别|喜欢|讨厌|必须|需要|想要|计划|记住|最爱|"
    r"名字|住在|搬|工作|生日|截止|约|目标",
    re.IGNORECASE,
)
_ENTITY = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+")
_NUMBER = re.compile(r"\d")
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|my|me)\b|我", re.IGNORECASE)
MAX_SENTENCE_CHARS = 240
SUMMARY_LINE = re.compile(r"^- \[(?P<date>[^\]]*)\] (?P<speaker>[^:]+): (?P<text>.*)$")


def summary_speaker(turn: WindowTurn) -> str:
    """The speaker of a summary line: the turn's role, then the client's name, on one
    line and without a colon, so that a name can neither start a line nor pose as a
    role ("user (Caroline)")."""
    if not turn.name:
        return turn.role
    name = " ".join(turn.name.replace(":", " ").split())
    return f"{turn.role} ({name})" if name else turn.role


def salience(sentence: str, role: str) -> int:
    """How much a sentence carries that a later turn may need: constraints, preferences,
    names, numbers and dates, what the user says of themselves."""
    score = 3 * len(_KEYWORDS.findall(sentence))
    score += 2 * bool(_NUMBER.search(sentence)) + 2 * bool(_ENTITY.search(sentence))
    score += bool(_FIRST_PERSON.search(sentence))
    return score - (role == "assistant")


class ExtractiveSummarizer:
    """Picks the sentences that carry facts, keeps them verbatim with date and speaker,
    and drops the least salient lines when over budget. Needs no model."""

    name = "extractive"

    def __init__(self, count_tokens: Callable[[str], int]) -> None:
        self._count_tokens = count_tokens

    async def summarize(self, previous: str, turns: Sequence[WindowTurn], max_tokens: int) -> str:
        lines = [line for line in previous.splitlines() if SUMMARY_LINE.match(line)]
        for turn in turns:
            if is_small_talk(turn.text):
                continue
            stamp = turn.created_at.strftime("%Y-%m-%d")
            for sentence in _SENTENCE.findall(turn.text):
                sentence = " ".join(sentence.split())[:MAX_SENTENCE_CHARS]
                if sentence and salience(sentence, turn.role) > 0:
                    lines.append(f"- [{stamp}] {summary_speaker(turn)}: {sentence}")
        return "\n".join(self._fit(lines, max_tokens))

    def _fit(self, lines: list[str], max_tokens: int) -> list[str]:
        costs = [self._count_tokens(line) + 1 for line in lines]
        total = sum(costs)
        if total <= max_tokens:
            return lines
        order = sorted(range(len(lines)), key=lambda i: (_line_salience(lines[i]), i))
        dropped: set[int] = set()
        for index in order:
            if total <= max_tokens:
                break
            dropped.add(index)
            total -= costs[index]
        return [line for i, line in enumerate(lines) if i not in dropped]


def _line_salience(line: str) -> int:
    match = SUMMARY_LINE.match(line)
    if match is None:
        return 0
    role = "assistant" if match["speaker"].startswith("assistant") else "user"
    return salience(match["text"], role)


class LlmSummarizer:
    """Asks the engine for the summary: the previous summary and the turns that left the
    window in, the new summary out. For capable engines (a real model behind vLLM)."""

    name = "llm"

    def __init__(self, engine: Engine, instructions: str) -> None:
        self._engine = engine
        self._instructions = instructions

    async def summarize(self, previous: str, turns: Sequence[WindowTurn], max_tokens: int) -> str:
        summary = previous
        for batch in self._batches(turns, max_tokens):
            transcript = "\n".join(f"{t.speaker}: {t.text}" for t in batch)
            messages = [
                ChatMessage("system", self._instructions),
                ChatMessage(
                    "user",
                    f"Summary so far:\n{summary or '(none)'}\n\nNew turns:\n{transcript}",
                ),
            ]
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
            summary = (await self._engine.generate(messages, params)).text.strip()
        return summary

    def _batches(self, turns: Sequence[WindowTurn], max_tokens: int) -> list[list[WindowTurn]]:
        """Turns in batches whose transcript leaves room for the summary and the reply."""
        room = max(1, self._engine.context_window - 3 * max_tokens - 200)
        batches: list[list[WindowTurn]] = [[]]
        used = 0
        for turn in turns:
            cost = turn.token_count + 8
            if batches[-1] and used + cost > room:
                batches.append([])
                used = 0
            batches[-1].append(turn)
            used += cost
        return [b for b in batches if b]
