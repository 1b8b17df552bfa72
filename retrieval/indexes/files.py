"""Files of derived state (vector indexes, lexical indexes, vocabularies), sealed with a checksum
and written atomically: a file is either whole and ours, or not used at all."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DIGEST_BYTES = 32


def seal(magic: bytes, payload: bytes) -> bytes:
    return magic + hashlib.sha256(payload).digest() + payload


def unseal(magic: bytes, data: bytes) -> bytes | None:
    """The payload of sealed bytes, or None if they are not an intact file of `magic`."""
    start = len(magic) + DIGEST_BYTES
    if not data.startswith(magic) or len(data) < start:
        return None
    payload = data[start:]
    if hashlib.sha256(payload).digest() != data[len(magic) : start]:
        return None
    return payload


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file, flush it to disk, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # processes may share a dir
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
