"""`bench/peers.py` on its smoke slice (one LoCoMo conversation's first sessions, ten
questions): every system runs end to end, so the comparison harness cannot rot between
full runs (`make bench-peers`). The peers run from `.venv-peers` (`make test` installs
it); the data is the benchmark data beside the clone (`../shared/data`, or
`MEMCHAT_TEST_BENCH_DATA`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("MEMCHAT_TEST_BENCH_DATA") or ROOT.parent / "shared" / "data")
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


@pytest.mark.model
def test_the_peers_harness_runs_every_system_on_a_slice(tmp_path: Path) -> None:
    if not (DATA / "locomo10_dev.json").exists():
        pytest.skip(f"no benchmark data at {DATA} (set MEMCHAT_TEST_BENCH_DATA)")
    if not PEERS_PYTHON.exists():
        pytest.skip("LOUD SKIP: no .venv-peers (`make peers`): the peers are untested")
    out = tmp_path / "peers.json"
    table = tmp_path / "peers.md"
    done = subprocess.run(
        [sys.executable, "bench/peers.py", "--smoke", "--data", str(DATA),
         "--json", str(out), "--markdown", str(table)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert list(figures) == ["memchat", "faiss", "bm25", "llamaindex", "mem0"]
    for name, system in figures.items():
        recall = system["recall"]["LoCoMo"]
        assert set(recall) == {"5", "10", "20"}, name
        assert all(0.0 <= value <= 1.0 for value in recall.values()), name
        assert system["write_turns_per_s"] > 0, name
        assert set(system["latency_ms"]["LoCoMo"]) == {"p50", "p95", "p99"}, name
    # The same embedder and exact search: plain FAISS and LlamaIndex's default vector
    # store rank alike, so their recall is the same.
    for key, recall in figures["faiss"]["recall"].items():
        assert figures["llamaindex"]["recall"][key] == recall, key
    # Each peer reports the versions it ran with.
    assert figures["mem0"]["versions"]["mem0ai"] == "2.2.1"
    header = table.read_text().splitlines()[0]
    assert header == "| | memchat | faiss | bm25 | llamaindex | mem0 |"
