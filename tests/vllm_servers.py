"""Real vLLM servers on the CPU for the tests: prepared once, started per test module;
and a pass-through to put in front of one, to see the requests that reach it.

If vLLM cannot be installed or started, the tests fail and say why. With
MEMCHAT_TEST_VLLM=skip they are skipped instead, loudly: the vLLM adapter, replica
failover and the vLLM REST path are then untested (see README).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
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


@contextmanager
def running_servers(
    count: int, log_dir: Path, chat_templates: Sequence[Path | None] = ()
) -> Iterator[list[LocalServer]]:
    """`count` servers started together (they load in parallel), stopped at the end;
    server i uses `chat_templates[i]` where given."""
    python, model_dir = prepare()
    servers: list[LocalServer] = []
    templates = [*chat_templates, *([None] * count)][:count]
    try:
        for number, template in enumerate(templates):
            # Small and quick: no graph capture, 1 GiB of KV cache (~40,000 SmolLM2 tokens).
            options = vllm_local.ServerOptions(
                port=free_port(), kv_cache_gib=1, enforce_eager=True, chat_template=template
            )
            log = log_dir / f"vllm-{number}.log"
            process = vllm_local.start_server(python, model_dir, options, log)
            servers.append(LocalServer(f"http://127.0.0.1:{options.port}", process, log))
        for server in servers:
            try:
                vllm_local.wait_ready(server.url, server.process, timeout_s=600)
            except vllm_local.LocalEngineError as exc:
                tail = server.log.read_text(errors="replace")[-3000:]
                _unavailable(f"{exc}\n{tail}")
        yield servers
    finally:
        for server in servers:
            vllm_local.stop_server(server.process)


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
    for scripted replicas)."""

    daemon_threads = True

    def __init__(self, upstream: str, transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Forwarding)
        self.upstream = httpx.Client(base_url=upstream, timeout=120, transport=transport)
        self.requests: list[tuple[str, str, dict[str, str]]] = []

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
        request = upstream.build_request(
            self.command,
            self.path,
            headers={k: v for k, v in headers.items() if k not in HOP_BY_HOP},
            content=body,
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
    upstream: str, transport: httpx.BaseTransport | None = None
) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(upstream, transport)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        proxy.upstream.close()
        thread.join(timeout=10)
