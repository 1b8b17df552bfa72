"""The app as `memchat serve` runs it: the heap frozen once the app has started."""

from __future__ import annotations

import gc
from pathlib import Path

from app.cli.serving import freeze_heap, serving_app
from app.settings import Settings


def test_the_serving_app_freezes_the_heap_after_its_lifespan(tmp_path: Path) -> None:
    app = serving_app(Settings(data_dir=tmp_path))
    # Litestar runs on_startup hooks after the lifespan managers (which load the models).
    assert app.on_startup == [freeze_heap]


def test_freeze_heap_moves_what_exists_out_of_the_collectors_reach() -> None:
    held = [[n] for n in range(3)]  # containers: tracked by the collector
    assert any(o is held[0] for o in gc.get_objects())
    assert gc.get_freeze_count() == 0
    try:
        freeze_heap()
        # No generation holds them any more, so no collection walks them.
        assert not any(o is held[0] for o in gc.get_objects())
        assert gc.get_freeze_count() > 0
        later = [0]
        assert any(o is later for o in gc.get_objects())  # made after: collected as usual
    finally:
        gc.unfreeze()
    assert any(o is held[0] for o in gc.get_objects())
