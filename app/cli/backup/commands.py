"""`memchat export` and `memchat import`: the process side of the export format (files,
standard streams, progress bars, exit codes)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from app.cli.backup.limits import ImportLimits
from app.cli.backup.restore import (
    BATCH_SIZE,
    ImportCounts,
    ImportTarget,
    check_lines,
    import_lines,
    vectors_only,
)
from app.cli.database import migrate_database
from app.cli.progress import add_progress_option, is_shown, progress_bar
from app.settings import Settings
from storage.backup.export import export_lines
from storage.backup.lines import BackupFormatError
from storage.db import Database
from storage.errors import NotFoundError
from storage.repositories import Repositories


def add_backup_commands(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="write one user's or a whole tenant's memory as JSON Lines (docs/export.md)",
    )
    who = export.add_mutually_exclusive_group()
    who.add_argument("--user-id", default=None, help="the user to export (default: every user)")
    who.add_argument(
        "--all",
        action="store_true",
        help="every user of the tenant and its shared knowledge (the default)",
    )
    export.add_argument("--tenant", default="default", help="the tenant to export from")
    export.add_argument("--output", default="-", help="file (default: standard output)")
    add_progress_option(export)
    export.set_defaults(run=cmd_export)
    restore = commands.add_parser(
        "import", help="restore an export; importing it again adds nothing (server stopped)"
    )
    restore.add_argument("path", help="export file, or - for standard input")
    restore.add_argument("--tenant", default="default", help="restore into this tenant")
    restore.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE, help="records written per transaction"
    )
    add_progress_option(restore)
    restore.set_defaults(run=cmd_import)


@contextmanager
def _output(path: str) -> Iterator[IO[bytes]]:
    """Standard output, or the file, written beside it first and renamed when complete
    (a failed export leaves no file that looks whole). A path that is no regular file (a
    device such as /dev/null, a pipe) is written as it goes: renamed over, it would be
    replaced by a file."""
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "wb") as stream:
            yield stream
        return
    partial = Path(f"{path}.partial")
    try:
        with partial.open("wb") as handle:
            yield handle
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


async def _export(settings: Settings, args: argparse.Namespace) -> int:
    db = Database.open(settings.resolved_database_url())
    num_lines = 0
    try:
        repositories = Repositories.of(db)
        tenant = await repositories.access.get_tenant(args.tenant)
        with (
            _output(args.output) as handle,
            progress_bar("export", "rows", enabled=is_shown(args)) as bar,
        ):
            lines = export_lines(
                repositories.backup,
                tenant.id,
                tenant.name,
                args.user_id,
                on_total=bar.set_total,
                on_rows=bar.advance,
            )
            async for line in lines:
                handle.write(line)
                num_lines += 1
    finally:
        await db.dispose()
    return num_lines - 2  # the records between the header and the end line


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate_database(settings, "head"))
    try:
        num_records = asyncio.run(_export(settings, args))
    except NotFoundError as exc:
        print(f"memchat export: {exc}", file=sys.stderr)
        return 2
    unit = f"user {args.user_id!r}" if args.user_id is not None else f"tenant {args.tenant!r}"
    print(f"exported {num_records} records of {unit}", file=sys.stderr)
    return 0


@contextmanager
def _input(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as handle:
        yield handle


async def _import(
    settings: Settings, args: argparse.Namespace, num_records: int | None
) -> ImportCounts:
    from app.adapters import build_index, load_embedder, load_second_embedder
    from app.runtime import build_knowledge, retrieval_config
    from retrieval.dense import SecondDense
    from retrieval.search.memory import TurnMemory

    db = Database.open(settings.resolved_database_url())
    try:
        repositories = Repositories.of(db)
        tenant = await repositories.access.ensure_tenant(args.tenant)
        embedder = await load_embedder(settings)
        second_embedder = await load_second_embedder(settings)
        second = None
        if second_embedder is not None:
            second = SecondDense(
                second_embedder, build_index(settings, second_embedder, second=True)
            )
        memory = TurnMemory(
            repositories.messages,
            repositories.embeddings,
            embedder,
            build_index(settings, embedder),
            vectors_only(retrieval_config(settings.retrieval, settings.embedder.reads_cjk)),
            second=second,
        )
        await memory.check_model()
        target = ImportTarget(
            repositories.backup,
            repositories.facts,
            memory,
            lambda: build_knowledge(settings, repositories, embedder, second_embedder),
            tenant.id,
        )
        with (
            _input(args.path) as lines,
            progress_bar("import", "records", enabled=is_shown(args), total=num_records) as bar,
        ):
            return await import_lines(
                target,
                lines,
                batch_size=args.batch_size,
                on_records=bar.advance,
                limits=import_limits(settings),
            )
    finally:
        await db.dispose()


def import_limits(settings: Settings) -> ImportLimits:
    return ImportLimits.of(settings.chat, settings.knowledge)


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    try:
        num_records = None
        if args.path != "-":
            # A file is read through first: a damaged one is refused before any write.
            with open(args.path, "rb") as handle:
                num_records = check_lines(handle, import_limits(settings))
        asyncio.run(migrate_database(settings, "head"))
        counts = asyncio.run(_import(settings, args, num_records))
    except (BackupFormatError, OSError) as exc:
        print(f"memchat import: {exc}", file=sys.stderr)
        return 2
    print(describe(counts))
    return 0


def describe(counts: ImportCounts) -> str:
    added = counts.num_added
    return (
        f"imported {added['users']} users, {added['sessions']} sessions, "
        f"{added['messages']} messages, {added['facts']} facts ({added['fact_changes']} "
        f"changes), {added['summaries']} summaries, {added['documents']} documents "
        f"({added['chunks']} chunks); {counts.num_present} rows were stored already"
    )
