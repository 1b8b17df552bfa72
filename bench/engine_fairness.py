"""How long one user's long prompt holds others up, on the embedded engine (llama.cpp).

A long message (30,000 characters, ~7,700 tokens, `max_tokens` 1, as the issue that
found it) is sent, and a short turn of another user starts just after it. Printed for
1 slot (the engine as it was: one KV cache, one turn at a time) and for the default
2 slots: the short turn's latency alone and behind the long prompt, and how long the
long prompt held its slot (at most the time limit, prompt evaluation included).

    .venv/bin/python bench/engine_fairness.py [--timeout-s 60] [--slots 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from retrieval.engines.llamacpp import LlamaCppEngine, default_model_path
from retrieval.errors import EngineTimeoutError
from retrieval.protocols import ChatMessage, SamplingParams

WEEK = "Ugh, what a week. The weather was awful and the trains were late. "
LONG = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", (WEEK * 500)[:30_000]),
]
SHORT = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Suggest a snack without peanuts."),
]


async def timed(
    engine: LlamaCppEngine, messages: list[ChatMessage], max_tokens: int
) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        await engine.generate(messages, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        outcome = "done"
    except EngineTimeoutError:
        outcome = "timed out"
    return time.perf_counter() - started, outcome


async def run(slots: int, timeout_s: float) -> None:
    engine = await LlamaCppEngine.loaded(
        default_model_path(), context_window=8192, num_slots=slots, timeout_s=timeout_s
    )
    print(f"long prompt: {len(await engine.prompt_tokens(LONG))} tokens; slots: {slots}")
    alone, _ = await timed(engine, SHORT, 16)
    long_task = asyncio.create_task(timed(engine, LONG, 1))
    await asyncio.sleep(0.2)
    behind, _ = await timed(engine, SHORT, 16)
    held, outcome = await long_task
    print(
        f"  short turn alone {alone:.2f} s, behind the long prompt {behind:.2f} s; "
        f"the long prompt {outcome} after {held:.2f} s"
    )
    await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    for slots in args.slots:
        asyncio.run(run(slots, args.timeout_s))


if __name__ == "__main__":
    main()
