"""Prometheus metrics: the route, and the engine's prefix-cache counters read on scrape.

vLLM counts prefix-cache lookups and hits in tokens (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`); the service republishes their sums over all replicas and
the hit rate, so one scrape of the API shows how much of the prompts the cache served.
Engines that run in process report none of these. The service's own metrics (turn
stages, context tokens, index sizes, requests) are in `app.observability.metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from litestar import Response, get
from litestar.datastructures import State
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from app.observability.metrics import ServiceMetrics


@get("/metrics", tags=["health"], media_type=CONTENT_TYPE_LATEST)
async def metrics(state: State) -> Response[bytes]:
    """Prometheus text format; engine and index figures appear once the service is started."""
    service_metrics: ServiceMetrics = state.metrics
    body = await service_metrics.render(state.get("runtime"))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
