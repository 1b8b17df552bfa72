"""The composition root: `create_app(settings)` builds the whole object graph.

Heavy parts (embedder, engine) load in the app's lifespan, off the event loop, not at
import or construction time. Tests may pass ready-made parts (fakes or shared real
models); parts passed in are not closed by the app.
"""

from __future__ import annotations

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

from app.access.guard import RequestGuard
from app.access.keys import (
    PUBLIC_PATHS,
    AccessGate,
    AccessMiddleware,
    bootstrap_key,
    check_local_mode,
    provide_principal,
)
from app.api.admin import AdminController, Deployment
from app.api.admin_page import AdminLoginController, AdminPageController, form_token_field
from app.api.errors import EXCEPTION_HANDLERS
from app.api.facts import FactController
from app.api.health import healthz, readyz
from app.api.knowledge import KnowledgeController
from app.api.memory import MemoryController
from app.api.metrics import metrics
from app.api.openapi import ContractJsonRenderPlugin, ContractSwaggerRenderPlugin
from app.api.sessions import SamplingDefaults, SessionController
from app.observability.metrics import ServiceMetrics
from app.observability.requests import observe_requests
from app.runtime import Runtime, build_runtime, close_runtime
from app.settings import Settings
from retrieval.chat.service import ChatService
from retrieval.facts.memory import FactMemory
from retrieval.knowledge.base import KnowledgeBase
from retrieval.protocols import (
    Embedder,
    Engine,
)
from storage.repository import Store

log = structlog.get_logger(__name__)

TEMPLATES_DIR = Path(__file__).parent / "templates"


def create_app(
    settings: Settings, *, embedder: Embedder | None = None, engine: Engine | None = None
) -> Litestar:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        runtime = await build_runtime(
            settings, embedder=embedder, engine=engine, on_turn=service_metrics.observe_turn
        )
        try:
            local_mode = await check_local_mode(
                runtime.access, settings.host, bootstrap_key(settings)
            )
            gate.open(runtime.access, local_mode=local_mode)
            app.state.runtime = runtime
            log.info("memchat_ready", database=runtime.db_engine.url.render_as_string())
            yield
        finally:
            gate.close()
            await close_runtime(runtime)

    def provide_store(state: State) -> Store:
        return state.runtime.store

    def provide_chat_service(state: State) -> ChatService:
        return state.runtime.chat

    def provide_fact_memory(state: State) -> FactMemory:
        return state.runtime.facts

    def provide_knowledge(state: State) -> KnowledgeBase:
        return state.runtime.knowledge

    def provide_sampling() -> SamplingDefaults:
        return sampling

    def provide_deployment(state: State) -> Deployment:
        runtime: Runtime = state.runtime
        return Deployment(
            index_kind=settings.index.kind,
            index_dir=settings.index_dir,
            embedder=runtime.embedder.model_name,
            engine=runtime.engine.model_name,
        )

    def runtime_part(name: str) -> Provide:
        def provide(state: State) -> Any:
            return getattr(state.runtime, name)

        return Provide(provide, sync_to_thread=False)

    gate = AccessGate(settings.access.requests_per_minute)
    service_metrics = ServiceMetrics()
    sampling = SamplingDefaults(
        max_tokens=settings.engine.max_tokens,
        temperature=settings.engine.temperature,
        top_p=settings.engine.top_p,
        top_k=settings.engine.top_k,
    )
    dependencies: dict[str, Any] = {
        "store": Provide(provide_store, sync_to_thread=False),
        "chat_service": Provide(provide_chat_service, sync_to_thread=False),
        "fact_memory": Provide(provide_fact_memory, sync_to_thread=False),
        "sampling": Provide(provide_sampling, sync_to_thread=False),
        "knowledge": Provide(provide_knowledge, sync_to_thread=False),
        "principal": Provide(provide_principal, sync_to_thread=False),
        "deployment": Provide(provide_deployment, sync_to_thread=False),
        "access": runtime_part("access"),
        "operations": runtime_part("operations"),
        "turn_memory": runtime_part("memory"),
        "summaries": runtime_part("summaries"),
    }
    app = Litestar(
        route_handlers=[
            SessionController,
            MemoryController,
            FactController,
            KnowledgeController,
            AdminController,
            AdminLoginController,
            AdminPageController,
            healthz,
            readyz,
            metrics,
        ],
        state=State(
            {
                "metrics": service_metrics,
                "access_gate": gate,
                "admin_session_ttl_s": settings.access.admin_session_ttl_s,
            }
        ),
        middleware=[DefineMiddleware(AccessMiddleware, exclude=PUBLIC_PATHS)],
        dependencies=dependencies,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=[lifespan],
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
            engine_callback=lambda jinja: jinja.register_template_callable(
                "form_token_field", form_token_field
            ),
        ),
    )
    app.asgi_handler = RequestGuard(app.asgi_handler, gate, settings.access.local_hosts)
    return observe_requests(app, service_metrics)
