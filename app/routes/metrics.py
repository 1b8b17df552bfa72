"""Prometheus metrics: the engine's prefix-cache counters, read from its servers on scrape.

vLLM counts prefix-cache lookups and hits in tokens (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`); the service republishes their sums over all replicas and
the hit rate, so one scrape of the API shows how much of the prompts the cache served.
Engines that run in process report none of these.
"""

from __future__ import annotations

from litestar import Response, get
from litestar.datastructures import State
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from retrieval.protocols import MonitoredEngine


class EngineMetrics:
    """One registry per app (never the global one: tests build many apps)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queries = Gauge(
            "memchat_engine_prefix_cache_queries_tokens",
            "Prompt tokens looked up in the engine servers' prefix caches since they started.",
            registry=self.registry,
        )
        self.hits = Gauge(
            "memchat_engine_prefix_cache_hits_tokens",
            "Prompt tokens served from the engine servers' prefix caches since they started.",
            registry=self.registry,
        )
        self.hit_rate = Gauge(
            "memchat_engine_prefix_cache_hit_rate",
            "Hits over queries of the engine servers' prefix caches (0 before any query).",
            registry=self.registry,
        )

    async def render(self, engine: object) -> bytes:
        if isinstance(engine, MonitoredEngine):
            queries, hits = await engine.prefix_cache_counters()
            self.queries.set(queries)
            self.hits.set(hits)
            self.hit_rate.set(hits / queries if queries else 0.0)
        return bytes(generate_latest(self.registry))


@get("/metrics", tags=["health"], media_type=CONTENT_TYPE_LATEST)
async def metrics(state: State) -> Response[bytes]:
    """Prometheus text format; engine gauges appear once the service is started."""
    runtime = state.get("runtime")
    metrics_of: EngineMetrics = state.engine_metrics
    body = await metrics_of.render(runtime.engine if runtime is not None else None)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
