"""The span of time a query asks about, in English or Chinese: "on 13 October 2023",
"in August 2023", "last May", "two weeks ago", "去年夏天", "上周", "2023年5月".

A span is resolved against `now` (the moment the query is asked) and is a half-open
UTC interval [start, end). Only what the words fix is taken: a month without a year is
the last such month before `now` ("in May" asked in March 2026 is May 2025); a day is
the whole day; "last week" the seven days before this week's Monday; "two weeks ago"
that week. When several expressions are found, the span covers them all. Text without
any returns None: most queries name no time, and the search is then unchanged.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass

_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_MONTH_NAMES = "|".join(sorted(_MONTHS, key=len, reverse=True))
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10,
}  # fmt: skip
_NUMBER = "(" + "|".join(sorted(_NUMBERS, key=len, reverse=True)) + r"|\d{1,3})"
_SEASONS = {"spring": (3, 3), "summer": (6, 3), "autumn": (9, 3), "fall": (9, 3), "winter": (12, 3)}
_ZH_DIGITS = {
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_ZH_SEASONS = {"春": (3, 3), "夏": (6, 3), "秋": (9, 3), "冬": (12, 3)}

_SEASON_NAMES = "spring|summer|autumn|fall|winter"
_EN = re.compile(
    rf"\b(?P<md_month>{_MONTH_NAMES})\.?\s+(?P<md_day>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<md_year>(?:19|20)\d\d)\b"
    rf"|\b(?P<dm_day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<dm_month>{_MONTH_NAMES})\.?,?\s+(?P<dm_year>(?:19|20)\d\d)\b"
    rf"|\b(?P<my_month>{_MONTH_NAMES})\.?,?\s+(?P<my_year>(?:19|20)\d\d)\b"
    r"|\b(?:in|during|since|of)\s+(?P<year>(?:19|20)\d\d)\b"
    rf"|\b(?P<which>last|this)\s+(?P<what>week|weekend|month|year|{_SEASON_NAMES})\b"
    rf"|\blast\s+(?P<last_month>{_MONTH_NAMES})\b"
    rf"|\b(?:in|during)\s+(?P<in_month>{_MONTH_NAMES})\b(?!\.?\s*\d)"
    rf"|\b(?P<count>{_NUMBER[1:-1]})\s+(?P<unit>day|week|month|year)s?\s+ago\b"
    r"|\b(?P<near>yesterday)\b",
    re.IGNORECASE,
)
_ZH = re.compile(
    r"(\d{4})年(\d{1,2})月(\d{1,2})[日号]"
    r"|(\d{4})年(\d{1,2})月"
    r"|(\d{4})年"
    r"|(去年|今年|前年)(?:的)?([春夏秋冬])(?:天|季)?"
    r"|(去年|今年|前年)"
    r"|(上个?|这个?|本)(周|星期|礼拜|月)"
    r"|(\d{1,2})月(\d{1,2})[日号]"
    r"|(\d{1,2}|[一二两三四五六七八九十]{1,2})月份?"
    r"|(\d{1,3}|[一二两三四五六七八九十]{1,3})(?:个)?(天|周|星期|月|年)(?:以)?前"
    r"|(昨天|前天)"
)


@dataclass(frozen=True, slots=True)
class Span:
    """[start, end) in UTC."""

    start: dt.datetime
    end: dt.datetime

    def holds(self, moment: dt.datetime) -> bool:
        return self.start <= moment < self.end


def time_span(query: str, now: dt.datetime) -> Span | None:
    """The span the query's time expressions cover, or None."""
    now = now.astimezone(dt.UTC)
    spans = [span for match in _EN.finditer(query) if (span := _resolved(_english, match, now))]
    spans += [span for match in _ZH.finditer(query) if (span := _resolved(_chinese, match, now))]
    if not spans:
        return None
    return Span(min(s.start for s in spans), max(s.end for s in spans))


def _resolved(
    resolve: Callable[[re.Match[str], dt.datetime], Span | None],
    match: re.Match[str],
    now: dt.datetime,
) -> Span | None:
    """A match's span; None for a day or year no calendar has (30 February, year 0)."""
    try:
        return resolve(match, now)
    except (ValueError, OverflowError):
        return None


def _day(year: int, month: int, day: int) -> Span | None:
    try:
        start = dt.datetime(year, month, day, tzinfo=dt.UTC)
    except ValueError:
        return None
    return Span(start, start + dt.timedelta(days=1))


def _month(year: int, month: int, count: int = 1) -> Span:
    start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
    end_month = month - 1 + count
    return Span(start, dt.datetime(year + end_month // 12, end_month % 12 + 1, 1, tzinfo=dt.UTC))


def _year(year: int) -> Span:
    return Span(dt.datetime(year, 1, 1, tzinfo=dt.UTC), dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC))


def _last_month_named(month: int, now: dt.datetime, *, before: bool = True) -> Span:
    """The last such month that started before now (this year's if it has begun)."""
    year = now.year if (month < now.month or (not before and month == now.month)) else now.year - 1
    return _month(year, month)


def _week_of(moment: dt.datetime) -> Span:
    monday = dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.UTC) - dt.timedelta(
        days=moment.weekday()
    )
    return Span(monday, monday + dt.timedelta(days=7))


