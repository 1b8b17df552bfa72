"""What the dense lists of turns, facts and knowledge share: a second model's parts (its
embedder and its index) and a query as they search it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retrieval.protocols import Embedder, VectorIndex


@dataclass(frozen=True, slots=True)
class SecondDense:
    """What a second dense list is made of: its embedder and its index."""

    embedder: Embedder
    index: VectorIndex


@dataclass(frozen=True, slots=True)
class DenseQuery:
    """A query as the dense lists search it: the first model's vector, the second
    model's (None: no second list), and whether the query is mostly in CJK script."""

    vector: np.ndarray
    second: np.ndarray | None = None
    is_cjk: bool = False
