"""The export route in the OpenAPI document: its answer is lines, each a record.

OpenAPI 3.1 has no way to give the schema of each line of a JSON-lines answer (3.2's
`itemSchema` does), so the answer's schema is a string and the records' own schemas,
msgspec's of the export format (`storage.backup.lines`), are given as `x-itemSchema`,
each record a component schema of its own. A link from a new session's answer to the
export of its user lets clients (and stateful fuzzing) export a user that exists.
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.api.export import NDJSON, PATH
from storage.backup.lines import Record

REF = "#/components/schemas/{name}"


def export_contract(document: dict[str, Any]) -> None:
    record, components = msgspec.json.schema_components((Record,), ref_template=REF)
    document["components"]["schemas"].update(components)
    answer = document["paths"][PATH]["get"]["responses"]["200"]
    answer["content"] = {
        NDJSON: {
            "schema": {
                "type": "string",
                "description": "One JSON record a line, each ended by a newline (`\\n`).",
            },
            "x-itemSchema": record[0],
        }
    }
    created = document["paths"]["/v1/sessions"]["post"]["responses"]["201"]
    created.setdefault("links", {})["ExportUser"] = {
        "operationRef": "#/paths/~1v1~1users~1{user_id}~1export/get",
        "parameters": {"user_id": "$response.body#/user_id"},
    }
