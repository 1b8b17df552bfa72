"""The served OpenAPI document states what the service enforces.

Litestar derives paths and responses from the handlers; the body schemas are replaced by
msgspec's own (which keep every constraint: Litestar drops zero bounds such as
`temperature >= 0`), request bodies are closed (`additionalProperties: false`, as the
structs refuse unknown fields), and limits that are settings rather than constants are
written in. Clients and schema-driven fuzzers then see the real contract.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin

from app.api import admin_schemas, schemas
from app.api.completions import served_models
from app.api.openapi_completions import completions_contract
from app.api.openapi_export import export_contract
from app.api.openapi_knowledge import knowledge_contract
from app.settings import Settings
from retrieval.prompt.budget import max_reply_tokens
from retrieval.text import VISIBLE_PATTERN

STRUCTS = (
    schemas.SessionCreate,
    schemas.Session,
    schemas.SessionList,
    schemas.MessageCreate,
    schemas.Turn,
    schemas.MessageList,
    schemas.HistoryImport,
    schemas.HistoryImported,
    schemas.SearchRequest,
    schemas.SearchResponse,
    schemas.ContextRequest,
    schemas.ContextPreview,
    schemas.Health,
    schemas.ProblemDetails,
    schemas.FactCreate,
    schemas.FactUpdate,
    schemas.Fact,
    schemas.FactList,
    admin_schemas.AdminSearch,
)
# What msgspec accepts as a datetime: RFC 3339, the offset optional (then UTC). 29 February
# is left out, as a pattern cannot tell leap years; the server still accepts it in them.
# `$(?!\n)`: Python's `$` (schemathesis reads the pattern with it) allows a final newline.
RFC3339 = (
    r"^(000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})-"
    r"((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))"
    r"[Tt ]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)?$(?!\n)"
)
REQUEST_BODIES = {
    ("/v1/sessions", "post"): "SessionCreate",
    ("/v1/sessions/{session_id}/messages", "post"): "MessageCreate",
    ("/v1/sessions/{session_id}/history", "post"): "HistoryImport",
    ("/v1/sessions/{session_id}/context", "post"): "ContextRequest",
    ("/v1/memory/search", "post"): "SearchRequest",
    ("/v1/users/{user_id}/facts", "post"): "FactCreate",
    ("/v1/facts/{fact_id}", "patch"): "FactUpdate",
    ("/admin/v1/facts/{fact_id}", "patch"): "FactUpdate",
    ("/admin/v1/users/{user_pk}/search", "post"): "AdminSearch",
}
PUBLIC = ("/healthz", "/readyz", "/metrics")
SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API key from `memchat keys create`. Not needed in local mode (no key "
    "exists, loopback only).",
}

TEXT_FIELDS = {
    "MessageCreate": "content",
    "HistoryMessage": "content",
    "ContextRequest": "content",
    "SearchRequest": "query",
    "AdminSearch": "query",
}


def body_schemas(settings: Settings, context_window: int) -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        STRUCTS, ref_template="#/components/schemas/{name}"
    )
    for name, schema in components.items():
        if name in ("SessionCreate", "MessageCreate", "HistoryMessage", "HistoryImport",
                    "SearchRequest", "ContextRequest", "FactCreate", "FactUpdate",
                    "AdminSearch"):  # fmt: skip
            schema["additionalProperties"] = False
    for name, field in TEXT_FIELDS.items():
        components[name]["properties"][field].update(
            minLength=1, maxLength=settings.chat.max_content_chars, pattern=VISIBLE_PATTERN
        )
    for name in ("FactCreate", "FactUpdate"):
        _string_option(components[name]["properties"]["text"])["pattern"] = VISIBLE_PATTERN
    components["HistoryImport"]["properties"]["messages"]["maxItems"] = (
        settings.chat.max_import_messages
    )
    components["HistoryImport"]["description"] = (
        f"At most {settings.chat.max_import_messages} messages of at most "
        f"{settings.chat.max_content_chars} characters each, and at most "
        f"{settings.chat.max_import_chars} characters together (else 413)."
    )
    components["SessionCreate"]["properties"]["metadata"]["description"] = (
        f"Free-form JSON object, at most {settings.chat.max_metadata_bytes} bytes encoded "
        "(else 422)."
    )
    created_at = components["HistoryMessage"]["properties"]["created_at"]
    _string_option(created_at)["pattern"] = RFC3339
    for name in ("MessageCreate", "ContextRequest"):
        option = _integer_option(components[name]["properties"]["max_tokens"])
        option["maximum"] = max_reply_tokens(context_window)
    return components


def _option(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(o for o in schema.get("anyOf", [schema]) if o.get("type") == kind)


def _string_option(schema: dict[str, Any]) -> dict[str, Any]:
    return _option(schema, "string")


def _integer_option(schema: dict[str, Any]) -> dict[str, Any]:
    return _option(schema, "integer")


def contract_document(
    document: dict[str, Any], settings: Settings, context_window: int, models: list[str]
) -> dict[str, Any]:
    patched = copy.deepcopy(document)
    patched["info"]["description"] = (
        "Conversational memory for LLM chat. Bodies are strict JSON (no type coercion;"
        " unknown fields are refused); text may not contain NUL (U+0000). Errors are RFC 9457"
        " problem details, except on the OpenAI-compatible routes (/v1/chat/completions,"
        " /v1/models), which answer OpenAI's error objects."
    )
    patched.setdefault("components", {}).setdefault("schemas", {}).update(
        body_schemas(settings, context_window)
    )
    for (path, method), struct in REQUEST_BODIES.items():
        operation = patched["paths"][path][method]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{struct}"}}},
        }
        operation["responses"].setdefault("415", _problem("The body is not sent as JSON."))
    turn = patched["paths"]["/v1/sessions/{session_id}/messages"]["post"]["responses"]["200"]
    turn["content"]["text/event-stream"] = {
        "schema": {
            "description": "`token` events ({text}), then one `done` (the Turn body) or `error`"
            " (problem details)",
            "type": "object",
            "properties": {
                "event": {"type": "string", "enum": ["token", "done", "error"]},
                "data": {"type": "string"},
            },
            "required": ["event", "data"],
        }
    }
    knowledge_contract(patched, settings)
    export_contract(patched)
    completions_contract(patched, models, context_window)
    _security(patched)
    return patched


def _security(document: dict[str, Any]) -> None:
    """Bearer keys everywhere but the probes; 401 and 429 may answer any secured call."""
    document["components"]["securitySchemes"] = {"apiKey": SECURITY_SCHEME}
    document["security"] = [{"apiKey": []}]
    refusals = {
        "401": "No API key, or an unknown or revoked one (outside local mode).",
        "403": "Not allowed: an admin route without an admin key; in local mode, a request "
        "addressed to another host, or a browser's request from another site or origin.",
        "429": "This key's rate limit is reached; see Retry-After.",
    }
    for path, operations in document["paths"].items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            if path in PUBLIC:
                operation["security"] = []
                continue
            for status, why in refusals.items():
                operation["responses"].setdefault(status, _problem(why))


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
        },
    }


class _Contract:
    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._settings = settings
        self._document: dict[str, Any] | None = None

    def contract(
        self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]
    ) -> dict[str, Any]:
        """Built on first use, when the engine (and so its context window) is loaded."""
        if self._document is None:
            engine = request.app.state.runtime.engine
            self._document = contract_document(
                openapi_schema, self._settings, engine.context_window, served_models(engine)
            )
        return self._document


class ContractJsonRenderPlugin(_Contract, JsonRenderPlugin):
    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.contract(request, openapi_schema))


class ContractSwaggerRenderPlugin(_Contract, SwaggerRenderPlugin):
    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, self.contract(request, openapi_schema))
