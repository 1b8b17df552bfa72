"""The embedded engine's plain-text tokenizer (`tokenizers`, from the GGUF's vocabulary)
gives llama.cpp's own ids for every text it takes, and the engine leaves the others to
llama.cpp.

The reference is a vocabulary-only copy of the model in llama.cpp.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llama_cpp import Llama
from tokenizers import Tokenizer

from retrieval.engines import gguf_tokenizer
from retrieval.engines.gguf_tokenizer import plain_tokenizer, takes, tokenizer_file
from retrieval.engines.llamacpp import LlamaCppEngine, default_model_path
from tests.test_token_counting import whole

pytestmark = pytest.mark.model

# Where the two libraries split apart: U+180E (a space in older Unicode, a format
# character now) before a code point not assigned yet.
DIVERGENT = "\u180e\U000b7709"


@pytest.fixture(scope="module")
def plain(reference: Llama, onnx_cache_dir: Path) -> Tokenizer:
    tokenizer = plain_tokenizer(default_model_path(), onnx_cache_dir, lambda t: whole(reference, t))
    assert tokenizer is not None
    return tokenizer


def test_every_printable_character_gets_llamas_ids(reference: Llama, plain: Tokenizer) -> None:
    """Each printable code point beside letters, digits, spaces, an apostrophe and a line
    break, 64 code points to a text."""
    printable = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isprintable()]
    assert len(printable) > 140_000
    texts = [
        " ".join(f"a{c}b {c}{c}1 {c}'{c}x\n{c}" for c in printable[start : start + 64])
        for start in range(0, len(printable), 64)
    ]
    assert all(takes(text) for text in texts)
    encoded = plain.encode_batch(texts, add_special_tokens=False)
    wrong = [t for t, e in zip(texts, encoded, strict=True) if e.ids != whole(reference, t)]
    assert wrong == []


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        st.characters(
            codec="utf-8", categories=["L", "M", "N", "P", "S", "Zs"], include_characters="\n "
        ),
        max_size=80,
    )
)
def test_printable_texts_get_llamas_ids(reference: Llama, plain: Tokenizer, text: str) -> None:
    if takes(text):
        assert plain.encode(text, add_special_tokens=False).ids == whole(reference, text)


def test_texts_with_other_white_space_go_to_llama_cpp(reference: Llama, plain: Tokenizer) -> None:
    """The two libraries differ on such a text; the engine tokenises it with llama.cpp."""
    assert plain.encode(DIVERGENT, add_special_tokens=False).ids != whole(reference, DIVERGENT)
    assert [takes(t) for t in ("a\tb", "a\rb", "a\x85b", "a\u2029b", "a\ufeffb")] == [False] * 5
    assert [takes(t) for t in ("a b\nc", "我对花生过敏。", "😀 1,000", "")] == [True] * 4


async def test_the_engine_counts_as_llama_cpp_and_keeps_its_tokenizer(
    reference: Llama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await LlamaCppEngine.loaded(
        default_model_path(), context_window=2048, num_slots=1, tokenizer_dir=tmp_path
    )
    try:
        assert engine._plain is not None
        for text in (f"a{DIVERGENT}b", "I'm allergic to peanuts.\n我对花生过敏。", "tab\there"):
            assert list(engine._tokenize_text(text)) == whole(reference, text)
            assert await engine.count_tokens(text) == len(whole(reference, text))
    finally:
        await engine.close()
    # Written once, named by the file's digest; a later start reads it, not the GGUF.
    (kept,) = tmp_path.iterdir()
    assert kept == tokenizer_file(default_model_path(), tmp_path)

    def no_reading(_path: Path) -> None:
        raise AssertionError("the GGUF's vocabulary was read again")

    monkeypatch.setattr(gguf_tokenizer, "build_tokenizer", no_reading)
    again = await LlamaCppEngine.loaded(
        default_model_path(), context_window=2048, num_slots=1, tokenizer_dir=tmp_path
    )
    try:
        assert again._plain is not None
    finally:
        await again.close()


def test_a_tokenizer_that_differs_on_a_probe_is_not_used(
    reference: Llama, onnx_cache_dir: Path
) -> None:
    def off_by_one(text: str) -> list[int]:
        return [*whole(reference, text), 0]

    assert plain_tokenizer(default_model_path(), onnx_cache_dir, off_by_one) is None


def test_a_models_directory_that_cannot_be_written_still_gets_the_tokenizer(
    reference: Llama, tmp_path: Path
) -> None:
    """Where nothing can be written (here a file stands where the directory would), the
    tokenizer is built and used, and nothing is kept."""
    blocked = tmp_path / "models"
    blocked.write_text("not a directory")
    tokenizer = plain_tokenizer(
        default_model_path(), blocked / "cache", lambda t: whole(reference, t)
    )
    assert tokenizer is not None
    assert tokenizer.encode("我对花生过敏。", add_special_tokens=False).ids == whole(
        reference, "我对花生过敏。"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]
