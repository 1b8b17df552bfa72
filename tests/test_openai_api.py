"""`/v1/chat/completions` and `/v1/models` driven by the official `openai` SDK (sync and
async, streamed and not) against a live server, in both history styles: a client that
sends only its new message (naming the session) and one that resends the whole list."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.factory import create_app
from app.settings import Settings
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server

REPLIES = ["I will remember that.", "Here is an answer for you.", "Happy to help."]
CAT = "My cat is named Zorbulon and she loves tuna."


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(REPLIES)


@pytest.fixture
def base_url(settings: Settings, engine: ScriptedEngine) -> Iterator[str]:
    app = create_app(settings, embedder=HashEmbedder(), engine=engine)
    with live_server(app) as base:
        yield base


def sdk(base: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base}/v1", api_key="local", max_retries=0, default_headers=headers or None
    )


def remember_cat(base: str, user_id: str) -> int:
    """A turn of another session, stored through the REST API: the id of the cat message."""
    with httpx.Client(base_url=base) as rest:
        session = rest.post("/v1/sessions", json={"user_id": user_id}).json()
        imported = rest.post(
            f"/v1/sessions/{session['id']}/history",
            json={
                "messages": [
                    {"role": "user", "content": CAT},
                    {"role": "assistant", "content": "What a lovely name."},
                ]
            },
        )
        assert imported.status_code == 201
        messages = rest.get(f"/v1/sessions/{session['id']}/messages").json()["messages"]
    return int(messages[0]["id"])


def stored(base: str, session_id: str) -> list[tuple[str, str]]:
    with httpx.Client(base_url=base) as rest:
        answer = rest.get(f"/v1/sessions/{session_id}/messages")
    assert answer.status_code == 200
    return [(m["role"], m["content"]) for m in answer.json()["messages"]]


def memory_ids(extension: dict[str, Any]) -> list[int]:
    return [m["id"] for m in extension["context"]["memories"]]


def test_models_lists_the_engine_model(base_url: str) -> None:
    models = sdk(base_url).models.list()
    assert [m.id for m in models.data] == ["scripted", "memchat"]
    assert {m.object for m in models.data} == {"model"}


def test_whole_list_client_sync(base_url: str, engine: ScriptedEngine) -> None:
    """Turn 2 resends turn 1 and its reply: nothing is stored twice, the session is found
    from the conversation's first message, and a turn stored in another session between
    the two turns is recalled."""
    client = sdk(base_url)
    system = {"role": "system", "content": "Answer like a ship's captain."}
    first = client.chat.completions.create(
        model="memchat",
        user="alice",
        messages=[system, {"role": "user", "content": "Hello there, I am back."}],
    )
    assert first.object == "chat.completion"
    assert first.choices[0].message.content == REPLIES[0]
    assert first.choices[0].finish_reason == "stop"
    extension = first.model_extra["memchat"]
    session_id = extension["session_id"]
    assert extension["num_history_stored"] == 0
    assert memory_ids(extension) == []
    cat_id = remember_cat(base_url, "alice")
    second = client.chat.completions.create(
        model="memchat",
        user="alice",
        messages=[
            system,
            {"role": "user", "content": "Hello there, I am back."},
            {"role": "assistant", "content": REPLIES[0]},
            {"role": "user", "content": "What is the name of my cat?"},
        ],
    )
    extension = second.model_extra["memchat"]
    assert extension["session_id"] == session_id
    assert extension["num_history_stored"] == 0
    assert memory_ids(extension) == [cat_id, cat_id + 1]
    assert second.usage.prompt_tokens == len(engine.tokens_now(engine.prompts[-1]))
    assert second.usage.prompt_tokens_details.cached_tokens == 0  # the scripted engine caches none
    assert stored(base_url, session_id) == [
        ("user", "Hello there, I am back."),
        ("assistant", REPLIES[0]),
        ("user", "What is the name of my cat?"),
        ("assistant", REPLIES[1]),
    ]
    # The client's instructions follow the service's prompt in the one system message.
    prompt = engine.prompts[-1]
    assert prompt[0].role == "system"
    assert "Answer like a ship's captain." in prompt[0].content
    assert [m.role for m in prompt].count("system") == 1
    assert CAT in prompt[-1].content


def test_new_message_only_client_async_streamed(base_url: str, engine: ScriptedEngine) -> None:
    """The session named by its header; each turn sends only its new message; streamed
    with usage; the cat memory from another session is in the second turn's context."""
    session_id = str(uuid.uuid4())
    cat_ids: list[int] = []

    async def run() -> list[list[Any]]:
        client = openai.AsyncOpenAI(
            base_url=f"{base_url}/v1",
            api_key="local",
            max_retries=0,
            default_headers={"X-Memchat-Session-Id": session_id, "X-Memchat-User-Id": "bob"},
        )
        turns = []
        for text in ("Good morning!", "Remind me, what is my cat called?"):
            if not cat_ids and text.startswith("Remind"):
                cat_ids.append(await asyncio.to_thread(remember_cat, base_url, "bob"))
            stream = await client.chat.completions.create(
                model="scripted",
                messages=[{"role": "user", "content": text}],
                stream=True,
                stream_options={"include_usage": True},
            )
            turns.append([chunk async for chunk in stream])
        await client.close()
        return turns

    turns = asyncio.run(run())
    for chunks, reply in zip(turns, REPLIES, strict=False):
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == reply
        finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert [c.choices[0].finish_reason for c in finish] == ["stop"]
        assert chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == len(reply.split())
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    extension = next(c for c in turns[1] if c.choices and c.choices[0].finish_reason).model_extra[
        "memchat"
    ]
    assert extension["session_id"] == session_id
    assert memory_ids(extension) == [cat_ids[0], cat_ids[0] + 1]
    assert CAT in engine.prompts[-1][-1].content
    assert stored(base_url, session_id) == [
        ("user", "Good morning!"),
        ("assistant", REPLIES[0]),
        ("user", "Remind me, what is my cat called?"),
        ("assistant", REPLIES[1]),
    ]


