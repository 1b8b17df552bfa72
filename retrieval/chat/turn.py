"""One chat turn: load -> embed -> search -> assemble -> persist -> generate -> persist ->
index.

Turns of one session are serialised (`SessionLocks`), so each turn's context sees every
earlier turn of that session, reply included. The user's message is embedded once, in
one call of the embedder for its query vector and the vector it is indexed with, and
stored with the context it was sent with, after the context is built: a failing engine
then finds it stored and indexed; no reply is stored.

SQL per steady-state turn (test_statement_count): the session with its user, summary
and knowledge flags; the window; the pinned facts; the retrieved turns; the message and
its vector; the reply and its vector (each vector with the user's change count). The
hops, function by function, are listed in docs/architecture.md.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import asdict

from retrieval.chat.config import ChatConfig, check_text
from retrieval.chat.context import ContextBuilder
from retrieval.chat.events import TurnEvent, TurnResult, TurnStarted
from retrieval.chat.sessions import SessionLocks, turn_state_of_tenant
from retrieval.chat.timing import StageClock
from retrieval.chat.turn_report import stage_seconds, stored_report, turn_report
from retrieval.engines.routing import Route, current_route
from retrieval.errors import EngineBusyError
from retrieval.prompt.reuse import PrefixTracker
from retrieval.protocols import Completion, Engine, SamplingParams
from retrieval.search.memory import TurnMemory
from retrieval.stages import Stage, StageValue, stage
from retrieval.text import normalise
from retrieval.window.keeper import WindowKeeper
from storage.messages import MessageRepository
from storage.records import NewTurn, Session, Turn
from storage.sessions import SessionRepository


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ChatTurn:
    def __init__(
        self,
        sessions: SessionRepository,
        messages: MessageRepository,
        memory: TurnMemory,
        windows: WindowKeeper,
        builder: ContextBuilder,
        engine: Engine,
        locks: SessionLocks,
        prefixes: PrefixTracker,
        config: ChatConfig,
        *,
        on_new_messages: Callable[[int], None] | None = None,
        on_turn: Callable[[TurnResult], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._messages = messages
        self._memory = memory
        self._windows = windows
        self._builder = builder
        self._engine = engine
        self._locks = locks
        self._prefixes = prefixes
        self._config = config
        # Told the user id after messages are stored (fact extraction runs off the path).
        self._on_new_messages = on_new_messages or (lambda _user_pk: None)
        # Told every finished turn (the app publishes its timings and token counts).
        self._on_turn = on_turn or (lambda _result: None)
        self._num_pending = 0

    @property
    def num_pending(self) -> int:
        """Turns admitted and not finished: waiting for their session's lock or the
        engine, or generating (the engine queue; /metrics reads it)."""
        return self._num_pending

    @property
    def max_pending(self) -> int:
        """Admitted turns beyond which a turn is refused with EngineBusyError."""
        return self._config.max_pending_turns

    async def run(
        self,
        session_id: str,
        content: str,
        params: SamplingParams,
        *,
        tenant_id: int,
        instructions: str = "",
    ) -> AsyncGenerator[TurnEvent]:
        """Yields TurnStarted, then TextDeltas, then one TurnResult.

        Bad input and unknown sessions raise before anything is stored. An engine failure
        raises after the user message is stored and indexed; no reply is stored then.
        `instructions` (a client's own system message) follow the service's prompt.
        """
        content_tokens = await self._builder.check(content, params)
        if instructions:
            check_text(instructions, "instructions", self._config.max_content_chars)
        if self._num_pending >= self._config.max_pending_turns:
            raise EngineBusyError(f"{self._num_pending} turns are already waiting for the engine")
        self._num_pending += 1
        try:
            async for event in self._admitted(
                session_id, content, content_tokens, params, tenant_id, instructions
            ):
                yield event
        finally:
            self._num_pending -= 1

    async def complete(
        self,
        session_id: str,
        content: str,
        params: SamplingParams,
        *,
        tenant_id: int,
        instructions: str = "",
    ) -> TurnResult:
        # Closed on return, not when collected: the turn leaves the engine queue at once.
        async with aclosing(
            self.run(session_id, content, params, tenant_id=tenant_id, instructions=instructions)
        ) as events:
            async for event in events:
                if isinstance(event, TurnResult):
                    return event
        raise RuntimeError("turn ended without a result")  # pragma: no cover

    async def _admitted(
        self,
        session_id: str,
        content: str,
        content_tokens: int,
        params: SamplingParams,
        tenant_id: int,
        instructions: str,
    ) -> AsyncIterator[TurnEvent]:
        clock = StageClock()  # the turn's total includes waiting for the session's lock
        with stage("chat_turn", session_id=session_id, model=self._engine.model_name) as turn:
            turn.content("user", content)
            result: TurnResult | None = None
            async with self._locks.hold(session_id):
                async for event in self._steps(
                    session_id, content, content_tokens, params, tenant_id, instructions, clock
                ):
                    if isinstance(event, TurnResult):
                        result = event
                    else:
                        yield event
            if result is None:  # pragma: no cover - the steps end with the result
                raise RuntimeError("turn ended without a result")
            _record_result(turn, result)
        # After the turn's stage has closed, and its session's lock is free: a caller that
        # stops at the result (`complete`) leaves nothing open.
        yield result

    async def _steps(
        self,
        session_id: str,
        content: str,
        content_tokens: int,
        params: SamplingParams,
        tenant_id: int,
        instructions: str,
        clock: StageClock,
    ) -> AsyncIterator[TurnEvent]:
        """The turn's steps, its session's lock held: its events, its result last."""
        state = await turn_state_of_tenant(self._sessions, session_id, tenant_id)
        view = self._windows.load(state)
        sent_at = _now()
        pending = Turn(
            id=0,
            session_id=session_id,
            user_pk=state.user.id,
            seq=view.last_seq + 1,
            role="user",
            name=None,
            content=content,
            created_at=sent_at,
            external_id=None,
            token_count=content_tokens,
        )
        with clock.stage("embed", model=self._memory.embedder.model_name):
            query_vector, own_vector = await self._memory.embed_turn(content, pending, view.loaded)
        assert query_vector is not None
        with clock.stage("context"):
            built = await self._builder.build(
                state,
                view,
                query_vector,
                content,
                content_tokens,
                params,
                clock,
                instructions=instructions,
            )
        if built.view.new_summary is not None:
            await self._windows.store(built.view.new_summary)
        report = built.context.report
        with stage("persist", role="user"):
            message = await self._append(
                state.session,
                NewTurn(
                    role="user",
                    content=content,
                    token_count=content_tokens,
                    created_at=sent_at,
                    context_note=[built.note] if built.note else None,
                    context_note_tokens=built.note_tokens,
                    context_note_ids=[h.turn.id for h in report.memories] if built.note else None,
                    context_note_fact_ids=[f.id for f in report.new_facts] if built.note else None,
                ),
                view.last_seq,
            )
            await self._memory.index(
                [message], vectors=[own_vector], earlier=view.loaded, fresh=True
            )
        self._prefixes.remember(session_id, built.tokens)
        yield TurnStarted(message, built.context)
        # The user's replica keeps their prefix cached. Set for the rest of this task
        # (one request): each turn sets its own route before generating.
        current_route.set(Route(key=str(state.user.id), tenant=str(state.user.tenant_id)))
        completion: Completion | None = None
        sent = time.perf_counter()
        with clock.stage("generation", **_request_values(self._engine, params)) as generation:
            async for event in self._engine.stream(built.context.messages, params):
                if isinstance(event, Completion):
                    completion = event
                else:
                    clock.mark_once("time_to_first_token", since=sent)
                    clock.mark_once("first_token", since=clock.started)
                    yield event
            if completion is None:  # pragma: no cover - engines always finish with one
                raise RuntimeError("engine stream ended without a completion")
            _record_completion(generation, completion)
        # Stored as clients' text is (retrieval.text.normalise): a model can echo tag
        # characters or direction controls it was shown elsewhere.
        reply_text = normalise(completion.text)
        seconds = stage_seconds(clock.timings(), clock.seconds_or_none("first_token"))
        inspected = turn_report(message.id, report, built.memories, completion, seconds)
        with stage("persist", role="assistant"):
            reply = await self._append(
                state.session,
                NewTurn(
                    role="assistant",
                    content=reply_text,
                    token_count=await self._engine.count_tokens(reply_text),
                    turn_report=stored_report(inspected),
                ),
                message.seq,
            )
            await self._memory.index([reply], earlier=[*view.loaded, message], fresh=True)
        self._on_new_messages(state.user.id)
        result = TurnResult(message, reply, report, completion, clock.timings())
        self._on_turn(result)
        yield result

    async def _append(self, session: Session, new: NewTurn, last_seq: int) -> Turn:
        appended = await self._messages.append(session, [new], last_seq=last_seq)
        return appended.turns[0]


def _request_values(engine: Engine, params: SamplingParams) -> dict[str, StageValue]:
    return {
        "model": engine.model_name,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }


def _record_completion(observed: Stage, completion: Completion) -> None:
    observed.content("assistant", completion.text)
    observed.record(
        input_tokens=completion.prompt_tokens,
        output_tokens=completion.completion_tokens,
        finish_reasons=[completion.finish_reason],
    )
    if completion.cached_prompt_tokens is not None:
        observed.record(cached_input_tokens=completion.cached_prompt_tokens)


def _record_result(observed: Stage, result: TurnResult) -> None:
    """A finished turn's counts: what it retrieved, its prompt by section, its reply."""
    report = result.context
    observed.content("assistant", result.completion.text)
    observed.record(
        message_id=result.message.id,
        reply_id=result.reply.id,
        num_memories=len(report.memories),
        num_knowledge=len(report.knowledge),
        num_pinned_facts=len(report.pinned_facts),
        prompt_tokens=report.prompt_tokens,
        input_tokens=result.completion.prompt_tokens,
        output_tokens=result.completion.completion_tokens,
        **{f"prompt_tokens.{name}": count for name, count in asdict(report.sections).items()},
    )
    if report.prefix_reuse is not None:
        observed.record(prefix_reuse_tokens=report.prefix_reuse)
