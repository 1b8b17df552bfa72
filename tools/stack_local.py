"""The docker-compose topology without Docker, then a smoke test through it, then stop.

Services, as in docker-compose.yml: this machine's PostgreSQL (a database of its own,
dropped at the end), a Chroma server (`chroma run`), vLLM on the CPU (the local engine
server, `.venv-vllm`), a one-shot `memchat migrate`, and the app (`memchat serve` with
engine.kind=vllm). The smoke test: readiness of every service, a session, two chat
turns (the second served partly from the engine's prefix cache), a memory search,
the prefix-cache hit rate in /metrics.

    .venv/bin/python tools/stack_local.py      (make stack-local)

MEMCHAT_STACK_POSTGRES_URL: admin URL of the PostgreSQL server
(default postgresql+asyncpg://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.vllm_server import local as vllm_local
from retrieval.engines.llamacpp import default_model_path

ADMIN_URL = os.environ.get(
    "MEMCHAT_STACK_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def step(message: str) -> None:
    print(f"[stack-local] {message}", flush=True)


async def _admin(statement: str) -> None:
    engine = create_async_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as connection:
            await connection.execute(text(statement))
    finally:
        await engine.dispose()


@contextmanager
def postgres_database() -> Iterator[str]:
    name = f"memchat_stack_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    step(f"postgres: database {name}")
    try:
        yield f"{ADMIN_URL.rpartition('/')[0]}/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def process(name: str, command: list[str], log: Path, env: dict[str, str] | None = None):
    with log.open("ab") as output:
        started = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    step(f"{name}: pid {started.pid}, log {log}")
    try:
        yield started
    finally:
        vllm_local.stop_server(started)


def wait_for(url: str, started: subprocess.Popen[bytes], name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if started.poll() is not None:
            raise SystemExit(f"{name} exited with {started.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                step(f"{name}: ready")
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{name} was not ready within {timeout_s} s")


def smoke(api: str, chroma: str) -> None:
    with httpx.Client(base_url=api, timeout=300) as client:
        ready = client.get("/readyz").json()
        assert ready["status"] == "ready", ready
        assert ready["checks"]["engine_health"] == "ok (1/1 replicas)", ready
        session = client.post("/v1/sessions", json={"user_id": "smoke"}).json()["id"]
        turns = []
        for content in ("I am allergic to peanuts. 我对花生过敏。", "What snack do you suggest?"):
            response = client.post(
                f"/v1/sessions/{session}/messages",
                json={"content": content, "max_tokens": 24, "temperature": 0},
            )
            assert response.status_code == 200, response.text
            turns.append(response.json())
        for turn in turns:
            assert turn["usage"]["prompt_tokens"] == turn["context"]["prompt_tokens"], turn
        assert turns[1]["usage"]["cached_prompt_tokens"] > 0, turns[1]["usage"]
        hits = client.post(
            "/v1/memory/search", json={"user_id": "smoke", "query": "food allergy", "k": 2}
        ).json()
        assert hits["results"][0]["id"] == turns[0]["message"]["id"], hits
        assert "memchat_engine_prefix_cache_hit_rate" in client.get("/metrics").text
        step(f"turn 2: {turns[1]['usage']}")
    assert httpx.get(f"{chroma}/api/v2/heartbeat", timeout=5).status_code == 200
    step("smoke test passed")


def main() -> None:
    python = vllm_local.ensure_venv()
    model = vllm_local.ensure_checkpoint(python, default_model_path())
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="memchat-stack-") as scratch:
        root = Path(scratch)
        database_url = stack.enter_context(postgres_database())

        chroma_port = free_port()
        chroma = f"http://127.0.0.1:{chroma_port}"
        chroma_cmd = [str(BIN / "chroma"), "run", "--path", str(root / "chroma"),
                      "--host", "127.0.0.1", "--port", str(chroma_port)]  # fmt: skip
        chroma_proc = stack.enter_context(process("chroma", chroma_cmd, root / "chroma.log"))

        options = vllm_local.ServerOptions(port=free_port(), kv_cache_gib=1, enforce_eager=True)
        engine = f"http://127.0.0.1:{options.port}"
        vllm_proc = vllm_local.start_server(python, model, options, root / "vllm.log")
        stack.callback(vllm_local.stop_server, vllm_proc)
        step(f"vllm: pid {vllm_proc.pid}, log {root / 'vllm.log'}")

        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMCHAT_")}
        env |= {
            "MEMCHAT_DATABASE_URL": database_url,
            "MEMCHAT_DATA_DIR": str(root / "data"),
            "MEMCHAT_ENGINE__KIND": "vllm",
            "MEMCHAT_VLLM_URLS": engine,
            # The knowledge base's Chroma server: read by the Chroma adapter once merged.
            "MEMCHAT_CHROMA_URL": chroma,
            "MEMCHAT_PORT": str(free_port()),
        }
        wait_for(f"{chroma}/api/v2/heartbeat", chroma_proc, "chroma", 120)
        vllm_local.wait_ready(engine, vllm_proc, timeout_s=600)
        step("vllm: ready")
        step("migrate: memchat migrate (one shot)")
        subprocess.run([str(BIN / "memchat"), "migrate"], env=env, check=True)
        api = f"http://127.0.0.1:{env['MEMCHAT_PORT']}"
        app_proc = stack.enter_context(
            process("app", [str(BIN / "memchat"), "serve"], root / "app.log", env)
        )
        wait_for(f"{api}/readyz", app_proc, "app", 300)
        smoke(api, chroma)
    step("stopped every service")


if __name__ == "__main__":
    main()
