"""The text of uploaded files: UTF-8 text and Markdown as they are, PDF through pypdf.

Every refusal names the file and says why, so the API can answer with a clear 4xx:
unsupported kinds, empty files, files over the limit, text that is not UTF-8 and PDFs
that cannot be parsed or hold no extractable text (scanned pages are images).
"""

from __future__ import annotations

import io
import logging
import struct
import zlib
from pathlib import PurePath

from pypdf import PdfReader
from pypdf.errors import PyPdfError

from retrieval.errors import (
    DocumentTooLargeError,
    UnreadableDocumentError,
    UnsupportedDocumentError,
)

SOURCES = {".txt": "txt", ".text": "txt", ".md": "md", ".markdown": "md", ".pdf": "pdf"}
FIELD = "file"
# What a malformed PDF makes pypdf raise besides its own errors.
_PDF_ERRORS = (
    PyPdfError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    AssertionError,
    ZeroDivisionError,
    RecursionError,
    struct.error,
    zlib.error,
    OSError,
)

# pypdf logs every oddity of a damaged file as a warning; the refusal says enough.
logging.getLogger("pypdf").setLevel(logging.ERROR)


def source_of(filename: str) -> str:
    suffix = PurePath(filename).suffix.lower()
    if suffix not in SOURCES:
        raise UnsupportedDocumentError(
            FIELD, f"{filename!r} is not a .txt, .md or .pdf file; only those are taken"
        )
    return SOURCES[suffix]


def read_upload(filename: str, data: bytes, max_bytes: int) -> tuple[str, str]:
    """(source kind, text) of an uploaded file."""
    source = source_of(filename)
    if not data:
        raise UnreadableDocumentError(FIELD, f"{filename!r} is empty")
    if len(data) > max_bytes:
        raise DocumentTooLargeError(
            FIELD, f"{filename!r} has {len(data)} bytes; the limit is {max_bytes}"
        )
    text = pdf_text(filename, data) if source == "pdf" else _utf8(filename, data)
    if not text.strip():
        raise UnreadableDocumentError(FIELD, f"{filename!r} has no text")
    return source, text


def _utf8(filename: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableDocumentError(
            FIELD, f"{filename!r} is not UTF-8 text (byte {exc.start} cannot be decoded)"
        ) from exc
    if "\x00" in text:
        raise UnreadableDocumentError(FIELD, f"{filename!r} contains NUL (U+0000): not text")
    return text


def pdf_text(filename: str, data: bytes) -> str:
    """The text of every page, pages separated by blank lines."""
    if not data.lstrip()[:5] == b"%PDF-":
        raise UnreadableDocumentError(FIELD, f"{filename!r} is not a PDF (no %PDF- header)")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnreadableDocumentError(FIELD, f"{filename!r} is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
    except _PDF_ERRORS as exc:
        raise UnreadableDocumentError(FIELD, f"{filename!r} is not a readable PDF: {exc}") from exc
    text = "\n\n".join(page.strip() for page in pages).replace("\x00", "")
    if not text.strip():
        raise UnreadableDocumentError(
            FIELD, f"{filename!r} has no extractable text (scanned pages are not read)"
        )
    return text
