"""Chat sessions, their messages, history import and context preview."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.access.keys import Principal
from app.api import schemas
from app.api.bodies import message_body, report_body, session_body, summary_body, turn_body
from app.api.errors import problem_body
from app.api.problems import problems
from app.api.requests import instant, strict_body
from app.api.tenancy import session_of
from retrieval.chat.events import TurnEvent, TurnResult
from retrieval.chat.service import ChatService
from retrieval.errors import EngineError
from retrieval.protocols import SamplingParams, TextDelta
from retrieval.turns import ImportedMessage, StoredTurn
from storage.repository import Store


class SamplingDefaults(msgspec.Struct, frozen=True):
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int

    def params_for(self, body: schemas.MessageCreate) -> SamplingParams:
        return SamplingParams(
            max_tokens=body.max_tokens or self.max_tokens,
            temperature=self.temperature if body.temperature is None else body.temperature,
            top_p=self.top_p if body.top_p is None else body.top_p,
            top_k=self.top_k if body.top_k is None else body.top_k,
            stop=tuple(body.stop or ()),
            seed=body.seed,
        )


class SessionController(Controller):
    path = "/v1/sessions"
    tags = ["sessions"]  # noqa: RUF012

    @post("/", status_code=HTTP_201_CREATED, responses=problems(400, 413, 422, 503))
    async def create_session(
        self,
        request: Request[Any, Any, Any],
        store: NamedDependency[Store],
        chat_service: NamedDependency[ChatService],
        principal: NamedDependency[Principal],
    ) -> schemas.Session:
        data = await strict_body(request, schemas.SessionCreate)
        chat_service.check_metadata(data.metadata)
        chat, user = await store.create_session(
            data.user_id, data.title, dict(data.metadata), tenant_id=principal.tenant_id
        )
        return session_body(chat, user, 0)

    @get("/", responses=problems(400, 422, 503))
    async def list_sessions(
        self,
        store: NamedDependency[Store],
        principal: NamedDependency[Principal],
        user_id: Annotated[
            str, QueryParameter(min_length=1, max_length=255, pattern=schemas.USER_ID_PATTERN)
        ],
    ) -> schemas.SessionList:
        user = await store.get_user_or_none(user_id, tenant_id=principal.tenant_id)
        if user is None:
            return schemas.SessionList(sessions=[])
        rows = await store.list_sessions(user_id, tenant_id=principal.tenant_id)
        return schemas.SessionList(sessions=[session_body(c, user, n) for c, n in rows])

    @get("/{session_id:str}", responses=problems(404, 503))
    async def get_session(
        self,
        session_id: FromPath[str],
        store: NamedDependency[Store],
        principal: NamedDependency[Principal],
    ) -> schemas.Session:
        chat, user = await session_of(store, principal, session_id)
        return session_body(chat, user, await store.count_messages(session_id))

    @delete("/{session_id:str}", status_code=HTTP_204_NO_CONTENT, responses=problems(404, 503))
    async def delete_session(
        self,
        session_id: FromPath[str],
        store: NamedDependency[Store],
        chat_service: NamedDependency[ChatService],
        principal: NamedDependency[Principal],
    ) -> None:
        await session_of(store, principal, session_id)
        await chat_service.delete_session(session_id)

    @get("/{session_id:str}/summaries", responses=problems(404, 503))
    async def list_summaries(
        self,
        session_id: FromPath[str],
        store: NamedDependency[Store],
        chat_service: NamedDependency[ChatService],
        principal: NamedDependency[Principal],
    ) -> schemas.SummaryList:
        """Every version of the session's rolling summary, oldest first; the last is current."""
        await session_of(store, principal, session_id)
        rows = await chat_service.list_summaries(session_id)
        return schemas.SummaryList(summaries=[summary_body(r) for r in rows])

    @get("/{session_id:str}/messages", responses=problems(400, 404, 422, 503))
    async def list_messages(
        self,
        session_id: FromPath[str],
        store: NamedDependency[Store],
        principal: NamedDependency[Principal],
        after_seq: Annotated[int, QueryParameter(ge=0, le=2**31 - 1)] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=10_000)] = 1000,
    ) -> schemas.MessageList:
        await session_of(store, principal, session_id)
        rows = await store.list_messages(session_id, limit=limit, after_seq=after_seq)
        return schemas.MessageList(messages=[message_body(StoredTurn.from_row(r)) for r in rows])

    @post(
        "/{session_id:str}/messages",
        status_code=HTTP_200_OK,
        responses={
            HTTP_200_OK: ResponseSpec(
                data_container=schemas.Turn,
                description="The turn; with `stream: true`, Server-Sent Events: `token` "
                "events, then one `done` event carrying this same body (or one `error`).",
            ),
            **problems(400, 404, 413, 422, 503),
        },
    )
    async def post_message(
        self,
        session_id: FromPath[str],
        request: Request[Any, Any, Any],
        chat_service: NamedDependency[ChatService],
        sampling: NamedDependency[SamplingDefaults],
        store: NamedDependency[Store],
        principal: NamedDependency[Principal],
    ) -> Response[schemas.Turn] | ServerSentEvent:
        await session_of(store, principal, session_id)
        data = await strict_body(request, schemas.MessageCreate)
        params = sampling.params_for(data)
        if not data.stream:
            result = await chat_service.complete_turn(session_id, data.content, params)
            return Response(turn_body(result))
        events = chat_service.run_turn(session_id, data.content, params)
        # Bad input and unknown sessions fail here, as plain HTTP errors, before the stream.
        await anext(events)
        return ServerSentEvent(_sse(events, session_id))

    @post(
        "/{session_id:str}/history",
        status_code=HTTP_201_CREATED,
        responses=problems(400, 404, 409, 413, 422, 503),
    )
    async def import_history(
        self,
        session_id: FromPath[str],
        request: Request[Any, Any, Any],
        chat_service: NamedDependency[ChatService],
        store: NamedDependency[Store],
        principal: NamedDependency[Principal],
    ) -> schemas.HistoryImported:
        await session_of(store, principal, session_id)
        data = await strict_body(request, schemas.HistoryImport)
        imported, skipped = await chat_service.import_history(
            session_id,
            [
                ImportedMessage(
                    role=m.role,
                    content=m.content,
                    name=m.name,
                    created_at=instant(m.created_at, f"messages[{i}].created_at"),
                    external_id=m.external_id,
                    image_caption=m.image_caption,
                )
                for i, m in enumerate(data.messages)
            ],
        )
        return schemas.HistoryImported(imported=imported, skipped=skipped)

    @post(
        "/{session_id:str}/context",
        status_code=HTTP_200_OK,
        responses=problems(400, 404, 413, 422, 503),
    )
    async def preview_context(
        self,
        session_id: FromPath[str],
        request: Request[Any, Any, Any],
        chat_service: NamedDependency[ChatService],
        sampling: NamedDependency[SamplingDefaults],
        store: NamedDependency[Store],
        principal: NamedDependency[Principal],
    ) -> schemas.ContextPreview:
        await session_of(store, principal, session_id)
        data = await strict_body(request, schemas.ContextRequest)
        params = SamplingParams(max_tokens=data.max_tokens or sampling.max_tokens)
        assembled = await chat_service.preview_context(session_id, data.content, params)
        return schemas.ContextPreview(
            messages=[schemas.PromptMessage(m.role, m.content) for m in assembled.messages],
            context=report_body(assembled.report),
        )


async def _sse(
    events: AsyncIterator[TurnEvent], session_id: str
) -> AsyncIterator[ServerSentEventMessage]:
    """`token` events, then one `done` with the non-streamed body, or one `error`."""
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                yield ServerSentEventMessage(
                    event="token", data=msgspec.json.encode({"text": event.text}).decode()
                )
            elif isinstance(event, TurnResult):
                yield ServerSentEventMessage(
                    event="done", data=msgspec.json.encode(turn_body(event)).decode()
                )
    except EngineError as exc:
        body = problem_body(
            503,
            f"the LLM engine failed: {exc}. Your message was stored; retry later.",
            f"/v1/sessions/{session_id}/messages",
        )
        yield ServerSentEventMessage(event="error", data=msgspec.json.encode(body).decode())
    finally:
        await events.aclose()
