"""Strict request bodies: JSON decoded by msgspec without type coercion.

Litestar converts bodies leniently (0 for false, numbers for datetimes, "5" for 5);
the service's contract is the documented types, so bodies are decoded here instead,
and the OpenAPI document names each operation's body (see app/openapi.py). One
leniency is JSON's own: 31.0 is an integer in JSON Schema, so integral floats are
taken as integers.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar import Request

from app.errors import BadBodyError

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


async def strict_body(request: Request[Any, Any, Any], struct: type[T]) -> T:
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
