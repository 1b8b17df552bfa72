"""vLLM engine over HTTP: any vLLM OpenAI-compatible server, one replica or several.

What makes a multi-turn chat cheap on vLLM is its prefix cache: each turn's prompt
starts with the previous turn's tokens, so the server reuses their KV blocks. That only
works if a user's turns reach the same replica, hence rendezvous hashing of the user
(`replicas.py`), with failover to the user's next replica when one is down.

Token counts come from the server's own `/tokenize` (with `messages`, so the chat
template the server applies is the one counted), asked with the async client like
everything else; every distinct text is tokenised once (LRU cache) and a prompt's count
is the sum of its contents' counts plus per-role template overheads, measured at
start (`connect`) and checked on a probe conversation.

Retries: only a connection that failed before the request was sent is retried (on the
next replica, then after a backoff); once a request reached a server it is never
repeated, since generation is not idempotent for the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx

from retrieval.engines.chat_format import MessageOverhead, prepare, renders, template_markers
from retrieval.engines.replicas import Replica, ReplicaSet, backoff_s
from retrieval.engines.routing import current_route
from retrieval.errors import EngineError, EngineTimeoutError, EngineUnavailableError
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta

_CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)
PROMPTS_CACHED = 256
TEXTS_CACHED = 16_384


class VllmEngine:
    """Built unconnected; `await connect()` (or `VllmEngine.connected(...)`) asks the
    servers what they serve and measures their chat template before any turn."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 3.0,
        tokenize_timeout_s: float = 10.0,
        connect_attempts: int = 3,
        backoff_base_s: float = 0.2,
        failure_threshold: int = 3,
        reset_after_s: float = 10.0,
        isolate_tenant_cache: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replicas = ReplicaSet(
            urls, failure_threshold=failure_threshold, reset_after_s=reset_after_s, clock=clock
        )
        self._wanted = model
        self._timeout_s = timeout_s
        self._connect_attempts = max(1, connect_attempts)
        self._backoff_base_s = backoff_base_s
        self._isolate = isolate_tenant_cache
        self._tokenize_timeout = httpx.Timeout(tokenize_timeout_s, connect=connect_timeout_s)
        self._client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s)
        )
        self._model_name = model or ""
        self._context_window = 0
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._prompts: OrderedDict[tuple[tuple[str, str], ...], list[int]] = OrderedDict()
        self._markers: frozenset[str] = frozenset()
        self._accepts_system = True
        self._overhead: MessageOverhead | None = None

    @classmethod
    async def connected(cls, urls: Sequence[str], **options: Any) -> VllmEngine:
        engine = cls(urls, **options)
        await engine.connect()
        return engine

    async def connect(self) -> None:
        """The served model and its context window, whether its template takes a system
        message, its markers, and its per-role token overheads."""
        self._model_name, self._context_window = await self._discover(self._wanted)
        self._accepts_system = await renders(self._tokenize_refusing)
        self._markers = await template_markers(self._render, self._accepts_system)
        self._overhead = await MessageOverhead.measure(
            self._full_count, self.count_tokens, opens_with_system=self._accepts_system
        )

    # Discovery and counting ------------------------------------------------------

    async def _discover(self, wanted: str | None) -> tuple[str, int]:
        """The served model and its context window (`max_model_len`) from `/v1/models`."""
        for attempt in range(self._connect_attempts):
            if attempt:
                await asyncio.sleep(backoff_s(attempt - 1, self._backoff_base_s))
            try:
                models = (await self._call("GET", "/v1/models"))["data"]
            except EngineUnavailableError:
                continue
            for entry in models:
                if wanted in (None, entry["id"]):
                    return str(entry["id"]), int(entry["max_model_len"])
            served = ", ".join(str(m["id"]) for m in models)
            raise EngineError(f"the engine serves {served}, not {wanted}")
        raise EngineUnavailableError(self._unreachable("no model list"))

    def _unreachable(self, what: str) -> str:
        urls = ", ".join(r.url for r in self._replicas.replicas)
        return f"{what}: no vLLM replica reachable ({urls})"

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        """One request (not generation) to the first replica that accepts a connection."""
        for replica in self._replicas.candidates(""):
            if not replica.breaker.allow():
                continue
            try:
                response = await self._client.request(
                    method, replica.url + path, json=body, timeout=self._tokenize_timeout
                )
            except _CONNECT_ERRORS:
                replica.breaker.record_failure()
                continue
            except httpx.TimeoutException as exc:
                replica.breaker.record_failure()
                raise EngineTimeoutError(f"{replica.url}{path} timed out") from exc
            except httpx.HTTPError as exc:
                replica.breaker.record_failure()
                raise EngineUnavailableError(f"{replica.url}{path} failed: {exc}") from exc
            _raise_for_status(replica, response.status_code, response.text)
            return response.json()
        raise EngineUnavailableError(self._unreachable(path))

    async def _tokenize_refusing(self, messages: Sequence[ChatMessage]) -> None:
        """Tokenise a chat as it is; raises when the server's template refuses it."""
        body = {
            "model": self._model_name,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "add_generation_prompt": True,
        }
        try:
            await self._call("POST", "/tokenize", body)
        except EngineUnavailableError:
            raise
        except EngineError as exc:  # 4xx: the template raised on this chat
            raise ValueError(str(exc)) from exc

    async def _render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt text the server's template makes of a chat (tokenised, then
        detokenised with its special tokens)."""
        tokens = await self.prompt_tokens(messages)
        body = {"model": self._model_name, "tokens": tokens}
        return str((await self._call("POST", "/detokenize", body))["prompt"])

    @property
    def accepts_system_role(self) -> bool:
        return self._accepts_system

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_window(self) -> int:
        return self._context_window

    async def count_tokens(self, text: str) -> int:
        """The server's count of a text, each distinct text asked once (LRU cache)."""
        if not text:
            return 0
        if (count := self._counts.get(text)) is not None:
            self._counts.move_to_end(text)
            return count
        body = {"model": self._model_name, "prompt": text, "add_special_tokens": False}
        count = int((await self._call("POST", "/tokenize", body))["count"])
        self._counts[text] = count
        if len(self._counts) > TEXTS_CACHED:
            self._counts.popitem(last=False)
        return count

    async def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt's tokens as the server builds them (its chat template, its tokenizer)."""
        if not messages:
            return []
        key = tuple((m.role, m.content) for m in messages)
        if (tokens := self._prompts.get(key)) is not None:
            self._prompts.move_to_end(key)
            return tokens
        body = {
            "model": self._model_name,
            "messages": self._messages(messages),
            "add_generation_prompt": True,
        }
        tokens = [int(t) for t in (await self._call("POST", "/tokenize", body))["tokens"]]
        self._prompts[key] = tokens
        while len(self._prompts) > PROMPTS_CACHED:
            self._prompts.popitem(last=False)
        return tokens

    async def _full_count(self, messages: Sequence[ChatMessage]) -> int:
        return len(await self.prompt_tokens(messages))

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        if not messages:
            # The server refuses to render an empty conversation; what the template adds
            # to any prompt (the reply's opening) is the measured fixed part.
            return self._overhead.fixed if self._overhead else 0
        prepared = prepare(messages, self._accepts_system, self._markers)
        counted = await self._overhead.count(prepared) if self._overhead else None
        return await self._full_count(messages) if counted is None else counted

    def _messages(self, messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        """The chat as the server's template gets it (see `chat_format.prepare`)."""
        prepared = prepare(messages, self._accepts_system, self._markers)
        return [{"role": m.role, "content": m.content} for m in prepared]

    # Generation ------------------------------------------------------------------

    def _body(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, stream: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model_name,
            "messages": self._messages(messages),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            # vLLM's extra sampling parameter; 0 (as in llama.cpp) means no top-k cut.
            "top_k": params.top_k if params.top_k > 0 else -1,
            "stream": stream,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if stream:
            body["stream_options"] = {"include_usage": True}
        route = current_route.get()
        if self._isolate and route is not None and route.tenant is not None:
            body["cache_salt"] = tenant_salt(route.tenant)
        return body

    async def _send(self, body: dict[str, Any]) -> tuple[Replica, httpx.Response]:
        """Post to the route's replicas in order; only failed connections move on."""
        route = current_route.get()
        key = route.key if route is not None else ""
        last: Exception | None = None
        for attempt in range(self._connect_attempts):
            candidates = self._replicas.candidates(key)
            if not candidates:
                break
            if attempt:
                await asyncio.sleep(backoff_s(attempt - 1, self._backoff_base_s))
            for replica in candidates:
                if not replica.breaker.allow():
                    continue
                try:
                    return replica, await self._post(replica, body)
                except _CONNECT_ERRORS as exc:
                    replica.breaker.record_failure()
                    last = exc
        raise EngineUnavailableError(self._unreachable(f"generation failed ({last})"))

    async def _post(self, replica: Replica, body: dict[str, Any]) -> httpx.Response:
        url = f"{replica.url}/v1/chat/completions"
        try:
            response = await self._client.send(
                self._client.build_request("POST", url, json=body), stream=True
            )
        except _CONNECT_ERRORS:
            raise
        except httpx.TimeoutException as exc:
            replica.breaker.record_failure()
            raise EngineTimeoutError(f"{url} did not answer within {self._timeout_s} s") from exc
        except httpx.HTTPError as exc:
            replica.breaker.record_failure()
            raise EngineUnavailableError(f"{url} failed: {exc}") from exc
        except BaseException:
            replica.breaker.release()
            raise
        if response.status_code >= 400:
            text = (await response.aread()).decode("utf-8", errors="replace")
            await response.aclose()
            _raise_for_status(replica, response.status_code, text)
        replica.breaker.record_success()
        return response

    async def _send_within(
        self, body: dict[str, Any], deadline: float
    ) -> tuple[Replica, httpx.Response]:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._send(body)
        except TimeoutError as exc:
            raise EngineTimeoutError(self._over_time()) from exc

    def _over_time(self) -> str:
        return f"the turn exceeded the engine's {self._timeout_s} s limit (prompt included)"

    def _deadline(self) -> float:
        """`timeout_s` bounds a whole generation: waiting for the server to take the
        prompt and evaluate it as much as producing the reply."""
        return asyncio.get_running_loop().time() + self._timeout_s

    async def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> Completion:
        deadline = self._deadline()
        body = self._body(messages, params, stream=False)
        replica, response = await self._send_within(body, deadline)
        payload = await self._read_json(replica, response, deadline)
        choice = payload["choices"][0]
        return _completion(choice["message"].get("content") or "", choice, payload.get("usage"))

    async def generate_json(
        self, messages: Sequence[ChatMessage], schema: Mapping[str, Any], params: SamplingParams
    ) -> str:
        """A reply constrained to `schema` (vLLM's structured output); valid JSON text."""
        deadline = self._deadline()
        body = self._body(messages, params, stream=False)
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": dict(schema), "strict": True},
        }
        replica, response = await self._send_within(body, deadline)
        payload = await self._read_json(replica, response, deadline)
        text = payload["choices"][0]["message"].get("content") or ""
        try:
            json.loads(text)
        except ValueError as exc:
            reason = payload["choices"][0].get("finish_reason")
            raise EngineError(f"the engine's JSON output is incomplete ({reason})") from exc
        return str(text)

    async def _read_json(
        self, replica: Replica, response: httpx.Response, deadline: float
    ) -> dict[str, Any]:
        try:
            async with asyncio.timeout_at(deadline):
                return dict(json.loads(await response.aread()))
        except TimeoutError as exc:
            raise EngineTimeoutError(f"{replica.url}: {self._over_time()}") from exc
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailableError(f"{replica.url} broke off its answer: {exc}") from exc
        finally:
            await response.aclose()

    async def stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> AsyncIterator[TextDelta | Completion]:
        """A cancelled stream (the client went away) closes the connection, which makes
        vLLM abort the request."""
        deadline = self._deadline()
        body = self._body(messages, params, stream=True)
        replica, response = await self._send_within(body, deadline)
        pieces: list[str] = []
        finish: dict[str, Any] = {}
        usage: dict[str, Any] | None = None
        events = _events(replica, response)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await anext(events)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    raise EngineTimeoutError(f"{replica.url}: {self._over_time()}") from exc
                usage = data.get("usage") or usage
                for choice in data.get("choices") or ():
                    if text := (choice.get("delta") or {}).get("content"):
                        pieces.append(text)
                        yield TextDelta(text)
                    if choice.get("finish_reason"):
                        finish = choice
        finally:
            await events.aclose()
            await response.aclose()
        if not finish or usage is None:
            raise EngineUnavailableError(f"{replica.url} ended its stream before the reply ended")
        yield _completion("".join(pieces), finish, usage)

    # Health and cache statistics -----------------------------------------------------

    async def check_health(self) -> str:
        """'ok (n/m replicas)' when at least one replica answers `/health`, else an error."""
        answers = await asyncio.gather(*(self._healthy(r) for r in self._replicas.replicas))
        num_ok = sum(answers)
        total = len(answers)
        if num_ok == 0:
            return f"error: none of {total} vLLM replicas answers"
        return f"ok ({num_ok}/{total} replicas)"

    async def _healthy(self, replica: Replica) -> bool:
        try:
            response = await self._client.get(f"{replica.url}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def prefix_cache_counters(self) -> tuple[float, float]:
        """(queries, hits) of the replicas' prefix caches, in tokens, from their /metrics."""
        queries = hits = 0.0
        for replica in self._replicas.replicas:
            try:
                response = await self._client.get(f"{replica.url}/metrics", timeout=2.0)
            except httpx.HTTPError:
                continue
            queries += metric_sum(response.text, "vllm:prefix_cache_queries_total")
            hits += metric_sum(response.text, "vllm:prefix_cache_hits_total")
        return queries, hits

    async def close(self) -> None:
        await self._client.aclose()


def tenant_salt(tenant: str) -> str:
    """vLLM's `cache_salt`: prompts with different salts never share cached blocks."""
    return hashlib.sha256(f"memchat-tenant\x00{tenant}".encode()).hexdigest()


def _raise_for_status(replica: Replica, status: int, text: str) -> None:
    """A server that answered is reachable; 5xx still counts against its breaker."""
    if status < 400:
        replica.breaker.record_success()
        return
    if status >= 500:
        replica.breaker.record_failure()
        raise EngineUnavailableError(f"{replica.url} answered {status}: {text[:300]}")
    replica.breaker.record_success()
    raise EngineError(f"{replica.url} refused the request ({status}): {text[:300]}")


async def _events(replica: Replica, response: httpx.Response) -> AsyncGenerator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to `[DONE]`."""
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                payload = json.loads(data)
            except ValueError as exc:
                raise EngineError(f"{replica.url} sent a malformed event: {data[:100]}") from exc
            if "error" in payload:
                raise EngineError(f"{replica.url} failed mid-reply: {payload['error']}")
            yield payload
    except httpx.TimeoutException as exc:
        raise EngineTimeoutError(f"{replica.url} stopped sending tokens") from exc
    except httpx.HTTPError as exc:
        replica.breaker.record_failure()
        raise EngineUnavailableError(f"{replica.url} broke off the reply: {exc!r}") from exc


def _completion(text: str, choice: dict[str, Any], usage: dict[str, Any] | None) -> Completion:
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return Completion(
        text=text,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        # vLLM leaves the field out when nothing was cached.
        cached_prompt_tokens=int(details.get("cached_tokens") or 0),
    )


def metric_sum(text: str, name: str) -> float:
    """The sum over all label sets of one counter in Prometheus' text format."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
