"""The FAISS vector index: exact ranked ids, scopes, removal, persistence, corruption;
scopes that grow past the threshold and are served by an IVF built in the background."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import numpy as np
import pytest

from retrieval.indexes.faiss import FaissIndex


def unit(*values: float) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


@pytest.fixture
async def index(tmp_path: Path) -> FaissIndex:
    index = FaissIndex(tmp_path / "faiss", dimension=3)
    await index.load(1)
    await index.add(1, [10, 11, 12], np.stack([unit(1, 0, 0), unit(1, 1, 0), unit(0, 0, 1)]))
    await index.add(2, [20], unit(1, 0, 0)[None, :])
    return index


async def test_search_ranks_by_inner_product_within_a_scope(index: FaissIndex) -> None:
    hits = await index.search(1, unit(1, 0.1, 0), k=3)
    assert [h.id for h in hits] == [10, 11, 12]
    assert hits[0].score > hits[1].score > hits[2].score
    assert [h.id for h in await index.search(2, unit(1, 0, 0), k=5)] == [20]
    assert await index.search(3, unit(1, 0, 0), k=5) == []


async def test_exclusion_still_returns_k_results(index: FaissIndex) -> None:
    hits = await index.search(1, unit(1, 0.1, 0), k=2, exclude={10})
    assert [h.id for h in hits] == [11, 12]


async def test_readding_an_id_replaces_its_vector(index: FaissIndex) -> None:
    await index.add(1, [12], unit(1, 0, 0)[None, :])
    assert await index.list_ids(1) == {10, 11, 12}
    assert [h.id for h in await index.search(1, unit(1, 0, 0), k=2)] in ([10, 12], [12, 10])


async def test_remove(index: FaissIndex) -> None:
    await index.remove(1, {10, 99})
    assert await index.list_ids(1) == {11, 12}
    assert [h.id for h in await index.search(1, unit(1, 0, 0), k=5)] == [11, 12]


async def test_save_and_load_round_trip(index: FaissIndex, tmp_path: Path) -> None:
    await index.save()
    reloaded = FaissIndex(tmp_path / "faiss", dimension=3)
    result = await reloaded.load(1)
    assert result.status == "loaded"
    assert result.ids == {10, 11, 12}
    assert [h.id for h in await reloaded.search(1, unit(0, 0, 1), k=1)] == [12]


async def test_missing_and_corrupt_files_are_reported(index: FaissIndex, tmp_path: Path) -> None:
    await index.save()
    (tmp_path / "faiss" / "scope-1.faiss").write_bytes(b"not a faiss index")
    reloaded = FaissIndex(tmp_path / "faiss", dimension=3)
    assert (await reloaded.load(1)).status == "corrupt"
    assert (await reloaded.load(7)).status == "missing"


async def test_wrong_dimension_file_is_corrupt(index: FaissIndex, tmp_path: Path) -> None:
    await index.save()
    assert (await FaissIndex(tmp_path / "faiss", dimension=4).load(1)).status == "corrupt"


async def test_drop_all_removes_files(index: FaissIndex, tmp_path: Path) -> None:
    await index.save()
    await index.drop_all()
    assert list((tmp_path / "faiss").glob("*.faiss")) == []
    assert await index.list_ids(1) == set()


async def test_a_file_whose_vectors_were_overwritten_is_never_trusted(tmp_path: Path) -> None:
    """Bytes overwritten in the middle of a file, its size kept: the checksum no longer
    matches, the scope is reported corrupt (the caller rebuilds it from SQL), and the
    damaged file is replaced by the rebuilt index, never saved back as it was."""
    index = FaissIndex(tmp_path / "faiss", dimension=64)
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((2000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    await index.add(1, list(range(1, 2001)), vectors)
    await index.save()
    path = tmp_path / "faiss" / "scope-1.faiss"
    data = bytearray(path.read_bytes())
    size = len(data)
    middle = size // 2
    data[middle - 100_000 : middle + 100_000] = rng.integers(
        0, 256, 200_000, dtype=np.uint8
    ).tobytes()
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size

    reloaded = FaissIndex(tmp_path / "faiss", dimension=64)
    result = await reloaded.load(1)
    assert (result.status, result.ids) == ("corrupt", frozenset())
    assert await reloaded.search(1, vectors[0], k=3) == []
    await reloaded.add(1, list(range(1, 2001)), vectors)  # what reconciliation adds from SQL
    await reloaded.save()
    assert bytes(data) != path.read_bytes()
    again = FaissIndex(tmp_path / "faiss", dimension=64)
    assert (await again.load(1)).status == "loaded"
    assert [h.id for h in await again.search(1, vectors[41], k=1)] == [42]


async def test_a_file_without_a_checksum_is_rebuilt(index: FaissIndex, tmp_path: Path) -> None:
    """Files of the format before checksums are not trusted either (one rebuild)."""
    import faiss

    path = tmp_path / "faiss" / "scope-5.faiss"
    old = faiss.IndexIDMap2(faiss.IndexFlatIP(3))
    old.add_with_ids(unit(1, 0, 0).reshape(1, -1), np.asarray([1], dtype=np.int64))
    faiss.write_index(old, str(path))
    assert (await FaissIndex(tmp_path / "faiss", dimension=3).load(5)).status == "corrupt"


# Approximate (IVF) scopes ---------------------------------------------------------------

DIMENSION = 16
EVERY_LIST = 10**9  # vectors read per query: every list, so IVF search is exhaustive


def seeded(count: int, seed: int = 3) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIMENSION)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def exact_top(vectors: np.ndarray, ids: list[int], query: np.ndarray, k: int) -> list[int]:
    order = np.argsort(-(vectors @ query), kind="stable")
    return [ids[i] for i in order[:k]]


def saved_index(directory: Path, scope: int) -> object:
    from retrieval.indexes.faiss import decode_index

    return decode_index((directory / f"scope-{scope}.faiss").read_bytes())


@pytest.fixture
def hold_training(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Training waits for `release` after telling `started`: what happens meanwhile is
    certain to happen after the build's snapshot."""
    from retrieval.indexes import faiss as module

    started, release = threading.Event(), threading.Event()
    train = module.train_ivf

    def held(vectors: np.ndarray, ids: np.ndarray) -> object:
        started.set()
        assert release.wait(timeout=30)
        return train(vectors, ids)

    monkeypatch.setattr(module, "train_ivf", held)
    return started, release


