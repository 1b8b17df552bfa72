"""The recent window sheds old turns in chunks, so consecutive prompts share their prefix."""

from __future__ import annotations

from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import ChatSettings, Settings
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session


async def test_turns_between_two_evictions_extend_the_previous_prompt(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    chunked = settings.model_copy(
        update={"chat": ChatSettings(recent_window_messages=6, window_eviction_chunk=4)}
    )
    async with AsyncTestClient(create_app(chunked, embedder=embedder, engine=engine)) as client:
        session = await create_session(client)
        turns = [
            (
                await client.post(
                    f"/v1/sessions/{session['id']}/messages", json={"content": f"turn {i}"}
                )
            ).json()
            for i in range(7)
        ]
    seqs = {t["message"]["id"]: t["message"]["seq"] for t in turns}
    seqs |= {t["reply"]["id"]: t["reply"]["seq"] for t in turns}
    windows = [[seqs[i] for i in t["context"]["recent_message_ids"]] for t in turns]
    assert windows == [
        [],
        [1, 2],
        [1, 2, 3, 4],
        [1, 2, 3, 4, 5, 6],
        [5, 6, 7, 8],  # 8 messages before: the 4 oldest go at once
        [5, 6, 7, 8, 9, 10],
        [9, 10, 11, 12],
    ]
    # Between evictions each prompt begins with the previous one's system prompt and
    # whole window (its retrieved memories and new message, last, may differ).
    for turn in (1, 2, 3, 5):
        stable = engine.prompts[turn - 1][: 1 + len(windows[turn - 1])]
        assert turns[turn]["context"]["prefix_reuse"] >= engine.count_prompt_tokens(stable) - 2
    for turn in (4, 6):
        assert turns[turn]["context"]["prefix_reuse"] < turns[turn - 1]["context"]["prefix_reuse"]


async def test_each_prompt_extends_the_previous_one_retrieved_context_included(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    async with AsyncTestClient(create_app(settings, embedder=embedder, engine=engine)) as client:
        old = await create_session(client)
        history = [
            {"role": "user", "content": f"Old note {i}: my garden has {i} tomato plants"}
            for i in range(8)
        ]
        await client.post(f"/v1/sessions/{old['id']}/history", json={"messages": history})
        session = await create_session(client)
        turns = []
        for content in ("How are my tomato plants?", "More about tomato plants", "And the garden?"):
            response = await client.post(
                f"/v1/sessions/{session['id']}/messages", json={"content": content}
            )
            turns.append(response.json())
    prompts = engine.prompts
    for turn in (1, 2):
        previous = prompts[turn - 1]
        # The previous prompt, then its reply, then this turn's context and message.
        assert prompts[turn][: len(previous)] == previous
        assert prompts[turn][len(previous)].content == turns[turn - 1]["reply"]["content"]
    shown = [{m["id"] for m in t["context"]["memories"]} for t in turns]
    assert shown[0] and not shown[0] & shown[1] and not (shown[0] | shown[1]) & shown[2]
    # What the prompt reuses is all of the previous prompt but its reply opening.
    for turn in (1, 2):
        previous_tokens = engine.count_prompt_tokens(prompts[turn - 1])
        assert turns[turn]["context"]["prefix_reuse"] >= previous_tokens - 2
