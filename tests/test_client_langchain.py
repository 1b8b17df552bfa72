"""memchat as LangChain memory (`memchat.integrations.langchain`) against a real memchat
server on SQLite (tests/client_server.py): `MemchatChatMessageHistory` keeping a
`RunnableWithMessageHistory` chain's conversation in a memchat session, and
`MemchatRetriever` over the memory search, in English and Chinese."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="NO langchain-core: `make install-dev` installs it")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.prompt_values import ChatPromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from memchat import AsyncMemchatClient, MemchatClient, RetryPolicy
from memchat.errors import InvalidRequestError, NotFoundError, RateLimitedError
from memchat.integrations.langchain import MemchatChatMessageHistory, MemchatRetriever
from tests.client_server import Server, memchat_server


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async with memchat_server(tmp_path_factory.mktemp("langchain")) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[MemchatClient]:
    with MemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


@pytest.fixture
async def async_client(server: Server) -> AsyncIterator[AsyncMemchatClient]:
    async with AsyncMemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


def when(text: str) -> dt.datetime:
    """A time as the API writes it (ISO 8601, `Z` for UTC)."""
    assert text.endswith("Z")
    return dt.datetime.fromisoformat(text)


def chat_chain(
    replies: list[str], prompts: list[list[BaseMessage]], history: Any
) -> RunnableWithMessageHistory:
    """prompt | model, with its history in memchat; `prompts` records what the model got."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{question}")]
    )

    def record(value: ChatPromptValue) -> ChatPromptValue:
        prompts.append(value.to_messages())
        return value

    model = GenericFakeChatModel(messages=iter([AIMessage(r) for r in replies]))
    chain: Runnable[Any, Any] = prompt | RunnableLambda(record) | model
    return RunnableWithMessageHistory(
        chain, history, input_messages_key="question", history_messages_key="history"
    )


def test_a_chain_keeps_its_conversation_in_a_memchat_session(
    client: MemchatClient, server: Server
) -> None:
    session = client.create_session("alice")
    prompts: list[list[BaseMessage]] = []
    chain = chat_chain(
        ["Try apple slices.", "Sorbet."],
        prompts,
        lambda session_id: MemchatChatMessageHistory(client, session_id),
    )
    config = {"configurable": {"session_id": session.id}}
    first = chain.invoke({"question": "I am allergic to peanuts. A snack?"}, config=config)
    second = chain.invoke({"question": "And a dessert?"}, config=config)
    assert (first.content, second.content) == ("Try apple slices.", "Sorbet.")
    assert server.turns(session.id) == [
        ("user", "I am allergic to peanuts. A snack?"),
        ("assistant", "Try apple slices."),
        ("user", "And a dessert?"),
        ("assistant", "Sorbet."),
    ]
    # The second prompt held the first exchange, read back from memchat with its ids.
    ids = [m.id for m in client.list_messages(session.id)]
    assert [(m.type, m.content, m.id) for m in prompts[1][1:3]] == [
        ("human", "I am allergic to peanuts. A snack?", str(ids[0])),
        ("ai", "Try apple slices.", str(ids[1])),
    ]
    # What the chain stored is memchat memory: a search of the user finds it.
    [found] = MemchatRetriever(client=client, user_id="alice", k=1).invoke("allergic to peanuts")
    assert (found.metadata["id"], found.page_content) == (
        ids[0], "I am allergic to peanuts. A snack?",
    )  # fmt: skip


async def test_an_async_chain_in_chinese(
    client: MemchatClient, async_client: AsyncMemchatClient, server: Server
) -> None:
    session = await async_client.create_session("小明")
    prompts: list[list[BaseMessage]] = []
    chain = chat_chain(
        ["好的，记住了。", "成都。"],
        prompts,
        lambda session_id: MemchatChatMessageHistory(client, session_id, async_client=async_client),
    )
    config = {"configurable": {"session_id": session.id}}
    await chain.ainvoke({"question": "我姐姐住在成都。"}, config=config)
    answer = await chain.ainvoke({"question": "我姐姐住在哪里？"}, config=config)
    assert answer.content == "成都。"
    assert server.turns(session.id) == [
        ("user", "我姐姐住在成都。"),
        ("assistant", "好的，记住了。"),
        ("user", "我姐姐住在哪里？"),
        ("assistant", "成都。"),
    ]
    assert [m.content for m in prompts[1][1:3]] == ["我姐姐住在成都。", "好的，记住了。"]