async def test_a_scope_that_crosses_the_threshold_becomes_an_ivf(tmp_path: Path) -> None:
    import faiss

    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200, ivf_num_scanned=EVERY_LIST)
    vectors = seeded(250)
    ids = list(range(1, 251))
    await index.add(1, ids[:199], vectors[:199])
    await index.wait_built()
    assert not index.is_approximate(1)
    await index.add(1, ids[199:], vectors[199:])
    await index.wait_built()
    assert index.is_approximate(1)
    assert await index.list_ids(1) == set(ids)
    assert await index.num_vectors() == 250
    for query in seeded(20, seed=11):
        hits = await index.search(1, query, k=10)
        assert [h.id for h in hits] == exact_top(vectors, ids, query, 10)
        expected = [float(vectors[h.id - 1] @ query) for h in hits]
        assert [h.score for h in hits] == pytest.approx(expected, abs=1e-5)
    await index.save()
    assert isinstance(saved_index(tmp_path / "faiss", 1), faiss.IndexIVFFlat)


async def test_default_parameters_find_each_stored_vector_first(tmp_path: Path) -> None:
    """20,000 vectors in 512 lists: a query reads about 150 of them, never its own miss."""
    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=1000)
    vectors = seeded(20_000)
    await index.add(1, list(range(1, 20_001)), vectors)
    await index.wait_built()
    assert index.is_approximate(1)
    for vector_id in range(1, 20_001, 100):
        hits = await index.search(1, vectors[vector_id - 1], k=1)
        assert [h.id for h in hits] == [vector_id]
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)


async def test_similarities_and_removal_stay_exact_in_an_ivf(tmp_path: Path) -> None:
    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200, ivf_num_scanned=1)
    vectors = seeded(300)
    ids = list(range(1, 301))
    await index.add(1, ids, vectors)
    await index.wait_built()
    assert index.is_approximate(1)
    query = seeded(1, seed=5)[0]
    # One list is read per search, yet every held id has its exact score.
    found = await index.similarities(1, query, [*ids, 999])
    assert set(found) == set(ids)
    assert [found[i] for i in ids] == pytest.approx((vectors @ query).tolist(), abs=1e-5)

    await index.remove(1, set(range(1, 301, 2)) | {999})
    kept = list(range(2, 301, 2))
    assert await index.list_ids(1) == set(kept)
    assert set(await index.similarities(1, query, ids)) == set(kept)
    # Excluding all but a few forces every list to be read: still k results, exact ones.
    hits = await index.search(1, query, k=3, exclude=set(kept[3:]))
    assert [h.id for h in hits] == exact_top(vectors[1::2][:3], kept[:3], query, 3)


