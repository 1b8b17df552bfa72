"""A sentence-transformers model run by ONNX Runtime: same vectors, a third of the latency.

The model directory is a sentence-transformers one (Transformer -> Pooling -> optional
Normalize). Its transformer is exported to ONNX once, with torch, into a cache directory
keyed by a hash of the weights; later starts load the cached file. Tokenisation uses the
model's own `tokenizer.json` through the Rust `tokenizers` library. Only mean and CLS
pooling are supported; other models must use the sentence-transformers adapter.

With `int8`, the exported model's weights are quantised to 8 bits (ONNX Runtime's
dynamic quantisation, per channel), also once into the cache: on CPUs with VNNI it
embeds two to three times as fast; its vectors differ slightly from the full model's
(cosine about 0.99), so they are stored under their own model name.

With `bf16_bulk` (the default on CPUs with AMX), a call of `BULK_MIN_TEXTS` texts or
more (an import, a long message's windows, a reindex) runs the same transformer in torch
in bfloat16 (`retrieval.embedders.bf16`): three times as fast there, vectors at cosine
>= 0.9999 of fp32's, so under the same model name. Tokenisation and pooling are shared;
queries of a few pieces stay with ONNX Runtime, which is faster for them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from retrieval.embedders.apart import convert_once
from retrieval.embedders.bf16 import BATCH_SIZE as BULK_BATCH_SIZE
from retrieval.embedders.bf16 import Bf16Transformer, release_freed_memory, takes_token_types
from retrieval.embedders.vocabulary import VocabularyVectors, write_vocabulary_vectors
from retrieval.embedders.word_table import WordTable

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

# From this many texts in one call, the bfloat16 path (where enabled) is faster: 8 texts
# 8.4 against 14.2 ms on two cores with AMX; 4 texts about the same.
BULK_MIN_TEXTS = 8
# Rows up to this many tokens longer than a batch's shortest may share its passes.
PADDING_SLACK = 16
# ONNX Runtime's buffers for one pass grow with rows x tokens (attention: with tokens
# squared): a pass holds at most this many tokens, so that long texts go in smaller
# batches and the buffers kept for the next call stay small. Short texts (LoCoMo's
# turns, about 30 tokens) still go 64 a pass.
ONNX_BATCH_TOKENS = 8192
# Threads of a query graph by default: a question's few dozen tokens are embedded fastest
# in one thread, as ONNX Runtime wakes its second thread for each of the graph's few
# hundred steps (two cores with AMX, 8-bit graphs, p50 of one text: e5 12 tokens 3.0
# against 4.4 ms, 48 tokens 8.1 against 9.6; MiniLM 24 tokens 2.2 against 3.2); two
# threads win only from about 200 tokens or 16 texts (bench/RESULTS.md).
QUERY_THREADS = 1
# After a pass of at least this many tokens, ONNX Runtime's arena gives back what it no
# longer uses (a single query's pass, far smaller, keeps its buffers: no cost per turn).
SHRINK_AFTER_TOKENS = 4096

HiddenState = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _weights_digest(model_path: Path) -> str:
    digest = hashlib.sha256()
    for name in (*WEIGHT_FILES, "config.json", "tokenizer.json"):
        path = model_path / name
        if path.exists():
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def _pooling_mode(model_path: Path) -> str:
    modules = json.loads((model_path / "modules.json").read_text(encoding="utf-8"))
    pooling = next((m for m in modules if m["type"].endswith("Pooling")), None)
    if pooling is None:
        return "mean"
    config = json.loads((model_path / pooling["path"] / "config.json").read_text(encoding="utf-8"))
    enabled = [key for key, value in config.items() if key.startswith("pooling_mode_") and value]
    if enabled == ["pooling_mode_mean_tokens"]:
        return "mean"
    if enabled == ["pooling_mode_cls_token"]:
        return "cls"
    raise ValueError(f"pooling {enabled} is not supported by the onnx embedder")


def _max_length(model_path: Path) -> int:
    config_path = model_path / "sentence_bert_config.json"
    if config_path.exists():
        return int(json.loads(config_path.read_text(encoding="utf-8")).get("max_seq_length", 512))
    return 512


def quantize_int8(source: Path, target: Path, *, reduce_range: bool = False) -> None:
    """The ONNX model at `source` with 8-bit weights (dynamic, per channel), at `target`.
    `reduce_range`: weights in 7 bits, so that the 8-bit products cannot saturate on a CPU
    without VNNI (AVX2 pairs them in 16-bit sums: there full 8-bit weights put some
    vectors at cosine 0.985 of fp32's instead of >= 0.993)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".onnx", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    # The quantiser logs a line per tensor it leaves alone (on the root logger): noise in
    # a service's first start, not news.
    logging.disable(logging.WARNING)
    try:
        # The model, not its path: given a path, the quantiser writes its shape-inferred
        # copy beside the source under a fixed name and deletes it after, so processes
        # converting on one first start at once would delete each other's copy; given the
        # model, it keeps that copy in a directory of its own.
        quantize_dynamic(
            onnx.load(source),
            tmp_path,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=reduce_range,
        )
        os.replace(tmp_path, target)
    finally:
        logging.disable(logging.NOTSET)
        tmp_path.unlink(missing_ok=True)


def export_onnx(model_path: Path, target: Path) -> None:
    """Export the transformer at `model_path` (a transformers directory) to ONNX."""
    from transformers import AutoModel

    export_model_onnx(AutoModel.from_pretrained(str(model_path), local_files_only=True), target)


def export_model_onnx(model: Any, target: Path, *, word_vectors: bool = False) -> None:
    """Export a transformers model's last hidden state to ONNX at `target` (dynamic batch
    and length; inputs `input_ids`, `attention_mask`, `token_type_ids`), atomically.
    `word_vectors`: the graph takes `inputs_embeds` (the tokens' rows of the word
    embedding table, looked up by the caller) instead of `input_ids`, and holds no table."""
    import torch

    model = model.eval()
    takes_types = takes_token_types(model)
    first_input = "inputs_embeds" if word_vectors else "input_ids"

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, first: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            extra = {"token_type_ids": token_type_ids} if takes_types else {}
            given = {first_input: first}
            out = self.model(attention_mask=attention_mask, **given, **extra)
            return out.last_hidden_state

    sample = torch.ones((1, 8), dtype=torch.long)
    first_sample = (
        torch.zeros((1, 8, model.config.hidden_size), dtype=torch.float32)
        if word_vectors
        else sample
    )
    axes = {0: "batch", 1: "length"}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        with warnings.catch_warnings():
            # The tracer's notes on shapes and the legacy exporter's deprecation: the export is
            # checked against the torch model's own vectors by the embedder contract tests.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                LastHiddenState(),
                (first_sample, sample, torch.zeros_like(sample)),
                str(tmp_path),
                input_names=[first_input, "attention_mask", "token_type_ids"],
                output_names=["last_hidden_state"],
                dynamic_axes={
                    first_input: axes,
                    "attention_mask": axes,
                    "token_type_ids": axes,
                    "last_hidden_state": axes,
                },
                opset_version=17,
                dynamo=False,
            )
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


