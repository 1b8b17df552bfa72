"""Key facts of a user: extraction from stored messages, keeping them current, search,
and the pinned facts each prompt carries.

Extraction reads a user's messages in id order after a per-user watermark kept in SQL,
and moves the watermark in the transaction that stores the facts: a crash loses no
message and repeats none. On PostgreSQL that transaction also claims the user's batch
(storage/claims.py), so two processes never extract the same message twice, nor even
read it twice for facts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import structlog

from retrieval.dense import DenseQuery
from retrieval.errors import InvalidInputError
from retrieval.facts.model import (
    CATEGORIES,
    CandidateFact,
    FactExtractor,
    default_priority,
    exclusive_key,
    is_instruction,
    is_pinned_by_default,
    normalize,
    statement,
)
from retrieval.fusion import LanguageWeights, fuse_by_language
from retrieval.protocols import Embedder, ScoredId
from retrieval.stages import stage
from retrieval.text import is_blank, is_mostly_cjk
from storage.errors import ConflictError
from storage.facts import FactRepository, NewFact, Resolution
from storage.messages import MessageRepository
from storage.records import Fact, FactChange, Turn, User

log = structlog.get_logger(__name__)

EXTRACT_BATCH_SIZE = 200
# Facts of one category this similar (cosine of their statements) are one fact said twice.
NEAR_DUPLICATE_SIMILARITY = 0.92

Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]


def fact_order(fact: Fact) -> tuple[int, int]:
    """Prompt order of pinned facts: highest priority first, then oldest."""
    return (-fact.priority, fact.id)


@dataclass(frozen=True, slots=True)
class FactHit:
    fact: Fact
    score: float


def resolve(active: Sequence[Fact], new: NewFact) -> Resolution:
    """Merge a fact said again, supersede what a newer statement replaces, and file an
    older statement that arrives late (an import of old history) as already superseded."""
    if new.subject:
        key = exclusive_key(new.subject)
        rivals = [f for f in active if f.subject and exclusive_key(f.subject) == key]
        same = [f for f in rivals if _same_statement(f, new)]
        if same:
            return Resolution("merge", same[:1])
        if not rivals:
            return Resolution("insert")
        newest = max(f.valid_from for f in rivals)
        if new.valid_from < newest:
            return Resolution("insert_superseded", rivals)
        return Resolution("supersede", rivals)
    same = [f for f in active if f.category == new.category and _same_statement(f, new)]
    return Resolution("merge", same[:1]) if same else Resolution("insert")


def _same_statement(fact: Fact, new: NewFact) -> bool:
    if fact.subject and new.subject and fact.value is not None and new.value is not None:
        return normalize(fact.value) == normalize(new.value)
    if normalize(fact.text) == normalize(new.text):
        return True
    if fact.vector is None or new.vector is None or fact.model != new.model:
        return False
    a = np.frombuffer(fact.vector, dtype=np.float32)
    b = np.frombuffer(new.vector, dtype=np.float32)
    return a.shape == b.shape and float(a @ b) >= NEAR_DUPLICATE_SIMILARITY


class FactMemory:
    def __init__(
        self,
        facts: FactRepository,
        messages: MessageRepository,
        extractor: FactExtractor,
        embed: Embed,
        model_name: str,
        *,
        second: Embedder | None = None,
        weights: tuple[LanguageWeights, LanguageWeights] = (
            LanguageWeights(1.0, 1.0),
            LanguageWeights(1.0, 1.0),
        ),
    ) -> None:
        """`embed`, `model_name`: the first model's (whose vector a fact's row holds and
        duplicates are told by); `second`: a second model, whose vectors of the facts
        (`FactEmbedding` rows, made when a search first needs them) are fused with the
        first's by `weights` (the first list's, the second's), as the turns' lists are."""
        self._facts = facts
        self._messages = messages
        self._extractor = extractor
        self._embed = embed
        self._model_name = model_name
        self._second = second
        self._weights = weights

    async def get_fact(self, fact_id: int) -> tuple[Fact, User]:
        return await self._facts.get_fact(fact_id)

    async def list_users_behind(self) -> list[int]:
        """Users whose messages extraction has not read yet (to resume after a restart)."""
        return await self._facts.list_users_behind()

    # Extraction ---------------------------------------------------------------------

    async def extract_pending(self, user_pk: int) -> int | None:
        """Extract facts from the user's messages after the watermark, a claimed batch at
        a time; returns how many messages were read, or None where another process holds
        the user's extraction (it reads them; the caller tries again later, in case that
        process ended its job just before newer messages came). Only the user's own turns
        are read for facts."""
        num_read = 0
        while True:
            async with self._facts.claim_extraction(user_pk) as claim:
                if claim is None:
                    return None
                messages = await self._messages.list_messages_after_id(
                    claim.watermark, EXTRACT_BATCH_SIZE, user_pk=user_pk
                )
                if not messages:
                    return num_read
                log.info(
                    "fact_extraction_batch",
                    user_pk=user_pk,
                    after_message_id=claim.watermark,
                    num_messages=len(messages),
                )
                with stage(
                    "fact_extraction",
                    user_pk=user_pk,
                    num_messages=len(messages),
                    extractor=self._extractor.name,
                ) as extracting:
                    new_facts = await self._new_facts(messages)
                    extracting.record(num_facts=len(new_facts))
                    stored = await claim.record(
                        new_facts,
                        resolve,
                        f"extractor:{self._extractor.name}",
                        through_message_id=messages[-1].id,
                    )
            if stored is not None:  # else the watermark was moved by a restore: read again
                num_read += len(messages)

    async def _new_facts(self, messages: Sequence[Turn]) -> list[NewFact]:
        found: list[tuple[CandidateFact, Turn]] = []
        for message in messages:
            if message.role != "user":
                continue
            found += [(c, message) for c in await self._extractor.extract(message.content)]
        if not found:
            return []
        texts = [statement(candidate) for candidate, _ in found]
        vectors = await self._embed(texts)
        return [
            NewFact(
                text=text,
                category=candidate.category,
                subject=candidate.subject,
                value=candidate.value,
                is_pinned=is_pinned_by_default(candidate.category),
                priority=default_priority(candidate),
                valid_from=message.created_at,
                source_message_ids=(message.id,),
                model=self._model_name,
                vector=vector.astype(np.float32).tobytes(),
            )
            for text, (candidate, message), vector in zip(texts, found, vectors, strict=True)
        ]

    # Facts a client states or corrects ----------------------------------------------

    async def add_fact(
        self,
        user_pk: int,
        text: str,
        *,
        category: str | None,
        subject: str | None,
        is_pinned: bool | None,
        priority: int | None,
        actor: str,
    ) -> Fact:
        _check_text(text)
        category = category or "other"
        if category not in CATEGORIES:
            raise InvalidInputError("category", f"category must be one of {', '.join(CATEGORIES)}")
        pinned = _check_pinnable(text, is_pinned, is_pinned_by_default(category))
        vector = (await self._embed([text]))[0]
        new = NewFact(
            text=text,
            category=category,
            subject=subject,
            value=text if subject else None,
            is_pinned=pinned,
            priority=priority if priority is not None else 0,
            valid_from=dt.datetime.now(dt.UTC),
            model=self._model_name,
            vector=vector.astype(np.float32).tobytes(),
        )
        stored = await self._facts.record_facts(user_pk, [new], resolve, actor)
        assert stored
        return stored[0]

    async def update_fact(
        self,
        fact_id: int,
        *,
        text: str | None,
        is_pinned: bool | None,
        priority: int | None,
        actor: str,
    ) -> Fact:
        if text is not None:
            _check_text(text)
        fact, _user = await self._facts.get_fact(fact_id)
        if fact.status == "deleted":
            # Before embedding a new text; the repository checks again as it writes.
            raise ConflictError(f"fact {fact_id} is deleted: it can no longer be changed")
        fields: dict[str, object] = {}
        if text is not None and text != fact.text:
            fields |= {"text": text, "model": self._model_name}
            fields["vector"] = (await self._embed([text]))[0].astype(np.float32).tobytes()
        if is_pinned is not None:
            fields["is_pinned"] = _check_pinnable(text or fact.text, is_pinned, False)
        elif text is not None and fact.is_pinned and is_instruction(text):
            fields["is_pinned"] = False
        if priority is not None:
            fields["priority"] = priority
        if not fields:
            return fact
        return await self._facts.update_fact(fact_id, actor, **fields)

    async def delete_fact(self, fact_id: int, actor: str) -> Fact:
        return await self._facts.delete_fact(fact_id, actor)

    async def list_facts(
        self, user_pk: int, statuses: Sequence[str], *, with_history: bool
    ) -> tuple[list[Fact], dict[int, list[FactChange]]]:
        facts = await self._facts.list_facts(user_pk, statuses)
        history: dict[int, list[FactChange]] = {f.id: [] for f in facts}
        if with_history:
            for change in await self._facts.list_changes([f.id for f in facts]):
                history[change.fact_id].append(change)
        return facts, history

    # Use ----------------------------------------------------------------------------

    async def pinned(self, user_pk: int) -> list[Fact]:
        """Active pinned facts in prompt order (`fact_order`); a turn has them from its
        state's read (`SessionRepository.get_turn_state`)."""
        return sorted(await self._facts.list_pinned_facts(user_pk), key=fact_order)

    async def search(self, user_pk: int, query: DenseQuery, k: int) -> list[FactHit]:
        """Active facts by similarity to the query, best first: with one model their
        cosine similarity; with a second model (and the query's second vector) both
        lists fused by standardised scores, each weighed by the language of the query
        and of the fact, the hits' scores then the fused ones."""
        facts = await self._with_vectors(await self._facts.list_facts(user_pk))
        if not facts:
            return []
        first = _similarities(facts, query.vector)
        if self._second is None or query.second is None:
            order = np.argsort(-first, kind="stable")[:k]
            return [FactHit(facts[i], float(first[i])) for i in order]
        second = await self._second_vectors(facts) @ query.second.astype(np.float32)
        ids = [fact.id for fact in facts]
        in_cjk = {fact.id for fact in facts if is_mostly_cjk(fact.text)}
        exact = [dict(zip(ids, map(float, scores), strict=True)) for scores in (first, second)]
        rankings = [
            sorted((ScoredId(i, s) for i, s in scores.items()), key=lambda h: (-h.score, h.id))
            for scores in exact
        ]
        by_id = {fact.id: fact for fact in facts}
        fused = fuse_by_language(rankings, exact, self._weights, query.is_cjk, in_cjk)
        return [FactHit(by_id[hit.id], hit.score) for hit in fused[:k]]

    async def _second_vectors(self, facts: Sequence[Fact]) -> np.ndarray:
        """The second model's vectors of the facts (a matrix, in their order), those not
        stored yet made and stored."""
        assert self._second is not None
        model = self._second.model_name
        stored = await self._facts.list_model_vectors([f.id for f in facts], model)
        missing = [f for f in facts if f.id not in stored]
        if missing:
            vectors = await self._second.embed([f.text for f in missing])
            made = [
                (f.id, v.astype(np.float32).tobytes())
                for f, v in zip(missing, vectors, strict=True)
            ]
            await self._facts.save_model_vectors(model, made)
            stored.update(made)
        return np.stack([np.frombuffer(stored[f.id], dtype=np.float32) for f in facts])

    async def _with_vectors(self, facts: Sequence[Fact]) -> list[Fact]:
        """The facts, those without a vector of the current model given one (after a model
        change), which is stored too."""
        stale = [f for f in facts if f.vector is None or f.model != self._model_name]
        if not stale:
            return list(facts)
        vectors = await self._embed([f.text for f in stale])
        fresh = {
            f.id: msgspec.structs.replace(
                f, vector=v.astype(np.float32).tobytes(), model=self._model_name
            )
            for f, v in zip(stale, vectors, strict=True)
        }
        await self._facts.save_vectors(
            [(f.id, self._model_name, f.vector or b"") for f in fresh.values()]
        )
        return [fresh.get(f.id, f) for f in facts]


def _similarities(facts: Sequence[Fact], vector: np.ndarray) -> np.ndarray:
    matrix = np.stack([np.frombuffer(f.vector or b"", dtype=np.float32) for f in facts])
    return matrix @ vector.astype(np.float32)


def _check_text(text: str) -> None:
    if is_blank(text):
        raise InvalidInputError("text", "text must not be empty")


def _check_pinnable(text: str, wanted: bool | None, default: bool) -> bool:
    if is_instruction(text):
        if wanted:
            raise InvalidInputError(
                "pinned",
                "the text reads as an instruction to the assistant; stored memory is data, "
                "and such text is never pinned into the prompt",
            )
        return False
    return default if wanted is None else wanted