def test_messages_with_ids_are_stored_once_and_read_back_with_memchats(
    client: MemchatClient, server: Server
) -> None:
    session = client.create_session("bob")
    history = MemchatChatMessageHistory(client, session.id)
    sent = [HumanMessage("hello", id="lc-1"), AIMessage("hi, Bob", id="lc-2")]
    history.add_messages(sent)
    history.add_messages(sent)  # the same LangChain ids: skipped
    history.add_user_message("no id, stored")
    assert server.turns(session.id) == [
        ("user", "hello"),
        ("assistant", "hi, Bob"),
        ("user", "no id, stored"),
    ]
    read = history.messages
    listed = client.list_messages(session.id)
    assert [(type(m), m.id) for m in read] == [
        (HumanMessage, str(listed[0].id)),
        (AIMessage, str(listed[1].id)),
        (HumanMessage, str(listed[2].id)),
    ]
    assert [m.response_metadata["seq"] for m in read] == [1, 2, 3]
    assert when(read[0].response_metadata["created_at"]) == listed[0].created_at
    with pytest.raises(ValueError, match="not 'tool' ones"):
        history.add_messages([ToolMessage("42", tool_call_id="call-1")])


def test_clear_deletes_the_session_and_goes_on_in_a_new_one(
    client: MemchatClient, server: Server
) -> None:
    session = client.create_session("carol", title="notes")
    history = MemchatChatMessageHistory(client, session.id)
    history.add_user_message("delete me")
    history.clear()
    assert history.session_id != session.id
    assert history.messages == []
    with pytest.raises(NotFoundError):
        client.get_session(session.id)
    assert [(s.id, s.title) for s in client.list_sessions("carol")] == [
        (history.session_id, "notes")
    ]
    assert client.search_memory("carol", "delete me") == []


def test_the_retriever_finds_turns_facts_and_knowledge_with_id_score_and_time(
    client: MemchatClient,
) -> None:
    session = client.create_session("dave")
    turn = client.send_message(session.id, "My sister lives in Chengdu")
    fact = client.add_fact("dave", "Dave's sister lives in Chengdu", category="relationship")
    document = client.add_document("Chengdu", "Chengdu is the capital of Sichuan.", user_id="dave")
    retriever = MemchatRetriever(
        client=client, user_id="dave", k=10, kinds=["turn", "fact", "knowledge"]
    )
    found = retriever.invoke("sister Chengdu")
    by_kind: dict[str, Any] = {}
    for hit in found:  # the best of each kind
        by_kind.setdefault(hit.metadata["kind"], hit)
    assert by_kind["turn"].metadata["id"] == turn.message.id
    assert when(by_kind["turn"].metadata["created_at"]) == turn.message.created_at
    assert by_kind["turn"].metadata["session_id"] == session.id
    assert by_kind["turn"].page_content == "My sister lives in Chengdu"
    assert by_kind["fact"].metadata["id"] == fact.id
    assert when(by_kind["fact"].metadata["created_at"]) == fact.valid_from
    assert by_kind["knowledge"].metadata["document_id"] == document.id
    assert [d.id for d in found] == [f"{d.metadata['kind']}:{d.metadata['id']}" for d in found]
    # Ranked and scored as the server ranks them.
    memories = client.search_memory(
        "dave", "sister Chengdu", k=10, kinds=["turn", "fact", "knowledge"]
    )
    assert [(d.metadata["kind"], d.metadata["id"], d.metadata["score"]) for d in found] == [
        (m.kind, m.id, m.score) for m in memories
    ]
    only_turns = MemchatRetriever(client=client, user_id="dave", k=10).invoke("sister Chengdu")
    assert [d.metadata["id"] for d in only_turns] == [turn.message.id, turn.reply.id]


async def test_the_async_retriever_in_chinese(async_client: AsyncMemchatClient) -> None:
    session = await async_client.create_session("小红")
    turn = await async_client.send_message(session.id, "我最喜欢的颜色是蓝色。")
    # The async client serves `ainvoke`; the blocking one would fail to connect.
    retriever = MemchatRetriever(
        client=MemchatClient("http://127.0.0.1:9"),
        async_client=async_client,
        user_id="小红",
        k=1,
    )
    [found] = await retriever.ainvoke("颜色")
    assert (found.metadata["id"], found.metadata["kind"]) == (turn.message.id, "turn")
    assert found.page_content == "我最喜欢的颜色是蓝色。"


def test_server_refusals_surface_as_the_clients_typed_errors(
    client: MemchatClient, server: Server
) -> None:
    # Alice exists whichever of the module's tests ran before (or none did): only the
    # refusals below are tested.
    client.create_session("alice")
    with pytest.raises(NotFoundError) as missing:
        MemchatChatMessageHistory(client, "no-such-session").add_user_message("hello")
    assert missing.value.detail == "session 'no-such-session' not found"
    with pytest.raises(InvalidRequestError) as invalid:
        MemchatRetriever(client=client, user_id="alice", k=500).invoke("anything")
    assert invalid.value.detail == "invalid request: k: Expected `int` <= 100"
    limited = MemchatClient(
        server.url, api_key=server.limited_key, retry=RetryPolicy(max_retries=0)
    )
    retriever = MemchatRetriever(client=limited, user_id="alice")
    with limited, pytest.raises(RateLimitedError) as refused:
        for _ in range(3):
            retriever.invoke("anything")
    assert refused.value.retry_after_s == 30
    assert refused.value.detail.startswith("rate limit of 2 requests per minute")
