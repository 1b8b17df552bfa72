from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.factory import create_app
from app.settings import EmbedderSettings, SecondEmbedderSettings, Settings
from retrieval.protocols import Embedder, Engine
from storage import migrate
from storage.db import create_engine
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.live import MODELS_DIR

if TYPE_CHECKING:
    from tests.vllm_servers import ServerPool

POSTGRES_ADMIN_URL = os.environ.get(
    "MEMCHAT_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
async def postgres_server_url() -> AsyncIterator[str]:
    """A fresh, empty database on the local PostgreSQL server, dropped at the end."""
    name = f"memchat_test_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


@pytest.fixture
async def postgres_url(postgres_server_url: str) -> AsyncIterator[str]:
    """The PostgreSQL test database, emptied and migrated to head for each test."""
    engine = create_engine(postgres_server_url)
    async with engine.begin() as connection:
        await connection.execute(text("DROP SCHEMA public CASCADE"))
        await connection.execute(text("CREATE SCHEMA public"))
    await migrate.upgrade(engine)
    await engine.dispose()
    yield postgres_server_url


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite database in the test's own directory."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'memchat.db'}"
    engine = create_engine(url)
    await migrate.upgrade(engine)
    await engine.dispose()
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A migrated database of each kind: every test that uses it runs on both."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=database_url)


@pytest.fixture
def embedder() -> HashEmbedder:
    return HashEmbedder()


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(["I will remember that.", "Here is an answer for you."])


@pytest.fixture
async def client(
    settings: Settings, embedder: Embedder, engine: Engine
) -> AsyncIterator[AsyncTestClient]:
    app = create_app(settings, embedder=embedder, engine=engine)
    async with local_client(app) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def onnx_cache_dir() -> Path:
    """Converted models, shared with the servers tests start (tests/live.py)."""
    return MODELS_DIR


@pytest.fixture(scope="session")
def real_embedder(onnx_cache_dir: Path) -> Embedder:
    """The default embedder as the service builds it from its default settings."""
    from app.adapters import EMBEDDERS

    config = EmbedderSettings()
    return EMBEDDERS[config.kind](config, onnx_cache_dir)


@pytest.fixture(scope="session")
def real_second_embedder(onnx_cache_dir: Path) -> Embedder:
    """The second dense list's embedder as the service builds it from its defaults."""
    from app.adapters import EMBEDDERS

    config = SecondEmbedderSettings()
    assert config.kind != "none"
    return EMBEDDERS[config.kind](config, onnx_cache_dir)


@pytest.fixture(scope="session")
async def real_engine() -> Engine:
    from retrieval.engines.llamacpp import LlamaCppEngine, default_model_path

    return await LlamaCppEngine.loaded(default_model_path(), context_window=2048)


@pytest.fixture(scope="session")
def chroma_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Chroma server for the whole run; tests keep apart by collection prefix."""
    from tests.chroma_server import chroma_server

    with chroma_server(tmp_path_factory.mktemp("chroma") / "server") as url:
        yield url


@pytest.fixture(scope="session")
def vllm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """The run's real vLLM servers on the CPU, started when a test first asks for them
    and shared by every module that does (tests/vllm_servers.py)."""
    from tests.vllm_servers import server_pool

    with server_pool(tmp_path_factory.mktemp("vllm")) as pool:
        yield pool
