"""OpenTelemetry traces: a server span per HTTP request, a span per stage of the work.

Off unless the standard variables ask for it (`tracer_provider_from_environment`):
`OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`, comma-separated) or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), unless
`OTEL_SDK_DISABLED=true`. The SDK reads the rest itself (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`, the exporter's
`OTEL_EXPORTER_OTLP_*`). Off, nothing here runs: no provider, no wrapper, no observer.

The retrieval layer names its stages (`retrieval.stages`); `SpanStages` makes each a
span, named and attributed after the OpenTelemetry GenAI semantic conventions where they
define the thing (`chat {model}` for the engine call, `embeddings {model}`, `retrieval
{index}`, `gen_ai.*` attributes), under `memchat.` otherwise. Message text reaches a span
only with `MEMCHAT_TRACING__CAPTURE_CONTENT=true` (`gen_ai.input.messages`,
`gen_ai.output.messages`). docs/operations.md lists every span and attribute.

Spans nest as the calls do (the OpenTelemetry context is a context variable): the
request's span holds the chat turn's, which holds its stages'. A request's `traceparent`
is honoured, so a trace goes on across a balancer in front of several processes, and
the engine's requests carry it on (`app.trace_context`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

from litestar import Litestar
from litestar.enums import ScopeType
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from app.observability.requests import METHODS
from retrieval.stages import Stage, StageValue, observing

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

TRACER_NAME = "memchat"
DEFAULT_SERVICE_NAME = "memchat"

# Values of the retrieval layer's stages that the GenAI conventions name; any other
# value `key` is published as `memchat.key`.
GENAI_ATTRIBUTES = {
    "session_id": "gen_ai.conversation.id",
    "model": "gen_ai.request.model",
    "max_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "cached_input_tokens": "gen_ai.usage.cache_read.input_tokens",
    "finish_reasons": "gen_ai.response.finish_reasons",
    "index": "gen_ai.data_source.id",
}
# Stages that are GenAI operations: the operation's name, and the value after which the
# span is named (`{operation} {value}`, as the conventions name such spans).
OPERATIONS = {
    "generation": ("chat", "model"),
    "embed": ("embeddings", "model"),
    "index_search": ("retrieval", "index"),
}
CONTENT_ATTRIBUTES = {"user": "gen_ai.input.messages", "assistant": "gen_ai.output.messages"}


# Setting up ---------------------------------------------------------------------------


def span_exporters_from_environment(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters the OpenTelemetry variables in `environ` ask for: none by default."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not names:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        names = "otlp" if endpoint else "none"
    return [
        _exporter(name.strip(), environ)
        for name in names.split(",")
        if name.strip() not in ("", "none")
    ]


def tracer_provider_from_environment(environ: Mapping[str, str]) -> TracerProvider | None:
    """A provider exporting where the OpenTelemetry variables in `environ` say, or None
    where they do not ask for traces (the default)."""
    exporters = span_exporters_from_environment(environ)
    if not exporters:
        return None
    service = environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    # The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={name!r}: memchat exports traces by otlp or console"
        )
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )
    if protocol != "grpc":
        raise ValueError(
            f"OTLP protocol {protocol!r}: memchat's OTLP exporter speaks grpc "
            "(OTEL_EXPORTER_OTLP_PROTOCOL=grpc, a collector's port 4317)"
        )
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, TLS and timeout from OTEL_EXPORTER_OTLP_*


class Tracing:
    """A provider's tracer, the observer of the stages and the request wrapper.

    `owns_provider`: the provider was made here (from the environment) and is shut down,
    its last spans exported, when the app stops.
    """

    def __init__(
        self, provider: TracerProvider, *, capture_content: bool, owns_provider: bool
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)
        self.stages = SpanStages(self.tracer, capture_content=capture_content)
        self._owns_provider = owns_provider

    def observing(self) -> AbstractContextManager[None]:
        """Stages of this context (the app's lifespan: its background tasks) are spans."""
        return observing(self.stages)

    def shutdown(self) -> None:
        if self._owns_provider:
            self.provider.shutdown()


def observing_stages(tracing: Tracing | None) -> AbstractContextManager[None]:
    return tracing.observing() if tracing is not None else nullcontext()


# Stages as spans ----------------------------------------------------------------------


def attributes_of(values: Mapping[str, StageValue]) -> dict[str, AttributeValue]:
    return {GENAI_ATTRIBUTES.get(key, f"memchat.{key}"): value for key, value in values.items()}


def span_name(stage: str, values: Mapping[str, StageValue]) -> str:
    operation = OPERATIONS.get(stage)
    if operation is None:
        return f"memchat.{stage}"
    name, after = operation
    return f"{name} {values[after]}" if after in values else name


class SpanStage:
    """One stage's span, as the retrieval layer's `Stage`."""

    def __init__(self, span: Span, *, capture_content: bool) -> None:
        self._span = span
        self._capture_content = capture_content

    def record(self, **values: StageValue) -> None:
        self._span.set_attributes(attributes_of(values))

    def content(self, role: str, text: str) -> None:
        if not self._capture_content:
            return
        # The conventions' message shape: a role and its parts.
        message = {"role": role, "parts": [{"type": "text", "content": text}]}
        self._span.set_attribute(
            CONTENT_ATTRIBUTES.get(role, "gen_ai.input.messages"),
            json.dumps([message], ensure_ascii=False),
        )


class SpanStages:
    """The retrieval layer's `StageObserver`: each stage a span of the current trace."""

    def __init__(self, tracer: trace.Tracer, *, capture_content: bool) -> None:
        self._tracer = tracer
        self._capture_content = capture_content

    @contextmanager
    def stage(self, name: str, values: Mapping[str, StageValue]) -> Iterator[Stage]:
        attributes = attributes_of(values)
        operation = OPERATIONS.get(name)
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation[0]
        # The engine is reached over the network (vLLM) or in this process (llama.cpp);
        # either way the conventions make the model call a client span.
        kind = SpanKind.CLIENT if name == "generation" else SpanKind.INTERNAL
        # Exceptions are not recorded as events: their messages may quote what a client
        # sent. A failure is the span's status and the exception's type (`error.type`).
        span = self._tracer.start_span(
            span_name(name, values),
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        parent = context.get_current()
        context.attach(trace.set_span_in_context(span, parent))
        try:
            yield SpanStage(span, capture_content=self._capture_content)
        except Exception as exc:  # marked and raised again, never handled here
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute("error.type", type(exc).__qualname__)
            raise
        finally:
            # The parent made current again, rather than the attach token reset: a turn
            # streamed to its client is begun in the request's task and ended in the
            # stream's, where a token of the first cannot be reset.
            context.attach(parent)
            span.end()


# Requests -----------------------------------------------------------------------------


def _carrier(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
    }


class TracedRequests:
    """ASGI wrapper: a server span per HTTP request, continuing the client's trace (its
    `traceparent`), named by route template once routing has found one; the stages of
    the request are spans under it."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self._app = app
        self._tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        # Any other method is "_OTHER" (the HTTP conventions): no client-made span names.
        method = scope["method"] if scope["method"] in METHODS else "_OTHER"
        status = 500  # what the client sees when the app fails before answering

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with (
            self._tracing.tracer.start_as_current_span(
                method if method != "_OTHER" else "HTTP",
                context=propagate.extract(_carrier(scope)),
                kind=SpanKind.SERVER,
                record_exception=False,
                attributes={
                    "http.request.method": method,
                    "url.path": scope["path"],
                    "url.scheme": scope.get("scheme", "http"),
                },
            ) as span,
            self._tracing.observing(),
        ):
            try:
                await self._app(scope, receive, send_status)
            finally:
                route = scope.get("path_template")
                if route and method != "_OTHER":
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))


def trace_requests(app: Litestar, tracing: Tracing) -> Litestar:
    """Wrap `app`'s ASGI handler in place, outside everything else."""
    app.asgi_handler = TracedRequests(app.asgi_handler, tracing)
    return app
