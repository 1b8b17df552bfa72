"""Turn recall on LoCoMo through the public API: recall@5/10/20, search latency, import rate.

Each LoCoMo conversation becomes one user; each of its sessions one chat session, imported
with `POST /v1/sessions/{id}/history` (`external_id` = the turn's `dia_id`, `created_at`
from the session's date, the speaker as `name`, the image caption when the turn shared a
photo). Every question of categories 1-4 is then asked with `POST /v1/memory/search`
(`kinds: ["turn"]`, k = 20); recall@k of a question is the share of its evidence turns
among the first k results, averaged over questions. Nothing is tuned here: the service's
settings (from `MEMCHAT_*` variables, or the server's) are what is measured.

With `--context`, each question is also sent to `POST /v1/sessions/{id}/context` in a
fresh session of its user (no recent window: the prompt's memory is all retrieval, facts
and summary), with the embedded llama.cpp engine counting tokens: evidence-in-context is
the share of a question's evidence turns whose text is in the assembled prompt (a turn
shown by an excerpt counts when the excerpt holds each of its sentences that share a
term with the gold answer: `evidence_shown`), printed
beside the prompt's tokens (p50 / p95) and the memories it holds.

    .venv/bin/python bench/locomo.py [--url http://127.0.0.1:8000] [--data FILE] [--context]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from _client import latency_line, percentile, post, service

from retrieval.prompt.excerpt import sentences
from retrieval.prompt.render import quote
from retrieval.search.lexical import tokenize

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo10_dev.json"
KS = (5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
# Settings are chosen on the tune pair only; the held-out pair is only reported.
SPLITS = {"conv-26": "tune pair", "conv-44": "tune pair", "conv-48": "held-out pair"}
SPLITS["conv-50"] = "held-out pair"
_DIA_ID = re.compile(r"D(\d+)\s*:\s*(\d+)")


def normalise_evidence(items: list[str]) -> set[str]:
    """`D8:6; D9:17` -> {D8:6, D9:17}; `D30:05` -> D30:5 (numbers compared as numbers)."""
    found: set[str] = set()
    for item in items:
        for session, turn in _DIA_ID.findall(item):
            found.add(f"D{int(session)}:{int(turn)}")
    return found


def normalise_id(dia_id: str) -> str:
    return next(iter(normalise_evidence([dia_id])), dia_id)


def session_time(text: str) -> dt.datetime:
    """LoCoMo dates look like `1:56 pm on 8 May, 2023` (no zone: taken as UTC)."""
    return dt.datetime.strptime(text, "%I:%M %p on %d %B, %Y").replace(tzinfo=dt.UTC)


def sessions_of(conversation: dict) -> list[tuple[int, dt.datetime, list[dict]]]:
    found = []
    number = 1
    while f"session_{number}" in conversation:
        date = session_time(conversation[f"session_{number}_date_time"])
        found.append((number, date, conversation[f"session_{number}"]))
        number += 1
    return found


def history_messages(
    turns: list[dict], date: dt.datetime, speaker_a: str, *, captions: bool
) -> list[dict]:
    """One message per turn; a turn's time is its session's plus one second per turn."""
    messages = []
    for position, turn in enumerate(turns):
        message = {
            "role": "user" if turn["speaker"] == speaker_a else "assistant",
            "name": turn["speaker"],
            "content": turn["text"],
            "external_id": turn["dia_id"],
            "created_at": (date + dt.timedelta(seconds=position)).isoformat(),
        }
        if captions and turn.get("blip_caption"):
            message["image_caption"] = turn["blip_caption"]
        messages.append(message)
    return messages


def evidence_shown(text: str, answer: str, prompt: str, excerpts: dict[str, str | None]) -> bool:
    """An evidence turn is in the prompt when its text is, whole (the prompt quotes a
    memory as a JSON string, `quote`: a turn with a double quote or a line break is there
    in its escaped form), or when it is a memory shown by an excerpt that holds each of
    its sentences sharing a term with the question's gold answer. A turn with no such
    sentence (the answer is a paraphrase, or an inference) counts only whole."""
    if quote(text)[1:-1] in prompt:
        return True
    excerpt = excerpts.get(text)
    if excerpt is None:
        return False
    terms = set(tokenize(answer))
    carrying = [s for s in sentences(text) if terms.intersection(tokenize(s))]
    return bool(carrying) and all(s in excerpt for s in carrying)


@dataclass
class InContext:
    """Evidence-in-context: per question, the share of its evidence turns whose text is
    in the assembled prompt; with the prompt's tokens and number of memories."""

    shares: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    memories: list[int] = field(default_factory=list)

    def add(self, gold: set[str], texts: dict[str, str], preview: dict, answer: str) -> None:
        prompt = "\n".join(m["content"] for m in preview["messages"])
        excerpts = {m["text"]: m["excerpt"] for m in preview["context"]["memories"]}
        found = sum(evidence_shown(texts[g], answer, prompt, excerpts) for g in gold if g in texts)
        self.shares.append(found / len(gold))
        self.tokens.append(preview["context"]["prompt_tokens"])
        self.memories.append(len(preview["context"]["memories"]))

    def line(self, name: str) -> str:
        n = len(self.shares)
        tokens = f"{percentile(self.tokens, 0.5):.0f} / {percentile(self.tokens, 0.95):.0f}"
        return (
            f"  {name:<22} n={n:<4} evidence in context {sum(self.shares) / n:.3f}  "
            f"prompt tokens p50/p95 {tokens}  memories {sum(self.memories) / n:.1f}"
        )


