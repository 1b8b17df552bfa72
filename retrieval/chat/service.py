"""One chat turn: persist -> embed -> search -> assemble -> generate -> persist -> index.

Turns of one session are serialised by a per-session lock, so each turn's context sees
every earlier turn of that session, reply included.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from retrieval.chat.events import Found, TurnEvent, TurnResult, TurnStarted
from retrieval.chat.timing import StageClock
from retrieval.engines.routing import Route, current_route
from retrieval.errors import EngineBusyError, InvalidInputError, TooLargeError
from retrieval.facts.memory import FactHit, FactMemory, PinnedFact, fact_order
from retrieval.knowledge.base import KnowledgeBase, KnowledgeHit
from retrieval.prompt.budget import ContextBudget, max_reply_tokens
from retrieval.prompt.layout import ContextAssembler
from retrieval.prompt.pinned import split_pinned
from retrieval.prompt.report import AssembledContext, ContextReport, RecentTurn, shared_prefix
from retrieval.protocols import Completion, Engine, SamplingParams, WindowTurn
from retrieval.search.hits import MemoryRecall
from retrieval.search.memory import TurnMemory
from retrieval.text import is_blank
from retrieval.timeutil import as_utc
from retrieval.turns import ImportedMessage, SearchHit, StoredTurn
from retrieval.window.compaction import SummaryState
from retrieval.window.keeper import WindowKeeper, WindowView, view_of
from storage.models import ChatSession, Message, SessionSummary, User
from storage.repository import NewMessage, Store


@dataclass(frozen=True, slots=True)
class ChatConfig:
    retrieval_k: int = 5
    memory_share: float = 0.25
    facts_share: float = 0.15
    summary_share: float = 0.10
    max_content_chars: int = 32_000
    max_import_messages: int = 1_000
    # Characters of all messages of one import together: what one request may make the
    # service embed and index.
    max_import_chars: int = 400_000
    # A session's metadata, encoded as JSON.
    max_metadata_bytes: int = 16_384
    # Turns admitted at once (generating or waiting for the engine); more are refused.
    max_pending_turns: int = 8
    # Knowledge-base chunks retrieved per turn, and their share of the prompt budget.
    knowledge_k: int = 3
    knowledge_share: float = 0.2


LoadedWindow = tuple[SummaryState, list[WindowTurn]]

LAST_PROMPTS_KEPT = 1024


class ChatService:
    def __init__(
        self,
        store: Store,
        memory: TurnMemory,
        engine: Engine,
        assembler: ContextAssembler,
        config: ChatConfig,
        *,
        windows: WindowKeeper,
        facts: FactMemory | None = None,
        knowledge: KnowledgeBase | None = None,
        on_new_messages: Callable[[int], None] | None = None,
        on_turn: Callable[[TurnResult], None] | None = None,
    ) -> None:
        self._knowledge = knowledge
        self._recall = MemoryRecall(store, memory, facts, knowledge)
        self._store = store
        self._windows = windows
        self._facts = facts
        # Told the user id after messages are stored (fact extraction runs off the path).
        self._on_new_messages = on_new_messages or (lambda _user_pk: None)
        # Told every finished turn (the app publishes its timings and token counts).
        self._on_turn = on_turn or (lambda _result: None)
        self._memory = memory
        self._engine = engine
        self._assembler = assembler
        self._config = config
        self._num_pending_turns = 0
        # The last prompt of recent sessions, oldest first, to measure prefix reuse.
        self._last_prompts: OrderedDict[str, list[int]] = OrderedDict()
        # Weak values: a lock lives while a turn holds it, so unknown ids leave nothing behind.
        self._session_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._session_locks.get(session_id)
        if lock is None:
            lock = asyncio.Lock()
            self._session_locks[session_id] = lock
        return lock

    def _budget(self, params: SamplingParams) -> ContextBudget:
        return ContextBudget(
            context_window=self._engine.context_window,
            reply_tokens=params.max_tokens,
            memory_share=self._config.memory_share,
            facts_share=self._config.facts_share,
            summary_share=self._config.summary_share,
            knowledge_share=self._config.knowledge_share if self._knowledge else 0.0,
        )

    def validate_content(self, content: str, field: str = "content") -> None:
        if is_blank(content):
            raise InvalidInputError(field, f"{field} must not be empty")
        if len(content) > self._config.max_content_chars:
            raise InvalidInputError(
                field,
                f"{field} has {len(content)} characters; the limit is "
                f"{self._config.max_content_chars}",
            )

    def _check_fits(self, content_tokens: int, params: SamplingParams) -> None:
        budget = self._budget(params)
        limit = max_reply_tokens(budget.context_window)
        if params.max_tokens > limit:
            raise InvalidInputError(
                "max_tokens",
                f"max_tokens is {params.max_tokens}; at most {limit} (half the "
                f"{budget.context_window}-token context window) may be reserved for the reply",
            )
        self._assembler.check_fits(content_tokens, budget)

    # One chat turn ----------------------------------------------------------------

    async def run_turn(
        self, session_id: str, content: str, params: SamplingParams
    ) -> AsyncIterator[TurnEvent]:
        """Yields TurnStarted, then TextDeltas, then one TurnResult.

        Bad input and unknown sessions raise before anything is stored. An engine failure
        raises after the user message is stored and indexed; no reply is stored then.
        """
        self.validate_content(content)
        content_tokens = self._engine.count_tokens(content)
        self._check_fits(content_tokens, params)
        if self._num_pending_turns >= self._config.max_pending_turns:
            raise EngineBusyError(
                f"{self._num_pending_turns} turns are already waiting for the engine"
            )
        self._num_pending_turns += 1
        try:
            async for event in self._run_admitted_turn(session_id, content, content_tokens, params):
                yield event
        finally:
            self._num_pending_turns -= 1

    async def _run_admitted_turn(
        self, session_id: str, content: str, content_tokens: int, params: SamplingParams
    ) -> AsyncIterator[TurnEvent]:
        clock = StageClock()  # the turn's total includes waiting for the session's lock
        async with self._lock(session_id):
            chat, user, window, vector = await self._load_and_embed(session_id, content, clock)
            message = await self._persist_user_message(chat, content, content_tokens)
            with clock.stage("context"):
                context = await self._context(
                    chat,
                    user.tenant_id,
                    window,
                    vector,
                    content,
                    params,
                    {message.id},
                    clock=clock,
                    persist=True,
                    message_id=message.id,
                )
            await self._memory.index_messages([message], vector[None, :])
            user_turn = StoredTurn.from_row(message)
            yield TurnStarted(user_turn, context)
            completion: Completion | None = None
            # The user's replica keeps their prefix cached. Set for the rest of this task
            # (one request): each turn sets its own route before generating.
            current_route.set(Route(key=str(chat.user_pk), tenant=str(user.tenant_id)))
            sent = time.perf_counter()
            with clock.stage("generation"):
                async for event in self._engine.stream(context.messages, params):
                    if isinstance(event, Completion):
                        completion = event
                    else:
                        clock.mark_once("time_to_first_token", since=sent)
                        yield event
            if completion is None:  # pragma: no cover - engines always finish with one
                raise RuntimeError("engine stream ended without a completion")
            reply = await self._persist_reply(chat, completion.text)
            await self._memory.index_messages([reply])
            self._on_new_messages(chat.user_pk)
            result = TurnResult(
                user_turn, StoredTurn.from_row(reply), context.report, completion, clock.timings()
            )
            self._on_turn(result)
            yield result

    async def complete_turn(
        self, session_id: str, content: str, params: SamplingParams
    ) -> TurnResult:
        async for event in self.run_turn(session_id, content, params):
            if isinstance(event, TurnResult):
                return event
        raise RuntimeError("turn ended without a result")  # pragma: no cover

    async def _persist_user_message(
        self, chat: ChatSession, content: str, token_count: int
    ) -> Message:
        result = await self._store.add_messages(
            chat, [NewMessage(role="user", content=content, token_count=token_count)]
        )
        return result.messages[0]

    async def _persist_reply(self, chat: ChatSession, text: str) -> Message:
        result = await self._store.add_messages(
            chat,
            [
                NewMessage(
                    role="assistant", content=text, token_count=self._engine.count_tokens(text)
                )
            ],
        )
        return result.messages[0]

    async def _load_and_embed(
        self, session_id: str, content: str, clock: StageClock
    ) -> tuple[ChatSession, User, LoadedWindow, np.ndarray]:
        """The session, its user and its window, read while the new message is embedded."""
        (chat, user), window, vector = await asyncio.gather(
            self._store.get_session(session_id),
            self._windows.load(session_id),
            self._embed_one(content, clock),
        )
        return chat, user, window, vector

    async def _embed_one(self, content: str, clock: StageClock) -> np.ndarray:
        with clock.stage("embed"):
            vectors = await self._memory.embed([content])
        return vectors[0]

    async def _context(
        self,
        chat: ChatSession,
        tenant_id: int,
        window: LoadedWindow,
        vector: np.ndarray,
        content: str,
        params: SamplingParams,
        exclude: set[int],
        *,
        clock: StageClock,
        persist: bool,
        message_id: int | None = None,
    ) -> AssembledContext:
        """Search the user's past turns (less the window and `exclude`) and knowledge,
        keep the window within the room that leaves it, and assemble the prompt.

        A turn keeps its retrieved context with its message (`message_id`): later prompts
        re-insert it as sent, so each prompt extends the previous one.

        The report says how many leading tokens the prompt shares with the session's
        previous one; a turn (not a preview) then becomes that previous prompt.
        """
        budget = self._budget(params)
        pinned = await self._facts.pinned(chat.user_pk) if self._facts is not None else []
        state, turns = window
        # What this turn retrieves decides how much room the window has, so the window
        # is kept within budget after the search; a compaction changes what is in view,
        # and the search is done again.
        view = view_of(state, turns)
        found = await self._find(chat, tenant_id, vector, content, view, pinned, exclude, clock)
        room = self._assembler.window_room(
            new_message=content,
            memories=found.memories,
            budget=budget,
            pinned=found.in_system,
            summary=view.state.text,
            knowledge=found.knowledge,
            new_facts=found.new_facts,
        )
        kept = await self._windows.keep_within_budget(
            chat.id,
            state,
            turns,
            budget=budget,
            room=room,
            pinned=pinned,
            content_tokens=self._engine.count_tokens(content),
            persist=persist,
        )
        if kept.state != view.state:
            view = kept
            found = await self._find(chat, tenant_id, vector, content, view, pinned, exclude, clock)
        recent = [
            RecentTurn(t.message_id, t.role, t.name, t.text, t.token_count, t.note)
            for t in view.turns
        ]
        context = self._assembler.assemble(
            new_message=content,
            memories=found.memories,
            recent=recent,
            budget=budget,
            pinned=found.in_system,
            summary=view.state.text,
            knowledge=found.knowledge,
            new_facts=found.new_facts,
        )
        report = replace(
            context.report,
            pinned_facts=tuple(
                sorted([*context.report.pinned_facts, *found.shown_before], key=fact_order)
            ),
            summary_version=view.state.version,
            summary_through_seq=view.state.through_seq,
            pruned_message_ids=view.pruned_message_ids,
        )
        tokens = self._engine.prompt_tokens(context.messages)
        previous = self._last_prompts.get(chat.id)
        if persist and message_id is not None:
            await self._keep_turn_context(message_id, report)
        if persist:
            self._last_prompts[chat.id] = tokens
            self._last_prompts.move_to_end(chat.id)
            while len(self._last_prompts) > LAST_PROMPTS_KEPT:
                self._last_prompts.popitem(last=False)
        if previous is not None:
            report = replace(report, prefix_reuse=shared_prefix(previous, tokens))
        return replace(context, report=report)

    async def _find(
        self,
        chat: ChatSession,
        tenant_id: int,
        vector: np.ndarray,
        content: str,
        view: WindowView,
        pinned: Sequence[PinnedFact],
        exclude: set[int],
        clock: StageClock,
    ) -> Found:
        """This turn's memories and knowledge, and where each pinned fact goes, for the
        window as `view` has it (its turns, and the turns its context notes show, are
        not retrieved again)."""
        user_pk = chat.user_pk
        exclude = exclude | {t.message_id for t in view.turns}
        exclude |= {i for t in view.turns for i in t.note_ids}
        with clock.stage("search"):
            hits, knowledge = await asyncio.gather(
                self._memory.search(
                    user_pk, vector, self._config.retrieval_k, exclude, query=content
                ),
                self._recall.knowledge_for(tenant_id, user_pk, vector, self._config.knowledge_k),
            )
            memories = await self._recall.memories(user_pk, hits)
        in_system, new_facts, shown_before = split_pinned(pinned, view, as_utc(chat.created_at))
        return Found(
            memories=tuple(memories),
            knowledge=tuple(hit.retrieved() for hit in knowledge),
            in_system=tuple(in_system),
            new_facts=tuple(new_facts),
            shown_before=tuple(shown_before),
        )

    async def _keep_turn_context(self, message_id: int, report: ContextReport) -> None:
        new_facts = report.new_facts
        block = self._assembler.turn_context(report.memories, report.knowledge, new_facts)
        if not block:
            return
        shown = [m.message_id for m in report.memories]
        await self._windows.summaries.set_context_note(
            message_id,
            [block],
            self._assembler.note_tokens(block),
            shown,
            [f.id for f in new_facts],
        )

    # Without generation -------------------------------------------------------------

    async def preview_context(
        self, session_id: str, content: str, params: SamplingParams
    ) -> AssembledContext:
        """The context a message would get, without storing or generating anything."""
        self.validate_content(content)
        self._check_fits(self._engine.count_tokens(content), params)
        clock = StageClock()  # a preview is no turn: its timings are not reported
        chat, user, window, vector = await self._load_and_embed(session_id, content, clock)
        return await self._context(
            chat, user.tenant_id, window, vector, content, params, set(), clock=clock, persist=False
        )

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        size = len(json.dumps(metadata, ensure_ascii=False).encode("utf-8"))
        if size > self._config.max_metadata_bytes:
            raise InvalidInputError(
                "metadata",
                f"metadata takes {size} bytes as JSON; the limit is "
                f"{self._config.max_metadata_bytes}",
            )

    async def import_history(
        self, session_id: str, messages: Sequence[ImportedMessage]
    ) -> tuple[int, int]:
        """Store and index existing history; returns (imported, skipped as duplicates)."""
        if len(messages) > self._config.max_import_messages:
            raise InvalidInputError(
                "messages",
                f"{len(messages)} messages in one import; the limit is "
                f"{self._config.max_import_messages}",
            )
        for position, item in enumerate(messages):
            self.validate_content(item.content, f"messages[{position}].content")
        num_chars = sum(len(m.content) for m in messages)
        if num_chars > self._config.max_import_chars:
            raise TooLargeError(
                "messages",
                f"the messages hold {num_chars} characters together; one import takes at "
                f"most {self._config.max_import_chars} (split it into several)",
            )
        chat, _user = await self._store.get_session(session_id)
        new = [
            NewMessage(
                role=m.role,
                content=m.content,
                token_count=self._engine.count_tokens(m.content),
                name=m.name,
                created_at=m.created_at,
                external_id=m.external_id,
                image_caption=m.image_caption,
            )
            for m in messages
        ]
        async with self._lock(session_id):
            result = await self._store.add_messages(chat, new)
            await self._memory.index_messages(result.messages)
        if result.messages:
            self._on_new_messages(chat.user_pk)
        return len(result.messages), result.num_skipped

    async def list_summaries(self, session_id: str) -> list[SessionSummary]:
        return await self._windows.summaries.list_summaries(session_id)

    async def search_all(
        self, user: User, query: str, k: int, session_id: str | None, kinds: Sequence[str]
    ) -> list[SearchHit | FactHit | KnowledgeHit]:
        """Past turns, key facts and/or knowledge chunks (as `kinds` says), merged best
        first."""
        self.validate_content(query, "query")
        vector = (await self._memory.embed([query]))[0]
        return await self._recall.search_all(user, query, vector, k, session_id, kinds)

    async def delete_session(self, session_id: str) -> None:
        chat, _user = await self._store.get_session(session_id)
        async with self._lock(session_id):
            ids = await self._store.delete_session(session_id)
            await self._memory.forget(chat.user_pk, ids)
            self._last_prompts.pop(session_id, None)
