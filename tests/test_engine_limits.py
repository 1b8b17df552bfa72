"""The embedded engine's limits, on the real model (SmolLM2-135M in llama.cpp): the time
limit covers prompt evaluation, a turn can be cancelled, and one long prompt holds one
slot, not the engine. Outcomes are asserted in tokens and completion order, not seconds.
"""

from __future__ import annotations

import asyncio

import pytest

from retrieval.engines.llamacpp import BATCH_TOKENS, LlamaCppEngine, default_model_path
from retrieval.errors import EngineTimeoutError
from retrieval.protocols import ChatMessage, Completion, SamplingParams

pytestmark = pytest.mark.model

LONG = "The weather report for every town of the valley, hour by hour. " * 450
SHORT = [ChatMessage("system", "Be brief."), ChatMessage("user", "Say hello.")]
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)


def long_prompt() -> list[ChatMessage]:
    return [ChatMessage("system", "Be brief."), ChatMessage("user", LONG)]


@pytest.fixture(scope="module")
async def engine() -> LlamaCppEngine:
    return await LlamaCppEngine.loaded(default_model_path(), context_window=8192, num_slots=2)


async def test_the_long_prompt_is_long(engine: LlamaCppEngine) -> None:
    assert len(await engine.prompt_tokens(long_prompt())) > 4 * BATCH_TOKENS


async def test_the_time_limit_covers_prompt_evaluation() -> None:
    engine = LlamaCppEngine(default_model_path(), context_window=8192, num_slots=1, timeout_s=0.05)
    with pytest.raises(EngineTimeoutError) as raised:
        await engine.generate(long_prompt(), ONE_TOKEN)
    assert "prompt evaluation included" in str(raised.value)
    # Evaluation stopped at the first check after the deadline: within one batch.
    (slot,) = engine._slots
    assert slot.llama.n_tokens <= BATCH_TOKENS
    assert not slot.busy
    await engine.close()


async def first_token(engine: LlamaCppEngine, messages: list[ChatMessage]) -> Completion:
    result = None
    async for event in engine.stream(messages, ONE_TOKEN):
        if isinstance(event, Completion):
            result = event
    assert result is not None
    return result


async def test_a_long_prompt_holds_one_slot_and_a_cancelled_turn_frees_it(
    engine: LlamaCppEngine,
) -> None:
    long_turn = asyncio.create_task(first_token(engine, long_prompt()))
    while not any(slot.busy for slot in engine._slots):
        await asyncio.sleep(0.01)
    # Another turn takes the other slot and finishes while the long prompt is evaluated.
    short = await engine.generate(SHORT, SamplingParams(max_tokens=4, temperature=0.0))
    assert short.completion_tokens >= 1
    assert not long_turn.done()
    long_slot = next(slot for slot in engine._slots if slot.busy)
    long_turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long_turn
    # Cancelled mid-prompt: the slot stopped evaluating and is free again.
    assert not long_slot.busy
    assert long_slot.llama.n_tokens < len(await engine.prompt_tokens(long_prompt())) - 1
    both = await asyncio.gather(first_token(engine, SHORT), first_token(engine, SHORT))
    assert [c.completion_tokens for c in both] == [1, 1]


async def test_a_session_returns_to_the_slot_that_holds_its_prefix(
    engine: LlamaCppEngine,
) -> None:
    first = [ChatMessage("system", "You help with cooking. " * 8), ChatMessage("user", "Eggs?")]
    other = [ChatMessage("system", "You help with maths. " * 8), ChatMessage("user", "2+2?")]
    await first_token(engine, first)
    await first_token(engine, other)
    again = await first_token(engine, [*first, ChatMessage("assistant", "Yes."), *first[1:]])
    assert again.cached_prompt_tokens is not None
    assert again.cached_prompt_tokens >= len(await engine.prompt_tokens(first)) - 2
