"""Liveness and readiness probes."""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec

from app.access.rate_limits import RateLimiterUnavailableError, RedisRateLimits
from app.api import schemas
from retrieval.errors import IndexUnavailableError
from retrieval.protocols import MonitoredEngine
from retrieval.search.backfill import BackfillProgress
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.runtime import Runtime


@get("/healthz", tags=["health"], sync_to_thread=False)
def healthz() -> schemas.Health:
    """The process is up; answers even while the engine is generating."""
    return schemas.Health(status="ok")


async def _database(runtime: Runtime) -> str:
    """The database answers and takes a write (a full disk fails only writes)."""
    try:
        await runtime.db.ping()
        await runtime.db.check_writable()
    except StorageError as exc:
        return f"error: {exc}"
    return "ok"


def _disk(directory: Path, min_free_bytes: int) -> str:
    """Free space where SQLite and the index files live, against the configured floor."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    mib = free // (1024 * 1024)
    if free < min_free_bytes:
        return (
            f"error: {mib} MiB free for {directory}, below MEMCHAT_MIN_FREE_DISK_BYTES "
            f"({min_free_bytes // (1024 * 1024)} MiB)"
        )
    return f"ok ({mib} MiB free)"


async def _index(ping: Callable[[], Awaitable[None]]) -> str:
    """A vector index's store answers (Chroma: a heartbeat; FAISS is in process)."""
    try:
        await ping()
    except IndexUnavailableError as exc:
        return f"error: {exc}"
    return "ok"


async def _rate_limiter(limits: RedisRateLimits) -> str:
    """The Redis server that holds the rate limits shared by every API process."""
    try:
        await limits.ping()
    except RateLimiterUnavailableError as exc:
        return f"error: {exc}"
    return "ok (redis)"


def describe_backfill(progress: BackfillProgress) -> str:
    """The second dense list's state: complete, or how far its background completion is
    (searches meanwhile use the first list and BM25 for users not yet complete)."""
    if progress.is_complete:
        return f"complete ({progress.done} turns)"
    share = progress.as_dict()["share"]
    return (
        f"{'indexing' if progress.running else 'waiting to index'} {progress.done} of "
        f"{progress.total} turns ({float(share):.0%})"  # type: ignore[arg-type]
    )


async def dependency_checks(runtime: Runtime) -> dict[str, str]:
    """Each dependency's state: "ok", a model name (loaded), or "error: ..."."""
    checks = {
        "database": await _database(runtime),
        "disk": _disk(runtime.data_dir, runtime.min_free_disk_bytes),
        "embedder": runtime.embedder.model_name,
        "engine": runtime.engine.model_name,
        "index": await _index(runtime.memory.ping_index),
    }
    if runtime.second_embedder is not None:
        checks["second_embedder"] = runtime.second_embedder.model_name
    if runtime.second_backfill is not None:
        checks["second_index"] = describe_backfill(runtime.second_backfill.progress)
    if runtime.knowledge is not None:
        checks["knowledge_index"] = await _index(runtime.knowledge.ping_index)
    if isinstance(runtime.engine, MonitoredEngine):
        # An engine behind a network hop: "ok (n/m replicas)" or "error: ...".
        checks["engine_health"] = await runtime.engine.check_health()
    return checks


@get(
    "/readyz",
    tags=["health"],
    responses={503: ResponseSpec(data_container=schemas.Health, description="Not ready.")},
)
async def readyz(state: State) -> Response[schemas.Health]:
    """Ready while no dependency reports an error: `database` (a read and a write),
    `disk` (free space for the data dir), `index` (the turn index), `knowledge_index`,
    `engine_health` for an engine behind a network hop, and `rate_limiter` for
    rate limits kept in Redis (MEMCHAT_ACCESS__REDIS_URL);
    `embedder`, `second_embedder` and `engine` name the loaded models; `second_index`
    says whether every turn holds the second dense list's vector, else how many do
    while the rest are embedded in the background (searches are served meanwhile)."""
    runtime = state.get("runtime")
    if runtime is None:
        return Response(schemas.Health("starting", {"runtime": "not started"}), status_code=503)
    checks = await dependency_checks(runtime)
    shared_limits: RedisRateLimits | None = state.get("shared_rate_limits")
    if shared_limits is not None:
        checks["rate_limiter"] = await _rate_limiter(shared_limits)
    ready = not any(value.startswith("error: ") for value in checks.values())
    return Response(
        schemas.Health("ready" if ready else "not ready", checks), status_code=200 if ready else 503
    )
