"""Chat sessions, their messages, history import and context preview."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
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
from retrieval.chat.events import TurnEvent, TurnResult
from retrieval.chat.history import HistoryImport
from retrieval.chat.preview import ContextPreview
from retrieval.chat.sessions import ChatSessions, session_of_tenant
from retrieval.chat.turn import ChatTurn
from retrieval.errors import EngineError
from retrieval.protocols import SamplingParams, TextDelta
from storage.messages import MessageRepository
from storage.records import NewTurn
from storage.sessions import SessionRepository
from storage.summaries import SummaryRepository
from storage.users import UserRepository


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
        chat_sessions: NamedDependency[ChatSessions],
        principal: NamedDependency[Principal],
    ) -> schemas.Session:
        data = await strict_body(request, schemas.SessionCreate)
        chat, user = await chat_sessions.create(
            data.user_id, data.title, data.metadata, tenant_id=principal.tenant_id
        )
        return session_body(chat, user, 0)

    @get("/", responses=problems(400, 422, 503))
    async def list_sessions(
        self,
        users: NamedDependency[UserRepository],
        sessions: NamedDependency[SessionRepository],
        principal: NamedDependency[Principal],
        user_id: Annotated[
            str, QueryParameter(min_length=1, max_length=255, pattern=schemas.USER_ID_PATTERN)
        ],
    ) -> schemas.SessionList:
        user = await users.get_user_or_none(user_id, tenant_id=principal.tenant_id)
        if user is None:
            return schemas.SessionList(sessions=[])
        rows = await sessions.list_sessions(user_id, tenant_id=principal.tenant_id)
        return schemas.SessionList(sessions=[session_body(c, user, n) for c, n in rows])

    @get("/{session_id:str}", responses=problems(404, 503))
    async def get_session(
        self,
        session_id: FromPath[str],
        sessions: NamedDependency[SessionRepository],
        principal: NamedDependency[Principal],
    ) -> schemas.Session:
        state = await session_of_tenant(sessions, session_id, principal.tenant_id)
        return session_body(state.session, state.user, await sessions.count_messages(session_id))

    @delete("/{session_id:str}", status_code=HTTP_204_NO_CONTENT, responses=problems(404, 503))
    async def delete_session(
        self,
        session_id: FromPath[str],
        chat_sessions: NamedDependency[ChatSessions],
        principal: NamedDependency[Principal],
    ) -> None:
        await chat_sessions.delete(session_id, tenant_id=principal.tenant_id)

    @get("/{session_id:str}/summaries", responses=problems(404, 503))
    async def list_summaries(
        self,
        session_id: FromPath[str],
        sessions: NamedDependency[SessionRepository],
        summaries: NamedDependency[SummaryRepository],
        principal: NamedDependency[Principal],
    ) -> schemas.SummaryList:
        """Every version of the session's rolling summary, oldest first; the last is current."""
        await session_of_tenant(sessions, session_id, principal.tenant_id)
        rows = await summaries.list_summaries(session_id)
        return schemas.SummaryList(summaries=[summary_body(r) for r in rows])

    @get("/{session_id:str}/messages", responses=problems(400, 404, 422, 503))
    async def list_messages(
        self,
        session_id: FromPath[str],
        sessions: NamedDependency[SessionRepository],
        messages: NamedDependency[MessageRepository],
        principal: NamedDependency[Principal],
        after_seq: Annotated[int, QueryParameter(ge=0, le=2**31 - 1)] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=10_000)] = 1000,
    ) -> schemas.MessageList:
        await session_of_tenant(sessions, session_id, principal.tenant_id)
        rows = await messages.list_messages(session_id, limit=limit, after_seq=after_seq)
        return schemas.MessageList(messages=[message_body(r) for r in rows])

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
        turns: NamedDependency[ChatTurn],
        sampling: NamedDependency[SamplingDefaults],
        principal: NamedDependency[Principal],
    ) -> Response[schemas.Turn] | ServerSentEvent:
        data = await strict_body(request, schemas.MessageCreate)
        params = sampling.params_for(data)
        tenant = principal.tenant_id
        if not data.stream:
            result = await turns.complete(session_id, data.content, params, tenant_id=tenant)
            return Response(turn_body(result))
        events = turns.run(session_id, data.content, params, tenant_id=tenant)
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
        history: NamedDependency[HistoryImport],
        principal: NamedDependency[Principal],
    ) -> schemas.HistoryImported:
        data = await strict_body(request, schemas.HistoryImport)
        messages = [
            NewTurn(
                role=m.role,
                content=m.content,
                name=m.name,
                created_at=instant(m.created_at, f"messages[{i}].created_at"),
                external_id=m.external_id,
                image_caption=m.image_caption,
            )
            for i, m in enumerate(data.messages)
        ]
        imported, skipped = await history.run(session_id, messages, tenant_id=principal.tenant_id)
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
        previews: NamedDependency[ContextPreview],
        sampling: NamedDependency[SamplingDefaults],
        principal: NamedDependency[Principal],
    ) -> schemas.ContextPreview:
        data = await strict_body(request, schemas.ContextRequest)
        params = SamplingParams(max_tokens=data.max_tokens or sampling.max_tokens)
        assembled = await previews.preview(
            session_id, data.content, params, tenant_id=principal.tenant_id
        )
        return schemas.ContextPreview(
            messages=[schemas.PromptMessage(m.role, m.content) for m in assembled.messages],
            context=report_body(assembled.report),
        )


async def _sse(
    events: AsyncGenerator[TurnEvent], session_id: str
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
