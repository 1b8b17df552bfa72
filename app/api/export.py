"""A user's whole memory as the export format, streamed: `GET /v1/users/{user_id}/export`.

The lines are `memchat export --user-id X --tenant T`'s, written by the same code
(`storage.backup.export`), so `memchat import` restores what this route sends. They are
read in one snapshot and sent as they are read: the server holds a page of rows, never
the user. An unknown user, or another tenant's, is a 404 before anything is sent; a
failure after the first line cuts the stream, and a cut export lacks its `end` line,
which import refuses.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from litestar.response import Stream
from litestar.status_codes import HTTP_200_OK

from app.access.keys import Principal
from app.api.facts import UserIdPath
from app.api.problems import problems
from storage.backup import BackupRepository
from storage.backup.export import export_lines

# Newline-delimited JSON, one record a line (the media type of Elasticsearch's and
# others' JSON-lines answers; `application/jsonl` is not registered either).
NDJSON = "application/x-ndjson"
PATH = "/v1/users/{user_id}/export"
CHUNK_BYTES = 64 * 1024


class ExportController(Controller):
    tags = ["export"]  # noqa: RUF012

    @get(
        "/v1/users/{user_id:str}/export",
        responses={
            HTTP_200_OK: ResponseSpec(
                data_container=None,
                media_type=NDJSON,
                description="The user's export, one JSON record a line (docs/export.md): "
                "the header, the user's rows, then the `end` record with their count.",
            ),
            **problems(400, 404, 422, 503),
        },
    )
    async def export_user(
        self,
        user_id: UserIdPath,
        backup: NamedDependency[BackupRepository],
        principal: NamedDependency[Principal],
    ) -> Stream:
        """Everything stored of one user of the caller's tenant (sessions, messages,
        facts with their history, summaries, the user's own knowledge documents), as
        `memchat export --user-id` writes it."""
        lines = export_lines(backup, principal.tenant_id, principal.tenant_name, user_id)
        # An unknown user fails here, as a plain 404, before the stream starts.
        header = await anext(lines)
        return Stream(_send(header, lines), media_type=NDJSON)


async def _send(header: bytes, lines: AsyncGenerator[bytes]) -> AsyncGenerator[bytes]:
    """The header, then the rest in chunks of whole lines of about `CHUNK_BYTES` (a
    write per line would cost more than the line); the snapshot is closed however the
    stream ends, a client that hangs up included."""
    try:
        yield header
        chunk: list[bytes] = []
        size = 0
        async for line in lines:
            chunk.append(line)
            size += len(line)
            if size >= CHUNK_BYTES:
                yield b"".join(chunk)
                chunk, size = [], 0
        yield b"".join(chunk)
    finally:
        await lines.aclose()
