"""Real vLLM servers on the CPU for the tests: prepared once, started once per run and
shared by the modules that need them; and a pass-through to put in front of one, to see
the requests that reach it, or to give its chat requests a template of their own.

If vLLM cannot be installed or started, the tests fail and say why. With
MEMCHAT_TEST_VLLM=skip they are skipped instead, loudly: the vLLM adapter, replica
failover and the vLLM REST path are then untested (see README).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.vllm_server import local as vllm_local
from tests.live import free_port

BLOCK_SIZE = vllm_local.ServerOptions().block_size


@dataclass
class LocalServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL the server and its engine process (its own process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _unavailable(reason: str) -> None:
    message = f"vLLM on CPU is NOT TESTED: {reason}"
    if os.environ.get("MEMCHAT_TEST_VLLM") == "skip":
        pytest.skip(message)
    pytest.fail(message + " (set MEMCHAT_TEST_VLLM=skip to skip these tests)")


def prepare() -> tuple[Path, Path]:
    from retrieval.engines.llamacpp import default_model_path

    try:
        python = vllm_local.ensure_venv(vllm_local.DEFAULT_VENV)
        return python, vllm_local.ensure_checkpoint(python, default_model_path())
    except (vllm_local.LocalEngineError, OSError) as exc:
        _unavailable(str(exc))
        raise  # pragma: no cover - _unavailable always raises


class ServerPool:
    """The run's local vLLM servers, shared by every module that needs some (starting
    them is most of the time these tests take): started on first demand, a killed one
    replaced on the next, all stopped at the end of the run.

    Each takes a chat template with a request (`--trust-request-chat-template`), so one
    server serves every template a test puts in front of it (`recording_proxy`)."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._servers: list[LocalServer] = []

    def running(self, count: int) -> list[LocalServer]:
        """`count` running servers, those already running first; the others are started
        together (they load in parallel)."""
        alive = [server for server in self._servers if server.process.poll() is None]
        if len(alive) < count:
            alive += self._start(count - len(alive))
        return alive[:count]

    def _start(self, count: int) -> list[LocalServer]:
        python, model_dir = prepare()
        started: list[LocalServer] = []
        for _ in range(count):
            # Small and quick: no graph capture, 1 GiB of KV cache (~40,000 SmolLM2 tokens).
            options = vllm_local.ServerOptions(
                port=free_port(), kv_cache_gib=1, enforce_eager=True,
                trust_request_chat_template=True,
            )  # fmt: skip
            log = self._log_dir / f"vllm-{len(self._servers)}.log"
            process = vllm_local.start_server(python, model_dir, options, log)
            server = LocalServer(f"http://127.0.0.1:{options.port}", process, log)
            self._servers.append(server)
            started.append(server)
        for server in started:
            try:
                vllm_local.wait_ready(server.url, server.process, timeout_s=600)
            except vllm_local.LocalEngineError as exc:
                tail = server.log.read_text(errors="replace")[-3000:]
                _unavailable(f"{exc}\n{tail}")
        return started

    def close(self) -> None:
        for server in self._servers:
            vllm_local.stop_server(server.process)


@contextmanager
def server_pool(log_dir: Path) -> Iterator[ServerPool]:
    pool = ServerPool(log_dir)
    try:
        yield pool
    finally:
        pool.close()


# Headers of one connection, not of the message: the pass-through sets its own.
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "host",
}  # fmt: skip


class RecordingProxy(ThreadingHTTPServer):
    """A pass-through to `upstream`: each request goes on with its method, path, headers
    and body, each answer comes back as the upstream sends it, chunk by chunk (a stream
    stays a stream); the headers that arrived with each request are kept (`requests`).
    `transport`, where given, is how the upstream is reached (an `httpx.MockTransport`
    for scripted replicas). `chat_template`, where given, goes with every chat request
    (a JSON body with `messages`: chat completions and `/tokenize`) as vLLM's
    request-level template: to the app, the upstream then serves with that template."""

    daemon_threads = True

    def __init__(
        self,
        upstream: str,
        transport: httpx.BaseTransport | None = None,
        chat_template: str | None = None,
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Forwarding)
        self.upstream = httpx.Client(base_url=upstream, timeout=120, transport=transport)
        self.chat_template = chat_template
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    def rewrite(self, body: bytes) -> bytes:
        """The body as sent upstream: with the chat template where one is set."""
        if self.chat_template is None or not body:
            return body
        payload = json.loads(body)
        if not isinstance(payload, dict) or "messages" not in payload:
            return body
        return json.dumps(payload | {"chat_template": self.chat_template}).encode()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Forwarding(BaseHTTPRequestHandler):
    server: RecordingProxy
    # HTTP/1.0: one request per connection, and an answer without a length (a stream)
    # ends when the connection closes.
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.requests.append((self.command, self.path, headers))
        upstream = self.server.upstream
        sent = self.server.rewrite(body)
        request = upstream.build_request(
            self.command,
            self.path,
            headers={
                k: v for k, v in headers.items() if k not in HOP_BY_HOP and k != "content-length"
            },
            content=sent,
        )
        answer = upstream.send(request, stream=True)
        try:
            self.send_response_only(answer.status_code, answer.reason_phrase)
            for name, value in answer.headers.multi_items():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("connection", "close")
            self.end_headers()
            for chunk in answer.iter_raw():
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            answer.close()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def recording_proxy(
    upstream: str, transport: httpx.BaseTransport | None = None, chat_template: str | None = None
) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(upstream, transport, chat_template)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        proxy.upstream.close()
        thread.join(timeout=10)
