"""One contract for every VectorIndex: FAISS, embedded Chroma and a Chroma server.

Exact ranked ids and inner-product scores, exclusion, replacement, removal, scopes kept
apart, persistence across a fresh instance, missing and wrong-dimension scopes, reset
and drop_all.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from retrieval.protocols import VectorIndex

Factory = Callable[[int], VectorIndex]


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def _faiss(tmp_path: Path) -> Factory:
    from retrieval.indexes.faiss import FaissIndex

    return lambda dimension: FaissIndex(tmp_path / "faiss", dimension)


def _chroma_embedded(tmp_path: Path) -> Factory:
    from chromadb.api.client import SharedSystemClient

    from retrieval.indexes.chroma import ChromaIndex, embedded_client

    def make(dimension: int) -> VectorIndex:
        # A fresh client, as in a new process: Chroma otherwise shares one per path.
        SharedSystemClient.clear_system_cache()
        connect = embedded_client(tmp_path / "chroma")
        return ChromaIndex(connect, dimension, namespace="contract")

    return make


def _chroma_server(url: str) -> Factory:
    from retrieval.indexes.chroma import ChromaIndex, server_client

    prefix = f"t{uuid.uuid4().hex[:12]}"  # this test's own collections on the shared server
    return lambda dimension: ChromaIndex(
        server_client(url), dimension, namespace="contract", prefix=prefix
    )


@pytest.fixture(params=["faiss", "chroma-embedded", "chroma-server"])
def make_index(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    if request.param == "faiss":
        return _faiss(tmp_path)
    if request.param == "chroma-embedded":
        return _chroma_embedded(tmp_path)
    return _chroma_server(request.getfixturevalue("chroma_server_url"))


VECTORS = {10: unit(1, 0, 0), 11: unit(1, 1, 0), 12: unit(0, 0, 1), 13: unit(1, 0.5, 0.2)}


@pytest.fixture
async def index(make_index: Factory) -> VectorIndex:
    index = make_index(3)
    assert (await index.load(1)).status == "missing"
    await index.add(1, list(VECTORS), np.stack(list(VECTORS.values())))
    await index.add(2, [20, 10], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    return index


async def test_search_ranks_by_inner_product_with_exact_scores(index: VectorIndex) -> None:
    query = unit(1, 0.1, 0)
    hits = await index.search(1, query, k=4)
    assert [h.id for h in hits] == [10, 13, 11, 12]
    expected = [float(VECTORS[h.id] @ query) for h in hits]
    assert [h.score for h in hits] == pytest.approx(expected, abs=1e-5)
    assert [h.id for h in await index.search(1, query, k=2)] == [10, 13]


async def test_similarities_are_exact_for_held_ids_only(index: VectorIndex) -> None:
    query = unit(1, 1, 1)
    found = await index.similarities(1, query, [10, 12, 13, 20, 99])
    # 20 is scope 2's and 99 nobody's: left out.
    assert set(found) == {10, 12, 13}
    for vector_id in found:
        assert found[vector_id] == pytest.approx(float(VECTORS[vector_id] @ query), abs=1e-5)
    assert (await index.similarities(2, query, [10]))[10] == pytest.approx(
        float(unit(0, 1, 0) @ query)
    )
    assert await index.similarities(1, query, []) == {}
    assert await index.similarities(3, query, [10]) == {}


async def test_scopes_never_answer_each_other(index: VectorIndex) -> None:
    # Id 10 is in both scopes with different vectors; each scope answers with its own.
    assert [h.id for h in await index.search(2, unit(1, 0, 0), k=5)] == [20, 10]
    assert (await index.search(2, unit(0, 1, 0), k=1))[0].id == 10
    assert (await index.search(2, unit(0, 1, 0), k=1))[0].score == pytest.approx(1.0, abs=1e-5)
    assert await index.search(3, unit(1, 0, 0), k=5) == []
    assert await index.list_ids(1) == {10, 11, 12, 13}
    assert await index.list_ids(2) == {10, 20}


async def test_exclusion_still_returns_k_results(index: VectorIndex) -> None:
    hits = await index.search(1, unit(1, 0.1, 0), k=2, exclude={10, 13})
    assert [h.id for h in hits] == [11, 12]


async def test_readding_an_id_replaces_its_vector(index: VectorIndex) -> None:
    await index.add(1, [12], unit(1, 0.05, 0)[None, :])
    assert await index.list_ids(1) == {10, 11, 12, 13}
    assert [h.id for h in await index.search(1, unit(1, 0, 0), k=4)] == [10, 12, 13, 11]


async def test_remove_only_touches_its_scope(index: VectorIndex) -> None:
    await index.remove(1, {10, 99})
    assert await index.list_ids(1) == {11, 12, 13}
    assert [h.id for h in await index.search(1, unit(1, 0, 0), k=5)] == [13, 11, 12]
    assert await index.list_ids(2) == {10, 20}


async def test_persist_and_reload_in_a_fresh_instance(
    index: VectorIndex, make_index: Factory
) -> None:
    await index.save()
    reloaded = make_index(3)
    assert not reloaded.is_loaded(1)
    result = await reloaded.load(1)
    assert (result.status, result.ids) == ("loaded", {10, 11, 12, 13})
    assert reloaded.is_loaded(1)
    assert [h.id for h in await reloaded.search(1, unit(0, 0, 1), k=2)] == [12, 13]
    assert (await reloaded.load(7)).status == "missing"


async def test_a_scope_of_another_dimension_is_corrupt(
    index: VectorIndex, make_index: Factory
) -> None:
    await index.save()
    other = make_index(4)
    assert (await other.load(1)).status == "corrupt"
    assert await other.list_ids(1) == set()


async def test_reset_and_drop_all(index: VectorIndex) -> None:
    await index.reset(1)
    assert await index.list_ids(1) == set()
    assert await index.search(1, unit(1, 0, 0), k=3) == []
    assert await index.list_ids(2) == {10, 20}
    await index.save()
    await index.drop_all()
    assert await index.list_ids(2) == set()
    assert await index.search(2, unit(1, 0, 0), k=3) == []


async def test_drop_forgets_one_scope_in_memory_and_in_storage(
    index: VectorIndex, make_index: Factory
) -> None:
    await index.add(-3, [30], unit(0, 1, 0)[None, :])
    await index.save()
    await index.drop(1)
    await index.drop(-3)
    assert not index.is_loaded(1)
    assert await index.list_ids(2) == {10, 20}
    await index.save()
    reloaded = make_index(3)
    assert (await reloaded.load(1)).status == "missing"
    assert (await reloaded.load(-3)).status == "missing"
    assert (await reloaded.load(2)).ids == {10, 20}


async def test_num_vectors_counts_the_open_scopes(index: VectorIndex, make_index: Factory) -> None:
    assert await index.num_vectors() == 6
    await index.add(1, [12], unit(1, 0.05, 0)[None, :])  # a replacement, not one more
    await index.remove(1, {10, 99})
    assert await index.num_vectors() == 5
    await index.reset(1)
    assert await index.num_vectors() == 2
    await index.save()
    reloaded = make_index(3)
    assert await reloaded.num_vectors() == 0  # nothing open yet
    await reloaded.load(2)
    assert await reloaded.num_vectors() == 2
    await reloaded.drop_all()
    assert await reloaded.num_vectors() == 0


async def test_ping_reaches_the_store(index: VectorIndex) -> None:
    assert await index.ping() is None


async def test_an_unloaded_scope_reopens_with_its_vectors(index: VectorIndex) -> None:
    """Closing a scope (an idle user) keeps it in storage; the other scope stays open."""
    await index.unload(1)
    assert not index.is_loaded(1)
    assert index.is_loaded(2)
    reopened = await index.load(1)
    assert reopened.status == "loaded"
    assert reopened.ids == frozenset(VECTORS)
    assert [h.id for h in await index.search(1, unit(1, 0.1, 0), k=4)] == [10, 13, 11, 12]
