"""The client's export of a user (`export_user`, `export_user_to_file`), blocking and
async, against a real server (tests/client_server.py): the records are the server's
lines decoded, as they stream; the file is the server's bytes; an unknown user raises
the typed 404; a stream that breaks, or ends without its end record, raises and leaves
no file."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from memchat import AsyncMemchatClient, HistoryMessage, MemchatClient
from memchat.errors import NotFoundError, ServerUnreachableError, UnexpectedAnswerError
from memchat.export import (
    EndRecord,
    ExportReader,
    ExportRecord,
    FactRecord,
    FactsThroughRecord,
    Header,
    MessageRecord,
    SessionRecord,
    UserRecord,
)
from tests.client_server import REPLY, Server, memchat_server

HISTORY = [
    HistoryMessage("user", "我叫小明，我住在上海。", external_id="h1"),
    HistoryMessage("assistant", "Nice to meet you, 小明."),
]


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async with memchat_server(tmp_path_factory.mktemp("client-export")) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[MemchatClient]:
    with MemchatClient(server.url, api_key=server.api_key) as memchat:
        yield memchat


def raw_export(server: Server, user_id: str) -> httpx.Response:
    return httpx.get(
        f"{server.url}/v1/users/{user_id}/export",
        headers={"Authorization": f"Bearer {server.api_key}"},
    )


def decoded(exported: bytes) -> list[ExportRecord]:
    return [msgspec.json.decode(line, type=ExportRecord) for line in exported.splitlines()]


def stored_user(client: MemchatClient, server: Server, user_id: str) -> bytes:
    """A user with history, a turn and a fact; the server's export of them once fact
    extraction has read every message (its `facts_through` names the last one)."""
    session = client.create_session(user_id, title="日常")
    client.import_history(session.id, HISTORY)
    client.send_message(session.id, "我喜欢放风筝")
    client.add_fact(user_id, "小明 likes kites.")
    for _ in range(400):
        answer = raw_export(server, user_id)
        lines = decoded(answer.content)
        last = [r for r in lines if isinstance(r, MessageRecord)][-1]
        if FactsThroughRecord((last.session_id, last.seq)) in lines:
            return answer.content
        time.sleep(0.025)
    raise AssertionError("fact extraction did not catch up")


def test_export_user_yields_the_servers_records_as_they_stream(
    client: MemchatClient, server: Server, tmp_path: Path
) -> None:
    exported = stored_user(client, server, "xiaoming")
    answer = raw_export(server, "xiaoming")
    assert answer.headers["content-type"] == "application/x-ndjson"
    assert answer.headers["transfer-encoding"] == "chunked"  # sent as it is read

    records = list(client.export_user("xiaoming"))
    assert records == decoded(exported)
    assert records[0] == Header("memchat-export", 2, "acme", "xiaoming")
    assert isinstance(records[1], UserRecord) and records[1].user_id == "xiaoming"
    assert [r.title for r in records if isinstance(r, SessionRecord)] == ["日常"]
    assert [r.content for r in records if isinstance(r, MessageRecord)] == [
        *(m.content for m in HISTORY),
        "我喜欢放风筝",
        REPLY,
    ]
    # Stated through the API, and extracted from the turns.
    assert "小明 likes kites." in [r.text for r in records if isinstance(r, FactRecord)]
    assert records[-1] == EndRecord(len(records) - 2)

    path = tmp_path / "xiaoming.jsonl"
    assert client.export_user_to_file("xiaoming", path) == len(records) - 2
    assert path.read_bytes() == exported
    assert list(tmp_path.iterdir()) == [path]

    with pytest.raises(NotFoundError) as unknown:
        list(client.export_user("nobody"))
    assert unknown.value.detail == "user 'nobody' not found"
    with pytest.raises(NotFoundError):
        client.export_user_to_file("nobody", tmp_path / "nobody.jsonl")
    assert list(tmp_path.iterdir()) == [path]


async def test_the_async_client_exports_the_same(
    client: MemchatClient, server: Server, tmp_path: Path
) -> None:
    exported = stored_user(client, server, "小红")
    async with AsyncMemchatClient(server.url, api_key=server.api_key) as memchat:
        records = [record async for record in memchat.export_user("小红")]
        path = tmp_path / "xiaohong.jsonl"
        assert await memchat.export_user_to_file("小红", path) == len(records) - 2
        with pytest.raises(NotFoundError):
            [record async for record in memchat.export_user("nobody")]
    assert records == decoded(exported)
    assert records[0] == Header("memchat-export", 2, "acme", "小红")
    assert path.read_bytes() == exported


def test_lines_split_anywhere_are_read_and_a_cut_export_raises() -> None:
    lines = [
        b'{"type":"header","format":"memchat-export","version":2,"tenant":"t","user_id":"u"}\n',
        b'{"type":"user","user_id":"u","created_at":null}\n',
        b'{"type":"end","num_records":1}\n',
    ]
    whole = b"".join(lines)
    for size in (1, 7, len(whole)):
        reader = ExportReader()
        found = [r for i in range(0, len(whole), size) for r in reader.feed(whole[i : i + size])]
        assert found == [Header("memchat-export", 2, "t", "u"), UserRecord("u"), EndRecord(1)]
        assert reader.finish() == 1
    cut = ExportReader()
    cut.feed(b"".join(lines[:2]))
    with pytest.raises(UnexpectedAnswerError, match="cut short"):
        cut.finish()
    with pytest.raises(UnexpectedAnswerError, match="export line 1"):
        ExportReader().feed(lines[1])
    with pytest.raises(UnexpectedAnswerError, match="export line 2"):
        ExportReader().feed(lines[0] + b"<html>\n")


HEADER = b'{"type":"header","format":"memchat-export","version":2,"tenant":"t","user_id":"u"}\n'
USER = b'{"type":"user","user_id":"u","created_at":null}\n'


class Broken(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An answer's body that stops after its first lines: the connection broken
    (`error`), or closed as if the answer were whole."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def __iter__(self) -> Iterator[bytes]:
        yield HEADER + USER
        if self.error is not None:
            raise self.error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self:
            yield chunk


@pytest.mark.parametrize(
    ("error", "raised"),
    [(httpx.ReadError("connection reset"), ServerUnreachableError), (None, UnexpectedAnswerError)],
)
async def test_an_export_cut_short_raises_and_leaves_no_file(
    tmp_path: Path, error: Exception | None, raised: type[Exception]
) -> None:
    def answer(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Broken(error))

    transport = httpx.MockTransport(answer)
    with MemchatClient("http://memchat", transport=transport) as memchat:
        found = []
        with pytest.raises(raised):
            for record in memchat.export_user("u"):
                found.append(record)
        assert found == [Header("memchat-export", 2, "t", "u"), UserRecord("u")]
        with pytest.raises(raised):
            memchat.export_user_to_file("u", tmp_path / "u.jsonl")
    async with AsyncMemchatClient("http://memchat", transport=transport) as memchat:
        with pytest.raises(raised):
            await memchat.export_user_to_file("u", tmp_path / "u.jsonl")
    assert list(tmp_path.iterdir()) == []
