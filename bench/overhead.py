"""Memory overhead of one chat turn without generation: embed + search + assemble.

Stores 1k, then 10k turns for one user (LoCoMo dialogue turns, cycled across sessions)
on the real default stack (all-MiniLM-L6-v2, FAISS, SQLite, SmolLM2's tokenizer), then
times `preview_context` (embed the new message, search the user's past turns, load the
recent window and the retrieved rows, assemble the prompt) for LoCoMo questions.
Prints p50/p95 of the whole and of each stage. A benchmark: nothing here is asserted.

    .venv/bin/python bench/overhead.py [--queries 200] [--sizes 1000 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from app.factory import Runtime, build_runtime, close_runtime
from app.settings import Settings
from retrieval.chat import ImportedMessage
from retrieval.protocols import SamplingParams
from storage import migrate
from storage.db import create_engine

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo10_dev.json"
TURNS_PER_SESSION = 500


def load_locomo(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(speaker, text) of every dialogue turn, and every question, from the LoCoMo file."""
    conversations = json.loads(path.read_text(encoding="utf-8"))
    turns: list[tuple[str, str]] = []
    questions: list[str] = []
    for item in conversations:
        conversation = item["conversation"]
        number = 1
        while f"session_{number}" in conversation:
            turns.extend((t["speaker"], t["text"]) for t in conversation[f"session_{number}"])
            number += 1
        questions.extend(qa["question"] for qa in item["qa"])
    return turns, questions


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summary(name: str, values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (
        f"  {name:<30} p50 {statistics.median(ms):7.2f} ms   p95 {percentile(ms, 0.95):7.2f} ms"
        f"   mean {statistics.fmean(ms):7.2f} ms"
    )


async def fill(
    runtime: Runtime, user_id: str, turns: list[tuple[str, str]], start: int, stop: int
) -> str:
    """Store turns[start:stop], cycled, in sessions of TURNS_PER_SESSION; returns the last one."""
    session_id = ""
    for offset in range(start, stop, TURNS_PER_SESSION):
        chat, _user = await runtime.store.create_session(user_id, f"bench {offset}", {})
        session_id = chat.id
        batch = []
        for position in range(offset, min(stop, offset + TURNS_PER_SESSION)):
            speaker, text = turns[position % len(turns)]
            role = "user" if position % 2 == 0 else "assistant"
            batch.append(ImportedMessage(role=role, content=text, name=speaker))
        await runtime.chat.import_history(session_id, batch)
    return session_id


async def measure(
    runtime: Runtime, session_id: str, questions: list[str], num_queries: int
) -> None:
    params = SamplingParams(max_tokens=256)
    user = (await runtime.store.get_session(session_id))[1]
    for question in questions[:10]:  # warm-up
        await runtime.chat.preview_context(session_id, question, params)
    whole, embed, search, assemble_rest = [], [], [], []
    for question in questions[:num_queries]:
        t0 = time.perf_counter()
        await runtime.chat.preview_context(session_id, question, params)
        whole.append(time.perf_counter() - t0)
        # The stages again, separately, for the breakdown.
        t1 = time.perf_counter()
        vector = (await runtime.memory.embed([question]))[0]
        t2 = time.perf_counter()
        await runtime.memory.search(user.id, vector, 5, query=question)
        t3 = time.perf_counter()
        embed.append(t2 - t1)
        search.append(t3 - t2)
        # SQL reads overlap the embedding in a turn, so this is what the turn adds beyond it.
        assemble_rest.append(max(0.0, whole[-1] - (t3 - t1)))
    print(summary("embed + search + assemble", whole))
    print(summary("  embed (MiniLM, 1 query)", embed))
    print(summary("  search (FAISS + BM25, k=5)", search))
    print(summary("  the rest: SQL reads, assemble", assemble_rest))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    turns, questions = load_locomo(args.data)
    print(f"LoCoMo: {len(turns)} turns, {len(questions)} questions; {args.queries} timed queries")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp))
        engine = create_engine(settings.resolved_database_url())
        await migrate.upgrade(engine)
        await engine.dispose()
        runtime = await build_runtime(settings)
        try:
            stored = 0
            for size in sorted(args.sizes):
                t0 = time.perf_counter()
                session_id = await fill(runtime, "bench-user", turns, stored, size)
                elapsed = time.perf_counter() - t0
                print(f"\n{size} stored turns (imported {size - stored} in {elapsed:.1f} s)")
                stored = size
                await measure(runtime, session_id, questions, args.queries)
        finally:
            await close_runtime(runtime)


if __name__ == "__main__":
    asyncio.run(main())
