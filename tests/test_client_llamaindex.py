"""memchat as LlamaIndex memory (`memchat.integrations.llamaindex`) against a real
memchat server on SQLite (tests/client_server.py): `MemchatRetriever` over the memory
search, blocking and async, in English and Chinese, and `MemchatMemoryBlock` as the
long-term block of LlamaIndex's `Memory`."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator

import pytest

pytest.importorskip(
    "llama_index.core", reason="NO llama-index-core: `make install-dev` installs it"
)

from llama_index.core.llms import ChatMessage
from llama_index.core.memory import Memory
from llama_index.core.schema import MetadataMode

from memchat import AsyncMemchatClient, HistoryMessage, MemchatClient, RetryPolicy
from memchat.errors import InvalidRequestError, NotFoundError, RateLimitedError
from memchat.integrations.llamaindex import MemchatMemoryBlock, MemchatRetriever
from tests.client_server import Server, memchat_server


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async with memchat_server(tmp_path_factory.mktemp("llamaindex")) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[MemchatClient]:
    with MemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


@pytest.fixture
async def async_client(server: Server) -> AsyncIterator[AsyncMemchatClient]:
    async with AsyncMemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


def test_the_retriever_gives_scored_nodes_with_id_and_time(client: MemchatClient) -> None:
    session = client.create_session("alice")
    when = dt.datetime(2026, 2, 1, 9, 0, tzinfo=dt.UTC)
    client.import_history(
        session.id,
        [
            HistoryMessage("user", "My sister lives in Chengdu", created_at=when),
            HistoryMessage("assistant", "Chengdu is lovely in spring", created_at=when),
        ],
    )
    fact = client.add_fact("alice", "Alice's sister lives in Chengdu")
    retriever = MemchatRetriever(client, "alice", k=10, kinds=["turn", "fact"])
    nodes = retriever.retrieve("where does my sister live")
    memories = client.search_memory(
        "alice", "where does my sister live", k=10, kinds=["turn", "fact"]
    )
    assert [(n.node.metadata["kind"], n.node.metadata["id"], n.score) for n in nodes] == [
        (m.kind, m.id, m.score) for m in memories
    ]
    turn = next(n for n in nodes if n.node.metadata["kind"] == "turn")
    assert turn.node.get_content() == "My sister lives in Chengdu"
    assert dt.datetime.fromisoformat(turn.node.metadata["created_at"]) == when
    assert turn.node.metadata["session_id"] == session.id
    assert turn.node.node_id == f"memchat-turn-{turn.node.metadata['id']}"
    # The LLM sees the text and its kind and time, not the ids.
    shown = turn.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "kind: turn" in shown and "created_at: 2026-02-01T09:00:00Z" in shown
    assert session.id not in shown
    assert {n.node.metadata["id"] for n in nodes if n.node.metadata["kind"] == "fact"} == {fact.id}


async def test_the_async_retriever_in_chinese(async_client: AsyncMemchatClient) -> None:
    session = await async_client.create_session("小明")
    turn = await async_client.send_message(session.id, "我最喜欢的水果是芒果。")
    document = await async_client.add_document("水果", "芒果是热带水果。", user_id="小明")
    retriever = MemchatRetriever(
        MemchatClient("http://127.0.0.1:9"),  # not used: the async client serves aretrieve
        "小明",
        k=2,
        kinds=["turn", "knowledge"],
        async_client=async_client,
    )
    nodes = await retriever.aretrieve("芒果")
    memories = await async_client.search_memory("小明", "芒果", k=2, kinds=["turn", "knowledge"])
    assert [n.node.metadata["id"] for n in nodes] == [m.id for m in memories]
    by_kind = {n.node.metadata["kind"]: n for n in nodes}
    assert by_kind["turn"].node.metadata["id"] == turn.message.id
    assert by_kind["turn"].node.get_content() == "我最喜欢的水果是芒果。"
    assert by_kind["knowledge"].node.metadata["document_id"] == document.id


async def test_the_memory_block_stores_what_memory_flushes_and_recalls_it(
    async_client: AsyncMemchatClient, server: Server
) -> None:
    past = await async_client.create_session("bob")
    await async_client.import_history(past.id, [HistoryMessage("user", "I drive a red Tesla")])
    session = await async_client.create_session("bob")
    block = MemchatMemoryBlock(
        client=async_client, user_id="bob", session_id=session.id, k=1, num_query_messages=1
    )
    # A short-term memory of a few tokens, so that older messages flush to the block.
    memory = Memory.from_defaults(
        session_id="bob-chat",
        memory_blocks=[block],
        token_limit=40,
        chat_history_token_ratio=0.5,
        token_flush_size=10,
    )
    said = [
        ChatMessage(role="user", content="Hello, I am planning a long road trip next month"),
        ChatMessage(role="assistant", content="Sounds fun, where are you going this time?"),
        ChatMessage(role="user", content="Which car do I drive?"),
    ]
    for message in said:
        await memory.aput(message)
    messages = await memory.aget()
    # The two older messages went over the short-term budget: they are memchat's now.
    assert server.turns(session.id) == [(m.role.value, m.content) for m in said[:2]]
    # The block read memchat for the latest messages: the car from another session.
    system = messages[0]
    assert system.role.value == "system"
    today = f"{dt.datetime.now(dt.UTC):%Y-%m-%d}"
    assert system.content == (
        f"<memory>\n<memchat>\n- [{today}] I drive a red Tesla\n</memchat>\n</memory>"
    )
    assert [m.content for m in messages[1:]] == ["Which car do I drive?"]


def test_server_refusals_surface_as_the_clients_typed_errors(
    client: MemchatClient, server: Server
) -> None:
    # Alice exists whichever of the module's tests ran before (or none did): only the
    # refusals below are tested.
    client.create_session("alice")
    with pytest.raises(NotFoundError) as missing:
        MemchatRetriever(client, "alice", session_id="no-such-session").retrieve("x")
    assert missing.value.detail == "session 'no-such-session' not found"
    with pytest.raises(InvalidRequestError) as invalid:
        MemchatRetriever(client, "alice", k=0).retrieve("x")
    assert invalid.value.detail == "invalid request: k: Expected `int` >= 1"
    limited = MemchatClient(
        server.url, api_key=server.limited_key, retry=RetryPolicy(max_retries=0)
    )
    retriever = MemchatRetriever(limited, "alice")
    with limited, pytest.raises(RateLimitedError) as refused:
        for _ in range(3):
            retriever.retrieve("anything")
    assert refused.value.retry_after_s == 30
    assert refused.value.detail.startswith("rate limit of 2 requests per minute")
