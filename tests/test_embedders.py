"""Every embedder adapter gives the same normalised vectors for the same model."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from app.adapters import load_embedder
from app.settings import EmbedderSettings, Settings
from retrieval.embedders.onnx import (
    BULK_MIN_TEXTS,
    OnnxEmbedder,
    OnnxQueryEmbedder,
    length_batches,
)
from retrieval.embedders.sentence_transformers import (
    SentenceTransformerEmbedder,
    default_model_path,
)
from retrieval.protocols import Embedder, QueryEmbedder

pytestmark = pytest.mark.model

TEXTS = [
    "I am allergic to peanuts.",
    "我对花生过敏",
    "我叫小明，我今年6岁了",
    "When did Caroline go to the LGBTQ support group?" * 3,
    "",
    "ok",
]


@pytest.fixture(scope="module")
def torch_embedder() -> Embedder:
    return SentenceTransformerEmbedder(default_model_path(), "all-MiniLM-L6-v2")


def test_onnx_and_torch_adapters_agree(real_embedder: Embedder, torch_embedder: Embedder) -> None:
    onnx_vectors = real_embedder.embed_now(TEXTS)
    torch_vectors = torch_embedder.embed_now(TEXTS)
    assert onnx_vectors.shape == torch_vectors.shape == (len(TEXTS), 384)
    assert onnx_vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(onnx_vectors, axis=1), 1.0, atol=1e-5)
    cosines = (onnx_vectors * torch_vectors).sum(axis=1)
    assert cosines.min() > 0.9999
    assert real_embedder.model_name == torch_embedder.model_name == "all-MiniLM-L6-v2"
    assert real_embedder.dimension == torch_embedder.dimension == 384


def test_batches_keep_input_order(real_embedder: Embedder) -> None:
    batch = real_embedder.embed_now(TEXTS)
    one_by_one = np.stack([real_embedder.embed_now([t])[0] for t in TEXTS])
    np.testing.assert_allclose(batch, one_by_one, atol=1e-5)
    assert real_embedder.embed_now([]).shape == (0, 384)


def test_similar_meaning_scores_higher(real_embedder: Embedder) -> None:
    query, close, far = real_embedder.embed_now(
        ["What food am I allergic to?", "I am allergic to peanuts.", "The train leaves at nine."]
    )
    assert float(query @ close) > float(query @ far) + 0.2


def test_onnx_export_is_cached(onnx_cache_dir: Path, real_embedder: Embedder) -> None:
    exported = list(onnx_cache_dir.glob("all-MiniLM-L6-v2-????????????????.onnx"))
    assert len(exported) == 1
    before = exported[0].stat().st_mtime_ns
    OnnxEmbedder(default_model_path(), "all-MiniLM-L6-v2", onnx_cache_dir)
    assert exported[0].stat().st_mtime_ns == before


def test_int8_model_is_quantised_once_and_named_apart(
    onnx_cache_dir: Path, real_embedder: Embedder, tmp_path: Path
) -> None:
    (exported,) = onnx_cache_dir.glob("all-MiniLM-L6-v2-????????????????.onnx")
    shutil.copy(exported, tmp_path / exported.name)  # the full model, exported once already
    int8 = OnnxEmbedder(default_model_path(), "all-MiniLM-L6-v2", tmp_path, int8=True)
    assert int8.model_name == "all-MiniLM-L6-v2-int8"
    quantized = tmp_path / f"{exported.stem}-int8.onnx"
    assert quantized.exists() and quantized.stat().st_size < exported.stat().st_size / 3
    vectors = int8.embed_now(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Close to the full model's vectors, not equal to them: hence a name of its own.
    cosines = (vectors * real_embedder.embed_now(TEXTS)).sum(axis=1)
    assert cosines.min() > 0.95 and cosines.max() < 0.99999
    before = quantized.stat().st_mtime_ns
    OnnxEmbedder(default_model_path(), "all-MiniLM-L6-v2", tmp_path, int8=True)
    assert quantized.stat().st_mtime_ns == before


def test_bf16_path_gives_the_fp32_vectors_for_large_calls(onnx_cache_dir: Path) -> None:
    embedder = OnnxEmbedder(
        default_model_path(), "all-MiniLM-L6-v2", onnx_cache_dir, bf16_bulk=True
    )
    assert embedder.bulk is not None
    texts = [f"{text} ({number})" for number in range(2) for text in TEXTS]
    assert len(texts) >= BULK_MIN_TEXTS
    # Before the model is loaded, every call is answered in fp32 (and starts the load).
    fp32 = embedder.embed_now(texts)
    assert embedder.bulk.wait(timeout=120) and not embedder.bulk.failed
    bf16 = embedder.embed_now(texts)
    # Computed apart (not bit for bit the same), the same vectors for ranking.
    cosines = (bf16 * fp32).sum(axis=1)
    assert cosines.min() > 0.9995 and not np.array_equal(bf16, fp32)
    np.testing.assert_allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-5)
    assert embedder.model_name == "all-MiniLM-L6-v2"
    # Fewer texts than BULK_MIN_TEXTS stay in fp32, bit for bit.
    few = texts[: BULK_MIN_TEXTS - 1]
    np.testing.assert_array_equal(embedder.embed_now(few), fp32[: BULK_MIN_TEXTS - 1])


def test_bf16_path_is_not_for_int8(onnx_cache_dir: Path) -> None:
    with pytest.raises(ValueError, match="not with int8"):
        OnnxEmbedder(
            default_model_path(), "all-MiniLM-L6-v2", onnx_cache_dir, int8=True, bf16_bulk=True
        )


def test_length_batches_group_similar_lengths_under_a_token_budget() -> None:
    lengths = [5, 1, 300, 2, 300, 300]
    batches = length_batches(lengths, max_rows=4, max_tokens=600)
    assert [b.tolist() for b in batches] == [[1, 3, 0], [2, 4], [5]]
    # A row longer than the budget still goes, alone; no budget: rows only.
    assert [b.tolist() for b in length_batches([900, 10], 4, 600)] == [[1], [0]]
    assert [b.tolist() for b in length_batches(lengths, 4, None)] == [[1, 3, 0], [2, 4, 5]]
    # A long query apart from its short sentences; rows within the slack stay together.
    assert [b.tolist() for b in length_batches([170, 12, 20, 9, 30, 25], 64, None)] == [
        [3, 1, 2, 5],
        [4],
        [0],
    ]
    assert [b.tolist() for b in length_batches([3, 19, 20], 64, None)] == [[0, 1], [2]]


QUESTIONS = [
    "When did Caroline go to the LGBTQ support group?",
    "What instruments does Melanie play?",
    "Would Melanie likely enjoy the song 'The Four Seasons' by Vivaldi?",
    "我开什么车？",
    "where does my sister live?",
]


def linked_models_dir(onnx_cache_dir: Path, tmp_path: Path, *patterns: str) -> Path:
    """A models directory holding links to the files of `onnx_cache_dir` that match."""
    for pattern in patterns:
        for path in onnx_cache_dir.glob(pattern):
            (tmp_path / path.name).hardlink_to(path)
    return tmp_path


def test_int8_queries_by_a_graph_of_their_own(
    onnx_cache_dir: Path, real_embedder: Embedder, tmp_path: Path
) -> None:
    models = linked_models_dir(
        onnx_cache_dir, tmp_path, "all-MiniLM-L6-v2-????????????????.onnx", "*.vocabulary.npy"
    )
    fp32 = OnnxEmbedder(default_model_path(), "all-MiniLM-L6-v2", models)
    queries = OnnxQueryEmbedder(default_model_path(), "all-MiniLM-L6-v2", models)
    assert isinstance(queries, QueryEmbedder) and not isinstance(fp32, QueryEmbedder)
    (graph,) = models.glob("all-MiniLM-L6-v2-*-int8-7bit.onnx")
    # Stored texts: the full model's vectors, bit for bit, under its name.
    assert queries.model_name == fp32.model_name == "all-MiniLM-L6-v2"
    np.testing.assert_array_equal(queries.embed_now(TEXTS), fp32.embed_now(TEXTS))
    # Queries: close to the full model's, not equal to them.
    asked = queries.embed_queries_now(QUESTIONS)
    np.testing.assert_allclose(np.linalg.norm(asked, axis=1), 1.0, atol=1e-5)
    cosines = (asked * fp32.embed_now(QUESTIONS)).sum(axis=1)
    assert cosines.min() >= 0.98 and cosines.mean() >= 0.99 and cosines.max() < 0.99999
    before = graph.stat().st_mtime_ns
    OnnxQueryEmbedder(default_model_path(), "all-MiniLM-L6-v2", models)
    assert graph.stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="int8 queries beside an int8 model"):
        OnnxQueryEmbedder(default_model_path(), "all-MiniLM-L6-v2", models, int8=True)


async def test_queries_are_embedded_in_one_thread_unless_set(
    onnx_cache_dir: Path, tmp_path: Path
) -> None:
    """The query graph runs in one thread by default (`MEMCHAT_EMBEDDER__QUERY_THREADS`),
    the stored texts' graph in all cores; the thread count does not change a vector."""
    models = linked_models_dir(
        onnx_cache_dir, tmp_path, "all-MiniLM-L6-v2-*.onnx", "*.vocabulary.npy"
    )
    default = await load_embedder(Settings(data_dir=tmp_path, models_dir=models))
    two = await load_embedder(
        Settings(data_dir=tmp_path, models_dir=models, embedder=EmbedderSettings(query_threads=2))
    )
    assert isinstance(default, OnnxQueryEmbedder) and isinstance(two, OnnxQueryEmbedder)
    assert (default.query_threads, two.query_threads) == (1, 2)
    assert OnnxQueryEmbedder(default_model_path(), "all-MiniLM-L6-v2", models).query_threads == 1
    np.testing.assert_allclose(
        default.embed_queries_now(QUESTIONS), two.embed_queries_now(QUESTIONS), atol=1e-5
    )
    with pytest.raises(ValueError, match="query_threads"):
        EmbedderSettings(query_threads=0)


def test_the_vocabulary_table_holds_the_embedders_own_word_vectors(
    onnx_cache_dir: Path, real_embedder: Embedder
) -> None:
    assert isinstance(real_embedder, OnnxEmbedder)
    words = ["camping", "June", "violin", "painting", "educaton", "vivaldi", "花生", "12345"]
    found = real_embedder.vocabulary_vectors(words)
    # Whole tokens of the vocabulary only ("June" is read as "june"); a word split into
    # pieces, or no English word, is left to be embedded.
    assert list(found) == ["camping", "June", "violin", "painting"]
    for word, vector in found.items():
        np.testing.assert_array_equal(vector, real_embedder.embed_now([word])[0])
    assert real_embedder.vocabulary_vectors([]) == {}
    (table,) = onnx_cache_dir.glob("all-MiniLM-L6-v2-????????????????.vocabulary.npy")
    rows = np.load(table, mmap_mode="r")
    assert rows.shape == (30522, 384)
    # About 21,000 English words of the 30,522 tokens; the other rows are zeros.
    assert 20_000 < int(np.count_nonzero(np.abs(rows).sum(axis=1))) < 22_000