async def test_adds_and_removes_during_a_build_are_kept(
    tmp_path: Path, hold_training: tuple[threading.Event, threading.Event]
) -> None:
    started, release = hold_training
    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200, ivf_num_scanned=EVERY_LIST)
    vectors = seeded(260)
    await index.add(1, list(range(1, 201)), vectors[:200])
    assert await anyio.to_thread.run_sync(started.wait, 30)
    await index.add(1, list(range(201, 261)), vectors[200:])  # new
    await index.add(1, [5], vectors[250:251])  # replaced
    await index.remove(1, {7, 230})  # removed, from the snapshot and from after it
    await index.remove(1, {9})
    await index.add(1, [9], vectors[9 - 1 : 9])  # removed, then back
    assert not index.is_approximate(1)
    assert [h.id for h in await index.search(1, vectors[6], k=1)] != [7]
    release.set()
    await index.wait_built()

    assert index.is_approximate(1)
    held = {i: vectors[i - 1] for i in range(1, 261) if i not in {7, 230}}
    held[5] = vectors[250]
    assert await index.list_ids(1) == set(held)
    assert await index.num_vectors() == len(held)
    query = seeded(1, seed=8)[0]
    found = await index.similarities(1, query, list(held))
    assert [found[i] for i in held] == pytest.approx(
        [float(v @ query) for v in held.values()], abs=1e-5
    )
    for probe in seeded(10, seed=9):
        expected = exact_top(np.stack(list(held.values())), list(held), probe, 10)
        assert [h.id for h in await index.search(1, probe, k=10)] == expected


@pytest.mark.parametrize("replace", ["reset", "drop", "unload"])
async def test_a_build_for_a_replaced_scope_is_thrown_away(
    tmp_path: Path, hold_training: tuple[threading.Event, threading.Event], replace: str
) -> None:
    started, release = hold_training
    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    vectors = seeded(201)
    await index.add(1, list(range(1, 201)), vectors[:200])
    assert await anyio.to_thread.run_sync(started.wait, 30)
    await getattr(index, replace)(1)
    await index.add(1, [500], vectors[200:])
    release.set()
    await index.wait_built()
    assert not index.is_approximate(1)
    assert await index.list_ids(1) == {500}


async def test_an_ivf_survives_save_and_load_without_a_rebuild(tmp_path: Path) -> None:
    import faiss

    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    vectors = seeded(250)
    ids = list(range(1, 251))
    await index.add(1, ids, vectors)
    await index.wait_built()
    await index.save()
    saved = saved_index(tmp_path / "faiss", 1)
    assert isinstance(saved, faiss.IndexIVFFlat)

    reloaded = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    result = await reloaded.load(1)
    assert (result.status, result.ids) == ("loaded", frozenset(ids))
    assert reloaded.is_approximate(1)  # as loaded: no build was needed
    await reloaded.wait_built()
    await reloaded.add(1, [251], seeded(1, seed=4))
    await reloaded.remove(1, {1})
    assert await reloaded.list_ids(1) == (set(ids) - {1}) | {251}
    query = vectors[41]
    assert [h.id for h in await reloaded.search(1, query, k=1)] == [42]


async def test_a_large_flat_file_is_rebuilt_as_an_ivf_after_loading(tmp_path: Path) -> None:
    vectors = seeded(250)
    ids = list(range(1, 251))
    flat = FaissIndex(tmp_path / "faiss", DIMENSION)
    await flat.add(1, ids, vectors)
    await flat.save()
    assert not flat.is_approximate(1)

    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    assert (await index.load(1)).ids == frozenset(ids)
    await index.wait_built()
    assert index.is_approximate(1)
    assert await index.list_ids(1) == set(ids)


async def test_an_ivf_outgrown_fourfold_is_rebuilt_with_more_lists(tmp_path: Path) -> None:
    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    vectors = seeded(800)
    await index.add(1, list(range(1, 201)), vectors[:200])
    await index.wait_built()
    await index.save()
    assert saved_index(tmp_path / "faiss", 1).nlist == 5  # type: ignore[attr-defined]
    await index.add(1, list(range(201, 390)), vectors[200:389])
    await index.wait_built()
    await index.save()
    assert saved_index(tmp_path / "faiss", 1).nlist == 5  # type: ignore[attr-defined]
    await index.add(1, list(range(390, 801)), vectors[389:])
    await index.wait_built()
    await index.save()
    assert saved_index(tmp_path / "faiss", 1).nlist == 20  # type: ignore[attr-defined]
    assert await index.list_ids(1) == set(range(1, 801))
    for query in seeded(5, seed=12):
        hits = await index.search(1, query, k=10)
        assert [h.id for h in hits] == exact_top(vectors, list(range(1, 801)), query, 10)


async def test_a_corrupt_ivf_file_is_reported(tmp_path: Path) -> None:
    index = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    await index.add(1, list(range(1, 251)), seeded(250))
    await index.wait_built()
    await index.save()
    path = tmp_path / "faiss" / "scope-1.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    reloaded = FaissIndex(tmp_path / "faiss", DIMENSION, ivf_threshold=200)
    assert (await reloaded.load(1)).status == "corrupt"
    assert await reloaded.list_ids(1) == set()
