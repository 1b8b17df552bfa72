"""The client's types are the server's: every body the client sends or reads
(`memchat.types`) has the fields of the server's struct of the same name
(`app.api.schemas`), with the same types, both ways, down through nested bodies; so has
every record of a user's export (`memchat.export`, the format's `storage.backup.lines`). The
server's limits (lengths, ranges, patterns) are not compared: the client leaves them
to the server. And the client installs light: importing it loads none of the server's
libraries, and its distribution depends on httpx and msgspec only."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

import memchat.export
import memchat.types
from app.api import schemas
from storage.backup import lines

CLIENT_ROOT = Path(__file__).resolve().parents[1] / "app" / "client"
# Every body of the routes the client calls, requests and responses; nested bodies are
# reached from these.
BODIES = [
    "SessionCreate", "Session", "SessionList", "MessageCreate", "MessageList", "Turn",
    "HistoryImport", "HistoryImported", "SearchRequest", "SearchResponse", "ContextRequest",
    "ContextPreview", "ProblemDetails", "FactCreate", "FactUpdate", "FactList", "Fact",
    "SummaryList", "KnowledgeCreate", "KnowledgeDocument", "KnowledgeDocumentList",
]  # fmt: skip


def shape(kind: mi.Type, names: dict[str, Any] | None = None) -> Any:
    """A comparable description of a type: a body by its name and fields (each field's
    name, type, and whether it is required), a union as a set, constraints dropped.
    Bodies met on the way are described once, in `names`."""
    names = {} if names is None else names
    if isinstance(kind, mi.StructType | mi.DataclassType):
        name = kind.cls.__name__
        if name not in names:
            names[name] = None  # recursion guard
            tagged = isinstance(kind, mi.StructType) and kind.tag_field is not None
            tag = (kind.tag_field, kind.tag) if tagged else None
            names[name] = (
                tag,
                {f.name: (shape(f.type, names), f.required) for f in kind.fields},
            )
        return ("body", name)
    if isinstance(kind, mi.UnionType):
        return frozenset(shape(t, names) for t in kind.types)
    if isinstance(kind, mi.ListType):
        return ("list", shape(kind.item_type, names))
    if isinstance(kind, mi.DictType):
        return ("dict", shape(kind.key_type, names), shape(kind.value_type, names))
    if isinstance(kind, mi.LiteralType):
        return ("literal", frozenset(kind.values))
    return type(kind).__name__  # StrType, IntType, ... without their constraints


def bodies(module: Any, body_names: list[str] = BODIES) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name in body_names:
        shape(mi.type_info(getattr(module, name)), names)
    return names


def differences(server: dict[str, Any], client: dict[str, Any]) -> list[str]:
    """Each body or field on one side only, or typed differently, in words."""
    found = [f"body {n} only in the server" for n in sorted(server.keys() - client.keys())]
    found += [f"body {n} only in the client" for n in sorted(client.keys() - server.keys())]
    for name in sorted(server.keys() & client.keys()):
        server_tag, server_fields = server[name]
        client_tag, client_fields = client[name]
        if server_tag != client_tag:
            found.append(f"{name}: tag {server_tag} in the server, {client_tag} in the client")
        for field in sorted(server_fields.keys() | client_fields.keys()):
            if field not in client_fields:
                found.append(f"{name}.{field} only in the server")
            elif field not in server_fields:
                found.append(f"{name}.{field} only in the client")
            elif server_fields[field] != client_fields[field]:
                found.append(
                    f"{name}.{field}: {server_fields[field]} in the server, "
                    f"{client_fields[field]} in the client"
                )
    return found


def test_every_body_of_the_client_is_the_servers_both_ways() -> None:
    server, client = bodies(schemas), bodies(memchat.types)
    assert differences(server, client) == []
    assert len(server) >= 30  # nested bodies reached too: Message, ContextReport, ...


def test_every_export_record_of_the_client_is_the_servers_both_ways() -> None:
    records = [kind.__name__ for kind in typing.get_args(lines.Record)]
    assert records == [kind.__name__ for kind in typing.get_args(memchat.export.ExportRecord)]
    server, client = bodies(lines, records), bodies(memchat.export, records)
    assert differences(server, client) == []
    assert len(server) == 12


def test_a_field_on_one_side_only_is_found() -> None:
    class Session(schemas.Session):  # the server's Session with one field more
        is_archived: bool = False

    class Usage(msgspec.Struct):  # a response field the client reads as another type
        prompt_tokens: str
        completion_tokens: int
        total_tokens: int
        cached_prompt_tokens: int | None

    server = bodies(schemas)
    grown: dict[str, Any] = {}
    shape(mi.type_info(Session), grown)
    server["Session"] = grown["Session"]
    assert differences(server, bodies(memchat.types)) == ["Session.is_archived only in the server"]
    assert differences(bodies(memchat.types), server) == ["Session.is_archived only in the client"]

    client = bodies(memchat.types)
    retyped: dict[str, Any] = {}
    shape(mi.type_info(Usage), retyped)
    client["Usage"] = retyped["Usage"]
    assert differences(bodies(schemas), client) == [
        "Usage.prompt_tokens: ('IntType', True) in the server, ('StrType', True) in the client"
    ]


def test_every_body_name_is_a_struct_on_both_sides() -> None:
    for name in BODIES:
        assert issubclass(getattr(schemas, name), msgspec.Struct), name
        assert issubclass(getattr(memchat.types, name), msgspec.Struct), name


HEAVY = ["litestar", "sqlalchemy", "torch", "faiss", "chromadb", "llama_cpp", "app", "numpy"]


def test_importing_the_client_loads_none_of_the_servers_libraries() -> None:
    script = (
        "import sys, memchat, memchat.client, memchat.integrations\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(sorted(m for m in ('langchain_core', 'llama_index') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=CLIENT_ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(CLIENT_ROOT)},
    )
    assert done.stdout.splitlines() == ["[]", "[]"], done.stderr


def test_the_client_distribution_depends_on_httpx_and_msgspec_only() -> None:
    project = tomllib.loads((CLIENT_ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "memchat-client"
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == ["httpx", "msgspec"]
    extras = project["optional-dependencies"]
    assert {k: [d.split(">")[0] for d in v] for k, v in extras.items()} == {
        "langchain": ["langchain-core"],
        "llamaindex": ["llama-index-core"],
    }
    assert not (CLIENT_ROOT / "__init__.py").exists()  # not part of the server's `app`


def test_the_server_pulls_neither_the_frameworks_nor_the_client() -> None:
    root = CLIENT_ROOT.parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = [d for group in project["optional-dependencies"].values() for d in group]
    names = [d.split(">")[0].split("[")[0] for d in [*project["dependencies"], *extras]]
    assert [n for n in names if n.startswith(("langchain", "llama-index", "memchat"))] == []


def test_the_keyword_arguments_are_the_bodies_fields() -> None:
    def names(struct: type[msgspec.Struct]) -> set[str]:
        return set(struct.__struct_fields__)

    assert set(memchat.types.Sampling.__annotations__) == names(schemas.MessageCreate) - {
        "content",
        "stream",
    }
    assert set(memchat.types.FactFields.__annotations__) == names(schemas.FactCreate) - {"text"}
    assert set(memchat.types.FactChanges.__annotations__) == names(schemas.FactUpdate)
