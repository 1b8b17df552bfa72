"""Strict request bodies: JSON decoded by msgspec without type coercion.

Litestar converts bodies leniently (0 for false, numbers for datetimes, "5" for 5);
the service's contract is the documented types, so bodies are decoded here instead,
and the OpenAPI document names each operation's body (see app/openapi.py); a body in any
other media type than JSON is refused (415). One leniency is JSON's own: 31.0 is an
integer in JSON Schema, so integral floats are taken as integers.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

import msgspec
from litestar import Request

from app.api.errors import BadBodyError
from retrieval.errors import InvalidInputError

T = TypeVar("T")
MAX_DEPTH = 64


def _normalise(value: Any, path: str = "$", depth: int = 0) -> Any:
    """Integral floats become ints; NUL characters (which PostgreSQL text cannot hold) refuse."""
    if depth > MAX_DEPTH:
        raise BadBodyError(422, f"the body nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise BadBodyError(422, f"text must not contain NUL (U+0000) - at `{path}`")
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_normalise(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        normalised = {}
        for key, item in value.items():
            _normalise(key, path, depth + 1)
            normalised[key] = _normalise(item, f"{path}.{key}", depth + 1)
        return normalised
    return value


def is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def strict_body(request: Request[Any, Any, Any], struct: type[T]) -> T:
    """The body as `struct`. Only JSON media types are taken: a web page can send
    `text/plain` or a form to any site without asking, but not JSON."""
    if not is_json_media_type(request.headers.get("content-type", "")):
        raise BadBodyError(415, "send the body as JSON, with `Content-Type: application/json`")
    raw = await request.body()
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadBodyError(400, f"the body is not valid JSON: {exc}") from exc
    return convert_strict(value, struct)


def convert_strict(value: Any, struct: type[T]) -> T:
    """Decoded JSON (or form fields) to `struct`, with the same rules as JSON bodies."""
    try:
        return msgspec.convert(_normalise(value), type=struct, strict=True)
    except msgspec.ValidationError as exc:
        raise BadBodyError(422, str(exc)) from exc


def instant(value: dt.datetime | None, field: str) -> dt.datetime | None:
    """A client's time as the instant in UTC (both databases then keep it); a time whose
    instant falls outside years 1 to 9999 (0001-01-01T00:00:00+00:01) is refused."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError as exc:
        raise InvalidInputError(field, "the time falls outside the years 1 to 9999 in UTC") from exc
