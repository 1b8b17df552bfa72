"""`POST /v1/chat/completions` and `GET /v1/models`: memory for clients of the OpenAI
chat-completions API, by changing their base URL.

Who and which conversation: the API key's tenant; the user from the body's `user` field
or the `X-Memchat-User-Id` header; the session from the `X-Memchat-Session-Id` header
(a UUID, created for the user on first use) or, without it, the conversation's first
user message (`retrieval.chat.conversation.conversation_id`), which suits clients that
resend the whole conversation. The reply goes through the same chat turn as
`/v1/sessions/{id}/messages`; errors are OpenAI-shaped (`app.api.errors`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.openapi import ResponseSpec
from litestar.response import Stream
from litestar.status_codes import HTTP_200_OK

from app.access.keys import Principal
from app.api import completions_wire as wire
from app.api import schemas
from app.api.bodies import report_body
from app.api.errors import OPENAI_EXCEPTION_HANDLERS, openai_error_body
from app.api.requests import strict_body
from app.api.sessions import SamplingDefaults
from retrieval.chat.conversation import ClientConversation, ClientTurn, conversation_id
from retrieval.chat.events import TurnEvent, TurnResult, TurnStarted
from retrieval.errors import EngineError, InvalidInputError
from retrieval.protocols import ChatMessage, Completion, Engine, SamplingParams, TextDelta

USER_HEADER = "X-Memchat-User-Id"
SESSION_HEADER = "X-Memchat-Session-Id"
# What `model` may name besides the engine's own model.
MODEL_ALIAS = "memchat"
_USER_ID = re.compile(schemas.USER_ID_PATTERN)
INSTRUCTION_ROLES = ("system", "developer")


def served_models(engine: Engine) -> list[str]:
    return [engine.model_name, MODEL_ALIAS]


def _text(message: wire.WireMessage, position: int) -> str:
    field = f"messages[{position}]"
    if message.tool_calls or message.role in ("tool", "function"):
        raise InvalidInputError(
            f"{field}.role", "tool calls and tool messages are not supported by this service"
        )
    if message.content is None:
        raise InvalidInputError(f"{field}.content", "a message needs its text content")
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text for part in message.content)


def split_messages(
    messages: list[wire.WireMessage],
) -> tuple[str, list[ChatMessage], str]:
    """(the client's instructions, its history, the new message): system and developer
    messages are instructions; the last message must be the user's new one."""
    instructions: list[str] = []
    history: list[ChatMessage] = []
    for position, message in enumerate(messages):
        text = _text(message, position)
        if message.role in INSTRUCTION_ROLES:
            instructions.append(text)
        else:
            history.append(ChatMessage(message.role, text))
    last = len(messages) - 1
    if not history or messages[last].role != "user":
        raise InvalidInputError(
            f"messages[{last}].role", "the last message must be the user's new message"
        )
    return "\n\n".join(i for i in instructions if i.strip()), history[:-1], history[-1].content


def _user_id(body: wire.ChatCompletionRequest, request: Request[Any, Any, Any]) -> str:
    user_id = body.user or request.headers.get(USER_HEADER)
    if not user_id:
        raise InvalidInputError(
            "user", f"name whose memory this is: the `user` field or the {USER_HEADER} header"
        )
    if len(user_id) > 255 or not _USER_ID.match(user_id):
        raise InvalidInputError("user", f"{user_id!r} is not a valid user id")
    return user_id


def _session_id(request: Request[Any, Any, Any], tenant_id: int, user_id: str, first: str) -> str:
    named = request.headers.get(SESSION_HEADER)
    if named is None:
        return conversation_id(tenant_id, user_id, first)
    try:
        return str(uuid.UUID(named))
    except ValueError as exc:
        raise InvalidInputError(SESSION_HEADER, "the session id must be a UUID") from exc


def _params(body: wire.ChatCompletionRequest, sampling: SamplingDefaults) -> SamplingParams:
    stop = body.stop if isinstance(body.stop, list) else [body.stop] if body.stop else []
    return SamplingParams(
        max_tokens=body.max_completion_tokens or body.max_tokens or sampling.max_tokens,
        temperature=sampling.temperature if body.temperature is None else body.temperature,
        top_p=sampling.top_p if body.top_p is None else body.top_p,
        top_k=sampling.top_k,
        stop=tuple(stop),
        seed=body.seed,
    )


def _usage(completion: Completion) -> wire.CompletionUsage:
    return wire.CompletionUsage(
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        total_tokens=completion.prompt_tokens + completion.completion_tokens,
        prompt_tokens_details=wire.PromptTokensDetails(completion.cached_prompt_tokens or 0),
    )


def _finish(completion: Completion) -> Any:
    return "length" if completion.finish_reason == "length" else "stop"


def _extension(turn: ClientTurn, user_id: str, result: TurnResult) -> wire.MemchatTurn:
    return wire.MemchatTurn(
        session_id=turn.session.id,
        user_id=user_id,
        message_id=result.message.id,
        reply_id=result.reply.id,
        num_history_stored=turn.num_stored,
        context=report_body(result.context),
    )


def completion_body(
    turn: ClientTurn, user_id: str, model: str, result: TurnResult
) -> wire.ChatCompletion:
    return wire.ChatCompletion(
        id=f"chatcmpl-{result.message.id}",
        object="chat.completion",
        created=int(result.reply.created_at.timestamp()),
        model=model,
        choices=[
            wire.Choice(
                index=0,
                message=wire.AssistantMessage("assistant", result.completion.text),
                finish_reason=_finish(result.completion),
            )
        ],
        usage=_usage(result.completion),
        memchat=_extension(turn, user_id, result),
    )


class ChatCompletionController(Controller):
    tags = ["openai"]  # noqa: RUF012
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @get("/v1/models")
    async def list_models(self, request: Request[Any, Any, Any]) -> wire.ModelList:
        engine: Engine = request.app.state.runtime.engine
        return wire.ModelList(
            object="list",
            data=[
                wire.Model(id=name, object="model", created=0, owned_by="memchat")
                for name in served_models(engine)
            ],
        )

    @post(
        "/v1/chat/completions",
        status_code=HTTP_200_OK,
        responses={
            HTTP_200_OK: ResponseSpec(
                data_container=wire.ChatCompletion,
                description="The completion; with `stream: true`, Server-Sent Events of "
                "`chat.completion.chunk` objects, ending with `data: [DONE]`.",
            ),
        },
    )
    async def create_chat_completion(
        self,
        request: Request[Any, Any, Any],
        conversations: NamedDependency[ClientConversation],
        sampling: NamedDependency[SamplingDefaults],
        principal: NamedDependency[Principal],
    ) -> Response[wire.ChatCompletion] | Stream:
        body = await strict_body(request, wire.ChatCompletionRequest)
        if (refused := wire.unsupported(body)) is not None:
            raise InvalidInputError(*refused)
        models = served_models(request.app.state.runtime.engine)
        if body.model not in models:
            raise NotFoundException(
                f"the model {body.model!r} does not exist; this service serves "
                + ", ".join(repr(m) for m in models)
            )
        instructions, history, new_message = split_messages(body.messages)
        user_id = _user_id(body, request)
        first = next((m.content for m in history if m.role == "user"), new_message)
        session_id = _session_id(request, principal.tenant_id, user_id, first)
        turn, events = await conversations.run(
            session_id,
            user_id,
            history,
            new_message,
            _params(body, sampling),
            tenant_id=principal.tenant_id,
            instructions=instructions,
        )
        headers = {SESSION_HEADER: turn.session.id}
        if not body.stream:
            result = await _result(events)
            return Response(completion_body(turn, user_id, body.model, result), headers=headers)
        # Bad input fails here, as a plain HTTP error, before the stream starts.
        started = await anext(events)
        assert isinstance(started, TurnStarted)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = _chunks(events, turn, user_id, body.model, started, include_usage=include_usage)
        return Stream(chunks, media_type="text/event-stream", headers=headers)


async def _result(events: AsyncGenerator[TurnEvent]) -> TurnResult:
    try:
        async for event in events:
            if isinstance(event, TurnResult):
                return event
    finally:
        await events.aclose()
    raise RuntimeError("turn ended without a result")  # pragma: no cover


def _sse(value: Any) -> bytes:
    return b"data: " + msgspec.json.encode(value) + b"\n\n"


async def _chunks(
    events: AsyncGenerator[TurnEvent],
    turn: ClientTurn,
    user_id: str,
    model: str,
    started: TurnStarted,
    *,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """The role first, then each piece of text, then the finish reason with the memchat
    extension, the usage if asked for, and `[DONE]`; an engine failure ends the stream
    with an OpenAI error object."""
    created = int(time.time())
    chunk_id = f"chatcmpl-{started.message.id}"

    def chunk(delta: wire.Delta, **extra: Any) -> wire.ChatCompletionChunk:
        finish = extra.pop("finish_reason", None)
        choices = [wire.ChunkChoice(index=0, delta=delta, finish_reason=finish)]
        return wire.ChatCompletionChunk(
            chunk_id, "chat.completion.chunk", created, model, choices, **extra
        )

    try:
        yield _sse(chunk(wire.Delta(role="assistant", content="")))
        async for event in events:
            if isinstance(event, TextDelta):
                yield _sse(chunk(wire.Delta(content=event.text)))
            elif isinstance(event, TurnResult):
                yield _sse(
                    chunk(
                        wire.Delta(),
                        finish_reason=_finish(event.completion),
                        memchat=_extension(turn, user_id, event),
                    )
                )
                if include_usage:
                    yield _sse(
                        wire.ChatCompletionChunk(
                            chunk_id,
                            "chat.completion.chunk",
                            created,
                            model,
                            [],
                            usage=_usage(event.completion),
                        )
                    )
    except EngineError as exc:
        message = f"the LLM engine failed: {exc}. Your message was stored; retry later."
        yield _sse(openai_error_body(503, message, None))
    finally:
        await events.aclose()
    yield b"data: [DONE]\n\n"
