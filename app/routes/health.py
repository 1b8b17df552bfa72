"""Liveness and readiness probes."""

from __future__ import annotations

from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec

from app import schemas
from retrieval.protocols import MonitoredEngine
from storage.errors import StorageError


@get("/healthz", tags=["health"], sync_to_thread=False)
def healthz() -> schemas.Health:
    """The process is up; answers even while the engine is generating."""
    return schemas.Health(status="ok")


@get(
    "/readyz",
    tags=["health"],
    responses={503: ResponseSpec(data_container=schemas.Health, description="Not ready.")},
)
async def readyz(state: State) -> Response[schemas.Health]:
    checks: dict[str, str] = {}
    runtime = state.get("runtime")
    if runtime is None:
        return Response(schemas.Health("starting", {"runtime": "not started"}), status_code=503)
    try:
        await runtime.store.ping()
        checks["database"] = "ok"
    except StorageError as exc:
        checks["database"] = f"error: {exc}"
    checks["embedder"] = runtime.embedder.model_name
    checks["engine"] = runtime.engine.model_name
    checks["index"] = "ok"
    ready = checks["database"] == "ok"
    if isinstance(runtime.engine, MonitoredEngine):
        # An engine behind a network hop: not ready while no replica answers.
        checks["engine_health"] = await runtime.engine.check_health()
        ready = ready and checks["engine_health"].startswith("ok")
    return Response(
        schemas.Health("ready" if ready else "not ready", checks), status_code=200 if ready else 503
    )
