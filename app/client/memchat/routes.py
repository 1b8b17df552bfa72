"""Each route of the API the clients call, written once: its method, path, body and how
its answer is read. `MemchatClient` and `AsyncMemchatClient` only send these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from memchat import types
from memchat.errors import UnexpectedAnswerError

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and the reading of its answer. `is_idempotent`: sending it twice
    leaves what sending it once does (it may be retried after any 503 with
    Retry-After, not only one where the server says nothing was done)."""

    method: str
    path: str
    read: Callable[[bytes], T]
    body: bytes | None = None
    params: dict[str, str | int] = field(default_factory=dict)
    files: dict[str, tuple[str, bytes]] | None = None
    data: dict[str, str] | None = None

    @property
    def is_idempotent(self) -> bool:
        return self.method in ("GET", "DELETE")

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        headers = {"content-type": "application/json"} if self.body is not None else None
        return http.build_request(
            self.method,
            self.path,
            content=self.body,
            params=self.params,
            files=self.files,
            data=self.data,
            headers=headers,
        )

    def answer(self, content: bytes) -> T:
        """The body of a successful answer, read; one that is not the documented body
        (a server of another version, a proxy's page) raises `UnexpectedAnswerError`."""
        try:
            return self.read(content)
        except msgspec.DecodeError as exc:
            raise UnexpectedAnswerError(f"{self.method} {self.path}: {exc}") from exc


def _reader(struct: type[S]) -> Callable[[bytes], S]:
    return msgspec.json.Decoder(struct).decode


def _listed(struct: type[S], name: str) -> Callable[[bytes], Any]:
    decode = msgspec.json.Decoder(struct).decode
    return lambda raw: getattr(decode(raw), name)


def _nothing(_raw: bytes) -> None:
    return None


def _segment(value: str | int) -> str:
    """A path segment: `/` and other reserved characters escaped."""
    return quote(str(value), safe="")


def _session(session_id: str, rest: str = "") -> str:
    return f"/v1/sessions/{_segment(session_id)}{rest}"


def create_session(
    user_id: str, title: str | None, metadata: dict[str, Any] | None
) -> Call[types.Session]:
    body = types.SessionCreate(user_id, title, dict(metadata or {}))
    return Call("POST", "/v1/sessions", _reader(types.Session), _encoder.encode(body))


def get_session(session_id: str) -> Call[types.Session]:
    return Call("GET", _session(session_id), _reader(types.Session))


def list_sessions(user_id: str) -> Call[list[types.Session]]:
    read = _listed(types.SessionList, "sessions")
    return Call("GET", "/v1/sessions", read, params={"user_id": user_id})


def delete_session(session_id: str) -> Call[None]:
    return Call("DELETE", _session(session_id), _nothing)


def list_messages(session_id: str, after_seq: int, limit: int) -> Call[list[types.Message]]:
    read = _listed(types.MessageList, "messages")
    params: dict[str, str | int] = {"after_seq": after_seq, "limit": limit}
    return Call("GET", _session(session_id, "/messages"), read, params=params)


def send_message(session_id: str, body: types.MessageCreate) -> Call[types.Turn]:
    return Call(
        "POST", _session(session_id, "/messages"), _reader(types.Turn), _encoder.encode(body)
    )


def import_history(
    session_id: str, messages: Sequence[types.HistoryMessage]
) -> Call[types.HistoryImported]:
    body = _encoder.encode(types.HistoryImport(list(messages)))
    return Call("POST", _session(session_id, "/history"), _reader(types.HistoryImported), body)


def preview_context(
    session_id: str, content: str, max_tokens: int | None
) -> Call[types.ContextPreview]:
    body = _encoder.encode(types.ContextRequest(content, max_tokens))
    return Call("POST", _session(session_id, "/context"), _reader(types.ContextPreview), body)


def list_summaries(session_id: str) -> Call[list[types.Summary]]:
    read = _listed(types.SummaryList, "summaries")
    return Call("GET", _session(session_id, "/summaries"), read)


def search_memory(body: types.SearchRequest) -> Call[list[types.Memory]]:
    read = _listed(types.SearchResponse, "results")
    return Call("POST", "/v1/memory/search", read, _encoder.encode(body))


def list_facts(user_id: str, status: str, include_history: bool) -> Call[list[types.Fact]]:
    params: dict[str, str | int] = {"status": status}
    if include_history:
        params["include"] = "history"
    read = _listed(types.FactList, "facts")
    return Call("GET", f"/v1/users/{_segment(user_id)}/facts", read, params=params)


def add_fact(user_id: str, body: types.FactCreate) -> Call[types.Fact]:
    path = f"/v1/users/{_segment(user_id)}/facts"
    return Call("POST", path, _reader(types.Fact), _encoder.encode(body))


def update_fact(fact_id: int, body: types.FactUpdate) -> Call[types.Fact]:
    path = f"/v1/facts/{_segment(fact_id)}"
    return Call("PATCH", path, _reader(types.Fact), _encoder.encode(body))


def delete_fact(fact_id: int) -> Call[None]:
    return Call("DELETE", f"/v1/facts/{_segment(fact_id)}", _nothing)


def add_document(body: types.KnowledgeCreate) -> Call[types.KnowledgeDocument]:
    return Call("POST", "/v1/knowledge", _reader(types.KnowledgeDocument), _encoder.encode(body))


def upload_document(
    filename: str, content: bytes, title: str | None, user_id: str | None
) -> Call[types.KnowledgeDocument]:
    fields = {"title": title, "user_id": user_id}
    data = {name: value for name, value in fields.items() if value is not None}
    return Call(
        "POST",
        "/v1/knowledge",
        _reader(types.KnowledgeDocument),
        files={"file": (filename, content)},
        data=data,
    )


def list_documents(user_id: str | None) -> Call[list[types.KnowledgeDocument]]:
    params: dict[str, str | int] = {} if user_id is None else {"user_id": user_id}
    read = _listed(types.KnowledgeDocumentList, "documents")
    return Call("GET", "/v1/knowledge", read, params=params)


def get_document(document_id: str) -> Call[types.KnowledgeDocument]:
    return Call("GET", f"/v1/knowledge/{_segment(document_id)}", _reader(types.KnowledgeDocument))


def delete_document(document_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/knowledge/{_segment(document_id)}", _nothing)


def export_user(user_id: str) -> Call[None]:
    """Streamed: the answer's lines are read by `memchat.export.ExportReader`."""
    return Call("GET", f"/v1/users/{_segment(user_id)}/export", _nothing)
