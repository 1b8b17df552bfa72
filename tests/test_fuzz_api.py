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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

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


@contextmanager
def fuzzed_server(url: str, data_dir: Path) -> Iterator[tuple[str, str]]:
    """A live server on the database at `url` and its admin key."""
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


def schemathesis(base: str, secret: str, output: IO[str]) -> subprocess.Popen[str]:
    # The schemathesis CLI, not its pytest plugin: it runs every phase (examples,
    # coverage of boundaries and negative inputs, fuzzing, stateful links) with all checks.
    return subprocess.Popen(
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
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_api_conforms_to_its_schema_on_sqlite_and_postgres(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """A live server on each database (PostgreSQL answers bad values in ways of its own),
    both fuzzed at once: each run is mostly schemathesis generating cases, one process
    busy on one core, so the two take about the time of one."""
    urls = {
        "sqlite": f"sqlite+aiosqlite:///{tmp_path / 'sqlite' / 'memchat.db'}",
        "postgres": postgres_server_url,
    }
    runs: dict[str, subprocess.Popen[str]] = {}
    with ExitStack() as stack:
        try:
            for name, url in urls.items():
                (tmp_path / name).mkdir()
                base, secret = stack.enter_context(fuzzed_server(url, tmp_path / name))
                output = stack.enter_context((tmp_path / f"{name}.log").open("w"))
                runs[name] = schemathesis(base, secret, output)
            for run in runs.values():
                run.wait(timeout=600)
        finally:
            for run in runs.values():
                if run.poll() is None:
                    run.kill()
                    run.wait()
    for name, run in runs.items():
        output = (tmp_path / f"{name}.log").read_text()
        assert run.returncode == 0, f"on {name}:\n" + output[-16000:]
