"""Progress bars of the long commands (export, import, reindex): tqdm on standard error,
shown only when it is a terminal and not turned off (`--no-progress`, `--quiet`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress",
        "--quiet",
        dest="show_progress",
        action="store_false",
        help="no progress bar (one is shown only when standard error is a terminal)",
    )


def is_shown(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "show_progress", True)) and sys.stderr.isatty()


class Bar:
    """One bar: a total (None while unknown) and a count that only grows."""

    def __init__(self, description: str, unit: str, *, enabled: bool) -> None:
        self._bar = tqdm(
            desc=description,
            unit=unit,
            total=None,
            file=sys.stderr,
            disable=not enabled,
            dynamic_ncols=True,
        )

    def set_total(self, total: int | None) -> None:
        self._bar.total = total
        self._bar.refresh()

    def advance(self, count: int = 1) -> None:
        self._bar.update(count)

    def close(self) -> None:
        self._bar.close()


@contextmanager
def progress_bar(
    description: str, unit: str, *, enabled: bool, total: int | None = None
) -> Iterator[Bar]:
    bar = Bar(description, unit, enabled=enabled)
    if total is not None:
        bar.set_total(total)
    try:
        yield bar
    finally:
        bar.close()
