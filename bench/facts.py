"""Precision and recall of the rule-based fact extractor on labelled user sentences.

    python bench/facts.py [--set test|dev] [--show-errors]

`bench/labelled/facts_test.jsonl` (240 sentences, 120 English and 120 Chinese, 40% of them
carrying no fact) is the held-out set the figures are reported on; `facts_dev.jsonl` is
for development. A predicted fact is correct when its subject key and value match a
labelled one of the same sentence: equal after case and punctuation folding, or one
containing the other and at least 60% of its length ("peanut" / "peanuts").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retrieval.facts.model import normalize
from retrieval.facts.rules import rule_extractor

DATA = Path(__file__).parent / "labelled"


def similar(a: str, b: str) -> bool:
    a, b = normalize(a), normalize(b)
    if a == b:
        return True
    short, long = sorted((a, b), key=len)
    return bool(short) and short in long and len(short) >= 0.6 * len(long)


def same_fact(predicted: tuple[str, str], gold: tuple[str, str]) -> bool:
    (p_subject, p_value), (g_subject, g_value) = predicted, gold
    p_key, _, p_item = p_subject.partition(":")
    g_key, _, g_item = g_subject.partition(":")
    return p_key == g_key and similar(p_item, g_item) and similar(p_value, g_value)


def score(items: list[dict]) -> tuple[Counter, list[str]]:
    extractor = rule_extractor()
    counts: Counter = Counter()
    errors: list[str] = []
    for item in items:
        lang = item["lang"]
        gold = [(f["subject"], f["value"]) for f in item["facts"]]
        predicted = [(f.subject, f.value) for f in extractor.extract_now(item["text"])]
        unmatched = list(gold)
        for fact in predicted:
            match = next((g for g in unmatched if same_fact(fact, g)), None)
            if match is None:
                counts[lang, "fp"] += 1
                errors.append(f"FP [{lang}] {item['text']!r}: {fact}")
            else:
                unmatched.remove(match)
                counts[lang, "tp"] += 1
        for fact in unmatched:
            counts[lang, "fn"] += 1
            errors.append(f"FN [{lang}] {item['text']!r}: {fact}")
    return counts, errors


def report(counts: Counter, langs: list[str]) -> tuple[float, float]:
    tp = sum(counts[lang, "tp"] for lang in langs)
    fp = sum(counts[lang, "fp"] for lang in langs)
    fn = sum(counts[lang, "fn"] for lang in langs)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return precision, recall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=["test", "dev"], default="test")
    parser.add_argument("--show-errors", action="store_true")
    args = parser.parse_args()
    lines = (DATA / f"facts_{args.set}.jsonl").read_text(encoding="utf-8").splitlines()
    items = [json.loads(line) for line in lines if line.strip()]
    counts, errors = score(items)
    print(f"rule-based extractor on {args.set} set ({len(items)} sentences)")
    print(f"{'':8} {'sentences':>9} {'facts':>6} {'precision':>9} {'recall':>7}")
    for name, langs in (("en", ["en"]), ("zh", ["zh"]), ("all", ["en", "zh"])):
        precision, recall = report(counts, langs)
        num = sum(1 for i in items if i["lang"] in langs)
        facts = sum(len(i["facts"]) for i in items if i["lang"] in langs)
        print(f"{name:8} {num:>9} {facts:>6} {precision:>9.3f} {recall:>7.3f}")
    if args.show_errors:
        print("\n".join(errors))


if __name__ == "__main__":
    main()
