"""`memchat serve --workers N`: N uvicorn worker processes sharing one listening socket.

Each worker is a process of its own that builds its app from the environment
(`worker_app`, uvicorn's app factory), so each has its own in-memory turn indexes; the
per-user change counters in SQL keep them current, as between separate `memchat serve`
processes behind a load balancer. The workers share one data dir, so whatever several
processes cannot share is refused before any starts: SQLite (one writer process, and no
cross-process session lock), the FAISS files and an embedded Chroma (files of one
process). With PostgreSQL and a Chroma server the data dir holds only the embedder's
ONNX export, which is written atomically.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from app.settings import Settings

if TYPE_CHECKING:
    from litestar import Litestar

# uvicorn pings each worker this often and replaces one that does not answer within it;
# a worker loading its models on busy cores can be slow to answer.
HEALTHCHECK_TIMEOUT_S = 30


class UnsupportedWorkersError(ValueError):
    """Settings that several worker processes cannot share."""


def check_workers(settings: Settings, num_workers: int) -> None:
    """Raises unless `num_workers` processes can share these settings."""
    if num_workers <= 1:
        return
    missing = []
    if not settings.resolved_database_url().startswith("postgresql"):
        missing.append("a PostgreSQL database (MEMCHAT_DATABASE_URL=postgresql+asyncpg://...)")
    if settings.index.kind != "chroma" or not settings.chroma_url:
        missing.append(
            "the turn vectors in a Chroma server (MEMCHAT_INDEX__KIND=chroma and "
            "MEMCHAT_CHROMA_URL=http://...)"
        )
    if missing:
        raise UnsupportedWorkersError(
            f"--workers {num_workers} needs " + " and ".join(missing) + "; SQLite, the FAISS"
            " files and an embedded Chroma belong to one process (or run one `memchat serve`"
            " per data dir behind a load balancer, docs/operations.md#several-processes)"
        )


def _add_pid(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    event["pid"] = os.getpid()
    return event


def worker_app() -> Litestar:
    """uvicorn's factory, called in each worker: the settings from the environment (the
    parent put --host and --port there), every log line naming the worker's pid."""
    from app.cli.logs import configure_logging
    from app.cli.serving import serving_app

    settings = Settings()
    configure_logging(settings.log_level, extra_processors=(_add_pid,))
    return serving_app(settings)


def serve_workers(settings: Settings, num_workers: int) -> None:
    import uvicorn

    # The workers are spawned, not forked: they read their settings from the environment.
    os.environ["MEMCHAT_HOST"] = settings.host
    os.environ["MEMCHAT_PORT"] = str(settings.port)
    uvicorn.run(
        "app.cli.workers:worker_app",
        factory=True,
        workers=num_workers,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_worker_healthcheck=HEALTHCHECK_TIMEOUT_S,
    )
