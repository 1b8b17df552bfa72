"""Errors raised by the storage layer; library exceptions are translated here, at the edge."""


class StorageError(Exception):
    """Base class for storage failures."""


class NotFoundError(StorageError):
    """A requested row does not exist."""

    def __init__(self, kind: str, key: object) -> None:
        super().__init__(f"{kind} {key!r} not found")
        self.kind = kind
        self.key = key


class ConflictError(StorageError):
    """A write conflicts with rows already stored."""


class DatabaseUnavailableError(StorageError):
    """The database could not be reached or refused the operation."""


class InvalidDataError(StorageError):
    """The database refused a value as invalid for its column."""


class LockTimeoutError(StorageError):
    """A lock held by another connection was not granted within `timeout_s`."""

    def __init__(self, key: str, timeout_s: float) -> None:
        super().__init__(f"lock {key!r} not granted within {timeout_s:g} s")
        self.key = key
        self.timeout_s = timeout_s


class RestoreRefusedError(StorageError):
    """A row to restore names a row that is not stored, or one of another owner: the
    export is damaged or out of order. `position` is the row's place in its batch."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(reason)
        self.position = position
        self.reason = reason
