"""Prometheus metrics: the route, and the engine's prefix-cache counters read on scrape.

vLLM counts prefix-cache lookups and hits in tokens (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`); the service republishes their sums over all replicas and
the hit rate, so one scrape of the API shows how much of the prompts the cache served.
Engines that run in process report none of these. The service's own metrics (turn
stages, context tokens, index sizes, requests) are in `app.observability`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from litestar import Response, get
from litestar.datastructures import State
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from retrieval.protocols import MonitoredEngine

if TYPE_CHECKING:
    from app.observability import ServiceMetrics


class EngineMetrics:
    """The engine servers' prefix-cache gauges, in the app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queries = Gauge(
            "memchat_engine_prefix_cache_queries_tokens",
            "Prompt tokens looked up in the engine servers' prefix caches since they started.",
            registry=registry,
        )
        self.hits = Gauge(
            "memchat_engine_prefix_cache_hits_tokens",
            "Prompt tokens served from the engine servers' prefix caches since they started.",
            registry=registry,
        )
        self.hit_rate = Gauge(
            "memchat_engine_prefix_cache_hit_rate",
            "Hits over queries of the engine servers' prefix caches (0 before any query).",
            registry=registry,
        )

    async def refresh(self, engine: object) -> None:
        if isinstance(engine, MonitoredEngine):
            queries, hits = await engine.prefix_cache_counters()
            self.queries.set(queries)
            self.hits.set(hits)
            self.hit_rate.set(hits / queries if queries else 0.0)


@get("/metrics", tags=["health"], media_type=CONTENT_TYPE_LATEST)
async def metrics(state: State) -> Response[bytes]:
    """Prometheus text format; engine and index figures appear once the service is started."""
    service_metrics: ServiceMetrics = state.metrics
    body = await service_metrics.render(state.get("runtime"))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
