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


def _integral_floats_to_int(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise BadBodyError(422, f"the body nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_to_int(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {key: _integral_floats_to_int(item, depth + 1) for key, item in value.items()}
    return value


async def strict_body(request: Request[Any, Any, Any], struct: type[T]) -> T:
    raw = await request.body()
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadBodyError(400, f"the body is not valid JSON: {exc}") from exc
    try:
        return msgspec.convert(_integral_floats_to_int(value), type=struct, strict=True)
    except msgspec.ValidationError as exc:
        raise BadBodyError(422, str(exc)) from exc
