"""The vLLM adapter's network behaviour, on scripted servers (httpx.MockTransport).

Replica choice, failover, what is retried and what is not, the circuit breaker, and the
mapping of server answers to errors and completions. The real server is exercised in
test_vllm_engine.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from retrieval.engines.replicas import CircuitBreaker, ReplicaSet, backoff_s
from retrieval.engines.routing import Route, current_route
from retrieval.engines.vllm import VllmEngine, metric_sum, tenant_salt
from retrieval.errors import EngineError, EngineTimeoutError, EngineUnavailableError
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"
MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "hi 你好")]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


IM_START, IM_END, NEWLINE = 1_000_001, 1_000_002, 10
ROLES = {"system": 1_000_011, "user": 1_000_012, "assistant": 1_000_013}
TEXT = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"} | {t: f"{r}\n" for r, t in ROLES.items()}


def tokenize(body: dict) -> dict:
    """A ChatML server whose tokens are characters: each message is its role marker (two
    tokens), its content and the end marker with a newline, then two for the reply."""
    if "prompt" in body:
        tokens = [ord(c) for c in body["prompt"]]
    else:
        tokens = []
        for message in body["messages"]:
            tokens += [IM_START, ROLES[message["role"]], *map(ord, message["content"])]
            tokens += [IM_END, NEWLINE]
        tokens += [IM_START, ROLES["assistant"]]
    return {"count": len(tokens), "tokens": tokens}


def detokenize(body: dict) -> dict:
    return {"prompt": "".join(TEXT.get(t) or chr(t) for t in body["tokens"])}


class Server:
    """Scripted replicas: `down` refuse connections, `chat` answers completions."""

    def __init__(self, chat: Callable[[str, dict], httpx.Response] | None = None) -> None:
        self.down: set[str] = set()
        self.chat_calls: list[tuple[str, dict]] = []
        self.chat = chat or (lambda _url, body: sse_reply(["Hel", "lo"], cached=None))

    def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content) if request.content else {}
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json=tokenize(body))
        if request.url.path == "/detokenize":
            return httpx.Response(200, json=detokenize(body))
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/metrics":
            text = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
            text += 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64.0\n'
            return httpx.Response(200, text=text)
        self.chat_calls.append((base, body))
        return self.chat(base, body)


def sse_reply(pieces: list[str], cached: int | None, *, finish: bool = True) -> httpx.Response:
    chunks = [{"choices": [{"delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    if finish:
        chunks.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
        usage: dict = {"prompt_tokens": 20, "completion_tokens": len(pieces)}
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        chunks.append({"choices": [], "usage": usage})
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    if finish:
        text += "data: [DONE]\n\n"
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


async def make_engine(
    server: Server, urls: list[str], clock: Clock | None = None, **options
) -> VllmEngine:
    return await VllmEngine.connected(
        urls,
        transport=httpx.MockTransport(server.handle),
        backoff_base_s=0.0,
        clock=clock or Clock(),
        **options,
    )


async def collect(engine: VllmEngine, params: SamplingParams | None = None) -> list:
    return [e async for e in engine.stream(MESSAGES, params or SamplingParams())]


def test_rendezvous_moves_only_the_users_of_a_removed_replica() -> None:
    three = ReplicaSet([A, B, C])
    two = ReplicaSet([A, C])
    keys = [str(n) for n in range(300)]
    first = {k: three.ranked(k)[0].url for k in keys}
    assert set(first.values()) == {A, B, C}
    for key in keys:
        expected = first[key] if first[key] != B else three.ranked(key)[1].url
        assert two.ranked(key)[0].url == expected


def test_breaker_opens_after_threshold_probes_once_then_closes() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=10, clock=clock)
    breaker.record_failure()
    assert breaker.state == "closed"
    breaker.record_failure()
    assert (breaker.state, breaker.allow()) == ("open", False)
    clock.now = 10.0
    assert breaker.state == "half-open"
    assert [breaker.allow(), breaker.allow()] == [True, False]  # one probe at a time
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now = 20.0
    assert breaker.allow()
    breaker.record_success()
    assert (breaker.state, breaker.allow()) == ("closed", True)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n, 0.25) for n in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]


async def test_stream_yields_deltas_then_the_completion_with_usage() -> None:
    engine = await make_engine(Server(), [A])
    events = await collect(engine)
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        Completion("Hello", "stop", prompt_tokens=20, completion_tokens=2, cached_prompt_tokens=0),
    ]


async def test_request_body_has_sampling_stop_seed_usage_and_tenant_salt() -> None:
    server = Server()
    engine = await make_engine(server, [A], isolate_tenant_cache=True)
    current_route.set(Route(key="7", tenant="7"))
    await collect(
        engine, SamplingParams(max_tokens=5, temperature=0, top_k=0, stop=("\n",), seed=3)
    )
    body = server.chat_calls[0][1]
    assert {k: body[k] for k in ("model", "max_tokens", "temperature", "top_p", "top_k")} == {
        "model": "m", "max_tokens": 5, "temperature": 0, "top_p": 0.95, "top_k": -1,
    }  # fmt: skip
    assert (body["stop"], body["seed"], body["stream"]) == (["\n"], 3, True)
    assert body["stream_options"] == {"include_usage": True}
    assert body["cache_salt"] == tenant_salt("7") != tenant_salt("8")
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hi 你好"}]  # fmt: skip


async def test_cached_tokens_are_read_from_prompt_tokens_details() -> None:
    engine = await make_engine(Server(lambda _u, _b: sse_reply(["x"], cached=64)), [A])
    assert (await collect(engine))[-1].cached_prompt_tokens == 64


async def test_a_user_fails_over_to_the_next_replica_and_comes_back() -> None:
    server = Server()
    clock = Clock()
    engine = await make_engine(server, [A, B, C], clock, failure_threshold=1, reset_after_s=5)
    key = next(str(n) for n in range(100) if engine._replicas.ranked(str(n))[0].url == A)
    second = engine._replicas.ranked(key)[1].url
    current_route.set(Route(key=key))
    await collect(engine)
    server.down.add(A)
    await collect(engine)
    await collect(engine)  # A's breaker is open: not even tried
    server.down.clear()
    clock.now = 5.0
    await collect(engine)  # the probe goes to A again
    assert [url for url, _ in server.chat_calls] == [A, second, second, A]


async def test_all_replicas_down_is_unavailable_after_the_connect_attempts() -> None:
    server = Server()
    engine = await make_engine(server, [A, B], connect_attempts=3, failure_threshold=10)
    server.down |= {A, B}
    with pytest.raises(EngineUnavailableError, match="no vLLM replica reachable"):
        await collect(engine)
    assert server.chat_calls == []


@pytest.mark.parametrize(("status", "error"), [(500, EngineUnavailableError), (400, EngineError)])
async def test_an_answered_request_is_never_retried(status: int, error: type) -> None:
    server = Server(lambda _u, _b: httpx.Response(status, text="no"))
    engine = await make_engine(server, [A, B])
    with pytest.raises(error, match=f"\\({status}\\)|answered {status}"):
        await collect(engine)
    assert len(server.chat_calls) == 1


async def test_a_stream_that_ends_early_is_unavailable_not_a_short_reply() -> None:
    engine = await make_engine(Server(lambda _u, _b: sse_reply(["Hel"], None, finish=False)), [A])
    with pytest.raises(EngineUnavailableError, match="ended its stream"):
        await collect(engine)


async def test_a_broken_connection_mid_stream_is_unavailable() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b'data: {"choices": [{"delta": {"content": "Hi"}, "finish_reason": null}]}\n\n'
            raise httpx.RemoteProtocolError("peer closed connection")

    engine = await make_engine(Server(lambda _u, _b: httpx.Response(200, stream=Broken())), [A])
    events = []
    with pytest.raises(EngineUnavailableError, match="broke off the reply"):
        async for event in engine.stream(MESSAGES, SamplingParams()):
            events.append(event)
    assert events == [TextDelta("Hi")]


async def test_a_read_timeout_is_a_timeout() -> None:
    def slow(_url: str, _body: dict) -> httpx.Response:
        raise httpx.ReadTimeout("too slow")

    engine = await make_engine(Server(slow), [A, B])
    with pytest.raises(EngineTimeoutError):
        await collect(engine)


async def test_counts_are_additive_and_cached() -> None:
    calls = []
    server = Server()
    handle = server.handle

    def counting(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return handle(request)

    engine = await VllmEngine.connected([A], transport=httpx.MockTransport(counting))
    before = len(calls)
    assert await engine.count_prompt_tokens(MESSAGES) == len("Be brief.") + len("hi 你好") + 10
    assert await engine.count_prompt_tokens(MESSAGES) == 24
    assert len(calls) - before == 2  # each distinct text tokenised once
    assert engine.context_window == 4096


async def test_health_and_prefix_cache_counters_sum_over_replicas() -> None:
    server = Server()
    engine = await make_engine(server, [A, B])
    assert await engine.check_health() == "ok (2/2 replicas)"
    assert await engine.prefix_cache_counters() == (200.0, 128.0)
    server.down.add(B)
    assert await engine.check_health() == "ok (1/2 replicas)"
    server.down.add(A)
    assert await engine.check_health() == "error: none of 2 vLLM replicas answers"


def test_metric_sum_adds_label_sets_and_ignores_lookalikes() -> None:
    text = 'x_total 5\nx_total{a="1"} 2.5\nx_total_created 99\n# HELP x_total help\n'
    assert metric_sum(text, "x_total") == 7.5


def test_memchat_vllm_urls_is_a_shorthand_for_the_replica_list() -> None:
    from app.settings import Settings

    settings = Settings(vllm_urls="http://a:8000, http://b:8000,")
    assert settings.engine.vllm.urls == ["http://a:8000", "http://b:8000"]
