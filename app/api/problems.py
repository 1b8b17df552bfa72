"""OpenAPI documentation of the problem-details answers that routes can give."""

from __future__ import annotations

from http import HTTPStatus

from litestar.openapi import ResponseSpec

from app.api import schemas
from app.api.errors import PROBLEM_JSON

WHY = {
    400: "The body is not valid JSON.",
    404: "No such session, user or document.",
    409: "Conflicts with stored data.",
    413: "The body (or an uploaded file) exceeds the configured size cap.",
    415: "Not a supported media type (bodies) or file kind (.txt, .md, .pdf uploads).",
    422: "Invalid input; `errors` names each offending field.",
    503: (
        "A dependency (engine, database or vector store) is unavailable or busy; see "
        "Retry-After. `x-should-retry: true`: nothing was done, the same request may be sent "
        "again."
    ),
}


def problems(*statuses: int) -> dict[int, ResponseSpec]:
    return {
        status: ResponseSpec(
            data_container=schemas.ProblemDetails,
            media_type=PROBLEM_JSON,
            description=WHY.get(status, HTTPStatus(status).phrase),
        )
        for status in statuses
    }