@dataclass
class Tally:
    recall: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, gold: set[str], ranked: list[str]) -> None:
        for k in KS:
            self.recall[k].append(len(gold & set(ranked[:k])) / len(gold))

    def line(self, name: str) -> str:
        n = len(self.recall[KS[0]])
        cells = "  ".join(f"R@{k} {sum(v) / len(v):.3f}" for k, v in sorted(self.recall.items()))
        return f"  {name:<22} n={n:<4} {cells}"

    def value(self, k: int) -> float:
        return sum(self.recall[k]) / len(self.recall[k])


async def import_conversation(client, item: dict, run: str, *, captions: bool) -> tuple[str, int]:
    conversation = item["conversation"]
    user_id = f"locomo-{item['sample_id']}-{run}"
    num_turns = 0
    for number, date, turns in sessions_of(conversation):
        session = await post(client, "/v1/sessions", {"user_id": user_id, "title": f"s{number}"})
        messages = history_messages(turns, date, conversation["speaker_a"], captions=captions)
        result = await post(client, f"/v1/sessions/{session['id']}/history", {"messages": messages})
        num_turns += result["imported"]
    return user_id, num_turns


async def ask(client, user_id: str, question: str, latencies: list[float]) -> list[str]:
    started = time.perf_counter()
    body = {"user_id": user_id, "query": question, "k": max(KS), "kinds": ["turn"]}
    results = (await post(client, "/v1/memory/search", body))["results"]
    latencies.append(time.perf_counter() - started)
    return [normalise_id(r["external_id"] or "") for r in results]


def turn_texts(conversation: dict) -> dict[str, str]:
    """Each turn's text by its normalised id."""
    return {
        normalise_id(turn["dia_id"]): turn["text"]
        for _, _, turns in sessions_of(conversation)
        for turn in turns
    }


async def preview(client, session_id: str, question: str) -> dict:
    return await post(client, f"/v1/sessions/{session_id}/context", {"content": question})


