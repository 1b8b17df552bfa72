"""Sessions, messages and chat turns over HTTP, on SQLite and PostgreSQL, with fake models."""

from __future__ import annotations

from litestar.testing import AsyncTestClient

from app.factory import create_app
from app.settings import ChatSettings, Settings
from retrieval.errors import EngineError
from retrieval.prompt.render import CONTEXT_CLOSE, CONTEXT_OPEN
from retrieval.protocols import Embedder
from tests.clients import local_client
from tests.fakes import ScriptedEngine


async def create_session(client: AsyncTestClient, user_id: str = "alice", **extra: object) -> dict:
    response = await client.post("/v1/sessions", json={"user_id": user_id, **extra})
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_get_list_and_delete_session(client: AsyncTestClient) -> None:
    created = await create_session(client, title="Trip", metadata={"channel": "web"})
    assert created["user_id"] == "alice"
    assert created["title"] == "Trip"
    assert created["metadata"] == {"channel": "web"}
    assert created["num_messages"] == 0

    fetched = await client.get(f"/v1/sessions/{created['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == created

    other = await create_session(client, user_id="bob")
    listed = await client.get("/v1/sessions", params={"user_id": "alice"})
    assert [s["id"] for s in listed.json()["sessions"]] == [created["id"]]
    assert (await client.get("/v1/sessions", params={"user_id": "nobody"})).json() == {
        "sessions": []
    }

    deleted = await client.delete(f"/v1/sessions/{created['id']}")
    assert deleted.status_code == 204
    assert (await client.get(f"/v1/sessions/{created['id']}")).status_code == 404
    assert (await client.get(f"/v1/sessions/{other['id']}")).status_code == 200


async def test_chat_turn_stores_both_messages_and_reports_context(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    session = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages",
        json={"content": "I am allergic to peanuts", "temperature": 0, "max_tokens": 16},
    )
    assert response.status_code == 200, response.text
    turn = response.json()
    assert turn["message"]["role"] == "user"
    assert turn["message"]["content"] == "I am allergic to peanuts"
    assert turn["message"]["seq"] == 1
    assert turn["message"]["token_count"] == 5
    assert turn["reply"]["role"] == "assistant"
    assert turn["reply"]["content"] == "I will remember that."
    assert turn["reply"]["seq"] == 2
    assert turn["finish_reason"] == "stop"
    assert turn["context"]["memories"] == []
    # The sections count contents; what the template adds is `template`.
    assert turn["context"]["tokens"]["new_message"] == 5
    assert turn["usage"]["prompt_tokens"] == turn["context"]["prompt_tokens"]
    assert turn["usage"]["completion_tokens"] == 4
    assert turn["usage"]["total_tokens"] == turn["usage"]["prompt_tokens"] + 4

    messages = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [(m["seq"], m["role"], m["content"]) for m in messages] == [
        (1, "user", "I am allergic to peanuts"),
        (2, "assistant", "I will remember that."),
    ]
    # The prompt carried our own system message first and the new message last.
    prompt = engine.prompts[-1]
    assert prompt[0].role == "system"
    assert (prompt[-1].role, prompt[-1].content) == ("user", "I am allergic to peanuts")
    assert (await client.get(f"/v1/sessions/{session['id']}")).json()["num_messages"] == 2


async def test_second_session_recalls_turns_of_the_first(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    first = await create_session(client)
    await client.post(
        f"/v1/sessions/{first['id']}/messages", json={"content": "I am allergic to peanuts"}
    )
    await client.post(
        f"/v1/sessions/{first['id']}/messages", json={"content": "My cat is called Miso"}
    )
    second = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{second['id']}/messages",
        json={"content": "Suggest a snack without peanuts, I am allergic"},
    )
    turn = response.json()
    memories = turn["context"]["memories"]
    assert memories[0]["text"] == "I am allergic to peanuts"
    assert memories[0]["session_id"] == first["id"]
    assert memories[0]["kind"] == "turn"
    scores = [m["score"] for m in memories]
    assert scores == sorted(scores, reverse=True)
    # This turn's memories open its user message, quoted, after the frame that says so.
    last = engine.prompts[-1][-1]
    assert last.role == "user"
    assert last.content.startswith(CONTEXT_OPEN)
    assert '\n- user: "I am allergic to peanuts"\n' in last.content
    assert last.content.endswith(f"{CONTEXT_CLOSE}\nSuggest a snack without peanuts, I am allergic")


async def test_recent_window_is_not_retrieved_again(client: AsyncTestClient) -> None:
    session = await create_session(client)
    await client.post(f"/v1/sessions/{session['id']}/messages", json={"content": "peanuts peanuts"})
    turn = (
        await client.post(
            f"/v1/sessions/{session['id']}/messages", json={"content": "peanuts again"}
        )
    ).json()
    assert turn["context"]["memories"] == []
    assert len(turn["context"]["recent_message_ids"]) == 2


async def test_memory_is_scoped_to_the_user(client: AsyncTestClient) -> None:
    alice = await create_session(client, user_id="alice")
    await client.post(f"/v1/sessions/{alice['id']}/messages", json={"content": "my secret is 1234"})
    bob = await create_session(client, user_id="bob")
    turn = (
        await client.post(
            f"/v1/sessions/{bob['id']}/messages", json={"content": "what is my secret"}
        )
    ).json()
    assert turn["context"]["memories"] == []
    search = await client.post("/v1/memory/search", json={"user_id": "bob", "query": "secret 1234"})
    results = search.json()["results"]
    assert [r["id"] for r in results] == [turn["message"]["id"], turn["reply"]["id"]]
    assert {r["session_id"] for r in results} == {bob["id"]}


async def test_engine_failure_answers_503_and_keeps_the_user_message(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    session = await create_session(client)
    engine.fail_with = EngineError("model crashed")
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "remember the blue door"}
    )
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    # The message is stored: sending the turn again would store it twice.
    assert "x-should-retry" not in response.headers
    body = response.json()
    assert body["status"] == 503
    assert "model crashed" in body["detail"]
    messages = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "remember the blue door")]
    search = await client.post("/v1/memory/search", json={"user_id": "alice", "query": "blue door"})
    assert [r["id"] for r in search.json()["results"]] == [messages[0]["id"]]


