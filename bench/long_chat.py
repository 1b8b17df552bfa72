"""A scripted 60-turn conversation through the REST API with the CPU engine.

Turn 1 states a constraint (a peanut allergy), the following turns talk of other things,
the last asks for a snack. Per turn it prints prompt tokens, the share of the prompt
shared with the previous prompt (`prefix_reuse`), the share the engine reused from its
KV cache, the time to first streamed token, whether the prompt stayed within the
budget, and where the turn-1 constraint is in the assembled context: in the recent
window, pinned as a key fact, in the session summary, or among retrieved memories.
Runs English and Chinese with the default window (prefix-stable: it grows by appending
and compacts in chunks), and English again with a 20-message window that slides one
message at a time, to show what prefix stability is worth.

    .venv/bin/python bench/long_chat.py [--turns 60] [--max-tokens 16] [--runs en-stable ...]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from _server import start_server

SCRIPTS = {
    "en": (
        "I am allergic to peanuts. Never suggest anything that contains peanuts.",
        [
            "What is a good name for a grey cat?", "How do I keep basil alive indoors?",
            "Recommend a science-fiction novel.", "What is the capital of Australia?",
            "How long should I boil an egg?", "Tell me a fun fact about octopuses.",
            "How do I fix a squeaky door?", "What is a haiku?", "Explain what a leap year is.",
            "Suggest a name for a rowing boat.", "How far is the Moon?",
            "What should I pack for a weekend hike?",
        ],
        "Any idea for an afternoon snack?",
    ),
    "zh": (
        "我对花生过敏，千万不要推荐任何含花生的东西。",
        [
            "给一只灰猫起个名字吧。", "室内怎么养罗勒？", "推荐一本科幻小说。",
            "澳大利亚的首都是哪里？",
            "鸡蛋要煮多久？", "讲一个关于章鱼的趣事。", "门吱吱响怎么修？", "什么是俳句？",
            "解释一下闰年。", "给一条划艇起个名字。", "月球有多远？", "周末徒步要带什么？",
        ],
        "下午吃点什么零食好？",
    ),
}  # fmt: skip
CHECKPOINTS = (20, 40, 60)
SLIDING = {"MEMCHAT_CHAT__RECENT_WINDOW_MESSAGES": "20", "MEMCHAT_CHAT__WINDOW_EVICTION_CHUNK": "1"}
RUNS = {"en-stable": {}, "zh-stable": {}, "en-sliding": SLIDING}


def stream_turn(
    client: httpx.Client, session: str, content: str, max_tokens: int
) -> tuple[float, dict]:
    started = time.perf_counter()
    first_token = None
    done: dict = {}
    body = {"content": content, "stream": True, "max_tokens": max_tokens, "temperature": 0}
    with client.stream("POST", f"/v1/sessions/{session}/messages", json=body) as response:
        event = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                if event == "token" and first_token is None:
                    first_token = time.perf_counter() - started
                elif event == "done":
                    done = json.loads(line.partition(":")[2])
                elif event == "error":
                    raise RuntimeError(line)
    return (first_token if first_token is not None else time.perf_counter() - started), done


def where_is(client: httpx.Client, session: str, user: str, done: dict, first_id: int) -> str:
    """Where the turn-1 message is in this turn's context, if anywhere."""
    context = done["context"]
    places = []
    if first_id in context["recent_message_ids"]:
        places.append("window")
    pinned = {f["id"] for f in context["pinned_facts"]}
    facts = client.get(f"/v1/users/{user}/facts").json()["facts"]
    if any(first_id in f["source_message_ids"] and f["id"] in pinned for f in facts):
        places.append("pinned")
    if context["summary_through_seq"] >= 1:
        summaries = client.get(f"/v1/sessions/{session}/summaries").json()["summaries"]
        text = summaries[-1]["text"] if summaries else ""
        if "allerg" in text or "过敏" in text:
            places.append("summary")
    if any(m["id"] == first_id for m in context["memories"]):
        places.append("memory")
    return "+".join(places) or "-"


def run_script(url: str, language: str, turns: int, max_tokens: int) -> dict[str, float]:
    constraint, filler, last = SCRIPTS[language]
    contents = [constraint] + [filler[i % len(filler)] for i in range(turns - 2)] + [last]
    reuse_shares, cached_shares, ttfts, present, over_budget = [], [], [], {}, 0
    user = f"long-{language}"
    with httpx.Client(base_url=url, timeout=300) as client:
        session = client.post("/v1/sessions", json={"user_id": user}).json()["id"]
        first_id = 0
        print(f"\n[{language}] turn  prompt  reuse  cached  ttft_ms  constraint")
        for number, content in enumerate(contents, 1):
            ttft, done = stream_turn(client, session, content, max_tokens)
            context = done["context"]
            if number == 1:
                first_id = done["message"]["id"]
            place = where_is(client, session, user, done, first_id)
            prompt = done["usage"]["prompt_tokens"]
            if prompt + context["reply_tokens_reserved"] > context["context_window"]:
                over_budget += 1
            reuse = (context["prefix_reuse"] or 0) / prompt
            cached = (done["usage"]["cached_prompt_tokens"] or 0) / prompt
            if number > 1:
                reuse_shares.append(reuse)
                cached_shares.append(cached)
                ttfts.append(ttft)
            if number in CHECKPOINTS:
                present[number] = place != "-"
            print(f"[{language}] {number:4d}  {prompt:6d}  {reuse:5.2f}  {cached:6.2f}  "
                  f"{ttft * 1000:7.0f}  {place}")  # fmt: skip
    summary = {
        "mean prefix reuse share (turns 2+)": statistics.fmean(reuse_shares),
        "mean engine cache share (turns 2+)": statistics.fmean(cached_shares),
        "median time to first token (ms)": statistics.median(ttfts) * 1000,
        "turns over budget": float(over_budget),
    }
    summary |= {f"constraint in context at turn {n}": float(p) for n, p in present.items()}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--runs", nargs="+", default=["en-stable", "zh-stable", "en-sliding"], choices=RUNS
    )
    args = parser.parse_args()
    results = {}
    for name in args.runs:
        language, layout = name.split("-")
        # The sliding window re-evaluates most of a 4k-token prompt each turn: on the CPU
        # that can pass the service's default limit for one turn, which is not measured here.
        env = {**RUNS[name], "MEMCHAT_ENGINE__TIMEOUT_S": "600"}
        with tempfile.TemporaryDirectory() as data_dir:
            process, url = start_server(Path(data_dir), env)
            try:
                results[(language, layout)] = run_script(url, language, args.turns, args.max_tokens)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    print()
    for (language, layout), summary in results.items():
        print(f"{language}, {layout} window:")
        for name, value in summary.items():
            print(f"  {name}: {value:.2f}")


if __name__ == "__main__":
    main()
