"""OpenTelemetry traces, with the SDK's in-memory exporter and fake models.

A chat turn is a tree of spans under its request's server span, named and attributed
after the GenAI conventions, holding no message text unless the setting says so; an
import and the fact extraction after it have theirs; a client's `traceparent` is
continued; the vLLM adapter's requests carry the trace context of the engine call's
span to the server; and with no OpenTelemetry variables set, nothing is traced.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app.factory import create_app
from app.observability.tracing import (
    TracedRequests,
    span_exporters_from_environment,
    tracer_provider_from_environment,
)
from app.settings import EngineSettings, Settings, TracingSettings, VllmSettings
from retrieval.errors import EngineError
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session, parse_sse
from tests.test_vllm_replicas import Server
from tests.vllm_servers import RecordingProxy, recording_proxy

MESSAGE = "I am allergic to peanuts and my sister Ingrid lives in Oslo"
REPLY = "I will remember that about the peanuts."
MESSAGES = "/v1/sessions/{session_id}/messages"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def traced_app(settings: Settings, provider: TracerProvider, **parts: Any) -> Litestar:
    parts.setdefault("embedder", HashEmbedder())
    parts.setdefault("engine", ScriptedEngine([REPLY, "A second reply."]))
    return create_app(settings, tracer_provider=provider, **parts)


@pytest.fixture
def traced_settings(tmp_path: Path, sqlite_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=sqlite_url)


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine([REPLY, "A second reply."])


@pytest.fixture
async def client(
    traced_settings: Settings, provider: TracerProvider, engine: ScriptedEngine
) -> AsyncIterator[AsyncTestClient]:
    app = traced_app(traced_settings, provider, engine=engine)
    async with local_client(app) as test_client:
        yield test_client


def tree(spans: Sequence[ReadableSpan], root: ReadableSpan, depth: int = 0) -> list[str]:
    """The span names under `root`, indented by depth, in start order."""
    lines = ["  " * depth + root.name]
    children = [s for s in spans if s.parent is not None and s.parent.span_id == _id(root)]
    for child in sorted(children, key=lambda s: s.start_time or 0):
        lines += tree(spans, child, depth + 1)
    return lines


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def texts_of(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute value of every span and event, as one string."""
    values: list[str] = []
    for span in spans:
        values += [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            values += [event.name, *(str(v) for v in (event.attributes or {}).values())]
        values.append(span.name)
    return "\n".join(values)


def request_trace(spans: Sequence[ReadableSpan], server: str) -> list[ReadableSpan]:
    """The spans of the trace of the request whose server span is named `server` (not
    those of background work that ran meanwhile)."""
    trace_id = _trace(one(spans, server))
    return [s for s in spans if _trace(s) == trace_id]


def _trace(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def edges(spans: Sequence[ReadableSpan]) -> list[tuple[str, str | None, SpanKind]]:
    """(name, parent's name, kind) of each span, sorted."""
    by_id = {_id(s): s.name for s in spans}
    return sorted(
        (s.name, by_id.get(s.parent.span_id) if s.parent else None, s.kind) for s in spans
    )


async def chat(client: AsyncTestClient, session_id: str, content: str = MESSAGE) -> dict:
    response = await client.post(MESSAGES.format(session_id=session_id), json={"content": content})
    assert response.status_code == 200, response.text
    return response.json()


TURN_SPANS = [
    ("POST /v1/sessions/{session_id}/messages", None, SpanKind.SERVER),
    ("chat scripted", "memchat.chat_turn", SpanKind.CLIENT),
    ("embeddings hash-64", "memchat.chat_turn", SpanKind.INTERNAL),
    ("memchat.assemble", "memchat.context", SpanKind.INTERNAL),
    ("memchat.chat_turn", "POST /v1/sessions/{session_id}/messages", SpanKind.INTERNAL),
    ("memchat.context", "memchat.chat_turn", SpanKind.INTERNAL),
    ("memchat.fusion", "memchat.search", SpanKind.INTERNAL),
    ("memchat.persist", "memchat.chat_turn", SpanKind.INTERNAL),
    ("memchat.persist", "memchat.chat_turn", SpanKind.INTERNAL),
    ("memchat.search", "memchat.context", SpanKind.INTERNAL),
    ("memchat.session_prior", "memchat.search", SpanKind.INTERNAL),
    ("retrieval dense", "memchat.search", SpanKind.INTERNAL),
    ("retrieval knowledge", "memchat.search", SpanKind.INTERNAL),
    ("retrieval lexical", "memchat.search", SpanKind.INTERNAL),
]


async def test_a_chat_turn_is_a_tree_of_spans_holding_no_message_text(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    session = await create_session(client)
    exporter.clear()
    await chat(client, session["id"])
    spans = request_trace(exporter.get_finished_spans(), TURN_SPANS[0][0])

    assert edges(spans) == TURN_SPANS
    server = one(spans, "POST /v1/sessions/{session_id}/messages")
    assert dict(server.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v1/sessions/{session_id}/messages",
        "url.path": f"/v1/sessions/{session['id']}/messages",
        "url.scheme": "http",
        "http.response.status_code": 200,
    }
    turn = dict(one(spans, "memchat.chat_turn").attributes or {})
    assert turn["gen_ai.conversation.id"] == session["id"]
    assert turn["gen_ai.request.model"] == "scripted"
    assert turn["memchat.num_memories"] == 0
    sections = {k: v for k, v in turn.items() if k.startswith("memchat.prompt_tokens.")}
    assert set(sections) == {
        f"memchat.prompt_tokens.{name}"
        for name in (
            "system",
            "facts",
            "summary",
            "memories",
            "recent",
            "new_message",
            "template",
            "knowledge",
        )
    }
    assert sum(sections.values()) == turn["memchat.prompt_tokens"]  # type: ignore[arg-type]
    generation = dict(one(spans, "chat scripted").attributes or {})
    assert generation == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "scripted",
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.usage.input_tokens": turn["memchat.prompt_tokens"],
        "gen_ai.usage.output_tokens": turn["gen_ai.usage.output_tokens"],
        "gen_ai.response.finish_reasons": ("stop",),
    }
    assert turn["gen_ai.usage.input_tokens"] == turn["memchat.prompt_tokens"]
    dense = dict(one(spans, "retrieval dense").attributes or {})
    assert dense["gen_ai.operation.name"] == "retrieval"
    assert dense["gen_ai.data_source.id"] == "dense"
    assert dense["memchat.num_hits"] == 0
    roles = sorted(
        str((s.attributes or {})["memchat.role"]) for s in named(spans, "memchat.persist")
    )
    assert roles == ["assistant", "user"]

    # The second turn retrieves the first, and is measured against its prompt.
    exporter.clear()
    await chat(client, session["id"], "Where does my sister live?")
    spans = request_trace(exporter.get_finished_spans(), TURN_SPANS[0][0])
    turn = dict(one(spans, "memchat.chat_turn").attributes or {})
    assert turn["memchat.num_memories"] == 0  # the first turn is still in the window
    assert isinstance(turn["memchat.prefix_reuse_tokens"], int)
    assert turn["memchat.prefix_reuse_tokens"] > 0

    # Fact extraction runs after the turn, in a trace of its own.
    # (The worker runs on the app's event loop, the test client's: its spans are awaited.)
    extraction: list[ReadableSpan] = []
    for _ in range(200):
        extraction = named(exporter.get_finished_spans(), "memchat.fact_extraction")
        if extraction:
            break
        await asyncio.sleep(0.05)
    assert extraction, "no fact extraction span"
    assert all(s.parent is None for s in extraction)
    assert {(s.attributes or {})["memchat.extractor"] for s in extraction} == {"rules"}

    everything = texts_of(spans) + texts_of(extraction)
    for word in ("peanuts", "Ingrid", "Oslo", "sister", "remember"):
        assert word not in everything


async def test_a_streamed_turn_has_the_same_tree(
    client: AsyncTestClient, exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    session = await create_session(client)
    exporter.clear()
    response = await client.post(
        MESSAGES.format(session_id=session["id"]), json={"content": MESSAGE, "stream": True}
    )
    assert response.status_code == 200, response.text
    assert [event for event, _ in parse_sse(response.text)][-1] == "done"
    spans = request_trace(exporter.get_finished_spans(), TURN_SPANS[0][0])
    assert edges(spans) == TURN_SPANS
    # Every span's context was left where it was entered (the stream's own task).
    assert "Failed to detach context" not in caplog.text


async def test_a_failed_engine_call_is_an_error_span_without_its_message(
    client: AsyncTestClient, exporter: InMemorySpanExporter, engine: ScriptedEngine
) -> None:
    session = await create_session(client)
    engine.fail_with = EngineError(f"the engine is down after reading {MESSAGE!r}")
    exporter.clear()
    response = await client.post(
        MESSAGES.format(session_id=session["id"]), json={"content": MESSAGE}
    )
    assert response.status_code == 503, response.text
    spans = request_trace(exporter.get_finished_spans(), TURN_SPANS[0][0])
    failed = {s.name: s for s in spans if s.status.status_code is StatusCode.ERROR}
    assert set(failed) == {
        "chat scripted",
        "memchat.chat_turn",
        "POST /v1/sessions/{session_id}/messages",
    }
    for name in ("chat scripted", "memchat.chat_turn"):
        assert (failed[name].attributes or {})["error.type"] == "EngineError"
    assert all(not s.events for s in spans)
    for word in ("peanuts", "Ingrid", "Oslo"):
        assert word not in texts_of(spans)


async def test_message_text_is_in_spans_only_when_the_setting_says_so(
    tmp_path: Path, sqlite_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_url,
        tracing=TracingSettings(capture_content=True),
    )
    async with local_client(traced_app(settings, provider)) as client:
        session = await create_session(client)
        exporter.clear()
        await chat(client, session["id"])
    spans = exporter.get_finished_spans()
    turn = dict(one(spans, "memchat.chat_turn").attributes or {})
    assert json.loads(str(turn["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": MESSAGE}]}
    ]
    assert json.loads(str(turn["gen_ai.output.messages"])) == [
        {"role": "assistant", "parts": [{"type": "text", "content": REPLY}]}
    ]
    generation = dict(one(spans, "chat scripted").attributes or {})
    assert json.loads(str(generation["gen_ai.output.messages"]))[0]["parts"][0] == {
        "type": "text",
        "content": REPLY,
    }


async def test_an_import_has_its_spans(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    session = await create_session(client)
    history = {
        "messages": [
            {"role": "user", "content": MESSAGE, "external_id": "a"},
            {"role": "assistant", "content": REPLY, "external_id": "b"},
        ]
    }
    path = f"/v1/sessions/{session['id']}/history"
    for expected in ({"imported": 2, "skipped": 0}, {"imported": 0, "skipped": 2}):
        exporter.clear()
        response = await client.post(path, json=history)
        assert response.status_code == 201, response.text
        assert response.json() == expected
        spans = request_trace(
            exporter.get_finished_spans(), "POST /v1/sessions/{session_id}/history"
        )
        assert edges(spans) == [
            ("POST /v1/sessions/{session_id}/history", None, SpanKind.SERVER),
            ("memchat.import", "POST /v1/sessions/{session_id}/history", SpanKind.INTERNAL),
            ("memchat.persist", "memchat.import", SpanKind.INTERNAL),
        ]
        assert dict(one(spans, "memchat.import").attributes or {}) == {
            "gen_ai.conversation.id": session["id"],
            "memchat.num_messages": 2,
            "memchat.num_imported": expected["imported"],
            "memchat.num_skipped": expected["skipped"],
        }
        for word in ("peanuts", "Ingrid", "remember"):
            assert word not in texts_of(spans)


async def test_a_clients_trace_is_continued(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    exporter.clear()
    response = await client.get(
        "/v1/sessions",
        params={"user_id": "alice"},
        headers={"traceparent": f"00-{trace_id}-{span_id}-01"},
    )
    assert response.status_code == 200, response.text
    (server,) = exporter.get_finished_spans()
    assert server.name == "GET /v1/sessions"
    assert server.context is not None and server.parent is not None
    assert server.context.trace_id == int(trace_id, 16)
    assert server.parent.span_id == int(span_id, 16)
    assert server.parent.is_remote


# The vLLM adapter's requests ---------------------------------------------------------


@pytest.fixture
def vllm_server() -> Iterator[RecordingProxy]:
    """The scripted vLLM replicas (test_vllm_replicas.Server) behind a recording
    pass-through: each request's path and headers kept."""
    replicas = Server()

    def streamed(request: httpx.Request) -> httpx.Response:
        # The scripted answers hold their body read; the pass-through streams it on.
        answer = replicas.handle(request)
        return httpx.Response(
            answer.status_code, headers=answer.headers, stream=httpx.ByteStream(answer.content)
        )

    transport = httpx.MockTransport(streamed)
    with recording_proxy("http://scripted-vllm", transport=transport) as proxy:
        yield proxy


async def test_vllm_requests_carry_the_engine_calls_trace_context(
    tmp_path: Path,
    sqlite_url: str,
    vllm_server: RecordingProxy,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_url,
        engine=EngineSettings(kind="vllm", vllm=VllmSettings(urls=[vllm_server.url])),
    )
    # The engine is the settings' (app.adapters), reached over HTTP.
    app = create_app(settings, embedder=HashEmbedder(), tracer_provider=provider)
    async with local_client(app) as client:
        # Connecting (model list, chat template) happens outside any span: no context.
        assert vllm_server.requests
        assert all("traceparent" not in headers for _, _, headers in vllm_server.requests)
        session = await create_session(client)
        exporter.clear()
        vllm_server.requests.clear()
        await chat(client, session["id"])
    spans = exporter.get_finished_spans()
    generation = one(spans, "chat m")
    assert generation.context is not None
    sent = [h for method, path, h in vllm_server.requests if path == "/v1/chat/completions"]
    assert len(sent) == 1
    trace_id, span_id = generation.context.trace_id, generation.context.span_id
    flags = int(generation.context.trace_flags)
    assert flags & 1  # sampled
    assert sent[0]["traceparent"] == f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
    # Counting tokens during the turn continues the turn's trace too.
    counted = [h for method, path, h in vllm_server.requests if path == "/tokenize"]
    assert all(h["traceparent"].split("-")[1] == f"{trace_id:032x}" for h in counted)


# Off by default ----------------------------------------------------------------------


def test_no_exporter_without_the_opentelemetry_variables() -> None:
    assert span_exporters_from_environment({}) == []
    assert span_exporters_from_environment({"OTEL_SERVICE_NAME": "memchat-eu"}) == []
    assert span_exporters_from_environment({"OTEL_TRACES_EXPORTER": "none"}) == []
    disabled = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
    assert span_exporters_from_environment(disabled) == []
    assert tracer_provider_from_environment({}) is None


def test_the_variables_pick_the_exporters() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    by_endpoint = span_exporters_from_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    )
    assert [type(e) for e in by_endpoint] == [OTLPSpanExporter]
    named = span_exporters_from_environment({"OTEL_TRACES_EXPORTER": "otlp,console"})
    assert [type(e) for e in named] == [OTLPSpanExporter, ConsoleSpanExporter]
    with pytest.raises(ValueError, match="zipkin"):
        span_exporters_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="http/protobuf"):
        span_exporters_from_environment(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        )
    for exporter in [*by_endpoint, *named]:
        exporter.shutdown()


def test_an_app_without_the_variables_traces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    app = create_app(
        Settings(data_dir=tmp_path), embedder=HashEmbedder(), engine=ScriptedEngine([])
    )
    assert not isinstance(app.asgi_handler, TracedRequests)
