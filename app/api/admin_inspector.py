"""The admin page's inspection of one conversation and of each of its turns.

A conversation is shown beside what was derived from it (facts, summaries); a turn is
shown as its stored report left it (`app.admin.inspection`). Both are pages of /admin,
under the same guard, forms and tokens as the rest of it (`app.api.admin_page`).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Template

from app.access.keys import Principal, admin_only
from app.admin.actions import session_of_user
from app.admin.inspection import inspect_turn
from app.api.admin_page import page
from retrieval.facts.memory import FactMemory
from storage.facts import STATUSES
from storage.messages import MessageRepository
from storage.sessions import SessionRepository
from storage.summaries import SummaryRepository


class AdminInspectorController(Controller):
    path = "/admin/users/{user_pk:int}/sessions/{session_id:str}"
    guards = [admin_only]  # noqa: RUF012
    include_in_schema = False

    @get("/")
    async def conversation(
        self,
        request: Request[Any, Any, Any],
        user_pk: FromPath[int],
        session_id: FromPath[str],
        sessions: NamedDependency[SessionRepository],
        messages: NamedDependency[MessageRepository],
        fact_memory: NamedDependency[FactMemory],
        summaries: NamedDependency[SummaryRepository],
        principal: NamedDependency[Principal],
    ) -> Template:
        """A conversation beside the facts and summaries derived from it; each user turn
        shows the memories, knowledge and facts it was sent with."""
        chat, user = await session_of_user(sessions, user_pk, session_id)
        turns = await messages.list_messages(session_id, limit=10_000, after_seq=0)
        memory_ids = {i for m in turns for i in (m.context_note_ids or [])}
        memories = {m.id: m for m in await messages.list_messages_by_id(user.id, memory_ids)}
        message_ids = {m.id for m in turns}
        facts, history = await fact_memory.list_facts(user.id, STATUSES, with_history=True)
        derived = [f for f in facts if message_ids & set(f.source_message_ids or [])]
        return page(
            request,
            "conversation",
            {
                "principal": principal,
                "user": user,
                "chat": chat,
                "messages": turns,
                "reported": await messages.list_reported_message_ids(session_id),
                "memories": memories,
                "facts": derived,
                "history": history,
                "summaries": await summaries.list_summaries(session_id),
            },
        )

    @get("/turns/{message_id:int}")
    async def turn(
        self,
        request: Request[Any, Any, Any],
        user_pk: FromPath[int],
        session_id: FromPath[str],
        message_id: FromPath[int],
        sessions: NamedDependency[SessionRepository],
        messages: NamedDependency[MessageRepository],
        fact_memory: NamedDependency[FactMemory],
        principal: NamedDependency[Principal],
    ) -> Template:
        """The inspector of one turn: what its prompt held, section by section, the
        memories it showed with their scores, the candidates and facts it left out, and
        where it spent its time, all as stored with the turn."""
        chat, user = await session_of_user(sessions, user_pk, session_id)
        inspection = await inspect_turn(messages, fact_memory, user.id, session_id, message_id)
        return page(
            request,
            "turn",
            {"principal": principal, "user": user, "chat": chat, "turn": inspection},
        )
