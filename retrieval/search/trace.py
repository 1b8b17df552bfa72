"""What one memory search weighed, kept for the turn's report: the fused ranking before
near duplicates were dropped, and each list's exact score of any id in it.

A search given a `SearchTrace` fills it and ranks exactly as without one; the lists'
scores of the few ids a turn reports are computed on request, after the search (a few
inner products and BM25 look-ups), never for every candidate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from retrieval.protocols import ScoredId

# Each list's exact scores of some ids, by list name ("dense", "second", "lexical").
SideScorer = Callable[[Collection[int]], Awaitable[Mapping[str, Mapping[int, float]]]]


@dataclass(frozen=True, slots=True)
class MemoryScores:
    """One memory's scores in one search: each list's own (None: the list did not score
    it, or the search had no such list) and the fused score it was ranked by."""

    fused: float
    dense: float | None = None
    second: float | None = None
    lexical: float | None = None


@dataclass(slots=True)
class SearchTrace:
    # The fused ranking, best first, near duplicates still in.
    ranked: list[ScoredId] = field(default_factory=list)
    scorer: SideScorer | None = None

    def near_duplicates(self, kept: Sequence[ScoredId], k: int) -> list[ScoredId]:
        """The hits a search for `k` passed over as near duplicates of better ones: those
        of the ranking, up to the last one it kept (to its end if it kept fewer than k),
        that it did not keep."""
        kept_ids = {h.id for h in kept}
        end = len(self.ranked)
        if len(kept_ids) >= k:
            end = 1 + max((i for i, h in enumerate(self.ranked) if h.id in kept_ids), default=-1)
        return [h for h in self.ranked[:end] if h.id not in kept_ids]

    async def scores(self, ids: Collection[int]) -> dict[int, MemoryScores]:
        """Each id's scores; an id the ranking does not hold gets none."""
        fused = {h.id: h.score for h in self.ranked}
        wanted = [i for i in ids if i in fused]
        sides = await self.scorer(wanted) if self.scorer is not None and wanted else {}
        return {
            i: MemoryScores(
                fused=fused[i],
                dense=sides.get("dense", {}).get(i),
                second=sides.get("second", {}).get(i),
                lexical=sides.get("lexical", {}).get(i),
            )
            for i in wanted
        }
