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
def index(tmp_path: Path) -> FaissIndex:
    index = FaissIndex(tmp_path / "faiss", dimension=3)
    index.load(1)
    index.add(1, [10, 11, 12], np.stack([unit(1, 0, 0), unit(1, 1, 0), unit(0, 0, 1)]))
    index.add(2, [20], unit(1, 0, 0)[None, :])
    return index


def test_search_ranks_by_inner_product_within_a_scope(index: FaissIndex) -> None:
    hits = index.search(1, unit(1, 0.1, 0), k=3)
    assert [h.id for h in hits] == [10, 11, 12]
    assert hits[0].score > hits[1].score > hits[2].score
    assert [h.id for h in index.search(2, unit(1, 0, 0), k=5)] == [20]
    assert index.search(3, unit(1, 0, 0), k=5) == []


def test_exclusion_still_returns_k_results(index: FaissIndex) -> None:
    hits = index.search(1, unit(1, 0.1, 0), k=2, exclude={10})
    assert [h.id for h in hits] == [11, 12]


def test_readding_an_id_replaces_its_vector(index: FaissIndex) -> None:
    index.add(1, [12], unit(1, 0, 0)[None, :])
    assert index.list_ids(1) == {10, 11, 12}
    assert [h.id for h in index.search(1, unit(1, 0, 0), k=2)] in ([10, 12], [12, 10])


def test_remove(index: FaissIndex) -> None:
    index.remove(1, {10, 99})
    assert index.list_ids(1) == {11, 12}
    assert [h.id for h in index.search(1, unit(1, 0, 0), k=5)] == [11, 12]


def test_save_and_load_round_trip(index: FaissIndex, tmp_path: Path) -> None:
    index.save()
    reloaded = FaissIndex(tmp_path / "faiss", dimension=3)
    result = reloaded.load(1)
    assert result.status == "loaded"
    assert result.ids == {10, 11, 12}
    assert [h.id for h in reloaded.search(1, unit(0, 0, 1), k=1)] == [12]


def test_missing_and_corrupt_files_are_reported(index: FaissIndex, tmp_path: Path) -> None:
    index.save()
    (tmp_path / "faiss" / "scope-1.faiss").write_bytes(b"not a faiss index")
    reloaded = FaissIndex(tmp_path / "faiss", dimension=3)
    assert reloaded.load(1).status == "corrupt"
    assert reloaded.load(7).status == "missing"


def test_wrong_dimension_file_is_corrupt(index: FaissIndex, tmp_path: Path) -> None:
    index.save()
    assert FaissIndex(tmp_path / "faiss", dimension=4).load(1).status == "corrupt"


def test_drop_all_removes_files(index: FaissIndex, tmp_path: Path) -> None:
    index.save()
    index.drop_all()
    assert list((tmp_path / "faiss").glob("*.faiss")) == []
    assert index.list_ids(1) == set()
