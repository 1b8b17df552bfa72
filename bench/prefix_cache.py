"""How much of each turn's prompt the engine serves from its prefix cache, per turn.

A returning user (earlier conversations imported into another session, so memories are
retrieved on every turn) holds a scripted 20-turn conversation through the REST API,
streamed. Per turn it prints prompt tokens, cached prompt tokens (what the engine
reports), their share, the prefix shared with the previous prompt, the tokens of the
retrieved memories and the time to first token. It runs twice: with the prefix-stable
layout ([system][recent window][memories][message]) and with it switched off (memories
before the recent window, `MEMCHAT_CHAT__STABLE_LAYOUT=false`).

With `--locomo`, the returning user is a LoCoMo conversation instead (conv-26, all its
sessions imported with their dates), and each of the 20 turns asks a question of the
data set whose evidence lies in another session, so that every turn retrieves memories
the session has not shown yet. Per turn it also prints whether the evidence reaches the
prompt: among the turn's own memories, or the earlier turns' still in the recent window.
`--memory-max-tokens` sets the memory budget (`MEMCHAT_CHAT__MEMORY_MAX_TOKENS`) and
`--memory-min-tokens` a continuing turn's least (`MEMCHAT_CHAT__MEMORY_MIN_TOKENS`), to
weigh them against the cached share.

Each run gets a fresh data dir and a nonce at the start of the system prompt, so the
second run finds nothing of the first in the engine's cache.

    .venv/bin/python bench/prefix_cache.py --vllm-url http://127.0.0.1:8001
    .venv/bin/python bench/prefix_cache.py --start-vllm        # a local CPU server
    .venv/bin/python bench/prefix_cache.py --engine llamacpp   # the embedded engine
    .venv/bin/python bench/prefix_cache.py --engine llamacpp --locomo [--memory-max-tokens N]
    .venv/bin/python bench/prefix_cache.py --start-vllm --locomo --layout stable \
        --engine-timeout 300 [--max-model-len 8192]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
from _server import local_vllm, start_server
from locomo import DATA as LOCOMO_DATA
from locomo import history_messages, normalise_evidence, normalise_id, sessions_of
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


@dataclass(frozen=True)
class Scenario:
    """A returning user: earlier sessions to import, then the turns, each with the texts
    of the turns that answer it (empty: not measured)."""

    earlier: list[list[dict]]
    turns: list[tuple[str, set[str]]]


def scripted() -> Scenario:
    history = [{"role": r, "content": c} for r, c in EARLIER]
    return Scenario([history], [(content, set()) for content in TURNS])


def locomo(path: Path, num_turns: int = 20) -> Scenario:
    """conv-26's sessions, and one question per session (in session order, then round
    again) whose evidence lies all in that session, categories 1-4."""
    item = json.loads(path.read_text(encoding="utf-8"))[0]
    conversation = item["conversation"]
    sessions = sessions_of(conversation)
    texts = {normalise_id(t["dia_id"]): t["text"] for _, _, ts in sessions for t in ts}
    by_session: dict[int, list[tuple[str, set[str]]]] = {}
    for qa in item["qa"]:
        gold = normalise_evidence(qa.get("evidence", []))
        numbers = {int(g[1:].split(":")[0]) for g in gold}
        if qa.get("category") in (1, 2, 3, 4) and len(numbers) == 1 and gold <= texts.keys():
            answer = {texts[g] for g in gold}
            by_session.setdefault(numbers.pop(), []).append((qa["question"], answer))
    if sum(map(len, by_session.values())) < num_turns:
        raise SystemExit(f"{path}: fewer than {num_turns} questions with one session's evidence")
    turns: list[tuple[str, set[str]]] = []
    while len(turns) < num_turns:
        for number in sorted(by_session):
            if by_session[number] and len(turns) < num_turns:
                turns.append(by_session[number].pop(0))
    earlier = [
        history_messages(ts, date, conversation["speaker_a"], captions=True)
        for _, date, ts in sessions
    ]
    return Scenario(earlier, turns)


def run_conversation(
    url: str, max_tokens: int, label: str, scenario: Scenario
) -> list[dict[str, float]]:
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for history in scenario.earlier:
            earlier = client.post("/v1/sessions", json={"user_id": "returning"}).json()["id"]
            client.post(f"/v1/sessions/{earlier}/history", json={"messages": history})
        session = client.post("/v1/sessions", json={"user_id": "returning"}).json()["id"]
        print(f"\n[{label}] turn  prompt  cached  share  prefix_reuse  memory_tokens  "
              "memories  evidence  ttft_ms")  # fmt: skip
        # The memory texts each user message of the session was sent with, by its id.
        shown_by: dict[int, set[str]] = {}
        for number, (content, answer) in enumerate(scenario.turns, 1):
            ttft, done = stream_turn(client, session, content, max_tokens)
            context = done["context"]
            prompt = done["usage"]["prompt_tokens"]
            cached = done["usage"]["cached_prompt_tokens"] or 0
            reuse = context["prefix_reuse"] or 0
            memory_tokens = context["tokens"]["memories"]
            own = {m["text"] for m in context["memories"]}
            in_window = [shown_by.get(i, set()) for i in context["recent_message_ids"]]
            shown = own.union(*in_window)
            shown_by[done["message"]["id"]] = own
            evidence = len(answer & shown) / len(answer) if answer else float("nan")
            rows.append({"prompt": prompt, "cached": cached, "ttft": ttft, "evidence": evidence})
            print(f"[{label}] {number:4d}  {prompt:6d}  {cached:6d}  {cached / prompt:5.2f}  "
                  f"{reuse:12d}  {memory_tokens:13d}  {len(own):8d}  {evidence:8.2f}  "
                  f"{ttft * 1000:7.0f}")  # fmt: skip
    return rows


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    later = rows[2:]  # turn 3 on
    shares = [r["cached"] / r["prompt"] for r in later]
    figures = {
        "cached share, turns 3-20 (tokens)": sum(r["cached"] for r in later)
        / sum(r["prompt"] for r in later),
        "lowest per-turn share, turns 3-20": min(shares),
        "turns 3-20 at >= 80% cached": float(sum(s >= 0.8 for s in shares)),
        "median time to first token, turns 3-20 (ms)": statistics.median(r["ttft"] for r in later)
        * 1000,
    }
    measured = [r["evidence"] for r in rows if r["evidence"] == r["evidence"]]  # not NaN
    if measured:
        figures["evidence in the prompt, all turns (share)"] = statistics.mean(measured)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["vllm", "llamacpp"], default="vllm")
    parser.add_argument("--vllm-url", action="append", default=[], help="repeat for replicas")
    parser.add_argument("--start-vllm", action="store_true", help="start a local CPU server")
    parser.add_argument("--enforce-eager", action="store_true", help="faster start (local)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--locomo",
        nargs="?",
        const=LOCOMO_DATA,
        type=Path,
        help="a LoCoMo conversation as the returning user (default file: the shared data)",
    )
    parser.add_argument("--memory-max-tokens", type=int, help="MEMCHAT_CHAT__MEMORY_MAX_TOKENS")
    parser.add_argument("--memory-min-tokens", type=int, help="MEMCHAT_CHAT__MEMORY_MIN_TOKENS")
    parser.add_argument(
        "--layout",
        choices=["both", "stable", "memories-first"],
        default="both",
        help="run one layout only (memories-first is slow on a CPU engine: nothing is cached)",
    )
    parser.add_argument(
        "--max-model-len", type=int, help="the local vLLM server's context (default 8192)"
    )
    parser.add_argument(
        "--engine-timeout", type=float, help="MEMCHAT_ENGINE__TIMEOUT_S (a slow CPU engine)"
    )
    args = parser.parse_args()
    scenario = locomo(args.locomo) if args.locomo else scripted()
    results = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        urls = args.vllm_url
        if args.engine == "vllm" and (args.start_vllm or not urls):
            urls = [
                stack.enter_context(
                    local_vllm(
                        Path(scratch) / "vllm.log",
                        port=18731,
                        enforce_eager=args.enforce_eager,
                        max_model_len=args.max_model_len,
                    )
                )
            ]
        for stable in (True, False):
            label = "stable" if stable else "memories-first"
            if args.layout not in ("both", label):
                continue
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
            if args.memory_max_tokens is not None:
                env["MEMCHAT_CHAT__MEMORY_MAX_TOKENS"] = str(args.memory_max_tokens)
            if args.memory_min_tokens is not None:
                env["MEMCHAT_CHAT__MEMORY_MIN_TOKENS"] = str(args.memory_min_tokens)
            if args.engine_timeout is not None:
                env["MEMCHAT_ENGINE__TIMEOUT_S"] = str(args.engine_timeout)
            process, url = start_server(data_dir, env)
            try:
                rows = run_conversation(url, args.max_tokens, label, scenario)
                results[label] = summary(rows)
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
