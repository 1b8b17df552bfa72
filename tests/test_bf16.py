"""When the bfloat16 path is chosen: on CPUs with AMX tiles, at the default precision."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from app.adapters import EMBEDDERS
from app.settings import EmbedderSettings
from retrieval.embedders import bf16
from retrieval.embedders.bf16 import (
    Bf16Transformer,
    bf16_path_for,
    cpu_flags,
    has_bf16_matrix_units,
    has_native_bf16,
)

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu vme avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text(SAPPHIRE_RAPIDS)
    flags = cpu_flags(tmp_path / "cpuinfo")
    assert {"amx_bf16", "amx_tile", "avx512_bf16", "fpu"} <= flags
    assert "spectre_v1" not in flags
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(
    ("cpuinfo", "expected"), [(SAPPHIRE_RAPIDS, True), (ZEN4, False), ("", False)]
)
def test_bf16_needs_amx_tiles(tmp_path: Path, cpuinfo: str, expected: bool) -> None:
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    assert has_bf16_matrix_units(cpu_flags(tmp_path / "cpuinfo")) is expected


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [(SAPPHIRE_RAPIDS, True), (ZEN4, True), ("processor\t: 0\nflags\t\t: fpu avx2\n", False)],
)
def test_native_bf16_is_amx_or_avx512_bf16(tmp_path: Path, cpuinfo: str, expected: bool) -> None:
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    assert has_native_bf16(cpu_flags(tmp_path / "cpuinfo")) is expected


@pytest.mark.parametrize(
    ("precision", "flags", "expected"),
    [
        ("auto", {"amx_bf16", "amx_tile"}, True),
        ("auto", {"avx512_bf16"}, False),
        ("bf16", {"avx512_bf16"}, True),
        ("bf16", {"amx_bf16", "amx_tile"}, True),
        ("fp32", {"amx_bf16", "amx_tile", "avx512_bf16"}, False),
        ("int8", {"amx_bf16", "amx_tile"}, False),
    ],
)
def test_which_precision_runs_large_calls_in_bf16(
    monkeypatch: pytest.MonkeyPatch, precision: str, flags: set[str], expected: bool
) -> None:
    monkeypatch.setattr(bf16, "cpu_flags", lambda: frozenset(flags))
    assert bf16_path_for(precision) is expected


def test_bf16_is_refused_on_a_cpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bf16, "cpu_flags", lambda: frozenset({"avx2"}))
    with pytest.raises(ValueError, match="precision bf16 needs a CPU with native bfloat16"):
        bf16_path_for("bf16")


@pytest.mark.model
@pytest.mark.parametrize(
    ("precision", "amx", "bulk", "model_name"),
    [
        ("auto", True, True, "all-MiniLM-L6-v2"),
        ("auto", False, False, "all-MiniLM-L6-v2"),
        ("fp32", True, False, "all-MiniLM-L6-v2"),
    ],
)
def test_precision_picks_the_bf16_path(
    onnx_cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    precision: str,
    amx: bool,
    bulk: bool,
    model_name: str,
) -> None:
    monkeypatch.setattr(
        bf16, "cpu_flags", lambda: frozenset({"amx_bf16", "amx_tile"} if amx else ())
    )
    config = EmbedderSettings.model_validate({"precision": precision})
    embedder = EMBEDDERS[config.kind](config, onnx_cache_dir)
    assert (getattr(embedder, "bulk", None) is not None) is bulk
    assert embedder.model_name == model_name


def test_default_precision_is_auto() -> None:
    assert EmbedderSettings().precision == "auto"


def test_ready_never_waits_for_a_load_in_progress(tmp_path: Path) -> None:
    gate = threading.Event()

    class Gated(Bf16Transformer):
        def load(self) -> None:
            with self._load_lock:
                gate.wait(30)

    model = Gated(tmp_path)
    assert model.ready() is False  # starts the (gated) load in its thread
    asked = threading.Thread(target=model.ready)
    asked.start()
    asked.join(timeout=5)
    try:
        assert not asked.is_alive()
    finally:
        gate.set()


def test_a_model_that_cannot_load_leaves_fp32_in_place(tmp_path: Path) -> None:
    model = Bf16Transformer(tmp_path / "missing")
    with capture_logs() as logs:
        assert model.ready() is False
        deadline = time.monotonic() + 60
        while not model.failed and time.monotonic() < deadline:
            time.sleep(0.05)
    assert model.failed and model.ready() is False and not model.wait(0)
    (entry,) = [e for e in logs if e["event"] == "bf16_embedder_not_loaded"]
    assert entry["log_level"] == "warning" and entry["fallback"] == "fp32"
