"""The knowledge operations in the OpenAPI document: both request bodies and their limits.

`POST /v1/knowledge` takes JSON (`KnowledgeCreate`) or a multipart upload, which
Litestar cannot derive from a handler that reads the request itself.
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.api import schemas
from app.settings import Settings
from retrieval.text import VISIBLE_PATTERN

REF = "#/components/schemas/{name}"
PATH = "/v1/knowledge"


def upload_schema(settings: Settings) -> dict[str, Any]:
    return {
        "type": "object",
        "description": "One .txt, .md (UTF-8) or .pdf file (with extractable text), at most "
        f"{settings.knowledge.max_upload_bytes} bytes; the file's extension names its kind.",
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "title": {
                "type": "string",
                "minLength": 1,
                "maxLength": 500,
                "description": "default: the file name without extension",
            },
            "user_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 255,
                "description": "absent: shared knowledge",
            },
        },
        "required": ["file"],
        "additionalProperties": False,
    }


def knowledge_contract(document: dict[str, Any], settings: Settings) -> None:
    _, components = msgspec.json.schema_components(
        (schemas.KnowledgeCreate, schemas.KnowledgeDocument, schemas.KnowledgeDocumentList),
        ref_template=REF,
    )
    create = components["KnowledgeCreate"]
    create["additionalProperties"] = False
    create["properties"]["text"].update(
        minLength=1, maxLength=settings.knowledge.max_document_chars, pattern=VISIBLE_PATTERN
    )
    document["components"]["schemas"].update(components)
    post = document["paths"][PATH]["post"]
    # Links let clients (and stateful fuzzing) follow a new document to its operations.
    links = {
        f"{method.capitalize()}Document": {
            "operationRef": f"#/paths/~1v1~1knowledge~1{{document_id}}/{method}",
            "parameters": {"document_id": "$response.body#/id"},
        }
        for method in ("get", "delete")
    }
    for status in ("200", "201", "202"):
        post["responses"][status]["links"] = links
    post["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": REF.format(name="KnowledgeCreate")}},
            "multipart/form-data": {"schema": upload_schema(settings)},
        },
    }