def test_sync_stream_and_async_plain(base_url: str) -> None:
    session_id = str(uuid.uuid4())
    client = sdk(base_url, **{"X-Memchat-Session-Id": session_id})
    stream = client.chat.completions.create(
        model="memchat",
        user="carol",
        messages=[{"role": "user", "content": "Tell me something."}],
        stream=True,
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == REPLIES[0]
    assert all(c.usage is None for c in chunks)

    async def plain() -> Any:
        async with openai.AsyncOpenAI(
            base_url=f"{base_url}/v1",
            api_key="local",
            max_retries=0,
            default_headers={"X-Memchat-Session-Id": session_id},
        ) as client:
            return await client.chat.completions.create(
                model="memchat",
                user="carol",
                messages=[{"role": "user", "content": "And another thing?"}],
            )

    answer = asyncio.run(plain())
    assert answer.choices[0].message.content == REPLIES[1]
    assert answer.model_extra["memchat"]["session_id"] == session_id
    assert [m for m, _ in stored(base_url, session_id)] == ["user", "assistant"] * 2


def test_history_the_session_lacks_is_stored_first(base_url: str) -> None:
    """A client that brings a conversation from elsewhere: its earlier messages are
    stored, in order, before the turn; resending them adds nothing."""
    client = sdk(base_url)
    history = [
        {"role": "user", "content": "I am allergic to peanuts."},
        {"role": "assistant", "content": "Noted, no peanuts."},
    ]
    answer = client.chat.completions.create(
        model="memchat",
        user="dave",
        messages=[*history, {"role": "user", "content": "Suggest a snack."}],
    )
    extension = answer.model_extra["memchat"]
    assert extension["num_history_stored"] == 2
    again = client.chat.completions.create(
        model="memchat",
        user="dave",
        messages=[
            *history,
            {"role": "user", "content": "Suggest a snack."},
            {"role": "assistant", "content": REPLIES[0]},
            {"role": "user", "content": "Something sweet?"},
        ],
    )
    assert again.model_extra["memchat"]["num_history_stored"] == 0
    assert again.model_extra["memchat"]["session_id"] == extension["session_id"]
    assert stored(base_url, extension["session_id"]) == [
        ("user", "I am allergic to peanuts."),
        ("assistant", "Noted, no peanuts."),
        ("user", "Suggest a snack."),
        ("assistant", REPLIES[0]),
        ("user", "Something sweet?"),
        ("assistant", REPLIES[1]),
    ]
    # The turns are the admin page's too.
    with httpx.Client(base_url=base_url) as rest:
        users = rest.get("/admin/v1/users").json()["users"]
        user_pk = next(u["id"] for u in users if u["user_id"] == "dave")
        page = rest.get(f"/admin/users/{user_pk}/sessions/{extension['session_id']}")
    assert page.status_code == 200
    for text in ("I am allergic to peanuts.", "Something sweet?", REPLIES[1]):
        assert text in page.text


@pytest.mark.parametrize(
    ("arguments", "error", "param", "words"),
    [
        ({"temperature": 5}, openai.BadRequestError, "temperature", "<= 2.0"),
        ({"n": 2}, openai.BadRequestError, "n", "only one choice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            openai.BadRequestError,
            "tools",
            "tools are not supported",
        ),
        ({"logprobs": True}, openai.BadRequestError, "logprobs", "log probabilities"),
        ({"extra_body": {"bogus": 1}}, openai.BadRequestError, "bogus", "unknown field"),
        ({"user": None}, openai.BadRequestError, "user", "X-Memchat-User-Id"),
        ({"model": "gpt-4o"}, openai.NotFoundError, None, "'gpt-4o' does not exist"),
    ],
)
def test_bad_fields_raise_the_sdk_typed_errors(
    base_url: str,
    arguments: dict[str, Any],
    error: type[openai.APIStatusError],
    param: str | None,
    words: str,
) -> None:
    call: dict[str, Any] = {
        "model": "memchat",
        "user": "erin",
        "messages": [{"role": "user", "content": "Hi"}],
    } | arguments
    if call["user"] is None:
        del call["user"]
    with pytest.raises(error) as raised:
        sdk(base_url).chat.completions.create(**call)
    body = raised.value.body
    assert isinstance(body, dict)
    assert words in body["message"]
    assert body["param"] == param
    assert body["type"] == "invalid_request_error"
    assert raised.value.response.headers["x-should-retry"] == "false"
    # Nothing was stored for the refused request.
    with httpx.Client(base_url=base_url) as rest:
        users = rest.get("/admin/v1/users").json()["users"]
    assert "erin" not in {u["user_id"] for u in users}


def test_last_message_must_be_the_user_s(base_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        sdk(base_url).chat.completions.create(
            model="memchat",
            user="frank",
            messages=[{"role": "assistant", "content": "Hello"}],
        )
    assert raised.value.body["param"] == "messages[0].role"
    assert "the last message must be the user's new message" in raised.value.body["message"]


def test_engine_failure_is_an_openai_503_and_the_message_is_kept(
    base_url: str, engine: ScriptedEngine
) -> None:
    from retrieval.errors import EngineError

    engine.fail_with = EngineError("the model crashed")
    session_id = str(uuid.uuid4())
    client = sdk(base_url, **{"X-Memchat-Session-Id": session_id})
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(
            model="memchat", user="gina", messages=[{"role": "user", "content": "Hello?"}]
        )
    assert raised.value.status_code == 503
    assert raised.value.body["type"] == "server_error"
    assert "the model crashed" in raised.value.body["message"]
    with pytest.raises(openai.APIError, match="the model crashed"):
        list(
            client.chat.completions.create(
                model="memchat",
                user="gina",
                messages=[{"role": "user", "content": "Hello?"}],
                stream=True,
            )
        )
    engine.fail_with = None
    # The retry of the unanswered message matches the stored history; the message stays.
    answer = client.chat.completions.create(
        model="memchat", user="gina", messages=[{"role": "user", "content": "Hello?"}]
    )
    assert answer.model_extra["memchat"]["num_history_stored"] == 0
    assert [r for r, _ in stored(base_url, session_id)] == ["user", "user", "user", "assistant"]


@pytest.fixture
def keyed(tmp_path: Path, sqlite_url: str) -> Iterator[tuple[str, str, str]]:
    """A live server outside local mode, with keys of two tenants."""

    async def keys() -> tuple[str, str]:
        engine = create_engine(sqlite_url)
        access = AccessRepository(Database(engine))
        _, first = await access.create_key("acme", "acme app")
        _, second = await access.create_key("globex", "globex app")
        await engine.dispose()
        return first, second

    first, second = asyncio.run(keys())
    settings = Settings(data_dir=tmp_path / "keyed", database_url=sqlite_url)
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine(REPLIES))
    with live_server(app) as base:
        yield base, first, second


def test_keys_and_tenants(keyed: tuple[str, str, str]) -> None:
    base, acme, globex = keyed
    with pytest.raises(openai.AuthenticationError) as raised:
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    assert raised.value.body["type"] == "authentication_error"
    assert raised.value.body["message"] == "unknown or revoked API key"
    session_id = str(uuid.uuid4())
    headers = {"X-Memchat-Session-Id": session_id}
    acme_client = openai.OpenAI(
        base_url=f"{base}/v1", api_key=acme, max_retries=0, default_headers=headers
    )
    acme_client.chat.completions.create(
        model="memchat", user="hal", messages=[{"role": "user", "content": CAT}]
    )
    globex_client = openai.OpenAI(
        base_url=f"{base}/v1", api_key=globex, max_retries=0, default_headers=headers
    )
    # Another tenant cannot write into (or read) the session.
    with pytest.raises(openai.NotFoundError):
        globex_client.chat.completions.create(
            model="memchat", user="hal", messages=[{"role": "user", "content": "My cat?"}]
        )
    # Its own user of the same name remembers nothing of acme's.
    answer = (
        openai.OpenAI(base_url=f"{base}/v1", api_key=globex, max_retries=0)
        .with_options(default_headers={"X-Memchat-Session-Id": str(uuid.uuid4())})
        .chat.completions.create(
            model="memchat", user="hal", messages=[{"role": "user", "content": "What is my cat?"}]
        )
    )
    assert answer.model_extra["memchat"]["context"]["memories"] == []


@pytest.mark.model
async def test_cached_tokens_from_the_llamacpp_engine(
    tmp_path: Path, sqlite_url: str, real_engine: Any
) -> None:
    """The in-process engine reports its prefix cache: the second turn's prompt opens with
    the whole first prompt, and the usage says those tokens were served from the cache."""
    import httpx2

    from tests.clients import LOCAL_URL, local_client

    settings = Settings(data_dir=tmp_path / "cached", database_url=sqlite_url)
    app = create_app(settings, embedder=HashEmbedder(), engine=real_engine)
    # The test client runs the app's lifespan; the SDK's own client (httpx2) calls the
    # app in process, on this loop, where the session's engine lives.
    async with (
        local_client(app),
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=LOCAL_URL) as http,
    ):
        client = openai.AsyncOpenAI(
            base_url=f"{LOCAL_URL}/v1",
            api_key="local",
            max_retries=0,
            http_client=http,
            default_headers={"X-Memchat-Session-Id": str(uuid.uuid4())},
        )
        first = await client.chat.completions.create(
            model="memchat",
            user="ivy",
            max_tokens=8,
            temperature=0,
            messages=[{"role": "user", "content": "My favourite colour is teal."}],
        )
        second = await client.chat.completions.create(
            model="memchat",
            user="ivy",
            max_tokens=8,
            temperature=0,
            messages=[{"role": "user", "content": "What is my favourite colour?"}],
        )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 4 <= cached < second.usage.prompt_tokens
