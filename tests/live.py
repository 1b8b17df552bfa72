"""A real uvicorn server in a thread, for tests that need true concurrency over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from litestar import Litestar


@contextmanager
def live_server(app: Litestar) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


MEMCHAT = [sys.executable, "-m", "app.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Converted models (the embedders' ONNX exports) shared by every server a test starts,
# and kept between runs: converting multilingual-e5-small takes a minute.
MODELS_DIR = Path(
    os.environ.get("MEMCHAT_TEST_MODELS_DIR", Path.home() / ".cache" / "memchat" / "models")
)


def cli_env(data_dir: Path, port: int = 8000) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    env |= {
        "MEMCHAT_DATA_DIR": str(data_dir),
        "MEMCHAT_MODELS_DIR": str(MODELS_DIR),
        "MEMCHAT_PORT": str(port),
        "MEMCHAT_ENGINE__CONTEXT_WINDOW": "2048",
        "HF_HUB_OFFLINE": "1",
    }
    return env


@contextmanager
def serving(
    data_dir: Path,
    *,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 120,
) -> Iterator[httpx.Client]:
    """`memchat serve` as a process; the client's `process` attribute is the server.

    `extra_env` is added to (and overrides) `cli_env`, e.g. a `MEMCHAT_DATABASE_URL`."""
    with serving_together([data_dir], extra_env=extra_env, ready_timeout_s=ready_timeout_s) as (
        client,
    ):
        yield client


@contextmanager
def serving_together(
    data_dirs: Sequence[Path],
    *,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 120,
) -> Iterator[list[httpx.Client]]:
    """`memchat serve` on each data directory, as `serving`: every process started
    before any is waited for (they load their models in parallel), stopped together."""
    started: list[tuple[subprocess.Popen[str], str]] = []
    try:
        for data_dir in data_dirs:
            port = free_port()
            process = subprocess.Popen(
                [*MEMCHAT, "serve"],
                env=cli_env(data_dir, port) | dict(extra_env or {}),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            started.append((process, f"http://127.0.0.1:{port}"))
        deadline = time.monotonic() + ready_timeout_s
        for process, base in started:
            _wait_ready(process, base, deadline, ready_timeout_s)
        with ExitStack() as stack:
            clients = []
            for process, base in started:
                client = stack.enter_context(httpx.Client(base_url=base, timeout=120))
                client.process = process  # type: ignore[attr-defined]
                clients.append(client)
            yield clients
    finally:
        for process, _ in started:
            process.send_signal(signal.SIGTERM)
        for process, _ in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(
    process: subprocess.Popen[str], base: str, deadline: float, timeout_s: float
) -> None:
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    pytest.fail(f"memchat serve did not become ready in {timeout_s} s")
