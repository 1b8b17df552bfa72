"""What decoding a request body costs: a history import of 1,000 messages of 2,000
characters each, from bytes to the checked `HistoryImport` (app/api/requests.py), in
plain English and in text with characters that normalisation changes.

    python -m bench.body_decode [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from app.api import schemas
from app.api.requests import convert_strict, decode_json

WORDS = (
    "the user said they would like a table for two near the window at seven, "
    "and the waiter wrote it down"
)


# Text a client may send: English (ASCII), other scripts, an emoji ZWJ sequence and a
# flag now and then, and the worst case: a decomposed accent and a joiner after every
# word (each pass of `normalise` then has work everywhere).
SCENARIOS = (
    ("ascii", ""),
    ("cafe, chinese, an emoji sequence", "café 我喜欢茶 "),
    ("worst: joiner and decomposed accent per word", "e\u0301\u200d"),
)
EMOJI = "\U0001f469\u200d\u2764\ufe0f\u200d\U0001f468 "


def history_body(num_messages: int, num_chars: int, extra: str = "") -> bytes:
    rng = random.Random(7)
    messages = []
    for i in range(num_messages):
        text = ""
        while len(text) < num_chars:
            text += rng.choice(WORDS.split()) + " " + extra
        role = "user" if i % 2 == 0 else "assistant"
        if extra and not extra.startswith("e"):
            text = EMOJI + text
        messages.append({"role": role, "content": text[:num_chars], "external_id": f"m{i}"})
    return json.dumps({"messages": messages}, ensure_ascii=False).encode()


def timed(raw: bytes, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        convert_strict(decode_json(raw), schemas.HistoryImport)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    for label, extra in SCENARIOS:
        raw = history_body(1000, 2000, extra)
        seconds = timed(raw, args.repeat)
        print(f"{label}: {len(raw) / 1e6:.1f} MB decoded in {seconds * 1000:.1f} ms (median)")


if __name__ == "__main__":
    main()