async def test_streamed_turn_sends_tokens_then_done(client: AsyncTestClient) -> None:
    session = await create_session(client)
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "hello there", "stream": True}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    assert [e for e, _ in events] == ["token"] * 4 + ["done"]
    assert "".join(__import__("json").loads(d)["text"] for e, d in events if e == "token") == (
        "I will remember that."
    )
    done = __import__("json").loads(events[-1][1])
    assert done["reply"]["content"] == "I will remember that."
    stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [m["id"] for m in stored] == [done["message"]["id"], done["reply"]["id"]]


async def test_stream_failing_midway_sends_error_event_and_stores_no_reply(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    session = await create_session(client)
    engine.fail_with = EngineError("lost the model")
    engine.fail_after_tokens = 2
    response = await client.post(
        f"/v1/sessions/{session['id']}/messages",
        json={"content": "tell me a story", "stream": True},
    )
    events = parse_sse(response.text)
    assert [e for e, _ in events] == ["token", "token", "error"]
    assert __import__("json").loads(events[-1][1])["status"] == 503
    stored = (await client.get(f"/v1/sessions/{session['id']}/messages")).json()["messages"]
    assert [m["role"] for m in stored] == ["user"]


def parse_sse(text: str) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                data.append(line.partition(":")[2].removeprefix(" "))
        if data:
            events.append((event, "\n".join(data)))
    return events


async def test_prefix_reuse_counts_tokens_shared_with_the_previous_prompt(
    client: AsyncTestClient, engine: ScriptedEngine
) -> None:
    session = await create_session(client)
    url = f"/v1/sessions/{session['id']}/messages"
    first = (await client.post(url, json={"content": "hello there"})).json()
    assert first["context"]["prefix_reuse"] is None
    second = (await client.post(url, json={"content": "second message"})).json()
    # Prompt 1 is [system, user]; prompt 2 is [system, user, assistant, user]: they share
    # both first messages and the opening token of the next one.
    system_and_user = await engine.count_prompt_tokens(engine.prompts[0]) - 2
    assert second["context"]["prefix_reuse"] == system_and_user + 1
    # A preview measures against the last turn's prompt without replacing it.
    preview_url = f"/v1/sessions/{session['id']}/context"
    previews = [
        (await client.post(preview_url, json={"content": "third"})).json()["context"]
        for _ in range(2)
    ]
    assert previews[0]["prefix_reuse"] == previews[1]["prefix_reuse"]
    assert previews[0]["prefix_reuse"] > second["context"]["prefix_reuse"]


async def test_a_listing_counts_each_sessions_own_messages(client: AsyncTestClient) -> None:
    def history(n: int) -> dict:
        return {"messages": [{"role": "user", "content": f"note {i}"} for i in range(n)]}

    first = await create_session(client, title="one")
    second = await create_session(client, title="two")
    empty = await create_session(client, title="three")
    elsewhere = await create_session(client, user_id="bob")
    for session, n in ((first, 3), (second, 1), (elsewhere, 5)):
        imported = await client.post(f"/v1/sessions/{session['id']}/history", json=history(n))
        assert imported.status_code == 201, imported.text
    listed = (await client.get("/v1/sessions", params={"user_id": "alice"})).json()["sessions"]
    assert [(s["id"], s["num_messages"]) for s in listed] == [
        (first["id"], 3),
        (second["id"], 1),
        (empty["id"], 0),
    ]


async def test_memories_fill_their_budget_and_later_turns_add_what_the_window_leaves(
    settings: Settings, embedder: Embedder
) -> None:
    """A fresh session's first turn shows memories until `memory_max_tokens` is used;
    the next turn's window already shows them in the first message's context note, so it
    adds only `memory_min_tokens` worth."""
    chat = ChatSettings(memory_max_tokens=120, memory_min_tokens=40)
    engine = ScriptedEngine(["Noted."] * 3)
    app = create_app(settings.model_copy(update={"chat": chat}), embedder=embedder, engine=engine)
    async with local_client(app) as client:
        old = await create_session(client)
        history = [
            {
                "role": "user",
                "content": f"trail {i} was steep",
                "created_at": f"2026-01-05T10:{i:02d}:00Z",
            }
            for i in range(60)
        ]
        imported = await client.post(
            f"/v1/sessions/{old['id']}/history", json={"messages": history}
        )
        assert imported.status_code == 201, imported.text
        session = await create_session(client)
        url = f"/v1/sessions/{session['id']}/messages"
        first = (await client.post(url, json={"content": "which trail was steep?"})).json()
        second = (await client.post(url, json={"content": "and which was long?"})).json()
    # The scripted engine counts words: the header is 13 words (15 with its breaks), the
    # line of their one day `[5 Jan 2026]` 3 (4), each memory line
    # `- user: "trail N was steep"` 6 words (7 with its break).
    assert len(first["context"]["memories"]) == (120 - 15 - 4) // 7
    assert first["context"]["tokens"]["memories"] == 13 + 3 + 6 * 14
    # The window shows turn 1's note (more than the budget less the minimum), so turn 2
    # has its minimum.
    assert len(second["context"]["memories"]) == (40 - 15 - 4) // 7
    shown_first = {m["id"] for m in first["context"]["memories"]}
    assert shown_first.isdisjoint(m["id"] for m in second["context"]["memories"])
