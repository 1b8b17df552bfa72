"""The vectors of the words a model's vocabulary holds whole, made once.

Query expansion (`retrieval.search.expansion`) embeds single words: a user's words as
their turns are indexed, a question's new words with the question. A word that the
tokenizer reads as one token of its vocabulary ("camping", "june") is the same model
input whoever embeds it, `[CLS] token [SEP]`, so its vector is the same every time:
made once for every such token (about 21,000 English words for all-MiniLM-L6-v2, 11 s on
two cores) into the models directory, then read instead of running the model. A word
the vocabulary splits into pieces ("educaton", "vivaldi") is still embedded.

The table is a `.npy` file of one row per token id (rows of tokens that are not whole
words are zeros), read row by row (`WordTable`: never mapped, so the process's resident
memory holds none of it).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.embedders.word_table import WordTable

# Words embedded per pass when the table is made (all three tokens long: no padding).
BATCH_SIZE = 256


def whole_word_tokens(tokenizer: Any) -> dict[str, int]:
    """The vocabulary's tokens that are English words (ASCII letters, three or more, as
    query expansion's words are) and that the tokenizer reads back as that one token."""
    found = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token.isascii() and token.isalpha() and len(token) >= 3:
            found[token] = token_id
    encodings = tokenizer.encode_batch(list(found))
    return {
        token: token_id
        for (token, token_id), encoding in zip(found.items(), encodings, strict=True)
        if _content_ids(encoding.ids, encoding.special_tokens_mask) == [token_id]
    }


def _content_ids(ids: Sequence[int], special: Sequence[int]) -> list[int]:
    return [token_id for token_id, is_special in zip(ids, special, strict=True) if not is_special]


def write_vocabulary_vectors(
    tokenizer: Any, embed: Callable[[list[str]], np.ndarray], dimension: int, target: Path
) -> None:
    """Write the table of `tokenizer`'s whole-word tokens at `target`, atomically:
    `embed(words)` gives their vectors, as the embedder gives any text's."""
    words = whole_word_tokens(tokenizer)
    table = np.zeros((tokenizer.get_vocab_size(), dimension), dtype=np.float32)
    ordered = list(words)
    for start in range(0, len(ordered), BATCH_SIZE):
        batch = ordered[start : start + BATCH_SIZE]
        table[[words[word] for word in batch]] = embed(batch)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        with tmp_path.open("wb") as handle:
            np.save(handle, table)
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


class VocabularyVectors:
    """Vectors of whole-word tokens, read from a table made by `write_vocabulary_vectors`
    with the same tokenizer and model."""

    def __init__(self, path: Path, tokenizer: Any) -> None:
        self._table = WordTable(path)
        if self._table.shape[0] != tokenizer.get_vocab_size():
            raise ValueError(f"{path} holds {self._table.shape[0]} rows, not one per token")
        self._tokenizer = tokenizer

    def of(self, words: Sequence[str]) -> dict[str, np.ndarray]:
        """The words that are one whole-word token, with their vectors; others are left
        out (to be embedded)."""
        if not words:
            return {}
        single = {}
        for word, encoding in zip(words, self._tokenizer.encode_batch(list(words)), strict=True):
            ids = _content_ids(encoding.ids, encoding.special_tokens_mask)
            if len(ids) == 1:
                single[word] = ids[0]
        if not single:
            return {}
        rows = self._table[np.asarray(list(single.values()))]
        return {word: row for word, row in zip(single, rows, strict=True) if row.any()}
