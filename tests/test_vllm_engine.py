"""The vLLM adapter against two real vLLM servers on the CPU (the run's, which these
tests start unless another module has).

A chat turn's trace context reaches server A as it arrives there: through a recording
pass-through in front of it (tests.vllm_servers.RecordingProxy).

Server A and server B serve the same SmolLM2 checkpoint. The last test kills A mid-reply,
so the order of the tests in this module matters (a later module that needs two servers
gets A replaced).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.factory import create_app
from app.settings import EngineSettings, Settings, VllmSettings
from app.vllm_server.local import SERVED_MODEL
from retrieval.engines.routing import Route, current_route
from retrieval.engines.vllm import VllmEngine, metric_sum
from retrieval.errors import EngineUnavailableError
from retrieval.prompt.report import shared_prefix
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta
from tests.clients import local_client
from tests.fakes import HashEmbedder
from tests.live import live_server
from tests.test_api_sessions import create_session, parse_sse
from tests.test_tracing import one, request_trace
from tests.vllm_servers import BLOCK_SIZE, LocalServer, ServerPool, recording_proxy

pytestmark = [pytest.mark.vllm, pytest.mark.model]

GREEDY = SamplingParams(max_tokens=16, temperature=0)


@pytest.fixture(scope="module")
def servers(vllm_pool: ServerPool) -> list[LocalServer]:
    """Two of the run's servers (tests.vllm_servers.ServerPool): A and B."""
    return vllm_pool.running(2)


@pytest.fixture
async def engine(servers: list[LocalServer]) -> AsyncIterator[VllmEngine]:
    vllm = await VllmEngine.connected(
        [s.url for s in servers], connect_attempts=2, backoff_base_s=0.05
    )
    yield vllm
    await vllm.close()


def conversation(nonce: str) -> list[ChatMessage]:
    """English and Chinese; the nonce first, so nothing of it is cached before the test."""
    return [
        ChatMessage("system", f"[{nonce}] You are a helpful assistant. 请简短回答。"),
        ChatMessage("user", "I am allergic to peanuts. 我对花生过敏。"),
        ChatMessage("assistant", "Noted: no peanuts (花生) for you."),
        ChatMessage("user", "Suggest a snack for tonight, please."),
    ]


def key_preferring(engine: VllmEngine, url: str) -> str:
    """A routing key whose first replica is `url`."""
    for number in range(1000):
        key = f"user-{number}"
        if engine._replicas.ranked(key)[0].url == url:
            return key
    raise AssertionError("no key prefers " + url)  # pragma: no cover


async def test_model_and_context_window_come_from_the_server(engine: VllmEngine) -> None:
    assert engine.model_name == SERVED_MODEL
    assert engine.context_window == 8192
    assert await engine.check_health() == "ok (2/2 replicas)"


async def test_counts_equal_the_prompt_tokens_the_server_reports(engine: VllmEngine) -> None:
    messages = conversation(uuid.uuid4().hex)
    counted = await engine.count_prompt_tokens(messages)
    assert counted == len(await engine.prompt_tokens(messages))
    completion = await engine.generate(messages, GREEDY)
    assert completion.prompt_tokens == counted
    text = "我对花生过敏, peanuts!"
    answer = httpx.post(
        f"{engine._replicas.replicas[0].url}/tokenize",
        json={"model": SERVED_MODEL, "prompt": text, "add_special_tokens": False},
    )
    assert await engine.count_tokens(text) == answer.json()["count"] > 0


async def test_stream_carries_usage_and_the_next_turn_is_served_from_the_cache(
    engine: VllmEngine,
) -> None:
    current_route.set(Route(key="stream-user"))
    first = conversation(uuid.uuid4().hex)
    events = [e async for e in engine.stream(first, GREEDY)]
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    completion = events[-1]
    assert isinstance(completion, Completion)
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    assert "".join(deltas) == completion.text
    assert completion.prompt_tokens == await engine.count_prompt_tokens(first)
    assert 0 < completion.completion_tokens <= 16
    assert completion.cached_prompt_tokens == 0  # the nonce opens the prompt

    second = [*first, ChatMessage("assistant", completion.text), ChatMessage("user", "Why?")]
    again = await engine.generate(second, GREEDY)
    shared = shared_prefix(await engine.prompt_tokens(first), await engine.prompt_tokens(second))
    cached = again.cached_prompt_tokens
    assert cached is not None
    assert cached % BLOCK_SIZE == 0
    assert shared // BLOCK_SIZE * BLOCK_SIZE <= cached < again.prompt_tokens


