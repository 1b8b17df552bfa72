"""Retrieval variants on LoCoMo without the service around them, to compare many quickly.

Uses the service's own pieces (indexed-text recipes, the BM25 index, fusion, dedup and
the default ONNX embedder) on the same turns and questions as bench/locomo.py, but keeps
the vectors of each text recipe in a cache directory so that a variant costs seconds.
Prints recall@5/10/20 on a tuning split (conv-26, conv-44), a held-out split (conv-48,
conv-50) and all four. Settings were chosen on the tuning split only; bench/locomo.py
then measures the chosen ones through the API.

    .venv/bin/python bench/locomo_variants.py --cache /tmp/locomo-vectors \\
        "mode=lexical lexical=speaker+date+caption+previous1 feedback=3,10,0.3" ...

A variant is space-separated key=value: mode (dense|lexical|hybrid), dense and lexical
(recipes: raw or parts joined by +: speaker, date, caption, previousN), wd, wl (weights),
c (RRF constant), cw (weight of context terms in BM25), cand (candidates per list), dedup
(Jaccard threshold), k1, b, and feedback=docs,terms,weight.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
from locomo import CATEGORIES, DATA, normalise_evidence, normalise_id, sessions_of

from retrieval.fusion import drop_near_duplicates, reciprocal_rank_fusion
from retrieval.lexical import Feedback, LexicalIndex, tokenize
from retrieval.protocols import ScoredId
from retrieval.turn_text import TextRecipe, TurnText, indexed_parts, indexed_texts

KS = (5, 10, 20)
SPLITS = {"tune": ("conv-26", "conv-44"), "held-out": ("conv-48", "conv-50")}


def load(path: Path) -> list[tuple[str, list[tuple[str, TurnText]], list[tuple[str, set[str]]]]]:
    conversations = []
    for item in json.loads(path.read_text(encoding="utf-8")):
        turns = [
            (
                normalise_id(t["dia_id"]),
                TurnText(
                    f"s{number}",
                    position + 1,
                    "user",
                    t["speaker"],
                    t["text"],
                    date + dt.timedelta(seconds=position),
                    t.get("blip_caption"),
                ),
            )
            for number, date, session in sessions_of(item["conversation"])
            for position, t in enumerate(session)
        ]
        questions = [
            (qa["question"], normalise_evidence(qa.get("evidence", [])))
            for qa in item["qa"]
            if qa["category"] in CATEGORIES
        ]
        conversations.append((item["sample_id"], turns, [q for q in questions if q[1]]))
    return conversations


def recipe(spec: str) -> TextRecipe:
    if spec == "raw":
        return TextRecipe()
    parts = spec.split("+")
    previous = next((int(p.removeprefix("previous")) for p in parts if "previous" in p), 0)
    return TextRecipe("speaker" in parts, "date" in parts, "caption" in parts, previous)


class Vectors:
    """Vectors of every turn per recipe and of every question, cached as .npy files."""

    def __init__(self, cache: Path, conversations) -> None:
        self._cache = cache
        self._conversations = conversations
        self._embedder = None
        cache.mkdir(parents=True, exist_ok=True)

    def _embed(self, name: str, texts: list[str]) -> np.ndarray:
        path = self._cache / f"{name}.npy"
        if path.exists():
            return np.load(path)
        if self._embedder is None:
            from retrieval.embedders.onnx import OnnxEmbedder
            from retrieval.embedders.sentence_transformers import default_model_path

            self._embedder = OnnxEmbedder(default_model_path(), "all-MiniLM-L6-v2", self._cache)
        vectors = self._embedder.embed(texts)
        np.save(path, vectors)
        return vectors

    def turns(self, spec: str) -> np.ndarray:
        texts = [
            text
            for _, turns, _ in self._conversations
            for text in indexed_texts(recipe(spec), [t for _, t in turns])
        ]
        return self._embed(f"turns-{spec}", texts)

    def questions(self) -> np.ndarray:
        return self._embed("questions", [q for _, _, qs in self._conversations for q, _ in qs])


def evaluate(variant: dict[str, str], conversations, vectors: Vectors) -> dict[str, list]:
    mode = variant.get("mode", "hybrid")
    cand, c = int(variant.get("cand", 100)), float(variant.get("c", 60))
    weights = [float(variant.get("wd", 1)), float(variant.get("wl", 1))]
    dedup = float(variant.get("dedup", 2))
    docs, offsets = 0, 0
    matrix = vectors.turns(variant.get("dense", "raw")) if mode != "lexical" else None
    queries = vectors.questions()
    feedback = (
        Feedback(
            *[t(v) for t, v in zip((int, int, float), variant["feedback"].split(","), strict=True)]
        )
        if "feedback" in variant
        else None
    )
    results: dict[str, list] = {}
    for sample_id, turns, questions in conversations:
        k1, b = float(variant.get("k1", 1.2)), float(variant.get("b", 0.75))
        lexical = LexicalIndex(k1, b, feedback, float(variant.get("cw", 1)))
        parts = indexed_parts(recipe(variant.get("lexical", "raw")), [t for _, t in turns])
        lexical.add(1, list(range(len(turns))), [p[0] for p in parts], [p[1] for p in parts])
        prints = [frozenset(tokenize(t.content)) for _, t in turns]
        recalls = []
        for position, (question, gold) in enumerate(questions):
            rankings = []
            if mode != "lexical":
                scores = matrix[docs : docs + len(turns)] @ queries[offsets + position]
                rankings.append(
                    [ScoredId(int(i), float(scores[i])) for i in np.argsort(-scores)[:cand]]
                )
            if mode != "dense":
                rankings.append(lexical.search(1, question, cand))
            if len(rankings) == 1:
                ranked = rankings[0]
            else:
                ranked = reciprocal_rank_fusion(rankings, weights, c)
            if dedup <= 1:
                ranked = drop_near_duplicates(ranked, prints.__getitem__, dedup, max(KS))
            ids = [turns[hit.id][0] for hit in ranked[: max(KS)]]
            recalls.append([len(gold & set(ids[:k])) / len(gold) for k in KS])
        results[sample_id] = recalls
        docs += len(turns)
        offsets += len(questions)
    return results


def line(results: dict[str, list]) -> str:
    cells = []
    for name, members in [*SPLITS.items(), ("all", tuple(results))]:
        rows = [r for sample_id in members for r in results[sample_id]]
        means = np.mean(rows, axis=0)
        cells.append(f"{name} " + " ".join(f"@{k} {m:.3f}" for k, m in zip(KS, means, strict=True)))
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args()
    conversations = load(args.data)
    vectors = Vectors(args.cache, conversations)
    for text in args.variants:
        variant = dict(item.split("=", 1) for item in text.split())
        print(f"{text}\n    {line(evaluate(variant, conversations, vectors))}", flush=True)


if __name__ == "__main__":
    main()