class OnnxHiddenState:
    """`last_hidden_state(ids, mask, types)` of an exported transformer, by ONNX Runtime.
    `word_vectors`: the word embedding table of a graph exported with `word_vectors`
    (`retrieval.embedders.word_table.WordTable`: only the rows of the tokens met are read)."""

    def __init__(
        self,
        onnx_path: Path,
        *,
        num_threads: int | None = None,
        word_vectors: WordTable | None = None,
    ) -> None:
        import onnxruntime

        self._word_vectors = word_vectors
        # Threads of each call (ONNX Runtime's intra-op pool).
        self.num_threads = num_threads or os.cpu_count() or 1
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.num_threads
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle worker threads would otherwise spin for a while after each call, taking the
        # cores that the rest of the turn (search, SQL, tokenising) runs on.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self._shrink = onnxruntime.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> Any:
        first = (
            {"inputs_embeds": self._word_vectors[ids]}
            if self._word_vectors is not None
            else {"input_ids": ids}
        )
        (hidden,) = self._session.run(
            ["last_hidden_state"],
            {**first, "attention_mask": mask, "token_type_ids": types},
            self._shrink if ids.size >= SHRINK_AFTER_TOKENS else None,
        )
        return hidden


def pick_hidden_state(
    num_rows: int, onnx: HiddenState, bulk: Bf16Transformer | None, batch_size: int
) -> tuple[HiddenState, int, int | None]:
    """The model for a call of `num_rows` sequences, its rows per pass and its tokens
    per pass (None: no limit): bfloat16 from `BULK_MIN_TEXTS` rows once it is loaded
    (the first such call starts loading it), ONNX Runtime otherwise."""
    if bulk is not None and num_rows >= BULK_MIN_TEXTS and bulk.ready():
        return bulk, BULK_BATCH_SIZE, None
    return onnx, batch_size, ONNX_BATCH_TOKENS


