"""The app as `memchat serve` runs it: one process of the service, for uvicorn."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from app.settings import Settings

if TYPE_CHECKING:
    from litestar import Litestar


def freeze_heap() -> None:
    """Moves what the start-up made (modules, models, the app's object graph) out of the
    garbage collector's reach. A full collection otherwise walks all of it, with the
    event loop stopped: 100-250 ms at a time, every second or so under a steady load of
    chat turns (bench/loop_lag.py), which every request of the process waits out. After
    this, a collection walks only what requests made since. Objects frozen here are never
    freed, which is what start-up objects of a serving process are anyway."""
    gc.collect()
    gc.freeze()


def serving_app(settings: Settings) -> Litestar:
    """`create_app` with the heap frozen once the app has started (after its lifespan,
    which loads the models and builds the runtime). Only for a serving process: tests
    that build many apps in one process must not freeze each one's objects."""
    from app.factory import create_app

    app = create_app(settings)
    app.on_startup.append(freeze_heap)
    return app
