"""The window's budget: pruning of small talk, compaction into rolling summaries (both
summarizers), the section layout of the prompt, and the allocator's flow of budget."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import ChatSettings, KnowledgeSettings, Settings
from retrieval.prompt.budget import ContextBudget
from retrieval.prompt.layout import ContextAssembler, Sections
from retrieval.prompt.render import FACTS_HEADER, SUMMARY_HEADER
from retrieval.window.compaction import Compaction, WindowPolicy, plan_compaction
from retrieval.window.smalltalk import is_small_talk
from retrieval.window.summarizers import ExtractiveSummarizer, LlmSummarizer
from storage.records import Turn
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.records import fact as stored_fact
from tests.records import turn
from tests.test_api_sessions import create_session

WHEN = dt.datetime(2026, 3, 1, 9, 0, tzinfo=dt.UTC)


def wt(seq: int, text: str, role: str | None = None) -> Turn:
    role = role or ("user" if seq % 2 else "assistant")
    return turn(seq * 10, text, role, seq=seq, created_at=WHEN)


NONE_PRUNED: frozenset[int] = frozenset()


def words(n: int) -> str:
    return " ".join(["word"] * n)


def one_token_overhead(tokens: int) -> int:
    return tokens + 1


def test_a_window_within_budget_is_left_alone() -> None:
    window = [wt(i, words(5)) for i in range(1, 5)]
    plan = plan_compaction(window, NONE_PRUNED, WindowPolicy(4, 2, 100, 50), one_token_overhead)
    assert (plan.evicted, plan.pruned_seqs) == ((), frozenset())


def test_too_many_messages_leave_in_whole_chunks() -> None:
    window = [wt(i, words(1)) for i in range(1, 10)]  # 9 messages, at most 6
    plan = plan_compaction(window, NONE_PRUNED, WindowPolicy(6, 4, 1000, 500), one_token_overhead)
    assert [t.seq for t in plan.evicted] == [1, 2, 3, 4]
    assert plan.through_seq == 4


def test_too_many_tokens_shed_down_to_the_low_water_mark() -> None:
    window = [wt(i, words(9)) for i in range(1, 11)]  # 10 x 10 tokens, budget 80
    policy = WindowPolicy(100, 1, token_budget=80, low_water_tokens=45)
    plan = plan_compaction(window, NONE_PRUNED, policy, one_token_overhead)
    assert [t.seq for t in plan.evicted] == [1, 2, 3, 4, 5, 6]  # 40 tokens left <= 45


def test_after_a_compaction_the_window_grows_to_its_budget_before_the_next() -> None:
    policy = WindowPolicy(100, 1, token_budget=100, low_water_tokens=50)
    window: list[Turn] = []
    compacted_at: list[int] = []
    for seq in range(1, 31):  # one 10-token message a turn
        plan = plan_compaction(window, NONE_PRUNED, policy, one_token_overhead)
        if plan.evicted:
            compacted_at.append(seq)
            window = [t for t in window if t.seq > (plan.through_seq or 0)]
            assert sum(t.token_count + 1 for t in window) == 50
        window.append(wt(seq, words(9)))
    # 11 messages (110 tokens) are over 100; 50 are left, and 6 more turns are over again.
    assert compacted_at == [12, 18, 24, 30]


def test_small_talk_is_pruned_before_anything_is_evicted() -> None:
    window = [
        wt(1, "Can you recommend some science fiction books like Dune?"),
        wt(2, "Try Hyperion by Dan Simmons and The Left Hand of Darkness by Le Guin."),
        wt(3, "By the way, I just had lunch, a really nice ramen."),
        wt(4, "Sounds delicious! Enjoy your afternoon."),
        wt(5, "Now my physics homework: explain momentum conservation in a collision."),
        wt(6, "In a closed system the total momentum before equals the total after."),
    ]
    tokens = sum(t.token_count + 1 for t in window)
    policy = WindowPolicy(100, 1, token_budget=tokens - 5, low_water_tokens=tokens - 15)
    plan = plan_compaction(window, NONE_PRUNED, policy, one_token_overhead)
    # The small-talk exchange (17 tokens) goes as a whole, and that is enough.
    assert (plan.evicted, sorted(plan.pruned_seqs)) == ((), [3, 4])
    tighter = WindowPolicy(100, 1, token_budget=tokens - 5, low_water_tokens=tokens - 30)
    plan = plan_compaction(window, NONE_PRUNED, tighter, one_token_overhead)
    assert sorted(plan.pruned_seqs) == [3, 4]
    assert [t.seq for t in plan.evicted] == [1, 2]  # then the oldest leave


def test_too_many_messages_shed_a_whole_chunk_small_talk_first() -> None:
    substance = "Explain momentum conservation in a collision of two carts."
    window = [wt(i, substance) for i in range(1, 11)]
    window[2:4] = [wt(3, "By the way, I just had lunch, a really nice ramen."), wt(4, "ok")]
    window[6:8] = [wt(7, "Thanks!"), wt(8, "ok, got it")]
    policy = WindowPolicy(8, 4, token_budget=1000, low_water_tokens=500)
    plan = plan_compaction(window, NONE_PRUNED, policy, one_token_overhead)
    # 10 messages, at most 8: a chunk of 4 goes, all of it small talk, not one exchange.
    assert (plan.evicted, sorted(plan.pruned_seqs)) == ((), [3, 4, 7, 8])
    # Two more messages are within the budget again.
    longer = [*window, wt(11, substance), wt(12, substance)]
    unchanged = Compaction(plan.pruned_seqs)
    assert plan_compaction(longer, plan.pruned_seqs, policy, one_token_overhead) == unchanged


def test_the_newest_messages_are_never_pruned() -> None:
    window = [wt(1, words(20)), wt(2, "thanks!"), wt(3, "ok")]
    policy = WindowPolicy(100, 1, token_budget=10, low_water_tokens=10, keep_last=2)
    plan = plan_compaction(window, NONE_PRUNED, policy, one_token_overhead)
    assert [t.seq for t in plan.evicted] == [1, 2, 3] or 2 not in plan.pruned_seqs


@pytest.mark.parametrize(
    ("text", "small"),
    [
        ("Thanks!", True),
        ("ok, got it", True),
        ("谢谢！", True),
        ("你好", True),
        ("By the way, I just had lunch, a really nice ramen.", True),
        ("今天天气真好，中午吃了饺子", True),
        ("Can you help with my homework on momentum?", False),
        ("I'm allergic to peanuts, thanks", False),
        ("帮我解释一下动量守恒", False),
        ("午饭推荐什么？", False),
        # A run of 哈 before a non-match split every way before (exponential).
        ("哈" * 150 + "x", False),
        ("哈哈哈，嗯嗯哦哦！", True),
    ],
)
def test_small_talk_is_told_apart_from_substance(text: str, small: bool) -> None:
    assert is_small_talk(text) is small


async def test_extractive_summary_keeps_what_matters_and_fits_its_budget() -> None:
    async def count(text: str) -> int:
        return len(text.split())

    summarizer = ExtractiveSummarizer(count)
    turns = [
        wt(1, "Hi there!"),
        wt(2, "Hello! How can I help?"),
        wt(3, "I am allergic to peanuts. The weather is nice today."),
        wt(4, "Noted, I will avoid peanuts in every recipe."),
        wt(5, "My sister Emma visits on 12 May."),
        wt(6, "我对花生过敏，周末要去上海。", "user"),
    ]
    summary = await summarizer.summarize("", turns, max_tokens=1000)
    assert summary.splitlines() == [
        "- [2026-03-01] user: I am allergic to peanuts.",
        "- [2026-03-01] assistant: Noted, I will avoid peanuts in every recipe.",
        "- [2026-03-01] user: My sister Emma visits on 12 May.",
        "- [2026-03-01] user: 我对花生过敏，周末要去上海。",
    ]
    tight = await summarizer.summarize("", turns, max_tokens=25)
    assert len(tight.split()) + len(tight.splitlines()) <= 25
    assert "- [2026-03-01] user: I am allergic to peanuts." in tight.splitlines()
    # The next compaction starts from the previous summary.
    later = await summarizer.summarize(summary, [wt(7, "I moved to Berlin in 2025.")], 1000)
    assert later.splitlines()[:4] == summary.splitlines()
    assert later.splitlines()[-1] == "- [2026-03-01] user: I moved to Berlin in 2025."


async def test_llm_summary_comes_from_the_engine_with_the_previous_summary() -> None:
    engine = ScriptedEngine(["- user is allergic to peanuts"])
    summarizer = LlmSummarizer(engine, "Summarize.")
    text = await summarizer.summarize("- user likes tea", [wt(1, "I am allergic to peanuts")], 50)
    assert text == "- user is allergic to peanuts"
    [prompt] = engine.prompts
    assert prompt[0].content == "Summarize."
    assert prompt[1].content == (
        "Summary so far:\n- user likes tea\n\nNew turns:\nuser: I am allergic to peanuts"
    )


async def test_llm_summarizer_feeds_long_histories_in_batches() -> None:
    engine = ScriptedEngine(["summary one", "summary two"], context_window=400)
    summarizer = LlmSummarizer(engine, "Summarize.")
    turns = [wt(i, words(60)) for i in range(1, 7)]  # 6 x 68: more than one batch of 150
    assert await summarizer.summarize("", turns, 50) == "summary two"
    assert len(engine.prompts) > 1
    assert "Summary so far:\nsummary one" in engine.prompts[1][1].content


async def test_layout_order_system_facts_summary_window_memories_new() -> None:
    engine = ScriptedEngine(context_window=400)
    assembler = await ContextAssembler.measured(engine, "be helpful")
    fact = stored_fact(7, "The user is allergic to peanuts.", priority=100, when=WHEN)
    sections = Sections(
        new_message="what now", pinned=[fact], summary="- [2026-03-01] user: I like tea."
    )
    plan = await assembler.plan(sections, ContextBudget(400, reply_tokens=50))
    context = await assembler.assemble(plan, [wt(5, "hello", "user"), wt(6, "hi", "assistant")])
    system = context.messages[0].content
    assert system.index("be helpful") < system.index(FACTS_HEADER) < system.index(SUMMARY_HEADER)
    assert system.endswith(f'{SUMMARY_HEADER}\n- "[2026-03-01] user: I like tea."')
    assert [m.content for m in context.messages[1:]] == ["hello", "hi", "what now"]
    sections = context.report.sections
    assert sections.summary == len(f'{SUMMARY_HEADER}\n- "[2026-03-01] user: I like tea."'.split())
    total = sum(getattr(sections, n) for n in sections.__slots__)  # type: ignore[attr-defined]
    assert total == context.report.prompt_tokens


async def test_unused_budget_flows_to_the_recent_window() -> None:
    assembler = await ContextAssembler.measured(ScriptedEngine(context_window=400), "be helpful")
    recent = [wt(i, words(20), "user") for i in range(1, 30)]
    budget = ContextBudget(400, reply_tokens=50, memory_share=0.25, facts_share=0.15)
    plan = await assembler.plan(Sections(new_message="hi"), budget)
    context = await assembler.assemble(plan, recent)
    # No memories, facts or summary: the window takes their shares too.
    assert context.report.sections.recent > budget.available * 0.6
    assert context.report.prompt_tokens <= budget.available


def pruning_settings(tmp_path: Path, sqlite_url: str) -> Settings:
    prompt = tmp_path / "system.txt"
    prompt.write_text("Be helpful.", encoding="utf-8")
    return Settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_url,
        chat=ChatSettings(
            system_prompt_file=prompt,
            memory_share=0.0,
            facts_share=0.0,
            summary_share=0.1,
            window_low_water=0.75,
        ),
        knowledge=KnowledgeSettings(share=0.0),
    )


async def test_small_talk_is_pruned_and_the_physics_request_stays(
    tmp_path: Path, sqlite_url: str
) -> None:
    replies = [
        "Try Hyperion by Dan Simmons and The Left Hand of Darkness.",
        "Sounds delicious! Enjoy your afternoon.",
        "Momentum is conserved: total momentum before equals total momentum after.",
        "Let us check your numbers step by step.",
    ]
    # A context so small that the fourth turn's window (75 tokens of the scripted engine)
    # is over its room (102 prompt tokens less 7 of system prompt and 23 of message: 72),
    # and without the small talk (21) is at its low-water mark (three quarters: 54).
    engine = ScriptedEngine(replies, context_window=122)
    app = create_app(pruning_settings(tmp_path, sqlite_url), embedder=HashEmbedder(), engine=engine)
    async with local_client(app) as client:
        session = await create_session(client)
        messages = [
            "Can you recommend science fiction books like Dune?",
            "By the way, I just had lunch, a really nice ramen.",
            "Now my physics homework: explain momentum conservation in a collision of two carts.",
            "Here is my answer: 2 kg at 3 m/s hits 1 kg at rest, so they move at 2 m/s.",
        ]
        turns = []
        for content in messages:
            response = await client.post(
                f"/v1/sessions/{session['id']}/messages",
                json={"content": content, "max_tokens": 20},
            )
            assert response.status_code == 200, response.text
            turns.append(response.json())
        summaries = (await client.get(f"/v1/sessions/{session['id']}/summaries")).json()
    last = turns[-1]["context"]
    small_talk = {turns[1]["message"]["id"], turns[1]["reply"]["id"]}
    assert set(last["pruned_message_ids"]) == small_talk
    assert turns[2]["message"]["id"] in last["recent_message_ids"]  # the physics request
    assert turns[0]["message"]["id"] in last["recent_message_ids"]  # nothing evicted
    assert last["summary_through_seq"] == 0
    [version] = summaries["summaries"]
    assert (version["version"], version["through_seq"], version["text"]) == (1, 0, "")
    assert version["pruned_seqs"] == [3, 4]


def window_of_four(tmp_path: Path, sqlite_url: str) -> Litestar:
    """The service with a window of 4 messages shedding 2 at a time, every reply "Noted."."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_url,
        chat=ChatSettings(recent_window_messages=4, window_eviction_chunk=2),
    )
    return create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(["Noted."]))


