"""Objects addressed by id are looked up within the caller's tenant.

Another tenant's session, fact or document is answered exactly like a missing one (the
same 404 and detail), so ids reveal nothing across tenants (sessions: see
`retrieval.chat.sessions.session_of_tenant`).
"""

from __future__ import annotations

from app.access.keys import Principal
from storage.errors import NotFoundError
from storage.knowledge import KnowledgeRepository
from storage.records import Document, Fact, User


def check_fact(principal: Principal, fact: Fact, user: User) -> None:
    """A fact the caller may correct or delete: its tenant's, and not deleted (a deleted
    fact stays in its user's history, where listing with status=deleted shows it, but is
    gone for every change, as a deleted resource answers 404; operators restore or edit
    it through the admin API)."""
    if user.tenant_id != principal.tenant_id or fact.status == "deleted":
        raise NotFoundError("fact", fact.id)


async def document_of(
    documents: KnowledgeRepository, principal: Principal, document_id: str
) -> tuple[Document, str | None]:
    """The document, if it is the caller's tenant's; another's is as missing as none."""
    document, owner = await documents.get_document(document_id)
    if document.tenant_id != principal.tenant_id:
        raise NotFoundError("document", document_id)
    return document, owner
