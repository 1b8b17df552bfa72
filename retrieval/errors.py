"""Errors raised by the retrieval layer."""


class RetrievalError(Exception):
    """Base class for retrieval failures."""


class InvalidInputError(RetrievalError):
    """Input that the service refuses; `field` names the offending request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ContextTooLongError(InvalidInputError):
    """The new message alone does not fit in the engine's context window."""


class EmbeddingModelMismatchError(RetrievalError):
    """Stored vectors were made by another embedding model than the configured one."""


class IndexCorruptError(RetrievalError):
    """A persisted vector index could not be read."""


class EngineError(RetrievalError):
    """The LLM engine failed to produce a reply."""


class EngineTimeoutError(EngineError):
    """The LLM engine did not finish within its time limit."""


class EngineUnavailableError(EngineError):
    """The LLM engine is not loaded or cannot be reached."""


class EngineBusyError(EngineUnavailableError):
    """Too many turns are already waiting for the engine; nothing was stored."""


class SessionBusyError(RetrievalError):
    """Another process held the session (a turn, an import, a deletion) for longer than
    the lock wait allows; nothing was stored."""

    def __init__(self, session_id: str, timeout_s: float) -> None:
        super().__init__(
            f"session {session_id!r} is busy with another request: not free within {timeout_s:g} s"
        )
        self.session_id = session_id
        self.timeout_s = timeout_s


class IndexUnavailableError(RetrievalError):
    """A vector store (e.g. a Chroma server) cannot be reached or refused the operation."""


class UnreadableDocumentError(InvalidInputError):
    """An uploaded file that is empty, not text of the expected kind, or cannot be parsed."""


class UnsupportedDocumentError(InvalidInputError):
    """An uploaded file of a kind the knowledge base does not take."""


class TooLargeError(InvalidInputError):
    """Input over a configured size limit (a 413 at the edge)."""


class DocumentTooLargeError(TooLargeError):
    """An uploaded file or text over the configured size limit."""
