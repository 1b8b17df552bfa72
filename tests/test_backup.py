"""Export and import (format version 2, and version 1 read): a round trip gives the same
bytes, a second import adds nothing, damaged files are refused naming the line."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import stat
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from app.cli.backup import (
    BackupFormatError,
    ImportTarget,
    check_lines,
    import_lines,
    vectors_only,
)
from app.settings import Settings
from retrieval.indexes.faiss import FaissIndex
from retrieval.knowledge.base import KnowledgeBase, KnowledgeConfig
from retrieval.search.memory import RetrievalConfig, TurnMemory
from storage import migrate
from storage.backup.export import export_lines
from storage.db import Database, create_engine
from storage.errors import NotFoundError
from storage.models import DEFAULT_TENANT_ID
from storage.repositories import Repositories
from tests.fakes import HashEmbedder
from tests.live import MEMCHAT, cli_env
from tests.test_api_sessions import create_session

HISTORY = [
    {"role": "user", "content": "我叫小明，我今年6岁了", "name": "小明",
     "created_at": "2026-01-05T10:00:00Z", "external_id": "x1"},
    {"role": "assistant", "content": "Nice to meet you!", "created_at": "2026-01-05T10:00:02Z"},
    {"role": "system", "content": "Keep answers short <b>please</b>", "external_id": "x3",
     "image_caption": "a kite over a beach"},
]  # fmt: skip

SESSION = "0b0c0d0e-0000-4000-8000-000000000001"
V1_EXPORT = (
    b'{"type":"header","format":"memchat-export","version":1,"user_id":"ana"}\n'
    b'{"type":"session","id":"' + SESSION.encode() + b'","title":"t",'
    b'"metadata":{},"created_at":"2026-01-01T00:00:00Z"}\n'
    b'{"type":"message","session_id":"' + SESSION.encode() + b'","seq":1,'
    b'"role":"user","name":null,"content":"I keep bees.","created_at":'
    b'"2026-01-01T00:00:01Z","external_id":"e1","token_count":4}\n'
)
# The same, as version 2 writes it.
V2_EXPORT = (
    b'{"type":"header","format":"memchat-export","version":2,"tenant":"default",'
    b'"user_id":"ana"}\n'
    b'{"type":"user","user_id":"ana","created_at":"CREATED"}\n'
    b'{"type":"session","id":"' + SESSION.encode() + b'","title":"t",'
    b'"metadata":{},"created_at":"2026-01-01T00:00:00Z"}\n'
    b'{"type":"message","session_id":"' + SESSION.encode() + b'","seq":1,'
    b'"role":"user","name":null,"content":"I keep bees.","created_at":'
    b'"2026-01-01T00:00:01Z","external_id":"e1","token_count":4}\n'
    b'{"type":"end","num_records":3}\n'
)


async def fill(client: AsyncTestClient) -> None:
    first = await create_session(client, title="intro", metadata={"channel": "app", "n": 1})
    await client.post(f"/v1/sessions/{first['id']}/history", json={"messages": HISTORY})
    second = await create_session(client)
    await client.post(f"/v1/sessions/{second['id']}/messages", json={"content": "I like kites"})
    await create_session(client, user_id="someone-else")


async def wait_for_extraction(repos: Repositories) -> None:
    """Facts are extracted in the background: wait until every message has been read."""
    for _ in range(400):
        if not await repos.facts.list_users_behind():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("fact extraction did not catch up")


async def open_store(url: str) -> tuple[Repositories, object]:
    engine = create_engine(url)
    await migrate.upgrade(engine)
    return Repositories.of(Database(engine)), engine


def import_target(repos: Repositories, directory: Path) -> ImportTarget:
    """Fakes for the derived parts: the hash embedder, FAISS indexes in `directory`."""
    embedder = HashEmbedder()
    memory = TurnMemory(
        repos.messages,
        repos.embeddings,
        embedder,
        FaissIndex(directory / "turns", embedder.dimension),
        vectors_only(RetrievalConfig()),
    )

    def knowledge() -> KnowledgeBase:
        index = FaissIndex(directory / "knowledge", embedder.dimension)
        return KnowledgeBase(repos.knowledge, embedder, index, KnowledgeConfig())

    return ImportTarget(repos.backup, repos.facts, memory, knowledge, DEFAULT_TENANT_ID)


def served_memory(repos: Repositories, directory: Path) -> TurnMemory:
    """The turn memory a service started on the imported store has (its default config):
    it opens the index files the import wrote and builds the lexical index from SQL."""
    embedder = HashEmbedder()
    index = FaissIndex(directory / "turns", embedder.dimension)
    return TurnMemory(repos.messages, repos.embeddings, embedder, index, RetrievalConfig())


async def export_bytes(
    repos: Repositories, user_id: str | None, tenant: str = "default", *, page_size: int = 500
) -> bytes:
    found = await repos.access.get_tenant(tenant)
    lines = export_lines(repos.backup, found.id, found.name, user_id, page_size=page_size)
    return b"".join([line async for line in lines])


def added(**counts: int) -> dict[str, int]:
    kinds = ("users", "facts", "fact_changes", "sessions", "messages", "summaries", "documents")
    return dict.fromkeys((*kinds, "chunks"), 0) | counts


async def test_round_trip_between_databases_is_byte_identical(
    client: AsyncTestClient, settings: Settings, tmp_path: Path
) -> None:
    await fill(client)
    source, source_engine = await open_store(settings.resolved_database_url())
    await wait_for_extraction(source)
    exported = await export_bytes(source, "alice")
    await source_engine.dispose()
    lines = exported.splitlines(keepends=True)
    # The rules extractor found 3 facts in the user's 2 messages: name, age, kites.
    assert [line.split(b'"', 4)[3] for line in lines] == [
        b"header", b"user", *[b"fact"] * 3, b"session", b"session", *[b"message"] * 5,
        *[b"fact_sources"] * 3, *[b"fact_change"] * 3, b"facts_through", b"end",
    ]  # fmt: skip
    assert b"someone-else" not in exported
    assert b'"image_caption":"a kite over a beach"' in exported

    target, target_engine = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'target.db'}")
    destination = import_target(target, tmp_path)
    first = await import_lines(destination, lines, batch_size=3)
    assert (first.num_added, first.num_present) == (
        added(users=1, facts=3, fact_changes=3, sessions=2, messages=5),
        0,
    )
    assert await export_bytes(target, "alice") == exported
    # Imported turns are searchable in the target, and a second import changes nothing.
    user = await target.users.get_user("alice", tenant_id=DEFAULT_TENANT_ID)
    memory = served_memory(target, tmp_path)
    vector = (await memory.embed(["小明 6岁"]))[0]
    hits = await memory.search(user.id, vector, 1, query="小明 6岁")
    [row] = await target.messages.list_messages_by_id(user.id, [hits[0].id])
    assert row.content == "我叫小明，我今年6岁了"
    second = await import_lines(destination, lines)
    assert (second.num_added, second.num_present) == (added(), 14)
    assert await export_bytes(target, "alice") == exported
    rows = await target.admin.count_rows()
    kinds = ("users", "sessions", "messages", "message_embeddings")
    assert [rows[kind] for kind in kinds] == [1, 2, 5, 5]
    # `memchat reindex` counts its progress in batches of messages.
    done: list[int] = []
    assert await memory.reindex_all(done.append) == 5
    assert done == [5]
    await target_engine.dispose()


async def test_a_version_1_file_still_imports_and_exports_as_version_2(
    sqlite_url: str, tmp_path: Path
) -> None:
    repos, engine = await open_store(sqlite_url)
    counts = await import_lines(import_target(repos, tmp_path), V1_EXPORT.splitlines(True))
    assert counts.num_added == added(users=1, sessions=1, messages=1)
    user = await repos.users.get_user("ana", tenant_id=DEFAULT_TENANT_ID)
    [turn] = await repos.messages.list_user_messages(user.id)
    assert (turn.session_id, turn.seq, turn.content, turn.external_id, turn.token_count) == (
        SESSION, 1, "I keep bees.", "e1", 4
    )  # fmt: skip
    created = user.created_at.isoformat().replace("+00:00", "Z").encode()
    assert await export_bytes(repos, "ana") == V2_EXPORT.replace(b"CREATED", created)
    again = await import_lines(import_target(repos, tmp_path), V1_EXPORT.splitlines(True))
    assert (again.num_added, again.num_present) == (added(), 3)
    await engine.dispose()


HEADER = b'{"type":"header","format":"memchat-export","version":2,"tenant":null,"user_id":null}\n'
USER = b'{"type":"user","user_id":"u"}\n'
SESSION_LINE = (
    b'{"type":"session","id":"' + SESSION.encode() + b'","title":null,"metadata":{},'
    b'"created_at":"2026-01-01T00:00:00Z"}\n'
)


def message_line(seq: int, **extra: bytes) -> bytes:
    fields = b"".join(b',"' + k.encode() + b'":' + v for k, v in extra.items())
    return (
        b'{"type":"message","session_id":"' + SESSION.encode() + b'","seq":'
        + str(seq).encode() + b',"role":"user","name":null,"content":"m'
        + str(seq).encode() + b'","created_at":"2026-01-01T00:00:01Z","external_id":null,'
        b'"token_count":1' + fields + b"}\n"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"", "not a memchat export: the file is empty"),
        (b'{"format": "x"}\n', "not a memchat export: the first line must be its header"),
        (b"not json\n", "line 1: not JSON: JSON is malformed: invalid character (byte 4)"),
        (HEADER.replace(b"2", b"3", 1), "export version 3 is not supported"),
        (
            b'{"type":"header","format":"memchat-export","version":1,"user_id":"a"}\n'
            + message_line(1),
            "line 2: a message must follow its own session's line",
        ),
        (HEADER + USER + SESSION_LINE, "the export is cut short: its last line, `end`, is missing"),
        (
            HEADER + USER + SESSION_LINE + b'{"type":"end","num_records":3}\n',
            "line 4: the end record counts 3 records; the file has 2",
        ),
        (HEADER + SESSION_LINE, "line 2: a session record must follow its user's record"),
        (
            HEADER + USER + SESSION_LINE + message_line(1) + SESSION_LINE,
            "line 5: a session record may not follow a message record of the same user",
        ),
        (
            HEADER + USER + SESSION_LINE + message_line(1, context_note_facts=b"[1]"),
            "line 4: fact 1 is not a fact of this user declared before",
        ),
        (
            HEADER + USER + SESSION_LINE + message_line(1).replace(b'"seq":1', b'"seq":"one"'),
            "line 4: Expected `int`, got `str` - at `$.seq`",
        ),
        (
            HEADER + USER + b'{"type":"chunk","document_id":"d","ordinal":0,"text":"t",'
            b'"token_count":1,"heading_path":""}\n',
            "line 3: a chunk must follow its document's line or another chunk of it",
        ),
    ],
    ids=[
        "empty", "no-header", "not-json", "unknown-version", "v1-orphan-message", "no-end",
        "wrong-end", "no-user", "out-of-order", "unknown-fact", "wrong-type", "orphan-chunk",
    ],
)  # fmt: skip
async def test_malformed_exports_are_refused_before_anything_is_written(
    content: bytes, error: str, sqlite_url: str, tmp_path: Path
) -> None:
    lines = content.splitlines(keepends=True)
    with pytest.raises(BackupFormatError) as checked:
        check_lines(lines)
    assert str(checked.value) == error
    repos, engine = await open_store(sqlite_url)
    with pytest.raises(BackupFormatError) as imported:
        await import_lines(import_target(repos, tmp_path), lines)
    assert str(imported.value) == error
    assert await repos.users.list_user_pks() == []
    await engine.dispose()


async def test_a_damaged_line_keeps_its_batch_out_and_the_batches_before_it_in(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Streamed (standard input), batches before the damaged line are written: valid, and a
    second import of the mended file adds only the rest."""
    good = [HEADER, USER, SESSION_LINE, *(message_line(seq) for seq in range(1, 7))]
    damaged = [*good[:7], b'{"type":"message","session_id":"x"\n', *good[8:]]
    repos, engine = await open_store(sqlite_url)
    target = import_target(repos, tmp_path)
    with pytest.raises(BackupFormatError, match=r"^line 8: not JSON: Input data was truncated$"):
        await import_lines(target, damaged, batch_size=3)
    user = await repos.users.get_user("u", tenant_id=DEFAULT_TENANT_ID)
    # Batches: (user, session, m1), (m2, m3, m4), then (m5, bad): only the first two stand.
    stored = await repos.messages.list_user_messages(user.id)
    assert [t.seq for t in stored] == [1, 2, 3, 4]
    mended = await import_lines(target, [*good, b'{"type":"end","num_records":8}\n'])
    assert (mended.num_added, mended.num_present) == (added(messages=2), 6)
    assert [t.seq for t in await repos.messages.list_user_messages(user.id)] == [1, 2, 3, 4, 5, 6]
    await engine.dispose()


