"""The FAISS vector index: exact ranked ids, scopes, removal, persistence, corruption."""

from __future__ import annotations

from pathlib import Path

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
