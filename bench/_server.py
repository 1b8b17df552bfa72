"""Start `memchat serve` on a fresh data dir, or a local vLLM CPU server, for a benchmark
(shared by the bench scripts)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

# Converted models (ONNX exports) kept between runs: converting e5 takes a minute.
# `MEMCHAT_MODELS_DIR` says where, for the benchmarks that build the service themselves
# too (as the service's own setting does).
MODELS_CACHE = Path(
    os.environ.get("MEMCHAT_MODELS_DIR") or Path.home() / ".cache" / "memchat" / "models"
)

REPO = Path(__file__).resolve().parents[1]


def start_server(
    data_dir: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
    env |= {
        "MEMCHAT_DATA_DIR": str(data_dir),
        # Converted models kept between runs, as the in-process service keeps them.
        "MEMCHAT_MODELS_DIR": str(MODELS_CACHE),
        "MEMCHAT_PORT": str(port),
        "MEMCHAT_LOG_LEVEL": "warning",
        **(extra_env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, timeout_s=300)
    except RuntimeError:
        process.kill()
        raise
    return process, url


def wait_until_ready(url: str, process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """Until the app at `url` answers `/readyz` with 200; fails early if it exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the app at {url} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the app at {url} was not ready within {timeout_s:g} s")
        time.sleep(0.2)


@contextmanager
def local_vllm(
    log: Path,
    *,
    port: int,
    enforce_eager: bool,
    kv_cache_gib: int = 2,
    max_model_len: int | None = None,
) -> Iterator[str]:
    """A vLLM CPU server of the local environment (`make vllm`) on SmolLM2-135M; its URL."""
    sys.path.insert(0, str(REPO))
    from app.vllm_server import local as vllm_local
    from retrieval.engines.llamacpp import default_model_path

    python = vllm_local.ensure_venv()
    model = vllm_local.ensure_checkpoint(python, default_model_path())
    options = vllm_local.ServerOptions(
        port=port,
        enforce_eager=enforce_eager,
        kv_cache_gib=kv_cache_gib,
        **({} if max_model_len is None else {"max_model_len": max_model_len}),
    )
    process = vllm_local.start_server(python, model, options, log)
    url = f"http://127.0.0.1:{options.port}"
    try:
        vllm_local.wait_ready(url, process, timeout_s=1200)
        yield url
    finally:
        vllm_local.stop_server(process)