def length_batches(
    lengths: Sequence[int], max_rows: int, max_tokens: int | None
) -> list[np.ndarray]:
    """Positions of `lengths` in batches of similar length (little padding): at most
    `max_rows` rows, at most `max_tokens` tokens once padded (a longer row alone), and
    no row longer than twice the batch's shortest (or `PADDING_SLACK` tokens more): a
    long query and its short sentences (retrieval/search/pieces.py) padded to one length
    cost five times what they cost apart."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        end = min(start + max_rows, len(order))
        longest = max(2 * lengths[order[start]], lengths[order[start]] + PADDING_SLACK)
        end = start + int(np.searchsorted([lengths[i] for i in order[start:end]], longest, "right"))
        if max_tokens is not None:
            # Rows go by growing length: the batch's padded size is its last row's.
            while end - start > 1 and (end - start) * lengths[order[end - 1]] > max_tokens:
                end -= 1
        batches.append(order[start:end])
        start = end
    return batches


def pad_rows(
    rows: Sequence[Sequence[int]], type_rows: Sequence[Sequence[int]] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, attention mask and token types of `rows`, padded with zeros to the
    longest."""
    ids = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
        if type_rows is not None:
            types[index, : len(row)] = type_rows[index]
    return ids, mask, types


def query_graph(onnx_path: Path) -> Path:
    """The copy of the graph at `onnx_path` that search queries run on, made once beside
    it: 8-bit weights in 7-bit range (`reduce_range`), as close to fp32 on CPUs without
    VNNI as with."""
    quantized = onnx_path.with_name(f"{onnx_path.stem}-int8-7bit.onnx")
    convert_once((quantized,), quantize_int8, onnx_path, quantized, reduce_range=True)
    return quantized


def encode_rows(encodings: list[Any], hidden_state: HiddenState, pooling: str) -> np.ndarray:
    """Normalised vectors of tokenised texts (one pass of `hidden_state`)."""
    ids, mask, types = pad_rows([e.ids for e in encodings], [e.type_ids for e in encodings])
    hidden = hidden_state(ids, mask, types)
    pooled = hidden[:, 0] if pooling == "cls" else mean_pool(hidden, mask)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


def export_vocabulary_vectors(model_path: Path, onnx_path: Path, target: Path) -> None:
    """The vectors of the whole-word tokens of the model's vocabulary, as the graph at
    `onnx_path` embeds them (`retrieval.embedders.vocabulary`), at `target`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    tokenizer.no_padding()
    hidden_state = OnnxHiddenState(onnx_path)
    pooling = _pooling_mode(model_path)

    def embed(words: list[str]) -> np.ndarray:
        return encode_rows(tokenizer.encode_batch(words), hidden_state, pooling)

    dimension = int(embed(["dimension"]).shape[1])
    write_vocabulary_vectors(tokenizer, embed, dimension, target)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The mean of each row's hidden states over its unmasked tokens."""
    weights = mask[..., None].astype(np.float32)
    return np.asarray((hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9))


