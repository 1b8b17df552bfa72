from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from llama_cpp import Llama

    from tests.vllm_servers import ServerPool


# The modules of the tests on real vLLM servers (marked `vllm`): run in parallel, they go to
# one worker (below), which starts the run's servers (`vllm_pool`) once.
VLLM_MODULES = frozenset(
    {"tests/test_stack_local.py", "tests/test_vllm_engine.py", "tests/test_vllm_templates.py"}
)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs two workers (pytest-xdist), each module a unit of work (its tests
    in order, its module fixtures made once, as in one process), but the vLLM modules
    together: one unit, sent first (it takes longest). (`--dist loadgroup` would group
    them by `xdist_group` marks, but those are lost under pytest 9.2: pytest-xdist issue
    1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class VllmFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0]
            return "vllm" if module in VLLM_MODULES else module

        def _assign_work_unit(self, node: Any) -> None:
            if "vllm" in self.workqueue:
                self.workqueue.move_to_end("vllm", last=False)
            super()._assign_work_unit(node)

    return VllmFirst(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stray = [
        item.nodeid
        for item in items
        if item.get_closest_marker("vllm") is not None
        and item.nodeid.partition("::")[0] not in VLLM_MODULES
    ]
    if stray:
        raise pytest.UsageError(f"tests marked vllm outside VLLM_MODULES: {stray[:3]}")


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


@pytest.fixture(scope="session")
async def postgres_head_template(postgres_server_url: str) -> AsyncIterator[str]:
    """A database migrated to head once for the run, the template of each test's (a copy
    takes a third of the time of a migration), dropped at the end."""
    name = postgres_server_url.rpartition("/")[2] + "_head"
    admin = create_async_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        engine = create_engine(f"{POSTGRES_ADMIN_URL.rpartition('/')[0]}/{name}")
        await migrate.upgrade(engine)
        await engine.dispose()  # a template takes no connections while copied
        yield name
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


@pytest.fixture
async def postgres_url(postgres_server_url: str, postgres_head_template: str) -> str:
    """The PostgreSQL test database, made afresh for each test as a copy of the one
    migrated to head (whatever the test before left in it, connections too, is gone)."""
    name = postgres_server_url.rpartition("/")[2]
    admin = create_async_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            await connection.execute(
                text(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_head_template}"')
            )
    finally:
        await admin.dispose()
    return postgres_server_url


@pytest.fixture(scope="session")
async def sqlite_head_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head once for the run, copied for each test."""
    path = tmp_path_factory.mktemp("sqlite-head") / "memchat.db"
    engine = create_engine(f"sqlite+aiosqlite:///{path}")
    await migrate.upgrade(engine)
    await engine.dispose()
    # The last connection closed checkpointed the write-ahead log into the file: the
    # file alone is the whole database.
    assert not path.with_name(path.name + "-wal").exists()
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_head_template: Path) -> str:
    """A migrated SQLite database in the test's own directory (a copy of the run's)."""
    path = tmp_path / "memchat.db"
    shutil.copyfile(sqlite_head_template, path)
    return f"sqlite+aiosqlite:///{path}"


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
async def real_engine(onnx_cache_dir: Path) -> Engine:
    """The embedded engine as the service builds it (its plain-text tokenizer kept with
    the converted models), in a 2,048-token context."""
    from retrieval.engines.llamacpp import LlamaCppEngine, default_model_path

    return await LlamaCppEngine.loaded(
        default_model_path(), context_window=2048, tokenizer_dir=onnx_cache_dir
    )


@pytest.fixture(scope="session")
def reference() -> Llama:
    """A vocabulary-only copy of the embedded model in llama.cpp: the tokens the engine's
    counts are checked against (`tests.test_token_counting.whole`)."""
    from llama_cpp import Llama

    from retrieval.engines.llamacpp import default_model_path

    return Llama(model_path=str(default_model_path()), vocab_only=True, verbose=False)


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
