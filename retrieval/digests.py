"""Names for what is derived from a model file (converted graphs, word tables, tokenizers):
the file's digest, so that another file under the same name gets its own."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's SHA-256: names what is derived from it."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
