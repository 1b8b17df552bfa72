"""The app as `memchat serve` runs it: one process of the service, for uvicorn."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from app.settings import Settings

if TYPE_CHECKING:
    from litestar import Litestar


def freeze_heap() -> None:
    """Moves what the start-up made (modules, models, the app's object graph) out of the
    garbage collector's reach. A full collection walks every tracked object with the
    event loop stopped: 100-250 ms each while the app starts (bench/loop_lag.py's
    process, timed with gc.callbacks), and after that whenever enough new long-lived
    objects accumulate. Frozen, the start-up's objects are no longer walked, so a later
    collection costs what requests made since (none over 20 ms in the same benchmark).
    They are never freed, which is what a serving process's start-up objects are anyway."""
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
