"""How much of each turn's prompt the engine serves from its prefix cache, per turn.

A returning user (earlier conversations imported into another session, so memories are
retrieved on every turn) holds a scripted 20-turn conversation through the REST API,
streamed. Per turn it prints prompt tokens, cached prompt tokens (what the engine
reports), their share, the prefix shared with the previous prompt, the tokens of the
retrieved memories and the time to first token. It runs twice: with the prefix-stable
layout ([system][recent window][memories][message]) and with it switched off (memories
before the recent window, `MEMCHAT_CHAT__STABLE_LAYOUT=false`).

Each run gets a fresh data dir and a nonce at the start of the system prompt, so the
second run finds nothing of the first in the engine's cache.

    .venv/bin/python bench/prefix_cache.py --vllm-url http://127.0.0.1:8001
    .venv/bin/python bench/prefix_cache.py --start-vllm        # a local CPU server
    .venv/bin/python bench/prefix_cache.py --engine llamacpp   # the embedded engine
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
from _server import local_vllm, start_server
from long_chat import stream_turn

REPO = Path(__file__).resolve().parents[1]
EARLIER = [
    ("user", "I am allergic to peanuts, so please never suggest anything with peanuts."),
    ("assistant", "Understood: no peanuts in anything I suggest."),
    ("user", "My daughter Lea plays the violin every evening after school."),
    ("assistant", "Lovely, violin practice every evening is a great habit."),
    ("user", "We moved to Lyon last spring and I still get lost in the old town."),
    ("assistant", "Vieux Lyon's traboules are confusing at first; it gets easier."),
    ("user", "我每天早上喝绿茶，不喝咖啡。"),
    ("assistant", "好的，你早上喝绿茶，不喝咖啡。"),
    ("user", "I am training for a half marathon in October."),
    ("assistant", "Good luck with the training; build up the long runs slowly."),
    ("user", "Our cat is called Miso and she hates the vacuum cleaner."),
    ("assistant", "Miso sounds like a typical cat; many hate vacuum cleaners."),
]
TURNS = [
    "Good morning! What could I cook tonight for the family?",
    "Something without meat, please.",
    "How long does that take to prepare?",
    "Could Lea help me cook it?",
    "What should I drink with it?",
    "And for dessert?",
    "Any idea for a weekend outing near Lyon?",
    "Is it suitable for a cat owner who is away for a day?",
    "What should I pack for that trip?",
    "How do I fit my running training into the weekend?",
    "我周末应该跑多远？",
    "What should I eat before a long run?",
    "Is green tea fine before running?",
    "Suggest a snack for the drive back.",
    "How do I keep Miso calm while we are away?",
    "What is a good piece for a young violinist to learn next?",
    "How many minutes a day should she practise?",
    "Give me a shopping list for the week.",
    "Anything I should avoid buying?",
    "Thanks! Summarise our plans for the weekend.",
]


def run_conversation(url: str, max_tokens: int, label: str) -> list[dict[str, float]]:
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        earlier = client.post("/v1/sessions", json={"user_id": "returning"}).json()["id"]
        history = [{"role": r, "content": c} for r, c in EARLIER]
        client.post(f"/v1/sessions/{earlier}/history", json={"messages": history})
        session = client.post("/v1/sessions", json={"user_id": "returning"}).json()["id"]
        print(f"\n[{label}] turn  prompt  cached  share  prefix_reuse  memory_tokens  ttft_ms")
        for number, content in enumerate(TURNS, 1):
            ttft, done = stream_turn(client, session, content, max_tokens)
            prompt = done["usage"]["prompt_tokens"]
            cached = done["usage"]["cached_prompt_tokens"] or 0
            reuse = done["context"]["prefix_reuse"] or 0
            memory_tokens = done["context"]["tokens"]["memories"]
            rows.append({"prompt": prompt, "cached": cached, "ttft": ttft})
            print(f"[{label}] {number:4d}  {prompt:6d}  {cached:6d}  {cached / prompt:5.2f}  "
                  f"{reuse:12d}  {memory_tokens:13d}  {ttft * 1000:7.0f}")  # fmt: skip
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    later = rows[2:]  # turn 3 on
    shares = [r["cached"] / r["prompt"] for r in later]
    return {
        "cached share, turns 3-20 (tokens)": sum(r["cached"] for r in later)
        / sum(r["prompt"] for r in later),
        "lowest per-turn share, turns 3-20": min(shares),
        "turns 3-20 at >= 80% cached": float(sum(s >= 0.8 for s in shares)),
        "median time to first token, turns 3-20 (ms)": statistics.median(r["ttft"] for r in later)
        * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["vllm", "llamacpp"], default="vllm")
    parser.add_argument("--vllm-url", action="append", default=[], help="repeat for replicas")
    parser.add_argument("--start-vllm", action="store_true", help="start a local CPU server")
    parser.add_argument("--enforce-eager", action="store_true", help="faster start (local)")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    results = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        urls = args.vllm_url
        if args.engine == "vllm" and (args.start_vllm or not urls):
            urls = [
                stack.enter_context(
                    local_vllm(
                        Path(scratch) / "vllm.log", port=18731, enforce_eager=args.enforce_eager
                    )
                )
            ]
        for stable in (True, False):
            label = "stable" if stable else "memories-first"
            data_dir = Path(scratch) / label
            prompt_file = Path(scratch) / f"{label}.txt"
            system = (REPO / "app" / "prompts" / "system.txt").read_text(encoding="utf-8")
            prompt_file.write_text(f"[{uuid.uuid4().hex[:8]}] {system}", encoding="utf-8")
            env = {
                "MEMCHAT_ENGINE__KIND": args.engine,
                "MEMCHAT_CHAT__STABLE_LAYOUT": str(stable).lower(),
                "MEMCHAT_CHAT__SYSTEM_PROMPT_FILE": str(prompt_file),
            }
            if args.engine == "vllm":
                env["MEMCHAT_VLLM_URLS"] = ",".join(urls)
            process, url = start_server(data_dir, env)
            try:
                results[label] = summary(run_conversation(url, args.max_tokens, label))
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    print()
    for label, figures in results.items():
        print(f"{label} layout ({args.engine}):")
        for name, value in figures.items():
            print(f"  {name}: {value:.2f}")


if __name__ == "__main__":
    main()