async def post_turns(client: AsyncTestClient, session_id: str, contents: list[str]) -> list[dict]:
    """One turn per message, in order: the turns' response bodies."""
    turns = []
    for content in contents:
        response = await client.post(
            f"/v1/sessions/{session_id}/messages", json={"content": content}
        )
        turns.append(response.json())
    return turns


async def test_turns_that_leave_the_window_are_summarised_and_stay_stored(
    tmp_path: Path, sqlite_url: str
) -> None:
    async with local_client(window_of_four(tmp_path, sqlite_url)) as client:
        session = await create_session(client)
        contents = [
            "I am allergic to peanuts.",
            "My daughter Mia turns 7 on 3 June.",
            "What a day.",
            "Tell me a story.",
        ]
        turns = await post_turns(client, session["id"], contents)
        preview = await client.post(
            f"/v1/sessions/{session['id']}/context", json={"content": "And now?"}
        )
        summaries = (await client.get(f"/v1/sessions/{session['id']}/summaries")).json()
        stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()
    # Turn 4 found 6 messages in a window of 4: the oldest chunk of 2 was compacted.
    assert [(s["version"], s["through_seq"]) for s in summaries["summaries"]] == [(1, 2)]
    [current] = summaries["summaries"]
    assert current["summarizer"] == "extractive"
    day = turns[0]["message"]["created_at"][:10]
    assert current["text"] == f"- [{day}] user: I am allergic to peanuts."
    last = turns[-1]["context"]
    assert (last["summary_version"], last["summary_through_seq"]) == (1, 2)
    assert last["tokens"]["summary"] > 0
    assert turns[0]["message"]["id"] not in last["recent_message_ids"]
    assert len(stored["messages"]) == 8  # compaction never deletes a message
    # A preview computes the next compaction (messages 3 and 4) but stores none.
    context = preview.json()["context"]
    assert (context["summary_version"], context["summary_through_seq"]) == (2, 4)
    system = preview.json()["messages"][0]["content"]
    assert system.endswith(
        f'{SUMMARY_HEADER}\n- "[{day}] user: I am allergic to peanuts."\n'
        f'- "[{day}] user: My daughter Mia turns 7 on 3 June."'
    )


async def test_a_compacting_turn_does_not_retrieve_the_turns_it_summarises(
    tmp_path: Path, sqlite_url: str
) -> None:
    async with local_client(window_of_four(tmp_path, sqlite_url)) as client:
        session = await create_session(client)
        contents = [
            "I am allergic to peanuts.",
            "My daughter Mia turns 7 on 3 June.",
            "What a day.",
            "Which food am I allergic to, peanuts?",
            "Remind me: am I allergic to peanuts?",
        ]
        turns = await post_turns(client, session["id"], contents)
    allergy = turns[0]["message"]["id"]
    # Turn 4 compacts messages 1 and 2 into the summary: the allergy is there, not
    # among its memories (every other stored turn is in its window).
    fourth = turns[3]["context"]
    assert (fourth["summary_version"], fourth["summary_through_seq"]) == (1, 2)
    assert fourth["memories"] == []
    # Turn 5 compacts messages 3 and 4 and retrieves the allergy (with its reply), out
    # of its window now.
    fifth = turns[4]["context"]
    assert (fifth["summary_version"], fifth["summary_through_seq"]) == (2, 4)
    assert [m["id"] for m in fifth["memories"]] == [allergy, turns[0]["reply"]["id"]]
