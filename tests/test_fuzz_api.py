"""Schemathesis fuzzes every operation of the app's own OpenAPI schema on a live server.

Any 5xx, any answer outside the documented status codes, content types or body schemas
fails. Examples per operation are bounded so that `make test` stays quick.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from app.factory import create_app
from app.settings import AccessSettings, Settings
from storage import migrate
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server

# Examples per operation: a short run in `make test`, a deeper one in `make fuzz`.
MAX_EXAMPLES = int(os.environ.get("MEMCHAT_FUZZ_EXAMPLES", "20"))


async def _migrate_with_key(url: str) -> str:
    """The migrated database and an admin key: every operation, /admin too, is reachable,
    and schemathesis checks that requests without it or with a wrong one are refused."""
    engine = create_engine(url)
    if engine.dialect.name == "postgresql":
        async with engine.begin() as connection:
            await connection.execute(text("DROP SCHEMA public CASCADE"))
            await connection.execute(text("CREATE SCHEMA public"))
    await migrate.upgrade(engine)
    _key, secret = await AccessRepository(Database(engine)).create_key(
        "fuzz", "fuzz", is_admin=True, requests_per_minute=0
    )
    await engine.dispose()
    return secret


@pytest.fixture(params=["sqlite", "postgres"])
def fuzz_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A live server on each database (PostgreSQL answers bad values in ways of its own)."""
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    if request.param == "postgres":
        url = str(request.getfixturevalue("postgres_server_url"))
    else:
        url = f"sqlite+aiosqlite:///{data_dir / 'memchat.db'}"
    secret = asyncio.run(_migrate_with_key(url))
    # Schemathesis sends each operation a wrong key once to see it refused: past a few,
    # the throttle of wrong keys per address (tests/test_failed_auth_limits.py) would
    # answer this address 429, as the key's own limit would (hence its 0 above).
    no_throttle = AccessSettings(failed_auth_per_minute=0)
    app = create_app(
        Settings(data_dir=data_dir, database_url=url, access=no_throttle),
        embedder=HashEmbedder(),
        # A window far above any valid message, so only real contract breaches fail.
        engine=ScriptedEngine(["A short reply."], context_window=1_000_000),
    )
    with live_server(app) as base:
        yield base, secret


def test_api_conforms_to_its_schema(fuzz_url: tuple[str, str]) -> None:
    base, secret = fuzz_url
    # The schemathesis CLI, not its pytest plugin: it runs every phase (examples,
    # coverage of boundaries and negative inputs, fuzzing, stateful links) with all checks.
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "--config-file",
            str(Path(__file__).parent / "schemathesis.toml"),
            "run",
            f"{base}/schema/openapi.json",
            "--header",
            f"Authorization: Bearer {secret}",
            "--checks",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            "20261130",
            # Text may not contain NUL (documented): PostgreSQL cannot store it.
            "--generation-allow-x00",
            "false",
            "--request-timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-4000:]
