"""`memchat`: the command line's entry point (serve, migrate, reindex, chat, ...). The
process boundary: each command lives in a module of its own and adds its parser here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.cli.backup.commands import add_backup_commands
from app.cli.chat import add_chat_command
from app.cli.database import add_migrate_command
from app.cli.engine import add_engine_commands
from app.cli.keys import add_key_commands
from app.cli.logs import configure_logging, severest
from app.cli.mcp import add_mcp_command
from app.cli.reindex import add_reindex_command
from app.cli.serve import add_serve_command
from app.settings import Settings
from storage.errors import DatabaseUnavailableError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memchat", description="Conversational memory service")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands)
    add_migrate_command(commands)
    add_reindex_command(commands)
    add_backup_commands(commands)
    add_chat_command(commands)
    add_engine_commands(commands)
    add_mcp_command(commands)
    add_key_commands(commands)
    return parser


def database_problem(settings: Settings, exc: DatabaseUnavailableError) -> str:
    """One line for a database that cannot be used: which, what is wrong, what to do."""
    url = settings.resolved_database_url()
    reason = (str(exc).strip().splitlines() or ["no reason given"])[0]
    if url.startswith("sqlite"):
        path = url.partition(":///")[2]
        return (
            f"the database file {path} cannot be used: {reason}. If it is damaged, restore "
            "it from a backup, or move it away to start with an empty database"
        )
    return (
        f"the database cannot be used: {reason}. Check that the server is running and "
        "that MEMCHAT_DATABASE_URL names it"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    # A command whose screen is a conversation (`memchat chat`) names a floor: no lines
    # below it, whatever MEMCHAT_LOG_LEVEL asks for; a quieter setting still wins.
    configure_logging(severest(settings.log_level, getattr(args, "log_floor", "debug")))
    try:
        return int(args.run(settings, args))
    except DatabaseUnavailableError as exc:
        # Process boundary: a store that cannot be opened is one line, not a traceback.
        print(f"memchat {args.command}: {database_problem(settings, exc)}", file=sys.stderr)
        return 2
