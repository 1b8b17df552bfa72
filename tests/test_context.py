"""Prompt assembly under the context window, with the scripted engine's tokenizer."""

from __future__ import annotations

import datetime as dt

import pytest

from retrieval.context import ContextAssembler
from retrieval.errors import ContextTooLongError
from retrieval.sections import ContextBudget, RecentTurn, RetrievedMemory
from tests.fakes import ScriptedEngine

WHEN = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)


def memory(i: int, text: str, score: float) -> RetrievedMemory:
    return RetrievedMemory(i, "s-old", "user", None, text, score, WHEN, None, len(text.split()))


def turn(i: int, words: int) -> RecentTurn:
    return RecentTurn(i, "user" if i % 2 else "assistant", None, " ".join(["w"] * words), words)


def vars_of(sections: object) -> dict[str, int]:
    return {name: getattr(sections, name) for name in sections.__slots__}  # type: ignore[attr-defined]


@pytest.fixture
def assembler() -> ContextAssembler:
    return ContextAssembler(ScriptedEngine(context_window=200), "be helpful")


def test_layout_is_system_recent_memories_new(assembler: ContextAssembler) -> None:
    context = assembler.assemble(
        new_message="what now",
        memories=[memory(1, "I like tea", 0.9)],
        recent=[turn(5, 3), turn(6, 3)],
        budget=ContextBudget(context_window=200, reply_tokens=50),
    )
    assert [m.role for m in context.messages] == ["system", "user", "assistant", "system", "user"]
    assert context.messages[0].content == "be helpful"
    assert context.messages[3].content.endswith("- [2026-01-05 10:00] user: I like tea")
    assert context.messages[-1].content == "what now"
    report = context.report
    assert report.recent_message_ids == (5, 6)
    assert [m.message_id for m in report.memories] == [1]
    # The scripted engine counts words plus 3 per message and 2 for the reply prompt.
    assert report.sections.system == 2 + 3
    assert report.sections.new_message == 2 + 3
    assert report.sections.recent == 2 * (3 + 3)
    assert report.sections.memories == len(context.messages[3].content.split()) + 3
    assert report.sections.template == 2
    assert report.prompt_tokens == sum(len(m.content.split()) + 3 for m in context.messages) + 2
    assert sum(vars_of(report.sections).values()) == report.prompt_tokens


def test_oldest_recent_turns_are_dropped_to_fit(assembler: ContextAssembler) -> None:
    recent = [turn(i, 30) for i in range(1, 8)]  # 7 x 33 tokens: far more than fits
    context = assembler.assemble(
        new_message="hi", memories=[], recent=recent, budget=ContextBudget(200, reply_tokens=50)
    )
    assert context.report.recent_message_ids == (4, 5, 6, 7)
    assert context.report.prompt_tokens <= 150


def test_memories_take_at_most_their_share_best_first(assembler: ContextAssembler) -> None:
    memories = [memory(i, " ".join(["m"] * 10), 1.0 - i / 10) for i in range(1, 6)]
    context = assembler.assemble(
        new_message="hi",
        memories=memories,
        recent=[],
        budget=ContextBudget(200, reply_tokens=50, memory_share=0.25),
    )
    # 37 tokens: the header costs 11 + 3 and each memory line 14 + 1, so one fits.
    assert [m.message_id for m in context.report.memories] == [1]
    assert context.report.sections.memories <= 37


def test_a_message_that_alone_exceeds_the_window_is_refused(assembler: ContextAssembler) -> None:
    with pytest.raises(ContextTooLongError) as caught:
        assembler.assemble(
            new_message="w " * 150, memories=[], recent=[], budget=ContextBudget(200, 50)
        )
    assert caught.value.field == "content"
    assert "200-token context window" in caught.value.message


def test_unstable_layout_puts_memories_before_the_recent_window() -> None:
    assembler = ContextAssembler(
        ScriptedEngine(context_window=200), "be helpful", stable_layout=False
    )
    context = assembler.assemble(
        new_message="what now",
        memories=[memory(1, "I like tea", 0.9)],
        recent=[turn(5, 3), turn(6, 3)],
        budget=ContextBudget(context_window=200, reply_tokens=50),
    )
    assert [m.role for m in context.messages] == ["system", "system", "user", "assistant", "user"]
    assert context.messages[1].content.endswith("- [2026-01-05 10:00] user: I like tea")
    sections = context.report.sections
    assert sections.recent == 2 * (3 + 3)
    assert sections.memories == len(context.messages[1].content.split()) + 3
    assert sum(vars_of(sections).values()) == context.report.prompt_tokens


def test_the_window_gets_the_shares_the_other_sections_leave_unused(
    assembler: ContextAssembler,
) -> None:
    budget = ContextBudget(200, reply_tokens=50, knowledge_share=0.2)
    # 150 prompt tokens less the system prompt (7) and the message (2 + 3): no summary,
    # memories, knowledge or facts this turn, so their shares are the window's.
    assert assembler.window_room(new_message="hi there", memories=[], budget=budget) == 138
    # Reserved at their full shares, they would have left it 138 - 15 - 37 - 30.
    assert assembler.window_budget_at_full_shares(budget, [], 2) == 56
    # A memory takes what its section actually takes: its header and line, 18 + 3.
    tea = [memory(1, "I like tea", 0.9)]
    assert assembler.window_room(new_message="hi there", memories=tea, budget=budget) == 117
    # A window of exactly that room is kept whole, and the prompt is then exactly full.
    fits = [turn(1, 14), *(turn(i, 20) for i in range(2, 6)), turn(6, 5)]  # 17 + 4 x 23 + 8
    context = assembler.assemble(new_message="hi there", memories=tea, recent=fits, budget=budget)
    assert context.report.recent_message_ids == (1, 2, 3, 4, 5, 6)
    assert context.report.prompt_tokens == 150
    # One token more and the oldest turn no longer fits.
    over = [turn(1, 15), *fits[1:]]
    context = assembler.assemble(new_message="hi there", memories=tea, recent=over, budget=budget)
    assert context.report.recent_message_ids == (2, 3, 4, 5, 6)
