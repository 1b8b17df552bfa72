"""`memchat reindex`: re-embed the stored turns and knowledge chunks and rebuild the
vector indexes, or (`--missing`) only give turns the second dense list's vector."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from app.cli.database import migrate_database
from app.cli.progress import add_progress_option, is_shown, progress_bar
from app.settings import Settings
from storage.db import Database
from storage.repositories import Repositories


async def _reindex(settings: Settings, show_progress: bool) -> tuple[int, int, str]:
    from app.adapters import load_embedder, load_second_embedder
    from app.runtime import build_knowledge, build_memory

    db = Database.open(settings.resolved_database_url())
    try:
        repositories = Repositories.of(db)
        embedder = await load_embedder(settings)
        second = await load_second_embedder(settings)
        memory = build_memory(settings, repositories, embedder, second)
        counts = await repositories.admin.count_rows()
        with progress_bar(
            "messages", "messages", enabled=show_progress, total=counts["messages"]
        ) as bar:
            num_messages = await memory.reindex_all(bar.advance)
        knowledge = build_knowledge(settings, repositories, embedder, second)
        with progress_bar(
            "knowledge", "chunks", enabled=show_progress, total=counts["knowledge_chunks"]
        ) as bar:
            num_chunks = await knowledge.rebuild(bar.advance)
        names = embedder.model_name + (f" and {second.model_name}" if second else "")
        return num_messages, num_chunks, names
    finally:
        await db.dispose()


async def _complete_second(settings: Settings, show_progress: bool) -> tuple[int, int, str]:
    """Give the second dense list's vector to the turns that lack it, as a running server
    does in the background: (turns embedded here, turns still missing, the model)."""
    from app.adapters import load_embedder, load_second_embedder
    from app.runtime import build_memory
    from retrieval.search.backfill import SecondListBackfill
    from storage.claims import JobClaimRepository

    second = await load_second_embedder(settings)
    if second is None:
        raise SystemExit("memchat reindex --missing: MEMCHAT_SECOND_EMBEDDER__KIND is none")
    db = Database.open(settings.resolved_database_url())
    try:
        memory = build_memory(settings, Repositories.of(db), await load_embedder(settings), second)
        await memory.check_model()
        claims = JobClaimRepository.open_or_none(
            settings.resolved_database_url(), timeout_s=settings.database_timeout_s
        )
        backfill = SecondListBackfill(memory, claims)
        progress = await memory.second_progress()
        done, total = progress or (0, 0)
        try:
            with progress_bar(
                "second list", "turns", enabled=show_progress, total=max(total - done, 0)
            ) as bar:
                num_embedded = await memory.backfill_second(backfill.hold, bar.advance)
            await memory.save()
        finally:
            await backfill.stop()
        done, total = await memory.second_progress() or (0, 0)
        return num_embedded, max(total - done, 0), second.model_name
    finally:
        await db.dispose()


def cmd_reindex(settings: Settings, args: argparse.Namespace) -> int:
    asyncio.run(migrate_database(settings, "head"))
    if args.missing:
        num_turns, num_left, model_name = asyncio.run(_complete_second(settings, is_shown(args)))
        print(f"gave {num_turns} messages their {model_name} vector", end="")
        print(f"; {num_left} more are being embedded by another process" if num_left else "")
        return 0
    num_messages, num_chunks, model_name = asyncio.run(_reindex(settings, is_shown(args)))
    print(
        f"re-embedded and indexed {num_messages} messages and {num_chunks} knowledge chunks"
        f" with {model_name}"
    )
    return 0


def add_reindex_command(commands: Any) -> None:
    reindex = commands.add_parser(
        "reindex",
        help="re-embed every stored turn and knowledge chunk and rebuild the vector indexes"
        " (server stopped)",
    )
    reindex.add_argument(
        "--missing",
        action="store_true",
        help="only give the turns that lack it the second dense list's vector (what a"
        " running server also does in the background; safe beside running servers)",
    )
    reindex.set_defaults(run=cmd_reindex)
    add_progress_option(reindex)
