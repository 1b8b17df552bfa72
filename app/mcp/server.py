"""The MCP server: memchat's memory tools, their argument schemas and descriptions.

The same server object serves both transports; only how a call finds its principal
differs (`PrincipalOf`): over HTTP the app's access middleware has already resolved the
request's Bearer key, over stdio the key in the environment is checked on every call.
Arguments are validated by the SDK from the signatures below; what only memchat can
check (blank text, unknown ids, another tenant's objects) comes back as a tool error
carrying memchat's message (app/mcp/errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Annotated, Any, Literal, cast

import msgspec
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field

from app.access.keys import Principal
from app.api.schemas import FactCategory, Kind
from app.mcp.errors import tool_errors
from app.mcp.tools import ALL_KINDS, MemoryTools

NAME = "memchat"
INSTRUCTIONS = (
    "Long-term memory of your application's users: their past chat turns across sessions, "
    "key facts about them, and knowledge documents. Search before answering questions "
    "about a user's past; remember facts the user states; correct or forget facts that "
    "are wrong. Everything is scoped to the API key's tenant."
)

PrincipalOf = Callable[[Context], Awaitable[Principal]]
Lifespan = Callable[[MCPServer[Any]], AbstractAsyncContextManager[Any]]

UserId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=255,
        description="The user's id in your application (no '/', no spaces at either end)",
    ),
]
SessionId = Annotated[str, Field(min_length=1, max_length=255, description="A session's id")]
FactId = Annotated[int, Field(description="A fact's id, from remember or list_facts")]
FactText = Annotated[str, Field(min_length=1, max_length=2000, description="The fact, a sentence")]
Priority = Annotated[
    int | None, Field(ge=-1000, le=1000, description="Order among pinned facts; higher first")
]
Pinned = Annotated[
    bool | None, Field(description="Whether every prompt of the user carries the fact")
]

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DELETES = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def _body(value: msgspec.Struct) -> dict[str, Any]:
    return cast(dict[str, Any], msgspec.to_builtins(value))


class MemoryServerTools:
    """The tools as the SDK registers them: each method's name, signature and docstring
    are the tool's name, input schema and description."""

    def __init__(self, tools: MemoryTools, principal_of: PrincipalOf) -> None:
        self._tools = tools
        self._principal_of = principal_of

    async def search_memory(
        self,
        ctx: Context,
        user_id: UserId,
        query: Annotated[str, Field(description="What to look for, in words")],
        k: Annotated[int, Field(ge=1, le=100, description="How many results")] = 10,
        session_id: Annotated[str | None, Field(description="Only this session's turns")] = None,
        kinds: Annotated[
            list[Kind] | None, Field(description="Default: turns, facts and knowledge")
        ] = None,
    ) -> dict[str, Any]:
        """Search one user's memory: past turns of all their sessions, their key facts and
        the knowledge documents they may read, ranked together by similarity to the query."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            found = await self._tools.search_memory(
                principal, user_id, query, k, session_id, kinds or ALL_KINDS
            )
            return _body(found)

    async def remember(
        self,
        ctx: Context,
        user_id: UserId,
        text: FactText,
        category: Annotated[
            FactCategory | None, Field(description="Default: other (a note)")
        ] = None,
        subject: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=255,
                description="What the fact is about (e.g. 'diet'); a newer fact of the same "
                "subject supersedes the older one",
            ),
        ] = None,
        pinned: Pinned = None,
        priority: Priority = None,
    ) -> dict[str, Any]:
        """Remember a fact or a note about a user. Pinned facts (by default those of
        category identity and constraint) are in every later prompt of the user."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            fact = await self._tools.remember(
                principal,
                user_id,
                text,
                category=category,
                subject=subject,
                pinned=pinned,
                priority=priority,
            )
            return _body(fact)

    async def list_facts(
        self,
        ctx: Context,
        user_id: UserId,
        status: Literal["active", "superseded", "deleted", "all"] = "active",
        include_history: Annotated[bool, Field(description="Each fact's changes")] = False,
    ) -> dict[str, Any]:
        """List a user's key facts (by default the active ones)."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            facts = await self._tools.list_facts(
                principal, user_id, status, with_history=include_history
            )
            return _body(facts)

    async def correct_fact(
        self,
        ctx: Context,
        fact_id: FactId,
        text: Annotated[
            str | None, Field(min_length=1, max_length=2000, description="The corrected fact")
        ] = None,
        pinned: Pinned = None,
        priority: Priority = None,
    ) -> dict[str, Any]:
        """Correct a fact's text, or pin, unpin or reorder it; its history keeps the old text."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            fact = await self._tools.correct_fact(
                principal, fact_id, text=text, pinned=pinned, priority=priority
            )
            return _body(fact)

    async def forget_fact(self, ctx: Context, fact_id: FactId) -> dict[str, Any]:
        """Forget (delete) a fact: it leaves every prompt and search; its history stays."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            return _body(await self._tools.forget_fact(principal, fact_id))

    async def list_sessions(self, ctx: Context, user_id: UserId) -> dict[str, Any]:
        """List a user's chat sessions, to read one with recent_turns."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            return _body(await self._tools.list_sessions(principal, user_id))

    async def recent_turns(
        self,
        ctx: Context,
        session_id: SessionId,
        limit: Annotated[int, Field(ge=1, le=1000, description="How many turns")] = 20,
    ) -> dict[str, Any]:
        """The most recent turns of a session, oldest first."""
        with tool_errors():
            principal = await self._principal_of(ctx)
            return _body(await self._tools.recent_turns(principal, session_id, limit))


@contextmanager
def _process_logging_kept() -> Iterator[None]:
    """`MCPServer()` calls `logging.basicConfig` (a Rich handler on the root logger, at
    INFO) unless the root logger has a handler; the process's logging is the command
    line's to configure (`app.cli.logs.configure_logging`), and `create_app` changes none."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


def build_server(
    tools: MemoryTools, principal_of: PrincipalOf, *, lifespan: Lifespan | None = None
) -> MCPServer[Any]:
    with _process_logging_kept():
        server: MCPServer[Any] = MCPServer(
            NAME, instructions=INSTRUCTIONS, version="0.1.0", lifespan=lifespan
        )
    face = MemoryServerTools(tools, principal_of)
    for method, hints in (
        (face.search_memory, READ_ONLY),
        (face.remember, WRITES),
        (face.list_facts, READ_ONLY),
        (face.correct_fact, WRITES),
        (face.forget_fact, DELETES),
        (face.list_sessions, READ_ONLY),
        (face.recent_turns, READ_ONLY),
    ):
        server.add_tool(method, annotations=hints)
    return server