class OnnxEmbedder:
    def __init__(
        self,
        model_path: Path,
        model_name: str,
        cache_dir: Path,
        *,
        batch_size: int = 64,
        num_threads: int | None = None,
        int8: bool = False,
        bf16_bulk: bool = False,
    ) -> None:
        from tokenizers import Tokenizer

        if bf16_bulk and int8:
            raise ValueError("bf16_bulk computes the full model's vectors: not with int8")
        if not (model_path / "tokenizer.json").exists():
            raise FileNotFoundError(
                f"no sentence-transformers model with tokenizer.json at {model_path}"
            )
        self._pooling = _pooling_mode(model_path)
        onnx_path = cache_dir / f"{model_name.replace('/', '_')}-{_weights_digest(model_path)}.onnx"
        # Converted in a child process: the service keeps none of the exporter's memory.
        convert_once((onnx_path,), export_onnx, model_path, onnx_path)
        if int8:
            quantized = onnx_path.with_name(f"{onnx_path.stem}-int8.onnx")
            convert_once((quantized,), quantize_int8, onnx_path, quantized)
            onnx_path = quantized
            model_name = f"{model_name}-int8"
        self._onnx_hidden_state = OnnxHiddenState(onnx_path, num_threads=num_threads)
        self._tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=_max_length(model_path))
        self._tokenizer.no_padding()
        self._model_name = model_name
        self._batch_size = batch_size
        self.bulk = Bf16Transformer(model_path, num_threads=num_threads) if bf16_bulk else None
        probe = encode_rows(
            self._tokenizer.encode_batch(["dimension probe"]),
            self._onnx_hidden_state,
            self._pooling,
        )
        self._dimension = int(probe.shape[1])
        self._onnx_path = onnx_path
        self._num_threads = num_threads
        vocabulary = onnx_path.with_name(f"{onnx_path.stem}.vocabulary.npy")
        convert_once((vocabulary,), export_vocabulary_vectors, model_path, onnx_path, vocabulary)
        self._vocabulary = VocabularyVectors(vocabulary, self._tokenizer)

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def dimension(self) -> int:
        return self._dimension

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """In a worker thread: the model's own threads do the work, the loop goes on."""
        return await anyio.to_thread.run_sync(self.embed_now, list(texts))

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed_by(texts, self._onnx_hidden_state)

    def vocabulary_vectors(self, words: Sequence[str]) -> dict[str, np.ndarray]:
        """The words that are whole tokens of the model's vocabulary, with the vectors
        `embed` gives them, read from the table made at first start."""
        return self._vocabulary.of(words)

    def _embed_by(self, texts: Sequence[str], onnx: HiddenState) -> np.ndarray:
        """Vectors of `texts` by the graph `onnx`, or by the bfloat16 model for a large call."""
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        hidden_state, batch_size, batch_tokens = pick_hidden_state(
            len(texts), onnx, self.bulk, self._batch_size
        )
        encodings = self._tokenizer.encode_batch(list(texts))
        out = np.empty((len(texts), self._dimension), dtype=np.float32)
        # Batches of similar length waste little on padding; the order is restored after.
        for chosen in length_batches([len(e.ids) for e in encodings], batch_size, batch_tokens):
            out[chosen] = encode_rows([encodings[i] for i in chosen], hidden_state, self._pooling)
        if len(texts) >= BULK_MIN_TEXTS:
            release_freed_memory()
        return out


class OnnxQueryEmbedder(OnnxEmbedder):
    """The same model and vectors of stored texts, and search queries by a copy of its
    graph with 8-bit weights (7-bit range, as e5's queries: `retrieval.embedders.e5`):
    about half the time of fp32 for a question, vectors at cosine about 0.99 of fp32's
    (all-MiniLM-L6-v2, 600 LoCoMo questions: mean 0.993, least 0.989). Only what is searched with
    changes, never what is stored, so stored vectors keep their model's name.

    `query_threads`: the query graph's threads (`QUERY_THREADS` by default)."""

    def __init__(
        self,
        model_path: Path,
        model_name: str,
        cache_dir: Path,
        *,
        query_threads: int = QUERY_THREADS,
        **options: Any,
    ) -> None:
        if options.get("int8"):
            raise ValueError("int8 queries beside an int8 model: use the int8 model alone")
        super().__init__(model_path, model_name, cache_dir, **options)
        self._query_hidden_state = OnnxHiddenState(
            query_graph(self._onnx_path), num_threads=query_threads
        )

    @property
    def query_threads(self) -> int:
        return self._query_hidden_state.num_threads

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Search queries, in a worker thread."""
        return await anyio.to_thread.run_sync(self.embed_queries_now, list(texts))

    def embed_queries_now(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed_by(texts, self._query_hidden_state)
