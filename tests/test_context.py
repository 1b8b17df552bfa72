"""Prompt assembly under the context window, with the scripted engine's tokenizer.

The scripted engine counts words, plus 3 tokens around each message and 2 for the
reply's opening.
"""

from __future__ import annotations

import datetime as dt

import pytest

from retrieval.errors import ContextTooLongError
from retrieval.prompt.budget import ContextBudget
from retrieval.prompt.layout import ContextAssembler, Sections
from retrieval.prompt.render import (
    CONTEXT_CLOSE,
    CONTEXT_OPEN,
    HISTORY_OPENING,
    MEMORY_HEADER,
    context_block,
)
from retrieval.prompt.report import ContextReport
from retrieval.turns import SearchHit
from storage.records import Turn
from tests.fakes import ScriptedEngine
from tests.records import hit
from tests.records import turn as stored_turn

WHEN = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)


def memory(i: int, text: str, score: float) -> SearchHit:
    return hit(i, text, score)


def turn(i: int, words: int) -> Turn:
    return stored_turn(i, " ".join(["w"] * words), "user" if i % 2 else "assistant")


async def assemble(assembler: ContextAssembler, *, budget: ContextBudget, recent=(), **sections):
    plan = await assembler.plan(Sections(**sections), budget)
    return await assembler.assemble(plan, recent)


async def window_room(assembler: ContextAssembler, *, budget: ContextBudget, **sections) -> int:
    return (await assembler.plan(Sections(**sections), budget)).window_room


def vars_of(sections: object) -> dict[str, int]:
    return {name: getattr(sections, name) for name in sections.__slots__}  # type: ignore[attr-defined]


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
async def assembler() -> ContextAssembler:
    return await ContextAssembler.measured(ScriptedEngine(context_window=200), "be helpful")


async def test_layout_is_one_system_message_then_alternating_turns(
    assembler: ContextAssembler,
) -> None:
    context = await assemble(
        assembler,
        new_message="what now",
        memories=[memory(1, "I like tea", 0.9)],
        recent=[turn(5, 3), turn(6, 3)],
        budget=ContextBudget(context_window=200, reply_tokens=50),
    )
    assert [m.role for m in context.messages] == ["system", "user", "assistant", "user"]
    assert context.messages[0].content == "be helpful"
    block = (
        f'{CONTEXT_OPEN}\n\n{MEMORY_HEADER}\n[5 Jan 2026]\n- user: "I like tea"\n\n{CONTEXT_CLOSE}'
    )
    assert context.messages[-1].content == f"{block}\nwhat now"
    report = context.report
    assert report.recent_message_ids == (5, 6)
    assert [m.turn.id for m in report.memories] == [1]
    sections = report.sections
    assert sections.system == 2
    assert sections.recent == 3 + 3
    assert sections.memories == words(f'{MEMORY_HEADER}\n[5 Jan 2026]\n- user: "I like tea"')
    # The new message's part: its words and the context's frame lines.
    assert sections.new_message == 2 + words(CONTEXT_OPEN) + words(CONTEXT_CLOSE)
    assert sections.template == 4 * 3 + 2
    assert report.prompt_tokens == sum(words(m.content) + 3 for m in context.messages) + 2
    assert sum(vars_of(sections).values()) == report.prompt_tokens


async def test_a_window_that_opens_with_the_assistant_gets_an_opening_line(
    assembler: ContextAssembler,
) -> None:
    context = await assemble(
        assembler,
        new_message="and then?",
        memories=[],
        recent=[turn(6, 3), turn(7, 2), turn(9, 2)],
        budget=ContextBudget(context_window=200, reply_tokens=50),
    )
    # Two user turns in a row (an import, or a turn without a reply) are one message.
    assert [(m.role, m.content) for m in context.messages] == [
        ("system", "be helpful"),
        ("user", HISTORY_OPENING),
        ("assistant", "w w w"),
        ("user", "w w\n\nw w\n\nand then?"),
    ]
    sections = context.report.sections
    assert sum(vars_of(sections).values()) == context.report.prompt_tokens


async def test_oldest_recent_turns_are_dropped_to_fit(assembler: ContextAssembler) -> None:
    recent = [turn(i, 30) for i in range(1, 8)]  # 7 x 33 tokens: far more than fits
    context = await assemble(
        assembler,
        new_message="hi",
        memories=[],
        recent=recent,
        budget=ContextBudget(200, reply_tokens=50),
    )
    # 138 tokens of room: turns 4-7 would take 132, but a window opening with the
    # assistant's turn 4 needs the opening line too (12): 5-7 it is.
    assert context.report.recent_message_ids == (5, 6, 7)
    # Turn 7 (the user's, unanswered) and the new message are one user message.
    assert context.report.prompt_tokens == 7 + 2 * 33 + (30 + 1 + 3)


async def memories_shown(assembler: ContextAssembler, memories: list[SearchHit]) -> ContextReport:
    """The report of a prompt whose memory share is 37 tokens (25 % of 150)."""
    budget = ContextBudget(200, reply_tokens=50, memory_share=0.25)
    context = await assemble(
        assembler, new_message="hi", memories=memories, recent=[], budget=budget
    )
    return context.report


async def test_memories_take_at_most_their_share_best_first(assembler: ContextAssembler) -> None:
    memories = [memory(i, " ".join(["m"] * 10), 1.0 - i / 10) for i in range(1, 6)]
    report = await memories_shown(assembler, memories)
    # 37 tokens: the header costs 13 + 2, the day's line 3 + 1 and each memory line
    # 12 + 1, so two do not fit.
    assert [m.turn.id for m in report.memories] == [1]
    assert report.sections.memories == 13 + 3 + 12


