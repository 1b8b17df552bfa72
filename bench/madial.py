"""Memory recall on MADial-Bench (English) through the public API.

MADial-Bench gives a bank of 160 dated memories (short third-person events such as
"Bart danced at the Christmas party and felt very happy") and 160 dialogues of two users
(Bart, Lisa) with an assistant; at the `test-turn` the assistant should bring up one of
the `relevant-id` memories. The bank carries no owner, so each dialogue user gets the
whole bank, imported as one session of turns (`external_id` = memory id, `created_at` =
its date, text = the event). The query is the dialogue before the first test turn: either
the user's last message (`last`) or all the user's messages so far (`user`).
recall@k = share of the relevant ids among the first k results; hit@k = at least one.

    .venv/bin/python bench/madial.py [--url URL] [--query last|user]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import time
import uuid
from pathlib import Path

from _client import latency_line, post, service

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "madial_bench_en"
KS = (1, 3, 5, 10)
_LINE = re.compile(r'^<([^>]+)>:\s*"?(.*?)"?\s*$', re.DOTALL)


def read_json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def memory_bank(directory: Path) -> dict[str, dict]:
    bank: dict[str, dict] = {}
    for item in read_json_lines(directory / "MADial-Bench-en-memory.json"):
        bank.update(item)
    return bank


def user_lines(dialogue: list[str], test_turn: int) -> list[str]:
    """The user's messages before the test turn (markers and the assistant's left out)."""
    found = []
    for line in dialogue[1:test_turn]:
        match = _LINE.match(line.strip())
        if match and match.group(1) != "Assistant":
            found.append(match.group(2))
    return found


async def import_bank(client, user_id: str, bank: dict[str, dict]) -> int:
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
        for memory_id, memory in bank.items()
    ]
    result = await post(client, f"/v1/sessions/{session['id']}/history", {"messages": messages})
    return result["imported"]


async def run(args: argparse.Namespace) -> None:
    bank = memory_bank(args.data)
    dialogues = read_json_lines(args.data / "MADial-Bench-en-dialogue.json")
    run_id = uuid.uuid4().hex[:8]
    recall = {k: [] for k in KS}
    hit = {k: [] for k in KS}
    latencies: list[float] = []
    async with service(args.url) as client:
        users = {}
        for user in sorted({d["user-id"] for d in dialogues}):
            users[user] = f"madial-{user}-{run_id}"
            await import_bank(client, users[user], bank)
        for dialogue in dialogues:
            lines = user_lines(dialogue["dialogue"], min(dialogue["test-turn"]))
            query = lines[-1] if args.query == "last" else " ".join(lines)
            started = time.perf_counter()
            body = {"user_id": users[dialogue["user-id"]], "query": query, "k": max(KS)}
            results = (await post(client, "/v1/memory/search", {**body, "kinds": ["turn"]}))[
                "results"
            ]
            latencies.append(time.perf_counter() - started)
            ranked = [r["external_id"] for r in results]
            relevant = {str(i) for i in dialogue["relevant-id"]}
            for k in KS:
                found = relevant & set(ranked[:k])
                recall[k].append(len(found) / len(relevant))
                hit[k].append(1.0 if found else 0.0)
    print(f"MADial-Bench en: {len(bank)} memories, {len(dialogues)} dialogues, query={args.query}")
    print("  recall " + "  ".join(f"@{k} {sum(v) / len(v):.3f}" for k, v in recall.items()))
    print("  hit    " + "  ".join(f"@{k} {sum(v) / len(v):.3f}" for k, v in hit.items()))
    print(latency_line(latencies))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running service; default: one in process")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--query", choices=["last", "user"], default="user")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
