"""The IVF side of the FAISS adapter: list counts, the kinds of index a scope may be, and
training an IVF on a scope's own vectors (see `retrieval.indexes.faiss`)."""

from __future__ import annotations

import math
from collections.abc import Collection

import faiss
import numpy as np

# The stubs shipped with faiss lack DirectMap; its Hashtable finds an IVF's vectors by id.
HASHTABLE: int = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]

# A scope's index: exact (below the threshold) or IVF.
ScopeIndex = faiss.IndexIDMap2 | faiss.IndexIVFFlat

# Measured on LoCoMo turns (all-MiniLM-L6-v2, 384 dimensions, one thread): exact search
# costs 1.2 ms at 20,000 vectors and grows linearly (6 ms at 50,000, 16 ms at 100,000);
# below 20,000 it already meets the millisecond, without training or approximation.
DEFAULT_IVF_THRESHOLD = 20_000
# nlist = 4 sqrt(N): at an equal number of vectors read, finer lists recall more (top-100
# overlap at 100k, ~5,000 read: 0.998 with 4 sqrt(N) lists, 0.986 with 2 sqrt(N)).
LISTS_PER_SQRT = 4.0
# k-means wants about 39 points per centroid; fewer and FAISS warns, centroids are noise.
MIN_POINTS_PER_LIST = 39
# Vectors a query reads (nprobe = this / mean list size): top-100 overlap with exact
# search 0.994-0.998 from 20k to 100k vectors (5,000: 0.993; 4,000: 0.991); 1-1.5 ms.
DEFAULT_IVF_NUM_SCANNED = 6_000
# Vectors copied per lock hold when a build takes its snapshot (about 5 ms each).
SNAPSHOT_CHUNK = 8192


def num_lists(num_vectors: int) -> int:
    """The IVF lists for a scope of this size: 4 sqrt(N), at least 39 points each."""
    wanted = round(LISTS_PER_SQRT * math.sqrt(num_vectors))
    return max(1, min(wanted, num_vectors // MIN_POINTS_PER_LIST))


def as_scope_index(index: faiss.Index | None, dimension: int) -> ScopeIndex | None:
    """The index read from a file if it is one this adapter writes, else None."""
    if index is None or index.d != dimension:
        return None
    if isinstance(index, faiss.IndexIDMap2):
        return index
    if (
        isinstance(index, faiss.IndexIVFFlat)
        and index.metric_type == faiss.METRIC_INNER_PRODUCT
        and index.direct_map.type == HASHTABLE
    ):
        return index
    return None


def stored_ids(index: ScopeIndex) -> set[int]:
    """The ids a flat (its id map) or IVF (its inverted lists) index holds."""
    if isinstance(index, faiss.IndexIDMap2):
        return set(faiss.vector_to_array(index.id_map).tolist())
    invlists = index.invlists
    assert invlists is not None  # an IVF always has its lists
    ids: set[int] = set()
    for list_no in range(index.nlist):
        size = invlists.list_size(list_no)
        if size:
            ids.update(faiss.rev_swig_ptr(invlists.get_ids(list_no), size).tolist())
    return ids


def train_ivf(vectors: np.ndarray, ids: np.ndarray) -> faiss.IndexIVFFlat:
    """An IVF over these vectors, trained on them (k-means, seeded: deterministic)."""
    dimension = vectors.shape[1]
    quantizer = faiss.IndexFlatIP(dimension)
    index = faiss.IndexIVFFlat(
        quantizer, dimension, num_lists(len(vectors)), faiss.METRIC_INNER_PRODUCT
    )
    index.train(vectors)
    index.set_direct_map_type(HASHTABLE)
    index.add_with_ids(vectors, ids)
    return index


def remove_ids(index: ScopeIndex, ids: Collection[int]) -> None:
    """Remove the ids an index holds: by a hash set from the flat index (one pass over
    it), by direct lookups from an IVF (its direct map takes only an id array)."""
    id_array = np.fromiter(ids, dtype=np.int64, count=len(ids))
    if isinstance(index, faiss.IndexIDMap2):
        index.remove_ids(faiss.IDSelectorBatch(id_array))
    else:
        index.remove_ids(faiss.IDSelectorArray(id_array))
