"""The context a message would get, without storing or generating anything: the same
build as a turn's (`ContextBuilder`), its summary version and note left unstored."""

from __future__ import annotations

from retrieval.chat.context import ContextBuilder
from retrieval.chat.sessions import turn_state_of_tenant
from retrieval.chat.timing import StageClock
from retrieval.prompt.report import AssembledContext
from retrieval.protocols import SamplingParams
from retrieval.search.memory import TurnMemory
from retrieval.window.keeper import WindowKeeper
from storage.sessions import SessionRepository


class ContextPreview:
    def __init__(
        self,
        sessions: SessionRepository,
        memory: TurnMemory,
        windows: WindowKeeper,
        builder: ContextBuilder,
    ) -> None:
        self._sessions = sessions
        self._memory = memory
        self._windows = windows
        self._builder = builder

    async def preview(
        self,
        session_id: str,
        content: str,
        params: SamplingParams,
        *,
        tenant_id: int,
        clock: StageClock | None = None,
    ) -> AssembledContext:
        """The context the message would get. A preview is no turn: its timings are not
        reported, but a caller's `clock` gets them (stages "embed", "search", "context")."""
        clock = clock or StageClock()
        content_tokens = await self._builder.check(content, params)
        state = await turn_state_of_tenant(self._sessions, session_id, tenant_id)
        view = self._windows.load(state)
        with clock.stage("embed", model=self._memory.embedder.model_name):
            vector = await self._memory.embed_query(state.user.id, content)
        with clock.stage("context"):
            built = await self._builder.build(
                state, view, vector, content, content_tokens, params, clock
            )
        return built.context
