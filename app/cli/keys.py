"""`memchat keys create|list|revoke`: API keys, written straight to the database.

A key's secret is printed once, at creation; only its hash is stored.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from app.cli.database import migrate_database
from app.settings import Settings
from storage.access import AccessRepository
from storage.db import Database
from storage.errors import NotFoundError
from storage.records import ApiKey

T = TypeVar("T")


def _with_access(settings: Settings, action: Callable[[AccessRepository], Awaitable[T]]) -> T:
    async def run() -> T:
        await migrate_database(settings, "head")
        db = Database.open(settings.resolved_database_url())
        try:
            return await action(AccessRepository(db))
        finally:
            await db.dispose()

    return asyncio.run(run())


def cmd_create(settings: Settings, args: argparse.Namespace) -> int:
    name = args.name or f"{args.tenant}{' admin' if args.admin else ''}"
    key, secret = _with_access(
        settings,
        lambda access: access.create_key(
            args.tenant,
            name,
            is_admin=args.admin,
            requests_per_minute=args.requests_per_minute,
        ),
    )
    role = "admin key" if key.is_admin else "key"
    print(f"created {role} {key.id} ({name!r}) of tenant {args.tenant!r}", file=sys.stderr)
    print(
        "the secret is shown only now; send it as `Authorization: Bearer <secret>`:",
        file=sys.stderr,
    )
    print(secret)
    return 0


def cmd_list(settings: Settings, _args: argparse.Namespace) -> int:
    rows = _with_access(settings, lambda access: access.list_keys())
    print(f"{'id':>4}  {'tenant':<20} {'name':<24} {'prefix':<14} {'admin':<5} {'rpm':>6}  state")
    for key, tenant in rows:
        state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
        rpm = "-" if key.requests_per_minute is None else str(key.requests_per_minute)
        print(
            f"{key.id:>4}  {tenant:<20.20} {key.name:<24.24} {key.prefix:<14} "
            f"{'yes' if key.is_admin else 'no':<5} {rpm:>6}  {state}"
        )
    return 0


def cmd_revoke(settings: Settings, args: argparse.Namespace) -> int:
    async def revoke(access: AccessRepository) -> tuple[ApiKey, bool]:
        return await access.revoke_key(args.key_id), await access.has_active_keys()

    try:
        key, any_left = _with_access(settings, revoke)
    except NotFoundError:
        print(f"memchat keys revoke: no key with id {args.key_id}", file=sys.stderr)
        return 2
    print(f"revoked key {key.id} ({key.name!r})")
    if not any_left:
        print(
            "no active key is left: every request needs a key until one is created "
            "(the service does not go back to local mode, even on a restart, unless "
            "MEMCHAT_ACCESS__ALLOW_LOCAL_MODE_AFTER_KEYS=true)",
            file=sys.stderr,
        )
    return 0


def add_key_commands(commands: Any) -> None:
    keys = commands.add_parser("keys", help="API keys: create, list, revoke")
    verbs = keys.add_subparsers(dest="verb", required=True)
    create = verbs.add_parser("create", help="a new key of a tenant (created if new)")
    create.add_argument("--tenant", required=True, type=_tenant_name)
    create.add_argument("--admin", action="store_true", help="the key also reaches /admin")
    create.add_argument("--name", default=None, help="a label for listings")
    create.add_argument(
        "--requests-per-minute", type=int, default=None, help="this key's rate limit (0: none)"
    )
    create.set_defaults(run=cmd_create)
    listing = verbs.add_parser("list", help="every key, revoked ones included")
    listing.set_defaults(run=cmd_list)
    revoke = verbs.add_parser("revoke", help="revoke a key: it stops working at once")
    revoke.add_argument("key_id", type=int)
    revoke.set_defaults(run=cmd_revoke)


def _tenant_name(value: str) -> str:
    if not (1 <= len(value) <= 64) or not all(c.isalnum() or c in "._-" for c in value):
        raise argparse.ArgumentTypeError("1-64 letters, digits, '.', '_' or '-'")
    return value
