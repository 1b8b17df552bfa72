"""The recent window sheds old turns in chunks, so consecutive prompts share their prefix."""

from __future__ import annotations

from pathlib import Path

from app.factory import create_app
from app.settings import ChatSettings, FactSettings, KnowledgeSettings, Settings
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session


async def test_turns_between_two_evictions_extend_the_previous_prompt(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    chunked = settings.model_copy(
        update={"chat": ChatSettings(recent_window_messages=6, window_eviction_chunk=4)}
    )
    async with local_client(create_app(chunked, embedder=embedder, engine=engine)) as client:
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
        assert (
            turns[turn]["context"]["prefix_reuse"] >= await engine.count_prompt_tokens(stable) - 2
        )
    for turn in (4, 6):
        assert turns[turn]["context"]["prefix_reuse"] < turns[turn - 1]["context"]["prefix_reuse"]


async def test_each_prompt_extends_the_previous_one_retrieved_context_included(
    settings: Settings, embedder: HashEmbedder, engine: ScriptedEngine
) -> None:
    async with local_client(create_app(settings, embedder=embedder, engine=engine)) as client:
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
        previous_tokens = await engine.count_prompt_tokens(prompts[turn - 1])
        assert turns[turn]["context"]["prefix_reuse"] >= previous_tokens - 2


async def chat_for(settings: Settings, engine: ScriptedEngine, num_turns: int) -> list[dict]:
    """`num_turns` turns of one session, each "Question i about topic i" (5 tokens)."""
    app = create_app(settings, embedder=HashEmbedder(), engine=engine)
    async with local_client(app) as client:
        session = await create_session(client)
        turns = []
        for i in range(1, num_turns + 1):
            response = await client.post(
                f"/v1/sessions/{session['id']}/messages",
                json={"content": f"Question {i} about topic {i}", "max_tokens": 20},
            )
            assert response.status_code == 200, response.text
            turns.append(response.json())
    return turns


def window_settings(settings: Settings, tmp_path: Path, **chat: object) -> Settings:
    """A 5-token system prompt, nothing retrieved and no facts: the window is all that
    grows, by 17 tokens a turn (message 5 + 3, reply 6 + 3)."""
    prompt = tmp_path / "system.txt"
    prompt.write_text("Be helpful.", encoding="utf-8")
    return settings.model_copy(
        update={
            "chat": ChatSettings(system_prompt_file=prompt, retrieval_k=0, **chat),
            "facts": FactSettings(extractor="none"),
            "knowledge": KnowledgeSettings(retrieval_k=0),
        }
    )


def compactions(turns: list[dict]) -> list[int]:
    versions = [t["context"]["summary_version"] for t in turns]
    return [n for n in range(2, len(turns) + 1) if versions[n - 1] > versions[n - 2]]


async def test_a_compaction_sheds_down_to_the_low_water_mark_and_buys_many_turns(
    settings: Settings, tmp_path: Path
) -> None:
    engine = ScriptedEngine(["Here is an answer for you."], context_window=300)
    shares = {"memory_share": 0.0, "summary_share": 0.0, "facts_share": 0.0}
    turns = await chat_for(window_settings(settings, tmp_path, **shares), engine, 27)
    # The window's room: 280 prompt tokens less the system prompt (7) and the message
    # (8), 265. Turn 17 finds 16 turns (272 tokens) and keeps 119 <= 265 / 2 (7 whole
    # exchanges, so that it opens with the user's message); the window then grows for 9
    # turns before it is over its room again.
    assert compactions(turns) == [17, 26]
    assert [len(t["context"]["recent_message_ids"]) for t in turns[15:18]] == [30, 14, 16]
    # The section counts the messages' contents (their template tokens are `template`).
    assert turns[16]["context"]["tokens"]["recent"] == 7 * 5 + 7 * 6
    # The turn after the compaction extends the compacting turn's prompt.
    compacting = await engine.count_prompt_tokens(engine.prompts[16])
    assert turns[17]["context"]["prefix_reuse"] >= compacting - 2


async def test_the_window_takes_the_unused_shares_and_a_compaction_leaves_them_room(
    settings: Settings, tmp_path: Path
) -> None:
    engine = ScriptedEngine(["Here is an answer for you."], context_window=300)
    turns = await chat_for(window_settings(settings, tmp_path), engine, 18)
    # Summary, memories and knowledge take nothing: the window has the same 265 tokens
    # as with no shares at all (reserved, they would have left it 111).
    assert compactions(turns) == [17]
    # The compaction keeps at most what fits with every section at its full share (111
    # tokens, less than half the room; 6 whole exchanges take 102): the grown summary
    # and the window both fit.
    context = turns[16]["context"]
    assert context["tokens"]["recent"] == 6 * 5 + 6 * 6
    assert context["tokens"]["summary"] > 0
    assert context["prompt_tokens"] <= 280
    assert len(context["recent_message_ids"]) == 12
