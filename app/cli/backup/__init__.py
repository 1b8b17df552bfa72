"""Export and import of a user's or a tenant's whole memory, as JSON Lines (`memchat
export`, `memchat import`; the format: `docs/export.md`).

Everything stored is exported except what is derived (vectors, indexes) and what
belongs to the operator rather than to users (API keys, admin sessions, the audit log):
users, facts with every version and change, sessions, messages with the context they
were sent with, every summary version, knowledge documents with their chunks. Both
directions stream: memory holds a page or a batch of rows, never the file or the user.

The format (`storage/backup/lines.py`) and the writer of an export
(`storage/backup/export.py`) live below the app, where the API's export route
(`GET /v1/users/{user_id}/export`) reads them too; this package is the commands and the
import, which checks records against the API's own limits.
"""

from app.cli.backup.restore import (
    ImportCounts,
    ImportTarget,
    check_lines,
    import_lines,
    vectors_only,
)
from storage.backup.lines import FORMAT, VERSION, BackupFormatError

__all__ = [
    "FORMAT",
    "VERSION",
    "BackupFormatError",
    "ImportCounts",
    "ImportTarget",
    "check_lines",
    "import_lines",
    "vectors_only",
]