def _ago(count: int, unit: str, now: dt.datetime) -> Span:
    today = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
    if unit == "day":
        return _day_span(today - dt.timedelta(days=count))
    if unit == "week":
        return _week_of(today - dt.timedelta(weeks=count))
    if unit == "month":
        index = now.year * 12 + now.month - 1 - count
        return _month(index // 12, index % 12 + 1)
    return _year(now.year - count)


def _day_span(start: dt.datetime) -> Span:
    return Span(start, start + dt.timedelta(days=1))


def _season(year: int, season: tuple[int, int]) -> Span:
    month, count = season
    return _month(year, month, count)


def _english(match: re.Match[str], now: dt.datetime) -> Span | None:
    g = {name: value for name, value in match.groupdict().items() if value}
    if "md_month" in g:  # October 13, 2023
        return _day(int(g["md_year"]), _MONTHS[g["md_month"].lower()], int(g["md_day"]))
    if "dm_month" in g:  # 13 October, 2023
        return _day(int(g["dm_year"]), _MONTHS[g["dm_month"].lower()], int(g["dm_day"]))
    if "my_month" in g:  # August 2023
        return _month(int(g["my_year"]), _MONTHS[g["my_month"].lower()])
    if "year" in g:  # in 2023
        return _year(int(g["year"]))
    if "which" in g:  # last / this week, month, year, summer
        return _last_or_this(g["which"].lower(), g["what"].lower(), now)
    if "last_month" in g:  # last May
        return _last_month_named(_MONTHS[g["last_month"].lower()], now)
    if "in_month" in g:  # in June
        return _last_month_named(_MONTHS[g["in_month"].lower()], now, before=False)
    if "count" in g:  # two weeks ago
        count = _NUMBERS.get(g["count"].lower()) or int(g["count"])
        return _ago(count, g["unit"].lower(), now)
    today = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
    return _day_span(today - dt.timedelta(days=1))  # yesterday


def _last_or_this(which: str, what: str, now: dt.datetime) -> Span:
    this = which == "this"
    if what in ("week", "weekend"):
        week = _week_of(now if this else now - dt.timedelta(weeks=1))
        if what == "weekend":
            return Span(week.start + dt.timedelta(days=5), week.end)
        return week
    if what == "month":
        return _ago(0 if this else 1, "month", now)
    if what == "year":
        return _year(now.year if this else now.year - 1)
    season = _SEASONS[what]
    year = now.year if this or season[0] < now.month else now.year - 1
    return _season(year, season)


def _zh_number(text: str) -> int | None:
    """A number of at most two Chinese numerals (十二, 二十, 三) or digits; None for what
    is not one (五五)."""
    if text.isdigit():
        return int(text)
    if text == "十":
        return 10
    tens, ten, units = text.partition("十")
    if ten:
        value = (_ZH_DIGITS.get(tens, 0) if tens else 1) * 10 + _ZH_DIGITS.get(units, 0)
        return (
            value
            if (not tens or tens in _ZH_DIGITS) and (not units or units in _ZH_DIGITS)
            else None
        )
    return _ZH_DIGITS.get(text) if len(text) == 1 else None


def _chinese(match: re.Match[str], now: dt.datetime) -> Span | None:  # noqa: C901
    g = match.groups()
    relative_year = {"去年": now.year - 1, "今年": now.year, "前年": now.year - 2}
    if g[0]:
        return _day(int(g[0]), int(g[1]), int(g[2]))
    if g[3]:
        month = int(g[4])
        return _month(int(g[3]), month) if 1 <= month <= 12 else None
    if g[5]:
        return _year(int(g[5]))
    if g[6]:
        return _season(relative_year[g[6]], _ZH_SEASONS[g[7]])
    if g[8]:
        return _year(relative_year[g[8]])
    if g[9]:
        this = not g[9].startswith("上")
        if g[10] == "月":
            return _ago(0 if this else 1, "month", now)
        return _week_of(now if this else now - dt.timedelta(weeks=1))
    if g[11]:
        month, day = int(g[11]), int(g[12])
        year = now.year if (month, day) <= (now.month, now.day) else now.year - 1
        return _day(year, month, day)
    if g[13]:
        named = _zh_number(g[13])
        return _last_month_named(named, now, before=False) if named and named <= 12 else None
    if g[14]:
        unit = {"天": "day", "周": "week", "星期": "week", "月": "month", "年": "year"}[g[15]]
        count = _zh_number(g[14])
        return None if count is None else _ago(count, unit, now)
    today = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
    return _day_span(today - dt.timedelta(days={"昨天": 1, "前天": 2}[g[16]]))
