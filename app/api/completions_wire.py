"""The OpenAI chat-completions wire format, as `/v1/chat/completions` takes and answers it.

Requests are strict like every body of the service: documented types, unknown fields
refused (OpenAI refuses them too). Fields that only tune the transport or the client's
own bookkeeping are accepted and have no effect (`parallel_tool_calls`, `store`,
`metadata`, `service_tier`); features the service does not have (tools, several
choices, log probabilities, logit bias, penalties, structured output) are refused with
a 400 saying so, never ignored, unless the value asks for nothing (`n: 1`,
`presence_penalty: 0`, `tool_choice: "none"`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from app.api import schemas

WireRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ContentPart(Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class WireMessage(Struct, forbid_unknown_fields=True):
    role: WireRole
    content: str | list[ContentPart] | None = None
    name: Annotated[str, Meta(max_length=255)] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool = False


Probability = Annotated[float, Meta(ge=0.0, le=1.0)]


class ChatCompletionRequest(Struct, forbid_unknown_fields=True):
    model: Annotated[str, Meta(min_length=1, max_length=255)]
    messages: Annotated[list[WireMessage], Meta(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    stop: (
        Annotated[str, Meta(min_length=1)]
        | Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=4)]
        | None
    ) = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    # Accepted only at values that ask for nothing this service lacks (see UNSUPPORTED).
    n: Annotated[int, Meta(ge=1)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    # Whose memory: this field, or the X-Memchat-User-Id header.
    user: (
        Annotated[str, Meta(min_length=1, max_length=255, pattern=schemas.USER_ID_PATTERN)] | None
    ) = None


def unsupported(body: ChatCompletionRequest) -> tuple[str, str] | None:
    """(field, why) of the first field that asks for a feature this service lacks."""
    checks = (
        ("n", body.n not in (None, 1), "only one choice (n = 1) is generated"),
        ("tools", bool(body.tools), "tools are not supported"),
        ("functions", bool(body.functions), "functions are not supported"),
        ("tool_choice", body.tool_choice not in (None, "none", "auto"), "tools are not supported"),
        ("function_call", body.function_call not in (None, "none", "auto"),
         "functions are not supported"),
        ("logprobs", bool(body.logprobs) or bool(body.top_logprobs),
         "log probabilities are not supported"),
        ("logit_bias", bool(body.logit_bias), "logit bias is not supported"),
        ("presence_penalty", bool(body.presence_penalty), "penalties are not supported"),
        ("frequency_penalty", bool(body.frequency_penalty), "penalties are not supported"),
        ("response_format", body.response_format not in (None, {"type": "text"}),
         "only text replies are supported (response_format type 'text')"),
    )  # fmt: skip
    return next(((field, why) for field, is_asked, why in checks if is_asked), None)


# Answers ----------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int


class CompletionUsage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class MemchatTurn(Struct):
    """The extension every answer carries (`memchat`): where the turn was stored and the
    context it was sent with."""

    session_id: str
    user_id: str
    message_id: int
    reply_id: int
    # Messages of the client's history that the session did not hold, stored first.
    num_history_stored: int
    context: schemas.ContextReport


class AssistantMessage(Struct):
    role: Literal["assistant"]
    content: str
    refusal: None = None


class Choice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(Struct):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    memchat: MemchatTurn
    system_fingerprint: None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(Struct, omit_defaults=True):
    """A stream's chunks; the last with a finish reason carries the `memchat` extension,
    and with `stream_options.include_usage` one more chunk (no choices) the usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    memchat: MemchatTurn | None = None


class Model(Struct):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Struct):
    object: Literal["list"]
    data: list[Model]


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Struct):
    error: ErrorDetail
