"""A word embedding table read row by row from its NumPy file, never mapped.

multilingual-e5-small's table is 250,037 x 384 floats (384 MB): most of the model, of
which a call needs the rows of its few tokens. Mapped into memory, every row read maps
its neighbours too (the kernel's fault-around, 64 KiB a fault): a service answering
turns kept adding about 2.5 MB of the table to its resident memory per short text
embedded, up to the whole table, though only clean copies of the file. Read with
`pread`, a row costs a system call (about a microsecond) and the file's pages stay in the
page cache, shared and reclaimable, out of the process's resident memory.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np


class WordTable:
    """`table[ids]`: the rows of `ids` (any shape) as float32, `ids.shape + (width,)`."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran_order, dtype = read_header(handle)
            self._offset = handle.tell()
        if len(shape) != 2 or fortran_order:
            raise ValueError(f"{path}: not a table of rows (shape {shape})")
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
        self._dtype = np.dtype(dtype)
        self._row_bytes = self.shape[1] * self._dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)
        # Closed when the table is collected, or at the interpreter's exit.
        self.close = weakref.finalize(self, os.close, self._fd)

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        unique, inverse = np.unique(ids, return_inverse=True)
        if len(unique) and not (unique[0] >= 0 and unique[-1] < self.shape[0]):
            raise IndexError(f"token ids outside the table's {self.shape[0]} rows")
        rows = np.empty((len(unique), self.shape[1]), dtype=np.float32)
        for position, token in enumerate(unique.tolist()):
            data = os.pread(self._fd, self._row_bytes, self._offset + token * self._row_bytes)
            rows[position] = np.frombuffer(data, dtype=self._dtype)
        return rows[inverse.reshape(ids.shape)]
