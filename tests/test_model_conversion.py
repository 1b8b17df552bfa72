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
from retrieval.embedders.onnx import quantize_int8

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


def small_model(path: Path) -> None:
    """A one-layer ONNX model (x @ W) at `path`: the quantiser has a weight to take."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_quantisation_writes_nothing_beside_its_source(tmp_path: Path) -> None:
    """Processes of one first start quantise the same source at once: a file the quantiser
    wrote beside it under a fixed name (its shape-inferred copy, deleted after) would be
    another process's too, deleted under it (a start failed so on a fresh models
    directory). The other process's file is left alone and nothing else appears."""
    import onnx

    source = tmp_path / "model.onnx"
    small_model(source)
    busy = tmp_path / "model-inferred.onnx"
    busy.write_bytes(b"another process's copy")
    target = tmp_path / "int8" / "model-int8.onnx"
    quantize_int8(source, target)
    assert busy.read_bytes() == b"another process's copy"
    beside = sorted(p.name for p in tmp_path.iterdir())
    assert beside == ["int8", "model-inferred.onnx", "model.onnx"]
    assert [p.name for p in target.parent.iterdir()] == ["model-int8.onnx"]
    quantised = onnx.load(target)
    assert "MatMulInteger" in {node.op_type for node in quantised.graph.node}


def converters_imported(script: str, models_dir: Path) -> str:
    """The converters (`CONVERTERS`) that a first start, `script` in a process of its own
    on `models_dir`, imported: "none" where it imported none."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(models_dir), *CONVERTERS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.split("\n")[-2]


@pytest.mark.model
def test_a_first_start_quantises_e5_in_a_child_and_imports_no_converter(
    onnx_cache_dir: Path, tmp_path: Path
) -> None:
    stem = f"{DEFAULT_MODEL_NAME}-{file_digest(default_model_path())}"
    for name in (f"{stem}.onnx", f"{stem}.words.npy"):
        os.link(onnx_cache_dir / name, tmp_path / name)
    assert converters_imported(FIRST_START, tmp_path) == "none"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{stem}-int8-7bit.onnx",
        f"{stem}.onnx",
        f"{stem}.words.npy",
    ]


MINILM_FIRST_START = """
import sys
from pathlib import Path
from retrieval.embedders.onnx import OnnxQueryEmbedder
from retrieval.embedders.sentence_transformers import default_model_path
OnnxQueryEmbedder(default_model_path(), "all-MiniLM-L6-v2", Path(sys.argv[1]))
print(" ".join(sorted(name for name in sys.argv[2:] if name in sys.modules)) or "none")
"""


@pytest.mark.model
def test_a_first_start_makes_minilms_query_graph_and_word_table_in_children(
    onnx_cache_dir: Path, tmp_path: Path
) -> None:
    (export,) = onnx_cache_dir.glob("all-MiniLM-L6-v2-????????????????.onnx")
    os.link(export, tmp_path / export.name)
    assert converters_imported(MINILM_FIRST_START, tmp_path) == "none"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{export.stem}-int8-7bit.onnx",
        export.name,
        f"{export.stem}.vocabulary.npy",
    ]
