"""A first start converts its models in a child process (retrieval/embedders/apart.py):
the service process never imports the converters, so it holds none of their memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval.digests import file_digest
from retrieval.embedders.apart import run_apart
from retrieval.embedders.e5 import DEFAULT_MODEL_NAME, default_model_path

REPO = Path(__file__).resolve().parents[1]

# What a conversion imports and the service itself never needs (without AMX).
CONVERTERS = ("onnx", "onnxruntime.quantization", "torch", "transformers")

FIRST_START = """
import sys
from pathlib import Path
from retrieval.embedders.e5 import E5Embedder
E5Embedder(Path(sys.argv[1]), int8_queries=True)
print(" ".join(sorted(name for name in sys.argv[2:] if name in sys.modules)) or "none")
"""


def test_a_call_apart_runs_in_another_process_and_brings_back_its_result() -> None:
    assert run_apart(os.getpid) != os.getpid()
    assert run_apart(divmod, 17, 5) == (3, 2)


def test_a_call_apart_brings_back_its_exception() -> None:
    with pytest.raises(ValueError, match="invalid literal for int"):
        run_apart(int, "seventeen")


@pytest.mark.model
def test_a_first_start_quantises_e5_in_a_child_and_imports_no_converter(
    onnx_cache_dir: Path, tmp_path: Path
) -> None:
    stem = f"{DEFAULT_MODEL_NAME}-{file_digest(default_model_path())}"
    for name in (f"{stem}.onnx", f"{stem}.words.npy"):
        os.link(onnx_cache_dir / name, tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-c", FIRST_START, str(tmp_path), *CONVERTERS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.split("\n")[-2] == "none"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{stem}-int8-7bit.onnx",
        f"{stem}.onnx",
        f"{stem}.words.npy",
    ]
