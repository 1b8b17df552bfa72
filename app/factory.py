"""The composition root: `create_app(settings)` builds the whole object graph.

Heavy parts (embedder, engine) load in the app's lifespan, off the event loop, not at
import or construction time. Tests may pass ready-made parts (fakes or shared real
models); parts passed in are not closed by the app.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.template.config import TemplateConfig
from opentelemetry.sdk.trace import TracerProvider

from app.access.keys import (
    PUBLIC_PATHS,
    AccessGate,
    AccessMiddleware,
    bootstrap_key,
    check_local_mode,
    provide_principal,
)
from app.access.proxies import ProxyTrust
from app.access.rate_limits import RedisRateLimits
from app.api.admin import AdminController, Deployment
from app.api.admin_inspector import AdminInspectorController
from app.api.admin_page import (
    AdminLoginController,
    AdminPageController,
    register_template_callables,
)
from app.api.completions import ChatCompletionController
from app.api.errors import EXCEPTION_HANDLERS
from app.api.export import ExportController
from app.api.facts import FactController
from app.api.guard import RequestGuard
from app.api.health import describe_backfill, healthz, readyz
from app.api.knowledge import KnowledgeController
from app.api.memory import MemoryController
from app.api.metrics import metrics
from app.api.openapi import ContractJsonRenderPlugin, ContractSwaggerRenderPlugin
from app.api.sessions import SamplingDefaults, SessionController
from app.mcp.http import mcp_endpoint
from app.observability.metrics import ServiceMetrics
from app.observability.requests import observe_requests
from app.observability.tracing import (
    Tracing,
    observing_stages,
    trace_requests,
    tracer_provider_from_environment,
)
from app.runtime import Runtime, build_runtime, close_runtime
from app.settings import Settings
from retrieval.protocols import Embedder, Engine

log = structlog.get_logger(__name__)

TEMPLATES_DIR = Path(__file__).parent / "templates"


def create_app(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    second_embedder: Embedder | None = None,
    engine: Engine | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Litestar:
    """`embedder` (and `second_embedder`), where given, replace the settings' embedders:
    see `build_runtime`. Traces go to `tracer_provider` where given, else where the
    OpenTelemetry environment variables say (nowhere by default)."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Background tasks started by the runtime trace their stages too.
        with observing_stages(tracing):
            runtime = await build_runtime(
                settings,
                embedder=embedder,
                second_embedder=second_embedder,
                engine=engine,
                on_turn=service_metrics.observe_turn,
                on_import=service_metrics.count_import,
            )
        try:
            local_mode = await check_local_mode(
                runtime.repositories.access,
                settings.host,
                bootstrap_key(settings),
                allow_after_keys=settings.access.allow_local_mode_after_keys,
            )
            gate.open(runtime.repositories.access, local_mode=local_mode)
            app.state.runtime = runtime
            log.info("memchat_ready", database=runtime.db.engine.url.render_as_string())
            yield
        finally:
            gate.close()
            await close_runtime(runtime)
            if shared_limits is not None:
                await shared_limits.aclose()
            if tracing is not None:
                tracing.shutdown()

    def provide_sampling() -> SamplingDefaults:
        return sampling

    def provide_deployment(state: State) -> Deployment:
        runtime: Runtime = state.runtime
        return Deployment(
            index_kind=settings.index.kind,
            index_dir=settings.index_dir,
            embedder=runtime.embedder.model_name,
            engine=runtime.engine.model_name,
            second_embedder=(
                runtime.second_embedder.model_name if runtime.second_embedder else None
            ),
            second_index=(
                describe_backfill(runtime.second_backfill.progress)
                if runtime.second_backfill
                else None
            ),
        )

    def part(path: str) -> Provide:
        """A part of the runtime by its attribute path (`repositories.sessions`)."""
        names = path.split(".")

        def provide(state: State) -> Any:
            value: Any = state.runtime
            for name in names:
                value = getattr(value, name)
            return value

        return Provide(provide, sync_to_thread=False)

    shared_limits = (
        RedisRateLimits.from_url(
            settings.access.redis_url,
            settings.access.redis_prefix,
            timeout_s=settings.access.redis_timeout_s,
        )
        if settings.access.redis_url
        else None
    )
    gate = AccessGate(
        settings.access.requests_per_minute,
        shared_limits,
        failed_auth_per_minute=settings.access.failed_auth_per_minute,
        proxies=ProxyTrust(settings.access.trusted_proxies),
    )
    mcp = mcp_endpoint(lambda: app.state.runtime)
    tracing = _tracing(settings, tracer_provider)
    service_metrics = ServiceMetrics()
    sampling = SamplingDefaults(
        max_tokens=settings.engine.max_tokens,
        temperature=settings.engine.temperature,
        top_p=settings.engine.top_p,
        top_k=settings.engine.top_k,
    )
    dependencies: dict[str, Any] = {
        "sampling": Provide(provide_sampling, sync_to_thread=False),
        "principal": Provide(provide_principal, sync_to_thread=False),
        "deployment": Provide(provide_deployment, sync_to_thread=False),
        # Use cases
        "turns": part("turns"),
        "previews": part("previews"),
        "history": part("history"),
        "conversations": part("conversations"),
        "chat_sessions": part("sessions"),
        "memory_search": part("search"),
        "fact_memory": part("facts"),
        "knowledge": part("knowledge"),
        "operations": part("operations"),
        "turn_memory": part("memory"),
        # Reads straight from the repositories
        "db": part("repositories.db"),
        "users": part("repositories.users"),
        "sessions": part("repositories.sessions"),
        "messages": part("repositories.messages"),
        "summaries": part("repositories.summaries"),
        "facts": part("repositories.facts"),
        "documents": part("repositories.knowledge"),
        "access": part("repositories.access"),
        "admin": part("repositories.admin"),
        "backup": part("repositories.backup"),
    }
    app = Litestar(
        route_handlers=[
            SessionController,
            ChatCompletionController,
            MemoryController,
            FactController,
            ExportController,
            KnowledgeController,
            AdminController,
            AdminInspectorController,
            AdminLoginController,
            AdminPageController,
            healthz,
            readyz,
            metrics,
            mcp.route,
        ],
        state=State(
            {
                "metrics": service_metrics,
                "access_gate": gate,
                "shared_rate_limits": shared_limits,
                "admin_session_ttl_s": settings.access.admin_session_ttl_s,
            }
        ),
        middleware=[DefineMiddleware(AccessMiddleware, exclude=PUBLIC_PATHS)],
        dependencies=dependencies,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=[lifespan, mcp.lifespan],
        openapi_config=OpenAPIConfig(
            title="memchat",
            version="0.1.0",
            path="/schema",
            render_plugins=[
                ContractJsonRenderPlugin(settings),
                ContractSwaggerRenderPlugin(settings, path="/swagger"),
            ],
        ),
        request_max_body_size=settings.max_request_bytes,
        template_config=TemplateConfig(
            directory=TEMPLATES_DIR,
            engine=JinjaTemplateEngine,
            engine_callback=register_template_callables,
        ),
    )
    app.asgi_handler = RequestGuard(app.asgi_handler, gate, settings.access.local_hosts)
    observe_requests(app, service_metrics)
    return trace_requests(app, tracing) if tracing is not None else app


def _tracing(settings: Settings, provider: TracerProvider | None) -> Tracing | None:
    owns_provider = provider is None
    if provider is None:
        provider = tracer_provider_from_environment(os.environ)
    if provider is None:
        return None
    return Tracing(
        provider,
        capture_content=settings.tracing.capture_content,
        owns_provider=owns_provider,
    )