async def test_a_reference_to_a_message_not_stored_names_its_line(
    sqlite_url: str, tmp_path: Path
) -> None:
    lines = [
        HEADER,
        USER,
        SESSION_LINE,
        message_line(1),
        message_line(2, context_note_messages=b'[["' + SESSION.encode() + b'",5]]'),
        b'{"type":"end","num_records":4}\n',
    ]
    repos, engine = await open_store(sqlite_url)
    with pytest.raises(BackupFormatError) as refused:
        await import_lines(import_target(repos, tmp_path), lines)
    assert str(refused.value) == f"line 5: no message 5 of session {SESSION} is stored before it"
    assert await repos.users.list_user_pks() == []  # the whole batch rolled back
    await engine.dispose()


async def test_a_session_of_another_user_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    repos, engine = await open_store(sqlite_url)
    target = import_target(repos, tmp_path)
    await import_lines(target, [HEADER, USER, SESSION_LINE, b'{"type":"end","num_records":2}\n'])
    other = [HEADER, USER.replace(b'"u"', b'"v"'), SESSION_LINE]
    with pytest.raises(BackupFormatError) as refused:
        await import_lines(target, [*other, b'{"type":"end","num_records":2}\n'])
    assert str(refused.value) == f"line 3: session {SESSION} is another user's"
    assert await repos.users.get_user_or_none("v", tenant_id=DEFAULT_TENANT_ID) is None
    await engine.dispose()


