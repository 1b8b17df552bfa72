"""Vector scopes are derived from SQL: on first use in a process, a scope is loaded and
made to hold exactly the vectors SQL has (the turn memory and the knowledge base alike)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from retrieval.protocols import VectorIndex

log = structlog.get_logger(__name__)


async def reconcile(
    index: VectorIndex,
    scope: int,
    sql_ids: set[int],
    add_missing: Callable[[set[int]], Awaitable[object]],
    *,
    event: str,
) -> None:
    """Load `scope`, drop the vectors SQL no longer has, add those it lacks with
    `add_missing` (ids in SQL, not in the index); logs `event` when anything changed."""
    result = await index.load(scope)
    extra = result.ids - sql_ids
    missing = sql_ids - result.ids
    await index.remove(scope, extra)
    if missing:
        await add_missing(missing)
    if result.status != "loaded" or extra or missing:
        log.info(
            event,
            scope=scope,
            status=result.status,
            num_added=len(missing),
            num_removed=len(extra),
        )
