"""The current trace context on outgoing HTTP requests (W3C `traceparent`, `baggage`).

An httpx transport, so the engine adapters take it as they take any transport: a vLLM
request sent while a span is current continues that span's trace on the server. With
tracing off no span is ever current and nothing is added (the OpenTelemetry API alone is
a no-op).
"""

from __future__ import annotations

import httpx
from opentelemetry import propagate


class TraceContextTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        # The propagators of `OTEL_PROPAGATORS` (default: tracecontext, baggage).
        propagate.inject(request.headers)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
