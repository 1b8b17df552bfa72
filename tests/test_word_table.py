"""`WordTable`: rows read from a NumPy file by id, exactly, without mapping the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval.embedders.word_table import WordTable


def mapped_files() -> set[str]:
    """The files this process has mapped into memory (from /proc/self/maps)."""
    return {
        line.split(maxsplit=5)[5]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if len(line.split(maxsplit=5)) == 6
    }


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_rows_are_the_files_own_in_the_ids_shape(tmp_path: Path, version: tuple[int, int]) -> None:
    table = np.arange(40 * 6, dtype=np.float32).reshape(40, 6) / 7
    path = tmp_path / "words.npy"
    with path.open("wb") as handle:
        np.lib.format.write_array(handle, table, version=version)
    words = WordTable(path)
    assert words.shape == (40, 6)
    ids = np.array([[39, 0, 3], [3, 3, 17]])
    rows = words[ids]
    assert rows.shape == (2, 3, 6) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, table[ids])
    np.testing.assert_array_equal(words[np.array([], dtype=np.int64)], np.zeros((0, 6)))
    assert str(path) not in mapped_files()


def test_ids_outside_the_table_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "words.npy"
    np.save(path, np.ones((5, 2), dtype=np.float32))
    words = WordTable(path)
    for outside in (5, -1):
        with pytest.raises(IndexError):
            words[np.array([0, outside])]


def test_a_file_of_other_than_rows_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "words.npy"
    np.save(path, np.ones((2, 3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="not a table of rows"):
        WordTable(path)
