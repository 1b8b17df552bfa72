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
