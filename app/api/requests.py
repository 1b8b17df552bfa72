"""Strict request bodies: JSON decoded without type coercion, every string normalised.

Litestar converts bodies leniently (0 for false, numbers for datetimes, "5" for 5);
the service's contract is the documented types, so bodies are decoded here instead,
and the OpenAPI document names each operation's body (see app/openapi.py); a body in any
other media type than JSON is refused (415). One leniency is JSON's own: 31.0 is an
integer in JSON Schema, so integral floats are taken as integers.

This is the edge where client text comes in: every string of a body, keys included, is
normalised here once (`retrieval.text.normalise`), as are form fields and MCP tool
arguments (`incoming_text`); what follows never sees tag characters, direction controls
or text outside NFC. A key twice in one object, a lone surrogate and bytes that are not
UTF-8 are refused with where they are.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any, TypeVar

import anyio
import msgspec
from litestar import Request

from app.api.errors import BadBodyError
from retrieval.errors import InvalidInputError
from retrieval.facts.model import hides_instruction
from retrieval.text import normalise

T = TypeVar("T")
MAX_DEPTH = 64
# Bodies from this size on (a history import, a knowledge document) are decoded and
# normalised in a worker thread: the decoder's Python steps give up the GIL every few
# milliseconds, so the event loop keeps answering other requests meanwhile.
THREAD_BODY_BYTES = 64 * 1024

NUL_RULE = "text must not contain NUL (U+0000)"
HIDDEN_INSTRUCTION_RULE = (
    "the text spells an instruction to the assistant in invisible tag characters "
    "(U+E0020-U+E007E, which models read as ASCII letters); send it in plain letters"
)


def _refusal(value: str) -> tuple[int, str, str]:
    """The text as the service keeps it, or why it is refused (a status and a message):
    a lone surrogate (not Unicode: it cannot be stored or encoded), NUL (PostgreSQL text
    cannot hold it), or an instruction only tag characters spell, which `normalise`
    would silently drop. The common cases cost one scan: ASCII text none."""
    if "\x00" in value:
        return 422, NUL_RULE, value
    if value.isascii():
        return 0, "", value
    try:
        value.encode("utf-8")  # quicker than a scan for surrogates
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        return (
            400,
            (
                f"the body holds a lone surrogate (U+{code:04X}); a \\uD800-\\uDFFF escape is "
                "only half of a character, and must be followed by its other half "
                "(\\uD83D\\uDE00 is one emoji)"
            ),
            value,
        )
    kept = normalise(value)
    # Only text that loses characters can have hidden an instruction in them.
    if kept != value and hides_instruction(value):
        return 422, HIDDEN_INSTRUCTION_RULE, value
    return 0, "", kept


def incoming_text(value: str, field: str) -> str:
    """A client's text outside a JSON body (MCP tool arguments, form fields) as the
    service keeps it (`retrieval.text.normalise`), by the rules of JSON bodies."""
    status, message, kept = _refusal(value)
    if status:
        raise InvalidInputError(field, message)
    return kept


def _body_text(value: str, path: str) -> str:
    status, message, kept = _refusal(value)
    if status == 400:
        raise BadBodyError(400, message.replace("; ", f" at `{path}`: ", 1))
    if status:
        raise BadBodyError(status, f"{message} - at `{path}`")
    return kept


def _normalise(value: Any, path: str = "$", depth: int = 0) -> Any:
    """Every string (keys too) as the service keeps it (see `_text_refusal` for what is
    refused); integral floats become ints. Two keys of an object that are the same once
    normalised are refused like any duplicate key."""
    if depth > MAX_DEPTH:
        raise BadBodyError(422, f"the body nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        return _body_text(value, path)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_normalise(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        normalised = {}
        for key, item in value.items():
            name = _body_text(key, path)
            if name in normalised:
                raise _duplicate(name, path)
            normalised[name] = _normalise(item, f"{path}.{name}", depth + 1)
        return normalised
    return value


def _duplicate(key: str, path: str) -> BadBodyError:
    return BadBodyError(
        422,
        f"the key `{key}` appears more than once in one object; each key may appear once "
        f"- at `{path}.{key}`",
    )


class _DuplicateKeyError(Exception):
    pass


class _Duplicated(dict[str, Any]):
    """An object of the body with a repeated key (found on a second reading, for its path)."""

    key = ""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _DuplicateKeyError
    return found


def _marking_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) == len(pairs):
        return found
    seen: set[str] = set()
    marked = _Duplicated(found)
    for key, _ in pairs:
        if key in seen:
            marked.key = key
            break
        seen.add(key)
    return marked


def _first_duplicate(value: Any, path: str) -> BadBodyError | None:
    if isinstance(value, _Duplicated):
        return _duplicate(value.key, path)
    items: Any = ()
    if isinstance(value, dict):
        items = ((f"{path}.{key}", item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    for where, item in items:
        if found := _first_duplicate(item, where):
            return found
    return None


def _finite(number: str) -> float:
    value = float(number)
    if math.isinf(value):
        raise ValueError(f"the number {number[:40]} is too large")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes) -> Any:
    """A JSON body, decoded strictly: UTF-8 only, no NaN or Infinity, and no object with
    a key twice (msgspec, like most decoders, keeps the last of a repeated key, so
    `{"user": "carol", "user": "alice"}` would read as alice to one reader and carol to
    another). The standard library's decoder is used for its `object_pairs_hook`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBodyError(
            400,
            f"the body is not valid UTF-8: byte 0x{raw[exc.start]:02X} at offset {exc.start} "
            "begins no character; send the body encoded as UTF-8",
        ) from exc
    try:
        return json.loads(
            text, object_pairs_hook=_unique_keys, parse_float=_finite, parse_constant=_no_constant
        )
    except _DuplicateKeyError:
        marked = json.loads(text, object_pairs_hook=_marking_duplicates)
        raise _first_duplicate(marked, "$") or BadBodyError(422, "a key appears twice") from None
    except (ValueError, RecursionError) as exc:
        raise BadBodyError(400, f"the body is not valid JSON: {exc}") from exc


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
    if len(raw) < THREAD_BODY_BYTES:
        return _decode_strict(raw, struct)
    return await anyio.to_thread.run_sync(_decode_strict, raw, struct)


def _decode_strict(raw: bytes, struct: type[T]) -> T:
    return convert_strict(decode_json(raw), struct)


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
