"""An HTTP client for the retrieval benchmarks: the service in process, or a running one.

In process, the app is built by `create_app(Settings(...))` with the real default
embedder and a whitespace-counting engine that never generates (benchmarks of memory
search need no LLM). Settings not given here come from `MEMCHAT_*` variables, so a
variant of the retrieval settings is chosen from the shell.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from _server import MODELS_CACHE

from app.adapters import EMBEDDERS
from app.factory import create_app
from app.settings import Settings
from retrieval.errors import EngineError
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta
from storage import migrate
from storage.db import create_engine

# One line per request would drown the figures.
logging.getLogger("httpx").setLevel(logging.WARNING)


class CountingEngine:
    """Counts tokens by whitespace; generation is refused (search benchmarks never chat)."""

    model_name = "none"
    context_window = 8192

    async def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return sum(len(m.content.split()) + 3 for m in messages)

    async def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        return [0] * await self.count_prompt_tokens(messages)

    async def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> Completion:
        raise EngineError("the benchmark engine does not generate")

    async def stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> AsyncIterator[TextDelta | Completion]:
        raise EngineError("the benchmark engine does not generate")
        yield  # pragma: no cover

    async def close(self) -> None:
        return None


@asynccontextmanager
async def service(
    url: str | None, *, real_engine: bool = False
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the service at `url`, or of a fresh in-process one on a temporary dir:
    with the counting engine, or with `real_engine` the configured one (the embedded
    llama.cpp model by default), whose tokenizer then counts the prompts."""
    if url is not None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            yield client
        return
    from litestar.testing import AsyncTestClient

    with tempfile.TemporaryDirectory() as tmp:
        # Converted models kept between runs (converting multilingual-e5-small takes a
        # minute), unless MEMCHAT_MODELS_DIR says where.
        settings = Settings(data_dir=Path(tmp))
        if settings.models_dir is None:
            settings.models_dir = MODELS_CACHE
        engine = create_engine(settings.resolved_database_url())
        await migrate.upgrade(engine)
        await engine.dispose()
        app = create_app(settings, engine=None if real_engine else CountingEngine())
        # Addressed as a local client: local mode answers loopback hosts only.
        async with AsyncTestClient(
            app=app, base_url="http://127.0.0.1:8000", timeout=600
        ) as client:
            yield client


def add_embedder_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--embedder",
        choices=sorted(EMBEDDERS),
        help="the in-process service's embedder kind (MEMCHAT_EMBEDDER__KIND); "
        "default: the settings' (onnx)",
    )


def use_embedder(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The in-process service reads its settings from `MEMCHAT_*`: the chosen kind goes
    there, like any other variant chosen from the shell."""
    if args.embedder is None:
        return
    if args.url is not None:
        parser.error("--embedder chooses the in-process service's embedder; not with --url")
    os.environ["MEMCHAT_EMBEDDER__KIND"] = args.embedder


async def post(client: httpx.AsyncClient, path: str, body: dict) -> dict:
    response = await client.post(path, json=body)
    if response.status_code >= 300:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:500]}")
    return response.json()


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def latency_line(values_s: Sequence[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (
        f"search latency: p50 {statistics.median(ms):.1f} ms, p95 {percentile(ms, 0.95):.1f} ms "
        f"({len(ms)} searches)"
    )