async def test_tenants_never_share_cached_prefixes(servers: list[LocalServer]) -> None:
    engine = await VllmEngine.connected([servers[0].url], isolate_tenant_cache=True)
    messages = conversation(uuid.uuid4().hex)
    try:
        current_route.set(Route(key="k", tenant="tenant-a"))
        assert (await engine.generate(messages, GREEDY)).cached_prompt_tokens == 0
        current_route.set(Route(key="k", tenant="tenant-b"))
        assert (await engine.generate(messages, GREEDY)).cached_prompt_tokens == 0
        current_route.set(Route(key="k", tenant="tenant-a"))
        cached = (await engine.generate(messages, GREEDY)).cached_prompt_tokens
        assert cached == (await engine.count_prompt_tokens(messages) - 1) // BLOCK_SIZE * BLOCK_SIZE
    finally:
        await engine.close()


async def test_stop_strings_and_seed(engine: VllmEngine) -> None:
    messages = conversation(uuid.uuid4().hex)
    # A first request fills the prefix cache: a prompt computed afresh and one read from
    # the cache may differ in the last bits of the logits, so compare cached with cached.
    await engine.generate(messages, GREEDY)
    sampled = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    first = await engine.generate(messages, sampled)
    assert (await engine.generate(messages, sampled)).text == first.text
    plain = await engine.generate(messages, GREEDY)
    stop = plain.text.strip().split()[1]
    stopped = await engine.generate(
        messages, SamplingParams(max_tokens=16, temperature=0, stop=(stop,))
    )
    assert stopped.text == plain.text[: plain.text.index(stop)]
    assert stopped.finish_reason == "stop"