def test_memories_are_shown_by_day_best_day_first_in_time_order_within_a_day() -> None:
    later = WHEN + dt.timedelta(days=2)
    memories = [
        hit(1, "tea in the evening", 0.9, created_at=later + dt.timedelta(hours=8), seq=7),
        hit(2, "I moved to Denver", 0.8, created_at=WHEN),
        hit(3, "coffee after lunch", 0.7, created_at=later, seq=2),
    ]
    block = context_block([], memories, [])
    assert block.splitlines() == [
        CONTEXT_OPEN,
        "",
        MEMORY_HEADER,
        "[7 Jan 2026]",
        '- user: "coffee after lunch"',
        '- user: "tea in the evening"',
        "[5 Jan 2026]",
        '- user: "I moved to Denver"',
        "",
        CONTEXT_CLOSE,
    ]


async def test_a_memory_pays_for_its_day_line_only_where_it_opens_the_day(
    assembler: ContextAssembler,
) -> None:
    other_day = WHEN + dt.timedelta(days=1)
    five = "w w w w w"
    memories = [
        hit(1, five, 0.9),
        hit(2, five, 0.8, created_at=other_day),
        hit(3, five, 0.7, created_at=WHEN + dt.timedelta(hours=1)),
    ]
    report = await memories_shown(assembler, memories)
    # 37 tokens: the header 13 + 2; the first memory its line (7 + 1) and its day's (3 + 1),
    # 27 in all; the second opens another day (12 more: over); the third shares the
    # first one's day (8 more: 35).
    assert [m.turn.id for m in report.memories] == [1, 3]
    assert report.sections.memories == 13 + 3 + 7 + 7


async def test_a_message_that_alone_exceeds_the_window_is_refused(
    assembler: ContextAssembler,
) -> None:
    with pytest.raises(ContextTooLongError) as caught:
        await assemble(
            assembler, new_message="w " * 150, memories=[], recent=[], budget=ContextBudget(200, 50)
        )
    assert caught.value.field == "content"
    assert "200-token context window" in caught.value.message


async def test_unstable_layout_puts_the_turns_context_in_the_system_message() -> None:
    assembler = await ContextAssembler.measured(
        ScriptedEngine(context_window=200), "be helpful", stable_layout=False
    )
    context = await assemble(
        assembler,
        new_message="what now",
        memories=[memory(1, "I like tea", 0.9)],
        recent=[turn(5, 3), turn(6, 3)],
        budget=ContextBudget(context_window=200, reply_tokens=50),
    )
    assert [m.role for m in context.messages] == ["system", "user", "assistant", "user"]
    block = context_block([], [memory(1, "I like tea", 0.9)], [])
    assert context.messages[0].content == f"be helpful\n\n{block}"
    assert context.messages[-1].content == "what now"
    sections = context.report.sections
    assert sections.recent == 3 + 3
    assert sections.memories == words(f'{MEMORY_HEADER}\n[5 Jan 2026]\n- user: "I like tea"')
    assert sections.new_message == 2
    assert sum(vars_of(sections).values()) == context.report.prompt_tokens


async def test_the_window_gets_the_shares_the_other_sections_leave_unused(
    assembler: ContextAssembler,
) -> None:
    budget = ContextBudget(200, reply_tokens=50, knowledge_share=0.2)
    # 150 prompt tokens less the system prompt (7) and the message (2 + 3): no summary,
    # memories, knowledge or facts this turn, so their shares are the window's.
    assert await window_room(assembler, new_message="hi there", memories=[], budget=budget) == 138
    # Reserved at their full shares, they would have left it 138 - 15 - 37 - 30.
    assert await assembler.window_budget_at_full_shares(budget, [], 2) == 56
    # A memory takes what its section actually takes: the context block it opens.
    tea = [memory(1, "I like tea", 0.9)]
    room = 138 - words(context_block([], tea, []))
    assert await window_room(assembler, new_message="hi there", memories=tea, budget=budget) == room
    # A window of exactly that room is kept whole, and the prompt is then exactly full.
    assert room == 83
    fits = [turn(1, room - 3 * 23 - 3), *(turn(i, 20) for i in range(2, 5))]
    context = await assemble(
        assembler, new_message="hi there", memories=tea, recent=fits, budget=budget
    )
    assert context.report.recent_message_ids == (1, 2, 3, 4)
    assert context.report.prompt_tokens == 150
    # One token more and the oldest turn no longer fits; the assistant's after it now
    # opens the window, with the opening line (12 tokens), which still fits (69 + 12).
    over = [turn(1, room - 3 * 23 - 2), *fits[1:]]
    context = await assemble(
        assembler, new_message="hi there", memories=tea, recent=over, budget=budget
    )
    assert context.report.recent_message_ids == (2, 3, 4)
    assert context.messages[1].content == HISTORY_OPENING


async def test_memories_take_at_most_their_token_cap_whatever_the_share(
    assembler: ContextAssembler,
) -> None:
    memories = [memory(i, " ".join(["m"] * 10), 1.0 - i / 10) for i in range(1, 6)]
    budget = ContextBudget(200, reply_tokens=50, memory_share=1.0, memory_max_tokens=45)
    assert budget.memory_tokens == 45
    context = await assemble(assembler, new_message="hi", memories=memories, budget=budget)
    # The header costs 10 + 2 and each memory line 15 + 1: two lines fit 45 tokens.
    assert [m.turn.id for m in context.report.memories] == [1, 2]
    assert context.report.sections.memories == 10 + 2 * 15
