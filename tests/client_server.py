"""One real memchat server for the Python client's tests (tests/test_client*.py): the
service's default settings on SQLite, the deterministic hash embedder and a scripted
engine, served by uvicorn on a loopback port (tests/live.py), with API keys, so that
requests need one as they do outside local mode.

`max_pending_turns` is 1: one turn held in the engine (`engine.gate`) is enough for the
next to be refused with the API's 503 "engine busy".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.factory import create_app
from app.settings import ChatSettings, Settings
from storage import migrate
from storage.access import AccessRepository
from storage.db import Database, create_engine
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import live_server

REPLY = "Noted, 记下了。"


@dataclass(frozen=True)
class Server:
    url: str
    engine: ScriptedEngine
    api_key: str
    # A key of the same tenant allowed 2 requests a minute (its third is a 429).
    limited_key: str

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The session's stored turns as the server answers them, without the client."""
        response = httpx.get(
            f"{self.url}/v1/sessions/{session_id}/messages",
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        assert response.status_code == 200, response.text
        return list(response.json()["messages"])

    def turns(self, session_id: str) -> list[tuple[str, str]]:
        """The session's stored turns as (role, content)."""
        return [(m["role"], m["content"]) for m in self.messages(session_id)]


async def _keys(url: str) -> tuple[str, str]:
    engine = create_engine(url)
    await migrate.upgrade(engine)
    access = AccessRepository(Database(engine))
    try:
        _, api_key = await access.create_key("acme", "client tests")
        _, limited = await access.create_key("acme", "slow", requests_per_minute=2)
    finally:
        await engine.dispose()
    return api_key, limited


@asynccontextmanager
async def memchat_server(directory: Path) -> AsyncIterator[Server]:
    database_url = f"sqlite+aiosqlite:///{directory / 'memchat.db'}"
    api_key, limited = await _keys(database_url)
    settings = Settings(
        data_dir=directory / "data",
        database_url=database_url,
        chat=ChatSettings(max_pending_turns=1),
    )
    engine = ScriptedEngine([REPLY])
    app = create_app(settings, embedder=HashEmbedder(), engine=engine)
    with live_server(app) as url:
        yield Server(url, engine, api_key, limited)
