"""The OpenAI-compatible operations in the OpenAPI document: their strict request body,
the models they serve, their stream, and their OpenAI-shaped errors."""

from __future__ import annotations

from typing import Any

import msgspec

from app.api import completions_wire as wire
from app.api.completions import SESSION_HEADER, USER_HEADER
from retrieval.prompt.budget import max_reply_tokens

REF = "#/components/schemas/{name}"
COMPLETIONS = "/v1/chat/completions"
MODELS = "/v1/models"
CLOSED = ("ChatCompletionRequest", "WireMessage", "ContentPart", "StreamOptions")
WHY = {
    "400": "Invalid or unsupported request; `error.param` names the field.",
    "401": "No API key, or an unknown or revoked one (outside local mode).",
    "403": "Not allowed (in local mode: addressed to another host, or from another site).",
    "404": "No such model, or a session of another tenant.",
    "409": "The named session belongs to another user.",
    "413": "The body exceeds the configured size cap.",
    "415": "The body is not sent as JSON.",
    "429": "This key's rate limit is reached; see Retry-After.",
    "503": "The engine, database or vector store is unavailable or busy; see Retry-After.",
}


def _error(description: str) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": REF.format(name="ErrorBody")}}}
    if description == WHY["403"]:
        # Refused before routing, as problem details, like every other path.
        content["application/problem+json"] = {
            "schema": {"$ref": REF.format(name="ProblemDetails")}
        }
    return {"description": description, "content": content}


def completions_contract(document: dict[str, Any], models: list[str], context_window: int) -> None:
    _, components = msgspec.json.schema_components(
        (wire.ChatCompletionRequest, wire.ChatCompletion, wire.ModelList, wire.ErrorBody),
        ref_template=REF,
    )
    for name in CLOSED:
        components[name]["additionalProperties"] = False
    request = components["ChatCompletionRequest"]
    request["properties"]["model"] = {"type": "string", "enum": models}
    request["required"] = sorted({*request.get("required", []), "user"})
    request["description"] = (
        f"`user` names whose memory this is; the {USER_HEADER} header may name it instead. "
        f"The {SESSION_HEADER} header (a UUID) names the session, created on first use; "
        "without it the conversation's first user message does."
    )
    for field in ("max_tokens", "max_completion_tokens"):
        option = next(o for o in request["properties"][field]["anyOf"] if o["type"] == "integer")
        option["maximum"] = max_reply_tokens(context_window)
    document["components"]["schemas"].update(components)
    operation = document["paths"][COMPLETIONS]["post"]
    operation["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": REF.format(name="ChatCompletionRequest")}}
        },
    }
    operation["responses"]["200"]["content"]["text/event-stream"] = {
        "schema": {
            "type": "string",
            "description": "`data:` lines of ChatCompletionChunk objects, then `data: [DONE]`",
        }
    }
    for path in (COMPLETIONS, MODELS):
        for current in document["paths"][path].values():
            if isinstance(current, dict) and "responses" in current:
                statuses = WHY if path == COMPLETIONS else ("401", "403", "429")
                for status in statuses:
                    current["responses"][status] = _error(WHY[status])