async def test_an_unknown_user_or_tenant_is_not_found(sqlite_url: str) -> None:
    repos, engine = await open_store(sqlite_url)
    with pytest.raises(NotFoundError):
        await export_bytes(repos, "nobody")
    with pytest.raises(NotFoundError):
        await export_bytes(repos, None, tenant="nowhere")
    await engine.dispose()


async def test_a_tenant_export_holds_every_user_and_its_shared_knowledge(
    client: AsyncTestClient, settings: Settings, tmp_path: Path
) -> None:
    await fill(client)
    shared = await client.post("/v1/knowledge", json={"title": "Kites", "text": "Kites fly."})
    assert shared.status_code == 201, shared.text
    source, source_engine = await open_store(settings.resolved_database_url())
    await wait_for_extraction(source)
    exported = await export_bytes(source, None)
    await source_engine.dispose()
    kinds = [line.split(b'"', 4)[3] for line in exported.splitlines()]
    assert kinds == [
        b"header", b"user", *[b"fact"] * 3, b"session", b"session", *[b"message"] * 5,
        *[b"fact_sources"] * 3, *[b"fact_change"] * 3, b"facts_through",
        b"user", b"session", b"document", b"chunk", b"end",
    ]  # fmt: skip
    target, target_engine = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'target.db'}")
    destination = import_target(target, tmp_path)
    counts = await import_lines(destination, exported.splitlines(True))
    assert counts.num_added == added(
        users=2, facts=3, fact_changes=3, sessions=3, messages=5, documents=1, chunks=1
    )
    assert await export_bytes(target, None) == exported
    done: list[int] = []
    assert await destination.knowledge().rebuild(done.append) == 1
    assert done == [1]
    await target_engine.dispose()


