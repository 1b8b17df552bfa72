"""`memchat import` takes only what the API would store: one crafted file per limit is
refused with exit status 2 and a message naming its line, and nothing is written, on
SQLite and PostgreSQL (docs/export.md, "What import refuses")."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from app.cli.backup import check_lines, import_lines
from app.cli.main import build_parser
from app.settings import Settings
from tests.live import cli_env
from tests.test_backup import import_target, open_store, run_cli

SESSION = "0b0c0d0e-0000-4000-8000-0000000000aa"
DOCUMENT = "0d0c0d0e-0000-4000-8000-0000000000dd"
SEED_SESSION = "0b0c0d0e-0000-4000-8000-0000000000bb"
AT = "2026-01-01T00:00:00Z"
TEXT = "Kites fly in the wind."


def message(seq: int, role: str, content: str) -> dict[str, Any]:
    return {
        "type": "message", "session_id": SESSION, "seq": seq, "role": role, "name": None,
        "content": content, "created_at": AT, "external_id": None, "token_count": 3,
    }  # fmt: skip


# A valid file: header (line 1), user (2), session (3), two messages (4, 5), a document
# (6) and its chunk (7), end (8).
RECORDS: list[dict[str, Any]] = [
    {"type": "header", "format": "memchat-export", "version": 2, "tenant": None, "user_id": None},
    {"type": "user", "user_id": "u"},
    {"type": "session", "id": SESSION, "title": "t", "metadata": {}, "created_at": AT},
    message(1, "user", "I keep bees."),
    message(2, "assistant", "Nice."),
    {
        "type": "document", "id": DOCUMENT, "title": "Kites", "source": "text", "filename": None,
        "content_hash": hashlib.sha256(TEXT.encode()).hexdigest(), "status": "ready",
        "failure_reason": None, "num_chars": len(TEXT), "num_chunks": 1, "num_chunks_indexed": 1,
        "created_at": AT, "updated_at": AT, "owner": "u", "metadata": {}, "content": TEXT,
    },
    {"type": "chunk", "document_id": DOCUMENT, "ordinal": 0, "text": TEXT, "token_count": 5,
     "heading_path": ""},
    {"type": "end", "num_records": 6},
]  # fmt: skip


def export_file(changes: dict[int, dict[str, Any]] | None = None) -> bytes:
    records = copy.deepcopy(RECORDS)
    for index, fields in (changes or {}).items():
        records[index].update(fields)
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


ID_RULE = (
    "is not one the API takes: 1 to 255 characters. Expected an id without '/', control or "
    "invisible characters or a space at either end"
)
CASES: dict[str, tuple[dict[int, dict[str, Any]], str]] = {
    "user-id-slash": (
        {1: {"user_id": "a/b"}, 5: {"owner": "a/b"}},
        f"line 2: user id 'a/b' {ID_RULE}",
    ),
    "user-id-256": (
        {1: {"user_id": "u" * 256}, 5: {"owner": "u" * 256}},
        f"line 2: user id {'u' * 40!r}... (256 characters) {ID_RULE}",
    ),
    "user-id-newline": (
        {1: {"user_id": "u\n"}, 5: {"owner": "u\n"}},
        f"line 2: user id 'u\\n' {ID_RULE}",
    ),
    "session-id-slash": ({2: {"id": "../x"}}, "line 3: session id '../x' is not a UUID"),
    "session-id-300": (
        {2: {"id": "a" * 300}},
        f"line 3: session id {'a' * 40!r}... (300 characters) is not a UUID",
    ),
    "external-id-256": (
        {3: {"external_id": "e" * 256}},
        "line 4: external_id has 256 characters; it takes 1 to 255",
    ),
    "content-empty": ({3: {"content": ""}}, "line 4: content must not be empty"),
    "content-blank": ({3: {"content": " \n\u200b"}}, "line 4: content must not be empty"),
    "content-32001": (
        {3: {"content": "x" * 32_001}},
        "line 4: content has 32001 characters; the limit is 32000 (chat.max_content_chars)",
    ),
    "content-nul": (
        {3: {"content": "a\x00b"}},
        "line 4: text must not contain NUL (U+0000) - at `$.content`",
    ),
    "metadata-nul": (
        {2: {"metadata": {"k": "\x00"}}},
        "line 3: text must not contain NUL (U+0000) - at `$.metadata.k`",
    ),
    "seq-negative": ({3: {"seq": -1}}, "line 4: seq -1 is out of range (1 to 2147483647)"),
    "seq-10**30": (
        {3: {"seq": 10**30}},
        f"line 4: seq {10**30} is out of range (1 to 2147483647)",
    ),
    "metadata-100kb": (
        {2: {"metadata": {"k": "x" * 100_000}}},
        "line 3: metadata takes 100009 bytes as JSON; the limit is 16384 (chat.max_metadata_bytes)",
    ),
    "note-100000-parts": (
        {3: {"context_note": ["n"] * 100_000}},
        "line 4: context_note has 100000 items; at most 8",
    ),
    "note-100000-messages": (
        {4: {"context_note": ["n"], "context_note_messages": [[SESSION, 1]] * 100_000}},
        "line 5: context_note_messages has 100000 items; at most 1000",
    ),
    "forged-content-hash": (
        {5: {"content_hash": "0" * 64}},
        f"line 6: content_hash '{'0' * 64}' is not the SHA-256 of the document's content",
    ),
    "document-empty": ({5: {"content": ""}}, "line 6: content must not be empty"),
}


async def seeded(url: str, tmp_path: Path) -> dict[str, int]:
    """Another user's rows in the store, so that "nothing written" is a count that stays
    (no messages: their vectors would be the test embedder's, not the command's)."""
    seed = [
        RECORDS[0],
        {"type": "user", "user_id": "seed"},
        {**RECORDS[2], "id": SEED_SESSION},
        {"type": "end", "num_records": 2},
    ]
    lines = [json.dumps(record).encode() + b"\n" for record in seed]
    repos, engine = await open_store(url)
    await import_lines(import_target(repos, tmp_path / "index"), lines)
    counts = await repos.admin.count_rows()
    await engine.dispose()
    return counts


async def stored(url: str) -> dict[str, int]:
    repos, engine = await open_store(url)
    counts = await repos.admin.count_rows()
    await engine.dispose()
    return counts


def run_import(settings: Settings, path: Path, *options: str) -> int:
    """`memchat import` as `main` runs it, with these settings."""
    args = build_parser().parse_args(["import", str(path), *options])
    return int(args.run(settings, args))


def test_the_valid_file_passes_every_check() -> None:
    assert check_lines(export_file().splitlines(True)) == 6


@pytest.mark.parametrize(("changes", "error"), CASES.values(), ids=CASES.keys())
def test_a_file_beyond_the_api_limits_is_refused_naming_its_line_and_nothing_is_written(
    changes: dict[int, dict[str, Any]],
    error: str,
    database_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = asyncio.run(seeded(database_url, tmp_path))
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(export_file(changes))
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    # One record per transaction: a refusal after the first would leave rows behind.
    status = run_import(settings, path, "--batch-size", "1", "--no-progress")
    assert (status, capsys.readouterr().err) == (2, f"memchat import: {error}\n")
    assert asyncio.run(stored(database_url)) == before


def test_the_limits_are_the_settings(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = asyncio.run(seeded(database_url, tmp_path))
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(export_file({2: {"metadata": {"k": "xy"}}}))
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        chat={"max_content_chars": 10, "max_metadata_bytes": 10},
        knowledge={"max_document_chars": 20},
    )
    assert run_import(settings, path, "--no-progress") == 2
    assert capsys.readouterr().err == (
        "memchat import: line 3: metadata takes 11 bytes as JSON; the limit is 10 "
        "(chat.max_metadata_bytes)\n"
    )
    path.write_bytes(export_file())
    assert run_import(settings, path, "--no-progress") == 2
    assert capsys.readouterr().err == (
        "memchat import: line 4: content has 12 characters; the limit is 10 "
        "(chat.max_content_chars)\n"
    )
    assert asyncio.run(stored(database_url)) == before


def test_the_command_refuses_a_seq_of_10_to_the_30_in_one_line(
    database_url: str, tmp_path: Path
) -> None:
    """The process itself: status 2, the one line on standard error and no traceback."""
    before = asyncio.run(seeded(database_url, tmp_path))
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(export_file({3: {"seq": 10**30}}))
    env = cli_env(tmp_path / "data") | {"MEMCHAT_DATABASE_URL": database_url}
    refused = run_cli("import", str(path), "--batch-size", "1", env=env, text=True)
    assert (refused.returncode, refused.stderr) == (
        2,
        f"memchat import: line 4: seq {10**30} is out of range (1 to 2147483647)\n",
    )
    assert asyncio.run(stored(database_url)) == before
