"""The summarizers a compaction folds the turns that leave the window into: extractive (no
model: the sentences that carry facts, verbatim with date and speaker) or the engine."""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from retrieval.protocols import ChatMessage, Engine, SamplingParams
from retrieval.window.smalltalk import is_small_talk
from storage.records import Turn


class Summarizer(Protocol):
    """Folds turns that leave the recent window into the session's running summary."""

    @property
    def name(self) -> str: ...

    async def summarize(self, previous: str, turns: Sequence[Turn], max_tokens: int) -> str: ...


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


def summary_speaker(turn: Turn) -> str:
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

    def __init__(self, count_tokens: Callable[[str], Awaitable[int]]) -> None:
        self._count_tokens = count_tokens

    async def summarize(self, previous: str, turns: Sequence[Turn], max_tokens: int) -> str:
        lines = [line for line in previous.splitlines() if SUMMARY_LINE.match(line)]
        for turn in turns:
            if is_small_talk(turn.content):
                continue
            stamp = turn.created_at.strftime("%Y-%m-%d")
            for sentence in _SENTENCE.findall(turn.content):
                sentence = " ".join(sentence.split())[:MAX_SENTENCE_CHARS]
                if sentence and salience(sentence, turn.role) > 0:
                    lines.append(f"- [{stamp}] {summary_speaker(turn)}: {sentence}")
        return "\n".join(await self._fit(lines, max_tokens))

    async def _fit(self, lines: list[str], max_tokens: int) -> list[str]:
        costs = [await self._count_tokens(line) + 1 for line in lines]
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


@functools.lru_cache(maxsize=16_384)
def _line_salience(line: str) -> int:
    """The salience of a summary line (cached: a summary's lines are ranked again at each
    compaction)."""
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

    async def summarize(self, previous: str, turns: Sequence[Turn], max_tokens: int) -> str:
        summary = previous
        for batch in self._batches(turns, max_tokens):
            transcript = "\n".join(f"{t.speaker}: {t.content}" for t in batch)
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

    def _batches(self, turns: Sequence[Turn], max_tokens: int) -> list[list[Turn]]:
        """Turns in batches whose transcript leaves room for the summary and the reply."""
        room = max(1, self._engine.context_window - 3 * max_tokens - 200)
        batches: list[list[Turn]] = [[]]
        used = 0
        for turn in turns:
            cost = turn.token_count + 8
            if batches[-1] and used + cost > room:
                batches.append([])
                used = 0
            batches[-1].append(turn)
            used += cost
        return [b for b in batches if b]
