"""The knowledge base over HTTP: add (JSON text or a .txt/.md/.pdf upload), list, get, delete.

`user_id` absent means shared knowledge, retrieved for every user; present, that user's
own. Adding content already stored in the same scope answers 200 with the stored
document; a new document answers 201 when ready (or failed), 202 while it is still
being processed in the background.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_202_ACCEPTED

from app.access.keys import Principal
from app.api import schemas
from app.api.bodies import document_body
from app.api.errors import BadBodyError
from app.api.problems import problems
from app.api.requests import convert_strict, incoming_text, strict_body
from app.api.tenancy import document_of
from retrieval.errors import InvalidInputError, UnsupportedDocumentError
from retrieval.knowledge.base import KnowledgeBase, Upload
from retrieval.knowledge.files import read_upload
from storage.knowledge import PROCESSING, KnowledgeRepository, scope_of
from storage.users import UserRepository

FORM_FIELDS = frozenset({"file", "title", "user_id", "metadata"})


class KnowledgeController(Controller):
    path = "/v1/knowledge"
    tags = ["knowledge"]  # noqa: RUF012

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        responses={
            HTTP_200_OK: ResponseSpec(
                data_container=schemas.KnowledgeDocument,
                description="The same content was already stored in this scope: that document.",
            ),
            HTTP_202_ACCEPTED: ResponseSpec(
                data_container=schemas.KnowledgeDocument,
                description="Stored; chunks are being embedded in the background "
                "(`status: processing`, progress in `num_chunks_indexed`).",
            ),
            **problems(400, 413, 415, 422, 503),
        },
    )
    async def add_document(
        self,
        request: Request[Any, Any, Any],
        knowledge: NamedDependency[KnowledgeBase],
        principal: NamedDependency[Principal],
    ) -> Response[schemas.KnowledgeDocument]:
        media_type = request.content_type[0]
        if media_type == "application/json":
            upload = await _json_upload(request, principal.tenant_id)
        elif media_type == "multipart/form-data":
            upload = await _file_upload(request, knowledge.max_upload_bytes, principal.tenant_id)
        else:
            raise UnsupportedDocumentError(
                "body", "send application/json or multipart/form-data (a file in `file`)"
            )
        document, owner, created = await knowledge.add(upload)
        status = HTTP_201_CREATED if created else HTTP_200_OK
        if created and document.status == PROCESSING:
            status = HTTP_202_ACCEPTED
        return Response(document_body(document, owner), status_code=status)

    @get("/", responses=problems(400, 422, 503))
    async def list_documents(
        self,
        users: NamedDependency[UserRepository],
        documents: NamedDependency[KnowledgeRepository],
        principal: NamedDependency[Principal],
        user_id: Annotated[str | None, QueryParameter(min_length=1, max_length=255)] = None,
    ) -> schemas.KnowledgeDocumentList:
        """A user's own documents, or the shared ones when `user_id` is absent."""
        user_pk = None
        if user_id is not None:
            user = await users.get_user_or_none(user_id, tenant_id=principal.tenant_id)
            if user is None:
                return schemas.KnowledgeDocumentList(documents=[])
            user_pk = user.id
        rows = await documents.list_documents(scope_of(principal.tenant_id, user_pk))
        return schemas.KnowledgeDocumentList(documents=[document_body(d, user_id) for d in rows])

    @get("/{document_id:str}", responses=problems(404, 503))
    async def get_document(
        self,
        document_id: FromPath[str],
        documents: NamedDependency[KnowledgeRepository],
        principal: NamedDependency[Principal],
    ) -> schemas.KnowledgeDocument:
        document, owner = await document_of(documents, principal, document_id)
        return document_body(document, owner)

    @delete("/{document_id:str}", responses=problems(404, 503))
    async def delete_document(
        self,
        document_id: FromPath[str],
        knowledge: NamedDependency[KnowledgeBase],
        documents: NamedDependency[KnowledgeRepository],
        principal: NamedDependency[Principal],
    ) -> None:
        """Removes the document, its chunks and their vectors."""
        await document_of(documents, principal, document_id)
        await knowledge.delete(document_id)


async def _json_upload(request: Request[Any, Any, Any], tenant_id: int) -> Upload:
    data = await strict_body(request, schemas.KnowledgeCreate)
    return Upload(tenant_id, data.user_id, data.title, data.text, dict(data.metadata), "text")


_Title = Annotated[str, msgspec.Meta(min_length=1, max_length=schemas.MAX_TITLE_CHARS)]


class _FormFields(msgspec.Struct, forbid_unknown_fields=True):
    title: _Title | None = None
    user_id: schemas.UserId | None = None
    metadata: dict[str, Any] = {}


async def _file_upload(request: Request[Any, Any, Any], max_bytes: int, tenant_id: int) -> Upload:
    form = await request.form()
    unknown = sorted(set(form.keys()) - FORM_FIELDS)
    if unknown:
        raise InvalidInputError(unknown[0], f"unknown form field `{unknown[0]}`")
    files = form.getall("file") if "file" in form else []
    if len(files) != 1 or not isinstance(files[0], UploadFile) or not files[0].filename:
        raise InvalidInputError("file", "send exactly one file, with its name, in `file`")
    file: UploadFile = files[0]
    if len(file.filename) > 255:
        raise InvalidInputError("file", "the file name is longer than 255 characters")
    fields = _text_fields(form)
    data = await file.read()
    source, text = read_upload(file.filename, data, max_bytes)
    text = incoming_text(text, "file")  # as the text of a JSON body is
    title = fields.title or PurePath(file.filename).stem or file.filename
    return Upload(
        tenant_id, fields.user_id, title[:500], text, fields.metadata, source, file.filename
    )


def _text_fields(form: Any) -> _FormFields:
    """The form's text fields, checked like a JSON body (metadata is a JSON object)."""
    values: dict[str, Any] = {}
    for name in ("title", "user_id", "metadata"):
        found = form.getall(name) if name in form else []
        if len(found) > 1 or (found and not isinstance(found[0], str)):
            raise InvalidInputError(name, f"send `{name}` once, as text")
        if found:
            values[name] = found[0]
    if "metadata" in values:
        try:
            values["metadata"] = msgspec.json.decode(values["metadata"])
        except msgspec.DecodeError as exc:
            raise BadBodyError(422, f"metadata is not JSON: {exc} - at `$.metadata`") from exc
    return convert_strict(values, _FormFields)
