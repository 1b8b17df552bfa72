"""The embedded engine (SmolLM2-135M in llama.cpp) tokenises a text by its lines: the
tokens are those of the whole text, and a turn's context block, which recurs in several
of the texts a turn counts, is never tokenised whole.

The reference is a second, vocabulary-only copy of the model's tokenizer that tokenises
every text whole.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_cpp import Llama

from retrieval.engines.llamacpp import LINE_BREAK, LlamaCppEngine, default_model_path
from retrieval.prompt.budget import ContextBudget
from retrieval.prompt.layout import ContextAssembler, Sections
from retrieval.prompt.render import (
    CONTEXT_CLOSE,
    context_block,
    format_memory,
    memory_text,
    with_note,
)
from retrieval.prompt.report import AssembledContext, shared_prefix
from retrieval.turns import SearchHit
from tests.records import chunk_hit, fact, hit

pytestmark = pytest.mark.model

ENGLISH = [
    "I am allergic to peanuts.",
    "My sister Clara lives in Lisbon and visits every May.",
    "I started a new job as a nurse at St. Mary's hospital.",
    "We've been together five years; my partner's name is Sam.",
    "The meeting moved to 3:30pm on 2026-01-05 (room 4B).",
    "Don't book flights before 7 a.m., I'll never make it!",
    'She said "call me later" -- then hung up...',
    "Prices: $12.50, 99%, 1,000,000 and 3.14159.",
    "What snack do you suggest?",
    "  indented text with trailing spaces  ",
    "e-mail: sam@example.com; URL: https://example.com/a?b=c",
    "Café, naïve, résumé: accents à la française.",
]
CHINESE = [
    "我对花生过敏。",
    "我19岁，刚上大学",
    "我最喜欢的食物是饺子",
    "今晚吃点什么零食好？",
    "可以试试酸奶配水果。",
    "我妹妹住在里斯本，每年五月来看我。",
    "会议改到2026年1月5日下午3点半。",
    "“别忘了带伞”，她说。",
    "我每天跑步5公里，周末游泳。",
    "中英混合：I like 绿茶 and 乌龙茶!",
]
SENTENCES = [*ENGLISH, *CHINESE]
# What may open or close an entry: nothing (most often), white space of every kind
# (Python's and llama.cpp's alike, or Python's only: U+001C), digits, punctuation,
# contractions, CJK, an emoji, a special token's text.
EDGES = [
    *[""] * 12,
    " ",
    "  ",
    "\t",
    "\n",
    "\r",
    "\u3000",
    "\xa0",
    "\x1c",
    "\u2028",
    "\x85",
    "7",
    "2026",
    "'s",
    "'",
    "!",
    "?",
    "。",
    "，",
    "中",
    "é",
    "-",
    '"',
    ")",
    "😀",
    "<|im_end|>",
]
BREAKS = [*["\n"] * 6, "\n\n", "\n\n\n", " \n", "\n ", "\r\n", "\n\t", "\n\u3000"]


def entry(rng: random.Random) -> str:
    return f"{rng.choice(EDGES)}{rng.choice(SENTENCES)}{rng.choice(EDGES)}"


def joined_entries(rng: random.Random) -> str:
    text = entry(rng)
    for _ in range(rng.randint(1, 5)):
        text += f"{rng.choice(BREAKS)}{entry(rng)}"
    return text


def memories(rng: random.Random, first_id: int, count: int) -> list[SearchHit]:
    return [hit(first_id + i, joined_entries(rng), 1.0 - i / 100) for i in range(count)]


def plain_memories(rng: random.Random, first_id: int, count: int) -> list[SearchHit]:
    return [hit(first_id + i, " ".join(rng.sample(SENTENCES, 3)), 0.9) for i in range(count)]


def new_message_with_context(rng: random.Random) -> str:
    """A user message as a turn sends it: its context block, then the message."""
    block = context_block(
        [fact(i, entry(rng)) for i in range(rng.randint(0, 2))],
        memories(rng, 1, rng.randint(0, 5)),
        [chunk_hit(i, joined_entries(rng), 0.5) for i in range(rng.randint(0, 2))],
    )
    return with_note(block, joined_entries(rng))


def texts(count: int) -> Iterator[str]:
    rng = random.Random(20260105)
    for i in range(count):
        yield new_message_with_context(rng) if i % 4 == 0 else joined_entries(rng)


def whole(reference: Llama, text: str) -> list[int]:
    return list(reference.tokenize(text.encode("utf-8"), add_bos=False, special=False))


@pytest.mark.parametrize("plain", [True, False], ids=["tokenizers", "llama.cpp"])
async def test_a_text_has_the_tokens_of_the_whole_text(
    reference: Llama, plain: bool, onnx_cache_dir: Path
) -> None:
    """By lines and whole, with the service's plain-text tokenizer and with llama.cpp's."""
    engine = await LlamaCppEngine.loaded(
        default_model_path(),
        context_window=2048,
        num_slots=1,
        tokenizer_dir=onnx_cache_dir if plain else None,
    )
    assert (engine._plain is not None) == plain
    every = list(texts(4000))
    # Most texts are tokenised by lines: the joins are exercised, not only whole texts.
    assert sum(len(LINE_BREAK.split(text)) > 1 for text in every) > len(every) // 2
    wrong_counts = [t for t in every if await engine.count_tokens(t) != len(whole(reference, t))]
    # The ids too: what the prompt carries between the template's pieces.
    wrong_tokens = [t for t in every if list(engine._tokenize_text(t)) != whole(reference, t)]
    assert (wrong_counts, wrong_tokens) == ([], [])
    await engine.close()


async def test_a_turn_tokenises_its_lines_once_and_never_its_context_block_whole(
    reference: Llama, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await LlamaCppEngine.loaded(default_model_path(), context_window=2048, num_slots=1)
    tokenised: list[str] = []
    tokenize = engine._llama.tokenize

    def recording(text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        tokenised.append(text.decode("utf-8"))
        return list(tokenize(text, add_bos=add_bos, special=special))

    monkeypatch.setattr(engine._llama, "tokenize", recording)
    assembler = await ContextAssembler.measured(engine, "Be helpful.")
    budget = ContextBudget(context_window=engine.context_window, reply_tokens=256)

    async def turn(message: str, found: list[SearchHit]) -> tuple[AssembledContext, int]:
        """What a turn counts: `ContextBuilder.build` without the search and the window."""
        await engine.count_tokens(message)
        plan = await assembler.plan(Sections(new_message=message, memories=found), budget)
        context = await assembler.assemble(plan, [])
        await engine.prompt_tokens(context.messages)
        note = assembler.turn_context(context.report)
        return context, await assembler.note_tokens(note)

    rng = random.Random(7)
    await turn("What did I say about food?", plain_memories(rng, 1, 3))
    tokenised.clear()
    found = plain_memories(rng, 10, 3)
    message = "And what should I cook tonight?"
    context, note_tokens = await turn(message, found)

    lines = [format_memory(m) for m in found]
    # The new message and each memory line once; of the block, only the piece where the
    # last memory and the closing line meet across a blank line (which is not cut: see
    # `LINE_PIECEWISE`). Whole texts would add the block, the block with the message and
    # the memory section, each tokenised whole.
    assert tokenised == [message, *lines, f"{lines[-1]}\n\n{CONTEXT_CLOSE}"]
    # Every count is the whole text's.
    block = context_block([], found, [])
    assert context.report.memories == tuple(found)
    assert context.messages[-1].content == with_note(block, message)
    assert note_tokens == len(whole(reference, f"{block}\n"))
    assert context.report.sections.memories == len(whole(reference, memory_text(found)))
    prompt = engine.render_prompt(context.messages).encode("utf-8")
    assert context.report.prompt_tokens == len(reference.tokenize(prompt, special=True))
    assert await engine.prompt_tokens(context.messages) == reference.tokenize(prompt, special=True)
    await engine.close()


@pytest.fixture(scope="module")
async def bounded() -> AsyncIterator[LlamaCppEngine]:
    engine = await LlamaCppEngine.loaded(default_model_path(), context_window=2048, num_slots=1)
    yield engine
    await engine.close()


def test_the_lower_bound_never_exceeds_the_count_of_the_corpus(
    reference: Llama, bounded: LlamaCppEngine
) -> None:
    """`min_tokens` (the engine's bound, from its pre-tokeniser) on the corpus's texts, and
    where it is tight."""
    over = [t for t in texts(2000) if bounded.min_tokens(t) > len(whole(reference, t))]
    assert over == []
    examples = ("2024-06-15", "I'm here", "我对花生过敏", "naïve café", "")
    assert [bounded.min_tokens(t) for t in examples] == [8, 3, 0, 2, 0]


@settings(max_examples=400, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=60))
def test_the_lower_bound_never_exceeds_the_count_of_any_text(
    reference: Llama, bounded: LlamaCppEngine, text: str
) -> None:
    assert bounded.min_tokens(text) <= len(whole(reference, text))


async def test_a_full_section_passes_over_candidates_that_cannot_fit(
    reference: Llama, onnx_cache_dir: Path
) -> None:
    """The memories a plan shows are the same with the bound as by counting each
    candidate; fewer candidates are tokenised."""
    engine = await LlamaCppEngine.loaded(
        default_model_path(), context_window=2048, num_slots=1, tokenizer_dir=onnx_cache_dir
    )

    class Unbounded:
        """The engine without its bound: every candidate counted."""

        def __getattr__(self, name: str) -> object:
            if name == "min_tokens":
                raise AttributeError(name)
            return getattr(engine, name)

    try:
        rng = random.Random(11)
        found = plain_memories(rng, 1, 50)
        budget = ContextBudget(
            context_window=engine.context_window, reply_tokens=256, memory_max_tokens=384
        )
        sections = Sections(new_message="What should I cook tonight?", memories=found)
        counted: list[str] = []
        count = engine.count_tokens

        async def recording(text: str) -> int:
            counted.append(text)
            return await count(text)

        engine.count_tokens = recording  # type: ignore[method-assign]
        bounded = await (await ContextAssembler.measured(engine, "Be helpful.")).plan(
            sections, budget
        )
        with_bound = len(counted)
        counted.clear()
        every = await (await ContextAssembler.measured(Unbounded(), "Be helpful.")).plan(  # type: ignore[arg-type]
            sections, budget
        )
        assert 3 < len(bounded.memories) < 40
        assert bounded.memories == every.memories
        assert bounded.window_room == every.window_room
        # English candidates are passed over (the bound gives a line of Chinese nothing).
        assert with_bound < len(counted)
    finally:
        await engine.close()


@given(
    st.lists(st.integers(0, 3), max_size=700),
    st.lists(st.integers(0, 3), max_size=700),
    st.integers(0, 700),
)
def test_the_shared_prefix_is_the_first_position_that_differs(
    first: list[int], second: list[int], common: int
) -> None:
    """Compared a block at a time, the count is the item-by-item one (lists, or a list
    and a tuple), blocks that agree included."""
    second = first[:common] + second
    expected = next(
        (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )
    assert shared_prefix(first, second) == expected
    assert shared_prefix(tuple(first), second) == expected
