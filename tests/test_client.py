"""The Python client (`memchat.client`, app/client/) against a real memchat server on
SQLite (tests/client_server.py), blocking and async, in English and Chinese: what it
sends is stored, what it reads is the server's, and the server's refusals surface as the
client's typed errors with the server's detail."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from memchat import AsyncMemchatClient, MemchatClient, RetryPolicy
from memchat.errors import (
    AuthenticationError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    ServiceUnavailableError,
)
from memchat.types import (
    FactResult,
    HistoryMessage,
    KnowledgeResult,
    SearchResult,
    Token,
    Turn,
)
from retrieval.errors import EngineError
from tests.client_server import REPLY, Server, memchat_server

NO_RETRY = RetryPolicy(max_retries=0)


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async with memchat_server(tmp_path_factory.mktemp("client")) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[MemchatClient]:
    with MemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


@pytest.fixture
async def async_client(server: Server) -> AsyncIterator[AsyncMemchatClient]:
    async with AsyncMemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


def test_history_and_a_turn_are_stored_and_found(client: MemchatClient, server: Server) -> None:
    session = client.create_session("alice", title="cooking", metadata={"app": "demo"})
    assert (session.user_id, session.title, session.metadata) == (
        "alice",
        "cooking",
        {"app": "demo"},
    )
    when = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)
    history = [
        HistoryMessage("user", "I am allergic to peanuts", created_at=when, external_id="m1"),
        HistoryMessage("assistant", "Noted: no peanuts.", external_id="m2"),
    ]
    imported = client.import_history(session.id, history)
    assert (imported.imported, imported.skipped) == (2, 0)
    assert client.import_history(session.id, history).skipped == 2

    turn = client.send_message(session.id, "Suggest a snack for tonight", max_tokens=32)
    assert turn.reply.content == REPLY
    stored = server.messages(session.id)
    assert [(m["role"], m["content"], m["external_id"]) for m in stored] == [
        ("user", "I am allergic to peanuts", "m1"),
        ("assistant", "Noted: no peanuts.", "m2"),
        ("user", "Suggest a snack for tonight", None),
        ("assistant", REPLY, None),
    ]
    assert [m["id"] for m in stored[2:]] == [turn.message.id, turn.reply.id]
    listed = client.list_messages(session.id)
    assert [m.id for m in listed] == [m["id"] for m in stored]
    assert [m.seq for m in listed] == [1, 2, 3, 4]
    assert client.list_messages(session.id, after_seq=2, limit=1)[0].id == turn.message.id
    assert client.get_session(session.id).num_messages == 4
    assert [s.id for s in client.list_sessions("alice")] == [session.id]

    results = client.search_memory("alice", "allergic to peanuts", k=3)
    first = results[0]
    assert isinstance(first, SearchResult)
    assert (first.id, first.session_id, first.external_id) == (stored[0]["id"], session.id, "m1")
    assert first.created_at == when
    assert first.score > 0
    # The turn's report: the stored history is its recent window.
    assert turn.context.recent_message_ids == [stored[0]["id"], stored[1]["id"]]


async def test_chinese_turns_through_the_async_client(
    async_client: AsyncMemchatClient, server: Server
) -> None:
    session = await async_client.create_session("小明", title="旅行")
    when = dt.datetime(2026, 3, 1, 8, 30, tzinfo=dt.UTC)
    await async_client.import_history(
        session.id, [HistoryMessage("user", "我姐姐住在成都。", created_at=when)]
    )
    turn = await async_client.send_message(session.id, "周末去哪里玩？")
    stored = server.messages(session.id)
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", "我姐姐住在成都。"),
        ("user", "周末去哪里玩？"),
        ("assistant", REPLY),
    ]
    assert [m["id"] for m in stored[1:]] == [turn.message.id, turn.reply.id]
    results = await async_client.search_memory("小明", "成都", k=1, session_id=session.id)
    assert [(type(r), r.id) for r in results] == [(SearchResult, stored[0]["id"])]
    assert results[0].created_at == when and results[0].score > 0
    assert [s.title for s in await async_client.list_sessions("小明")] == ["旅行"]
    preview = await async_client.preview_context(session.id, "我姐姐住在哪里？")
    assert preview.messages[-1].content.endswith("我姐姐住在哪里？")
    assert preview.context.recent_message_ids == [m["id"] for m in stored]
    assert len(server.messages(session.id)) == 3  # a preview stores nothing
    assert await async_client.list_summaries(session.id) == []
    await async_client.delete_session(session.id)
    with pytest.raises(NotFoundError):
        await async_client.get_session(session.id)


def test_a_streamed_turn_yields_tokens_then_the_stored_turn(
    client: MemchatClient, server: Server
) -> None:
    session = client.create_session("bob")
    events = list(client.stream_message(session.id, "hello there", temperature=0))
    assert all(isinstance(e, Token) for e in events[:-1])
    turn = events[-1]
    assert isinstance(turn, Turn)
    assert "".join(e.text for e in events[:-1] if isinstance(e, Token)) == REPLY
    assert [m["id"] for m in server.messages(session.id)] == [turn.message.id, turn.reply.id]


async def test_an_async_streamed_turn_in_chinese(
    async_client: AsyncMemchatClient, server: Server
) -> None:
    session = await async_client.create_session("小红")
    events = [e async for e in async_client.stream_message(session.id, "你好")]
    turn = events[-1]
    assert isinstance(turn, Turn) and turn.message.content == "你好"
    assert "".join(e.text for e in events if isinstance(e, Token)) == REPLY
    assert [m["id"] for m in server.messages(session.id)] == [turn.message.id, turn.reply.id]


def test_facts_and_knowledge_are_searched_with_turns(client: MemchatClient) -> None:
    fact = client.add_fact("carol", "Carol is vegetarian", category="preference", pinned=True)
    assert (fact.user_id, fact.category, fact.pinned, fact.status) == (
        "carol", "preference", True, "active",
    )  # fmt: skip
    updated = client.update_fact(fact.id, priority=5)
    assert updated.priority == 5
    [listed] = client.list_facts("carol", include_history=True)
    assert listed.id == fact.id and listed.history is not None
    assert listed.history[0].action == "created"

    document = client.add_document(
        "Returns", "# Returns\n\nItems can be returned within 30 days.", user_id="carol"
    )
    assert document.status == "ready" and document.user_id == "carol"
    assert [d.id for d in client.list_documents("carol")] == [document.id]
    assert client.get_document(document.id).title == "Returns"
    uploaded = client.upload_document(
        "faq.md", "# 退货\n\n三十天内可以退货。".encode(), user_id="carol"
    )
    assert (uploaded.filename, uploaded.title, uploaded.source) == ("faq.md", "faq", "md")

    kinds = ["fact", "knowledge"]
    facts = client.search_memory("carol", "vegetarian", k=1, kinds=["fact"])
    assert [(type(r), r.id) for r in facts] == [(FactResult, fact.id)]
    found = client.search_memory("carol", "returned within 30 days", k=1, kinds=["knowledge"])
    assert isinstance(found[0], KnowledgeResult) and found[0].document_id == document.id
    chinese = client.search_memory("carol", "退货", k=1, kinds=kinds)
    assert isinstance(chinese[0], KnowledgeResult) and chinese[0].document_id == uploaded.id

    client.delete_fact(fact.id)
    assert client.list_facts("carol") == []
    assert [f.status for f in client.list_facts("carol", status="all")] == ["deleted"]
    client.delete_document(document.id)
    with pytest.raises(NotFoundError) as missing:
        client.get_document(document.id)
    assert missing.value.detail == f"document {document.id!r} not found"


def test_unknown_session_and_bad_body_raise_the_servers_404_and_422(
    client: MemchatClient,
) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.send_message("no-such-session", "hello")
    assert missing.value.status == 404
    assert missing.value.detail == "session 'no-such-session' not found"
    assert missing.value.problem.instance == "/v1/sessions/no-such-session/messages"

    session = client.create_session("dave")
    with pytest.raises(InvalidRequestError) as invalid:
        client.send_message(session.id, "hello", temperature=5)
    assert invalid.value.status == 422
    assert invalid.value.detail == "invalid request: temperature: Expected `float` <= 2.0"
    assert [(e.field, e.message) for e in invalid.value.problem.errors] == [
        ("temperature", "Expected `float` <= 2.0")
    ]
    assert client.list_messages(session.id) == []


def test_the_api_key_comes_from_the_argument_or_the_environment(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEMCHAT_API_KEY", raising=False)
    with MemchatClient(server.url) as keyless, pytest.raises(AuthenticationError) as refused:
        keyless.list_sessions("alice")
    assert (refused.value.status, refused.value.detail) == (
        401, "an API key is required: send `Authorization: Bearer <key>`",
    )  # fmt: skip
    monkeypatch.setenv("MEMCHAT_API_KEY", server.api_key)
    with MemchatClient(server.url) as from_environment:
        assert from_environment.list_sessions("nobody") == []
    wrong = MemchatClient(server.url, api_key="mck_wrong")
    with wrong, pytest.raises(AuthenticationError) as unknown:
        wrong.list_sessions("alice")
    assert unknown.value.detail == "unknown or revoked API key"


def test_the_rate_limit_raises_429_with_retry_after(server: Server) -> None:
    # The server asks for 30 s; a client that waits at most 1 s raises at once.
    policy = RetryPolicy(max_retries=2, max_wait_s=1)
    with MemchatClient(server.url, api_key=server.limited_key, retry=policy) as limited:
        assert limited.list_documents() == []
        assert limited.list_documents() == []
        with pytest.raises(RateLimitedError) as refused:
            limited.list_documents()
    assert refused.value.status == 429
    assert refused.value.retry_after_s == 30
    assert refused.value.detail.startswith(
        "rate limit of 2 requests per minute for this key reached"
    )


def _hold_the_engine(server: Server, session_id: str) -> threading.Thread:
    """A turn of `session_id` that waits in the engine until `server.engine.gate` is set."""
    server.engine.gate = threading.Event()
    num_prompts = len(server.engine.prompts)

    def send() -> None:
        with MemchatClient(server.url, api_key=server.api_key) as other:
            other.send_message(session_id, "a long question")

    held = threading.Thread(target=send)
    held.start()
    while len(server.engine.prompts) == num_prompts:
        threading.Event().wait(0.02)
    return held


def test_a_busy_engine_raises_503_or_is_retried_after_retry_after(
    client: MemchatClient, server: Server
) -> None:
    first, second = client.create_session("erin"), client.create_session("erin")
    held = _hold_the_engine(server, first.id)
    try:
        once = MemchatClient(server.url, api_key=server.api_key, retry=NO_RETRY)
        with once, pytest.raises(ServiceUnavailableError) as busy:
            once.send_message(second.id, "me too")
        assert (busy.value.status, busy.value.retry_after_s) == (503, 2)
        assert busy.value.detail.startswith("the LLM engine is busy")
        assert busy.value.detail.endswith("nothing was stored, retry later")
        assert client.list_messages(second.id) == []
        # The server said "retry after 2 s" and that nothing was stored: the client
        # waits and sends the turn again, which the freed engine then answers.
        threading.Timer(0.5, server.engine.gate.set).start()
        turn = client.send_message(second.id, "me too")
    finally:
        server.engine.gate.set()
        held.join(timeout=30)
        server.engine.gate = None
    assert [m.id for m in client.list_messages(second.id)] == [turn.message.id, turn.reply.id]


async def test_a_failed_engine_raises_503_and_is_not_retried(
    async_client: AsyncMemchatClient, server: Server
) -> None:
    session = await async_client.create_session("frank")
    num_prompts = len(server.engine.prompts)
    server.engine.fail_with = EngineError("model crashed")
    try:
        with pytest.raises(ServiceUnavailableError) as failed:
            await async_client.send_message(session.id, "remember the blue door")
    finally:
        server.engine.fail_with = None
    assert failed.value.detail == (
        "the LLM engine failed: model crashed. Your message was stored; retry later."
    )
    assert failed.value.retry_after_s == 5
    # Sent once: a second try would have stored the message twice.
    assert len(server.engine.prompts) == num_prompts + 1
    stored = server.messages(session.id)
    assert [(m["role"], m["content"]) for m in stored] == [("user", "remember the blue door")]


async def test_an_engine_failing_mid_stream_raises_503(
    async_client: AsyncMemchatClient, server: Server
) -> None:
    session = await async_client.create_session("gina")
    server.engine.fail_with = EngineError("lost the model")
    server.engine.fail_after_tokens = 1
    tokens: list[str] = []
    try:
        with pytest.raises(ServiceUnavailableError) as failed:
            async for event in async_client.stream_message(session.id, "tell me a story"):
                assert isinstance(event, Token)
                tokens.append(event.text)
    finally:
        server.engine.fail_with, server.engine.fail_after_tokens = None, None
    assert len(tokens) == 1
    assert failed.value.detail == (
        "the LLM engine failed: lost the model. Your message was stored; retry later."
    )
    assert [m["role"] for m in server.messages(session.id)] == ["user"]


async def test_the_async_client_raises_the_same_typed_errors(
    async_client: AsyncMemchatClient,
) -> None:
    with pytest.raises(NotFoundError) as missing:
        await async_client.list_messages("gone")
    assert missing.value.detail == "session 'gone' not found"
    with pytest.raises(InvalidRequestError) as invalid:
        await async_client.search_memory("alice", "x", k=500)
    assert invalid.value.detail == "invalid request: k: Expected `int` <= 100"