@dataclass
class Figures:
    overall: Tally = field(default_factory=Tally)
    by_category: dict[int, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_conversation: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_split: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    in_context: InContext = field(default_factory=InContext)
    in_context_by_category: dict[int, InContext] = field(
        default_factory=lambda: defaultdict(InContext)
    )
    in_context_by_split: dict[str, InContext] = field(
        default_factory=lambda: defaultdict(InContext)
    )
    latencies: list[float] = field(default_factory=list)
    num_unanswerable: int = 0

    def print(self, context: bool) -> None:
        print(latency_line(self.latencies))
        print(f"questions without evidence skipped: {self.num_unanswerable}")
        print(self.overall.line("categories 1-4"))
        for category, name in CATEGORIES.items():
            print(self.by_category[category].line(f"{category} {name}"))
        for sample_id, tally in self.by_conversation.items():
            print(tally.line(sample_id))
        for split, tally in self.by_split.items():
            print(tally.line(split))
        if context:
            print("what reaches the prompt (a fresh session, the embedded engine's tokens):")
            print(self.in_context.line("categories 1-4"))
            for category, name in CATEGORIES.items():
                print(self.in_context_by_category[category].line(f"{category} {name}"))
            for split, shown in self.in_context_by_split.items():
                print(shown.line(split))

    def values(self, context: bool) -> dict:
        by_conversation = self.by_conversation.items()
        values = {
            "overall": {k: self.overall.value(k) for k in KS},
            "by_conversation": {s: {k: t.value(k) for k in KS} for s, t in by_conversation},
            "by_split": {s: {k: t.value(k) for k in KS} for s, t in self.by_split.items()},
        }
        if context:
            shown = self.in_context
            values |= {
                "evidence_in_context": sum(shown.shares) / len(shown.shares),
                "prompt_tokens_p50": percentile(shown.tokens, 0.5),
                "prompt_tokens_p95": percentile(shown.tokens, 0.95),
                "evidence_in_context_by_split": {
                    split: sum(seen.shares) / len(seen.shares)
                    for split, seen in self.in_context_by_split.items()
                },
                "evidence_in_context_by_category": {
                    CATEGORIES[category]: sum(seen.shares) / len(seen.shares)
                    for category, seen in self.in_context_by_category.items()
                },
            }
        return values


async def ask_all(client, item: dict, user_id: str, figures: Figures, context: bool) -> None:
    """Every question of categories 1-4 with evidence: searched, and previewed if asked."""
    texts = turn_texts(item["conversation"])
    if context:
        fresh = await post(client, "/v1/sessions", {"user_id": user_id, "title": "q"})
    for qa in item["qa"]:
        if qa["category"] not in CATEGORIES:
            continue
        gold = normalise_evidence(qa.get("evidence", []))
        if not gold:
            figures.num_unanswerable += 1
            continue
        ranked = await ask(client, user_id, qa["question"], figures.latencies)
        tallies = [
            figures.overall,
            figures.by_category[qa["category"]],
            figures.by_conversation[item["sample_id"]],
        ]
        if item["sample_id"] in SPLITS:
            tallies.append(figures.by_split[SPLITS[item["sample_id"]]])
        for tally in tallies:
            tally.add(gold, ranked)
        if context:
            shown = await preview(client, fresh["id"], qa["question"])
            seen_in = [figures.in_context, figures.in_context_by_category[qa["category"]]]
            if item["sample_id"] in SPLITS:
                seen_in.append(figures.in_context_by_split[SPLITS[item["sample_id"]]])
            for seen in seen_in:
                seen.add(gold, texts, shown, str(qa["answer"]))


async def run(args: argparse.Namespace) -> dict:
    conversations = json.loads(args.data.read_text(encoding="utf-8"))
    run_id = uuid.uuid4().hex[:8]
    figures = Figures()
    num_turns, import_s = 0, 0.0
    async with service(args.url, real_engine=args.context) as client:
        for item in conversations:
            started = time.perf_counter()
            user_id, imported = await import_conversation(
                client, item, run_id, captions=not args.no_captions
            )
            import_s += time.perf_counter() - started
            num_turns += imported
            await ask_all(client, item, user_id, figures, args.context)
    print(f"LoCoMo {args.data.name}: {len(conversations)} conversations, {num_turns} turns")
    print(f"import: {num_turns / import_s:.1f} turns/s ({import_s:.1f} s)")
    figures.print(args.context)
    return figures.values(args.context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running service; default: one in process")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--no-captions", action="store_true", help="do not send image captions with turns"
    )
    parser.add_argument(
        "--context",
        action="store_true",
        help="also measure evidence-in-context through the context preview",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
