"""Times are stored and compared in UTC."""

from __future__ import annotations

import datetime as dt


def as_utc(value: dt.datetime) -> dt.datetime:
    # SQLite drops the zone; everything is stored in UTC.
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
