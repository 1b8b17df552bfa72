"""`MemchatClient` and `AsyncMemchatClient`: the REST API as typed Python calls.

Each route is described once in `memchat.routes`; the two clients only send those calls
(blocking, or on the event loop), so each public method is one line per client. Bodies
are `memchat.types` structs; an error answer is raised as a `memchat.errors` exception
carrying the server's problem details.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import httpx

from memchat import routes, types
from memchat.answers import RetryPolicy, error_of
from memchat.errors import ServerUnreachableError
from memchat.events import EventReader
from memchat.export import ExportReader, ExportRecord, partial_file

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"
# Generation on a CPU can take a while; connecting should not.
DEFAULT_TIMEOUT = httpx.Timeout(120.0, connect=5.0)


def _headers(api_key: str | None) -> dict[str, str]:
    """The key from the argument, else `MEMCHAT_API_KEY`; none in local mode."""
    key = api_key if api_key is not None else os.environ.get("MEMCHAT_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _turn_body(content: str, stream: bool, sampling: types.Sampling) -> types.MessageCreate:
    return types.MessageCreate(content=content, stream=stream, **sampling)


def _unreachable(base_url: httpx.URL, exc: httpx.TransportError) -> ServerUnreachableError:
    return ServerUnreachableError(f"memchat at {base_url}: {type(exc).__name__}: {exc}")


class MemchatClient:
    """A blocking client. `api_key` defaults to `MEMCHAT_API_KEY`; `retry` says how
    often a request the API allows to be retried is sent again (`RetryPolicy(0)`:
    never); `transport` is an httpx transport (tests give a scripted one)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self._retry = retry or RetryPolicy()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, call: routes.Call[Any], stream: bool = False) -> httpx.Response:
        """The answer to `call`, sent again while the API says to retry; raises the
        typed error of an error answer. A streamed answer is returned unread."""
        for num_retries in range(self._retry.max_retries + 1):
            try:
                response = self._http.send(call.request(self._http), stream=stream)
            except httpx.TransportError as exc:
                raise _unreachable(self._http.base_url, exc) from exc
            if response.is_success:
                return response
            content = response.read()
            wait = self._retry.wait_s(
                response, is_idempotent=call.is_idempotent, num_retries=num_retries
            )
            if wait is None:
                raise error_of(response, content)
            time.sleep(wait)
        raise AssertionError("unreachable: the last try raises or returns")

    def _send(self, call: routes.Call[T]) -> T:
        return call.answer(self._request(call).content)

    @contextmanager
    def _streamed(self, call: routes.Call[Any]) -> Iterator[httpx.Response]:
        """The answer to `call`, to be read as it arrives; closed after."""
        response = self._request(call, stream=True)
        try:
            yield response
        except httpx.TransportError as exc:
            raise _unreachable(self._http.base_url, exc) from exc
        finally:
            response.close()

    # Sessions and turns ---------------------------------------------------------------

    def create_session(
        self, user_id: str, title: str | None = None, metadata: dict[str, Any] | None = None
    ) -> types.Session:
        return self._send(routes.create_session(user_id, title, metadata))

    def get_session(self, session_id: str) -> types.Session:
        return self._send(routes.get_session(session_id))

    def list_sessions(self, user_id: str) -> list[types.Session]:
        return self._send(routes.list_sessions(user_id))

    def delete_session(self, session_id: str) -> None:
        return self._send(routes.delete_session(session_id))

    def list_messages(
        self, session_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[types.Message]:
        return self._send(routes.list_messages(session_id, after_seq, limit))

    def send_message(
        self, session_id: str, content: str, **sampling: Unpack[types.Sampling]
    ) -> types.Turn:
        """A chat turn; `sampling` (`max_tokens`, `temperature`, ...) defaults to the
        server's settings."""
        return self._send(routes.send_message(session_id, _turn_body(content, False, sampling)))

    def stream_message(
        self, session_id: str, content: str, **sampling: Unpack[types.Sampling]
    ) -> Iterator[types.Token | types.Turn]:
        """A streamed chat turn: `Token`s, then the `Turn`. A failing engine raises
        `ServiceUnavailableError` mid-stream."""
        call = routes.send_message(session_id, _turn_body(content, True, sampling))
        with self._streamed(call) as response:
            reader = EventReader()
            for line in response.iter_lines():
                if (event := reader.feed(line)) is not None:
                    yield event

    def import_history(
        self, session_id: str, messages: Sequence[types.HistoryMessage]
    ) -> types.HistoryImported:
        return self._send(routes.import_history(session_id, messages))

    def preview_context(
        self, session_id: str, content: str, *, max_tokens: int | None = None
    ) -> types.ContextPreview:
        return self._send(routes.preview_context(session_id, content, max_tokens))

    def list_summaries(self, session_id: str) -> list[types.Summary]:
        return self._send(routes.list_summaries(session_id))

    # Memory, facts, knowledge ---------------------------------------------------------

    def search_memory(
        self,
        user_id: str,
        query: str,
        *,
        k: int = 10,
        session_id: str | None = None,
        kinds: Sequence[types.Kind] | None = None,
    ) -> list[types.Memory]:
        body = types.SearchRequest(user_id, query, k, session_id, list(kinds or ()) or None)
        return self._send(routes.search_memory(body))

    def list_facts(
        self, user_id: str, *, status: types.FactStatus = "active", include_history: bool = False
    ) -> list[types.Fact]:
        return self._send(routes.list_facts(user_id, status, include_history))

    def add_fact(self, user_id: str, text: str, **fields: Unpack[types.FactFields]) -> types.Fact:
        return self._send(routes.add_fact(user_id, types.FactCreate(text, **fields)))

    def update_fact(self, fact_id: int, **fields: Unpack[types.FactChanges]) -> types.Fact:
        return self._send(routes.update_fact(fact_id, types.FactUpdate(**fields)))

    def delete_fact(self, fact_id: int) -> None:
        return self._send(routes.delete_fact(fact_id))

    def add_document(
        self,
        title: str,
        text: str,
        *,
        user_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> types.KnowledgeDocument:
        body = types.KnowledgeCreate(title, text, user_id, dict(metadata or {}))
        return self._send(routes.add_document(body))

    def upload_document(
        self, filename: str, content: bytes, *, title: str | None = None, user_id: str | None = None
    ) -> types.KnowledgeDocument:
        """A .txt, .md or .pdf file's bytes."""
        return self._send(routes.upload_document(filename, content, title, user_id))

    def list_documents(self, user_id: str | None = None) -> list[types.KnowledgeDocument]:
        return self._send(routes.list_documents(user_id))

    def get_document(self, document_id: str) -> types.KnowledgeDocument:
        return self._send(routes.get_document(document_id))

    def delete_document(self, document_id: str) -> None:
        return self._send(routes.delete_document(document_id))

    # Export ---------------------------------------------------------------------------

    def export_user(self, user_id: str) -> Iterator[ExportRecord]:
        """The user's export (`memchat.export`'s records) as it streams: the `Header`,
        the user's rows, the `EndRecord`. A cut stream raises `UnexpectedAnswerError`."""
        with self._streamed(routes.export_user(user_id)) as response:
            reader = ExportReader()
            for chunk in response.iter_bytes():
                yield from reader.feed(chunk)
            reader.finish()

    def export_user_to_file(self, user_id: str, path: str | os.PathLike[str]) -> int:
        """The user's export written to `path` byte for byte as the server sends it
        (`memchat import` restores it), renamed into place once whole; the number of
        records."""
        reader = ExportReader()
        with self._streamed(routes.export_user(user_id)) as response, partial_file(path) as file:
            for chunk in response.iter_bytes():
                reader.feed(chunk)
                file.write(chunk)
            return reader.finish()


class AsyncMemchatClient:
    """`MemchatClient` on the event loop: the same methods, awaited (`stream_message`
    is an async iterator)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self._retry = retry or RetryPolicy()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, call: routes.Call[Any], stream: bool = False) -> httpx.Response:
        """As `MemchatClient._request`, without blocking the event loop."""
        for num_retries in range(self._retry.max_retries + 1):
            try:
                response = await self._http.send(call.request(self._http), stream=stream)
            except httpx.TransportError as exc:
                raise _unreachable(self._http.base_url, exc) from exc
            if response.is_success:
                return response
            content = await response.aread()
            wait = self._retry.wait_s(
                response, is_idempotent=call.is_idempotent, num_retries=num_retries
            )
            if wait is None:
                raise error_of(response, content)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last try raises or returns")

    async def _send(self, call: routes.Call[T]) -> T:
        return call.answer((await self._request(call)).content)

    @asynccontextmanager
    async def _streamed(self, call: routes.Call[Any]) -> AsyncIterator[httpx.Response]:
        response = await self._request(call, stream=True)
        try:
            yield response
        except httpx.TransportError as exc:
            raise _unreachable(self._http.base_url, exc) from exc
        finally:
            await response.aclose()

    # Sessions and turns ---------------------------------------------------------------

    async def create_session(
        self, user_id: str, title: str | None = None, metadata: dict[str, Any] | None = None
    ) -> types.Session:
        return await self._send(routes.create_session(user_id, title, metadata))

    async def get_session(self, session_id: str) -> types.Session:
        return await self._send(routes.get_session(session_id))

    async def list_sessions(self, user_id: str) -> list[types.Session]:
        return await self._send(routes.list_sessions(user_id))

    async def delete_session(self, session_id: str) -> None:
        return await self._send(routes.delete_session(session_id))

    async def list_messages(
        self, session_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[types.Message]:
        return await self._send(routes.list_messages(session_id, after_seq, limit))

    async def send_message(
        self, session_id: str, content: str, **sampling: Unpack[types.Sampling]
    ) -> types.Turn:
        body = _turn_body(content, False, sampling)
        return await self._send(routes.send_message(session_id, body))

    async def stream_message(
        self, session_id: str, content: str, **sampling: Unpack[types.Sampling]
    ) -> AsyncIterator[types.Token | types.Turn]:
        call = routes.send_message(session_id, _turn_body(content, True, sampling))
        async with self._streamed(call) as response:
            reader = EventReader()
            async for line in response.aiter_lines():
                if (event := reader.feed(line)) is not None:
                    yield event

    async def import_history(
        self, session_id: str, messages: Sequence[types.HistoryMessage]
    ) -> types.HistoryImported:
        return await self._send(routes.import_history(session_id, messages))

    async def preview_context(
        self, session_id: str, content: str, *, max_tokens: int | None = None
    ) -> types.ContextPreview:
        return await self._send(routes.preview_context(session_id, content, max_tokens))

    async def list_summaries(self, session_id: str) -> list[types.Summary]:
        return await self._send(routes.list_summaries(session_id))

    # Memory, facts, knowledge ---------------------------------------------------------

    async def search_memory(
        self,
        user_id: str,
        query: str,
        *,
        k: int = 10,
        session_id: str | None = None,
        kinds: Sequence[types.Kind] | None = None,
    ) -> list[types.Memory]:
        body = types.SearchRequest(user_id, query, k, session_id, list(kinds or ()) or None)
        return await self._send(routes.search_memory(body))

    async def list_facts(
        self, user_id: str, *, status: types.FactStatus = "active", include_history: bool = False
    ) -> list[types.Fact]:
        return await self._send(routes.list_facts(user_id, status, include_history))

    async def add_fact(
        self, user_id: str, text: str, **fields: Unpack[types.FactFields]
    ) -> types.Fact:
        return await self._send(routes.add_fact(user_id, types.FactCreate(text, **fields)))

    async def update_fact(self, fact_id: int, **fields: Unpack[types.FactChanges]) -> types.Fact:
        return await self._send(routes.update_fact(fact_id, types.FactUpdate(**fields)))

    async def delete_fact(self, fact_id: int) -> None:
        return await self._send(routes.delete_fact(fact_id))

    async def add_document(
        self,
        title: str,
        text: str,
        *,
        user_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> types.KnowledgeDocument:
        body = types.KnowledgeCreate(title, text, user_id, dict(metadata or {}))
        return await self._send(routes.add_document(body))

    async def upload_document(
        self, filename: str, content: bytes, *, title: str | None = None, user_id: str | None = None
    ) -> types.KnowledgeDocument:
        return await self._send(routes.upload_document(filename, content, title, user_id))

    async def list_documents(self, user_id: str | None = None) -> list[types.KnowledgeDocument]:
        return await self._send(routes.list_documents(user_id))

    async def get_document(self, document_id: str) -> types.KnowledgeDocument:
        return await self._send(routes.get_document(document_id))

    async def delete_document(self, document_id: str) -> None:
        return await self._send(routes.delete_document(document_id))

    # Export ---------------------------------------------------------------------------

    async def export_user(self, user_id: str) -> AsyncIterator[ExportRecord]:
        async with self._streamed(routes.export_user(user_id)) as response:
            reader = ExportReader()
            async for chunk in response.aiter_bytes():
                for record in reader.feed(chunk):
                    yield record
            reader.finish()

    async def export_user_to_file(self, user_id: str, path: str | os.PathLike[str]) -> int:
        """As `MemchatClient.export_user_to_file`; the file is written off the loop."""
        reader = ExportReader()
        async with self._streamed(routes.export_user(user_id)) as response:
            with partial_file(path) as file:
                async for chunk in response.aiter_bytes():
                    reader.feed(chunk)
                    await asyncio.to_thread(file.write, chunk)
                return reader.finish()