async def test_json_schema_output(engine: VllmEngine) -> None:
    schema = {
        "type": "object",
        "properties": {"facts": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
        "required": ["facts"],
        "additionalProperties": False,
    }
    messages = [
        ChatMessage("system", "Extract facts about the user as JSON."),
        ChatMessage("user", "I am allergic to peanuts and I live in Lyon. 我喜欢喝茶。"),
    ]
    text = await engine.generate_json(
        messages, schema, SamplingParams(max_tokens=96, temperature=0)
    )
    parsed = json.loads(text)
    assert set(parsed) == {"facts"}
    assert all(isinstance(fact, str) for fact in parsed["facts"])


async def test_a_user_stays_on_their_replica(
    engine: VllmEngine, servers: list[LocalServer]
) -> None:
    for server in servers:
        key = key_preferring(engine, server.url)
        before = [_prompt_tokens_served(s.url) for s in servers]
        current_route.set(Route(key=key))
        completion = await engine.generate(conversation(uuid.uuid4().hex), GREEDY)
        after = [_prompt_tokens_served(s.url) for s in servers]
        moved = [round(b - a) for a, b in zip(before, after, strict=True)]
        expected = [completion.prompt_tokens if s is server else 0 for s in servers]
        assert moved == expected


def _prompt_tokens_served(url: str) -> float:
    return metric_sum(httpx.get(f"{url}/metrics").text, "vllm:prompt_tokens_total")


async def test_api_turns_on_vllm_count_exactly_and_hit_the_cache(
    tmp_path: Path, database_url: str, servers: list[LocalServer]
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        engine=EngineSettings(kind="vllm", vllm=VllmSettings(urls=[s.url for s in servers])),
    )
    async with local_client(create_app(settings, embedder=HashEmbedder()), timeout=120) as client:
        ready = (await client.get("/readyz")).json()
        assert ready["checks"]["engine"] == SERVED_MODEL
        assert ready["checks"]["engine_health"] == "ok (2/2 replicas)"
        session = await create_session(client)
        turns = []
        for content in ("I am allergic to peanuts.", "我住在里昂。What should I eat?"):
            response = await client.post(
                f"/v1/sessions/{session['id']}/messages",
                json={"content": content, "max_tokens": 16, "temperature": 0},
            )
            assert response.status_code == 200, response.text
            turns.append(response.json())
        for turn in turns:
            assert turn["usage"]["prompt_tokens"] == turn["context"]["prompt_tokens"]
        assert turns[1]["usage"]["cached_prompt_tokens"] >= (
            turns[1]["context"]["prefix_reuse"] // BLOCK_SIZE * BLOCK_SIZE
        )
        assert turns[1]["context"]["prefix_reuse"] > BLOCK_SIZE

        published = (await client.get("/metrics")).text
        queries, hits = (
            sum(metric_sum(httpx.get(f"{s.url}/metrics").text, name) for s in servers)
            for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
        )
        assert hits > 0
        assert metric_sum(published, "memchat_engine_prefix_cache_hits_tokens") == hits
        assert metric_sum(published, "memchat_engine_prefix_cache_queries_tokens") == queries
        rate = metric_sum(published, "memchat_engine_prefix_cache_hit_rate")
        assert rate == pytest.approx(hits / queries)


async def test_a_turns_trace_context_reaches_the_vllm_server(
    tmp_path: Path, sqlite_url: str, servers: list[LocalServer]
) -> None:
    """The request that reaches vLLM for a streamed turn names the turn's trace, and the
    engine call's span (`chat {model}`, a child of the turn's) as its parent."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = servers[0]
    with recording_proxy(server.url) as proxy:
        settings = Settings(
            data_dir=tmp_path / "data",
            database_url=sqlite_url,
            engine=EngineSettings(kind="vllm", vllm=VllmSettings(urls=[proxy.url])),
        )
        app = create_app(settings, embedder=HashEmbedder(), tracer_provider=provider)
        async with local_client(app, timeout=120) as client:
            session = await create_session(client)
            exporter.clear()
            proxy.requests.clear()
            served_before = _prompt_tokens_served(server.url)
            body = {"content": "我对花生过敏。What can I snack on?", "max_tokens": 8,
                    "temperature": 0, "stream": True}  # fmt: skip
            response = await client.post(f"/v1/sessions/{session['id']}/messages", json=body)
    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    assert [name for name, _ in events][-1] == "done"
    done = json.loads(events[-1][1])
    streamed = "".join(json.loads(data)["text"] for name, data in events if name == "token")
    assert streamed == done["reply"]["content"] != ""
    # The reply is the real server's: it read exactly the turn's prompt.
    served = _prompt_tokens_served(server.url) - served_before
    assert round(served) == done["usage"]["prompt_tokens"] > 0

    spans = request_trace(exporter.get_finished_spans(), "POST /v1/sessions/{session_id}/messages")
    turn, generation = one(spans, "memchat.chat_turn"), one(spans, f"chat {SERVED_MODEL}")
    assert turn.context is not None and generation.context is not None
    assert generation.parent is not None
    assert generation.parent.span_id == turn.context.span_id
    trace_id = f"{turn.context.trace_id:032x}"
    sent = [h for _, path, h in proxy.requests if path == "/v1/chat/completions"]
    assert len(sent) == 1
    flags = int(generation.context.trace_flags)
    assert flags & 1  # sampled
    parent = f"{generation.context.span_id:016x}"
    assert sent[0]["traceparent"] == f"00-{trace_id}-{parent}-{flags:02x}"
    # Every request of the turn (its token counts too) continues the turn's trace.
    assert {h["traceparent"].split("-")[1] for _, _, h in proxy.requests} == {trace_id}


def _session_on(client: httpx.Client, target: LocalServer, servers: list[LocalServer]) -> str:
    """A session whose user the engine routes to `target` (seen in the servers' counters)."""
    for number in range(20):
        session = client.post("/v1/sessions", json={"user_id": f"failover-{number}"}).json()
        before = [_prompt_tokens_served(s.url) for s in servers]
        turn = client.post(
            f"/v1/sessions/{session['id']}/messages",
            json={"content": "Hello!", "max_tokens": 4, "temperature": 0},
        )
        assert turn.status_code == 200, turn.text
        after = [_prompt_tokens_served(s.url) for s in servers]
        if after[servers.index(target)] > before[servers.index(target)]:
            return str(session["id"])
    raise AssertionError("no user was routed to " + target.url)  # pragma: no cover


def _stream_killing(client: httpx.Client, session: str, victim: LocalServer) -> list[str]:
    """Streams a long reply and kills `victim` as soon as the first token arrives."""
    body = {"content": "Count from 1 to 300, separated by commas.", "max_tokens": 300,
            "temperature": 0, "stream": True}  # fmt: skip
    lines = []
    with client.stream("POST", f"/v1/sessions/{session}/messages", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("event: token") and victim.process.poll() is None:
                victim.kill()
    return lines


def test_replica_killed_mid_reply_gives_an_error_stores_nothing_then_fails_over(
    tmp_path: Path, sqlite_url: str, servers: list[LocalServer]
) -> None:
    """Runs last: it kills server A, then the same user's next turn goes to server B."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=sqlite_url,
        engine=EngineSettings(
            kind="vllm", vllm=VllmSettings(urls=[s.url for s in servers], backoff_base_s=0.05)
        ),
    )
    doomed, survivor = servers
    app = create_app(settings, embedder=HashEmbedder())
    with live_server(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        session = _session_on(client, doomed, servers)
        events = parse_sse("\n".join(_stream_killing(client, session, doomed)) + "\n")
        names = [name for name, _ in events]
        assert (names[0], names[-1]) == ("token", "error")
        error = json.loads(events[-1][1])
        assert error["status"] == 503
        assert "broke off the reply" in error["detail"]
        stored = client.get(f"/v1/sessions/{session}/messages").json()
        assert [m["role"] for m in stored["messages"]] == ["user", "assistant", "user"]

        served_before = _prompt_tokens_served(survivor.url)
        response = client.post(
            f"/v1/sessions/{session}/messages",
            json={"content": "And now?", "max_tokens": 8, "temperature": 0},
        )
        assert response.status_code == 200, response.text
        turn = response.json()
        served = _prompt_tokens_served(survivor.url) - served_before
        assert round(served) == turn["usage"]["prompt_tokens"]
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"]["engine_health"] == "ok (1/2 replicas)"

    with pytest.raises(EngineUnavailableError, match="no vLLM replica reachable"):
        asyncio.run(VllmEngine.connected([doomed.url], connect_attempts=1))
