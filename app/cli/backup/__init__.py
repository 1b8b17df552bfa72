"""Export and import of a user's or a tenant's whole memory, as JSON Lines (`memchat
export`, `memchat import`; the format: `docs/export.md`).

Everything stored is exported except what is derived (vectors, indexes) and what
belongs to the operator rather than to users (API keys, admin sessions, the audit log):
users, facts with every version and change, sessions, messages with the context they
were sent with, every summary version, knowledge documents with their chunks. Both
directions stream: memory holds a page or a batch of rows, never the file or the user.
"""

from app.cli.backup.export import export_lines
from app.cli.backup.lines import FORMAT, VERSION, BackupFormatError
from app.cli.backup.restore import (
    ImportCounts,
    ImportTarget,
    check_lines,
    import_lines,
    vectors_only,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "BackupFormatError",
    "ImportCounts",
    "ImportTarget",
    "check_lines",
    "export_lines",
    "import_lines",
    "vectors_only",
]