def run_cli(*args: str, env: dict[str, str], **options: object) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMCHAT, *args], env=env, capture_output=True, **options)  # type: ignore[call-overload, no-any-return]


def test_cli_refuses_a_damaged_file_before_writing(tmp_path: Path) -> None:
    """The command reads a file through before it writes (no model is loaded for that)."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(HEADER + USER + SESSION_LINE + b"{oops\n")
    env = cli_env(tmp_path / "data")
    refused = run_cli("import", str(path), env=env, text=True)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        "memchat import: line 4: not JSON: JSON is malformed: object keys must be strings (byte 1)"
    )
    assert not (tmp_path / "data" / "memchat.db").exists()


def _export_on_a_terminal(env: dict[str, str], *options: str) -> bytes:
    """Standard error on a pseudo-terminal, as a person runs the command."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with subprocess.Popen(
        [*MEMCHAT, "export", "--output", os.devnull, *options],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=follower,
    ) as process:
        os.close(follower)
        output = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closes with the process
                break
            if not chunk:
                break
            output += chunk
        assert process.wait() == 0
    os.close(leader)
    return output


async def test_cli_export_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "data")
    repos, engine = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'data' / 'memchat.db'}")
    lines = [HEADER, USER, SESSION_LINE, message_line(1), b'{"type":"end","num_records":3}\n']
    await import_lines(import_target(repos, tmp_path), lines)
    await engine.dispose()
    piped = run_cli("export", "--output", str(tmp_path / "out.jsonl"), env=env, text=True)
    assert piped.stderr.splitlines()[-1] == "exported 3 records of tenant 'default'"
    assert "rows" not in piped.stderr
    exported = (tmp_path / "out.jsonl").read_bytes().splitlines(keepends=True)
    assert exported[0] == HEADER.replace(b"null", b'"default"', 1)
    assert exported[2:] == lines[2:]
    assert b"export: 100%" in _export_on_a_terminal(env)
    assert b"export:" not in _export_on_a_terminal(env, "--no-progress")
    assert b"export:" not in _export_on_a_terminal(env, "--quiet")
    # Written into, never renamed over: /dev/null is still the device.
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    # A pipe is written as it goes and stays a pipe.
    fifo = tmp_path / "export.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    run_cli("export", "--output", str(fifo), "--quiet", env=env, text=True)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert received[0].splitlines(keepends=True) == exported
    assert not (tmp_path / "export.fifo.partial").exists()


@pytest.mark.model
def test_cli_import_and_export(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(V1_EXPORT)
    env = cli_env(tmp_path / "data")
    restored = run_cli("import", str(tmp_path / "in.jsonl"), env=env, text=True, check=True)
    assert restored.stdout.strip() == (
        "imported 1 users, 1 sessions, 1 messages, 0 facts (0 changes), 0 summaries, "
        "0 documents (0 chunks); 0 rows were stored already"
    )
    again = run_cli("export", "--user-id", "ana", env=env, check=True)
    assert again.stdout.startswith(V2_EXPORT.split(b"CREATED")[0])
    assert again.stdout.endswith(V2_EXPORT.split(b"CREATED")[1])
    (tmp_path / "out.jsonl").write_bytes(again.stdout)
    twice = run_cli("import", str(tmp_path / "out.jsonl"), env=env, text=True, check=True)
    assert twice.stdout.strip().endswith("; 3 rows were stored already")
