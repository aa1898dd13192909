"""Blocked (tcgen05 / cuBLAS) scale layout: constants and the shared-memory staged tile store.

A scale matrix S (R x C bytes) is stored as 128x4 tiles of 512 bytes; inside a tile, byte
``(r, c)`` sits at ``(r % 32) * 16 + (r // 32) * 4 + c``. So the tile's 16-byte chunk ``lane``
(0..31) holds rows ``lane, lane + 32, lane + 64, lane + 96``, four columns each: one 16-byte
global store per thread once the 128 rows are staged in shared memory.

Staging buffer: 128 rows of ``window_cols`` bytes (a multiple of 4) kept as Int32 words with one
pad word per row, so the column-of-words gathers of the store phase hit 32 distinct banks; the pad
word also holds the 17th aligned word that a misaligned window of raw words spills into
(:func:`funnel_word`).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32, Uint64

from .constants import TILE_COLS, TILE_ROWS

TILE_BYTES = TILE_ROWS * TILE_COLS
CHUNK_BYTES = 16
CHUNKS_PER_TILE = TILE_BYTES // CHUNK_BYTES  # 32: one warp writes one tile


def staging_layout(window_cols: int) -> cute.Layout:
    """Layout (in Uint32 words) of a padded 128 x ``window_cols``-byte staging buffer."""
    words = window_cols // TILE_COLS
    return cute.make_layout((TILE_ROWS, words + 1), stride=(words + 1, 1))


def allocate_staging(smem, window_cols: int):
    """Allocate the staging buffer (a Uint32 tensor: one word per staged tile column and row)."""
    return smem.allocate_tensor(Uint32, staging_layout(window_cols), byte_alignment=16)


def ceil_div(a, b):
    """Integer ceiling division that works on Python ints and DSL integers alike."""
    return (a + (b - 1)) // b


@cute.jit
def store_tile_chunk(stage: cute.Tensor, tile: Int32, lane: Int32, dst_chunks: cute.Tensor, chunk: Int32):
    """Write 16-byte chunk ``lane`` of the staged tile ``tile`` to ``dst_chunks[chunk, :]``.

    ``stage`` is the Uint32 staging view, ``dst_chunks`` a (n, 4) Uint32 tensor whose rows are
    16-byte aligned (one STG.128).
    """
    frag = cute.make_rmem_tensor(cute.make_layout(TILE_COLS), Uint32)
    for q in cutlass.range_constexpr(TILE_ROWS // CHUNKS_PER_TILE):
        frag[q] = stage[lane + CHUNKS_PER_TILE * q, tile]
    cute.autovec_copy(frag, dst_chunks[chunk, None])


@cute.jit
def element_or_zero(src: cute.Tensor, e: Int32, row: Int32, col: Int32, valid):
    """``src[e, row, col]`` when ``valid`` else 0 (no load is issued for invalid elements)."""
    value = src.element_type(0)
    if valid:
        value = src[e, row, col]
    return value


@cute.jit
def store_tail_words(stage: cute.Tensor, tile: Int32, lane: Int32, dst_words: cute.Tensor, first_word: Int32):
    """Word-by-word store of a 16-byte chunk that straddles the end of ``dst_words``: only the
    words below ``size(dst_words)`` are written (outputs whose size is not a multiple of 16)."""
    for q in cutlass.range_constexpr(TILE_ROWS // CHUNKS_PER_TILE):
        if first_word + q < cute.size(dst_words):
            dst_words[first_word + q] = stage[lane + CHUNKS_PER_TILE * q, tile]


@cute.jit
def load_tile_column(src8: cute.Tensor, e: Int32, row: Int32, col: Int32, count: Int32) -> Uint32:
    """Bytes ``src8[e, row, col + k]`` for ``k < count`` (0..4) packed little-endian into one word,
    zeros above ``count``: one staged tile column from rows that are not whole 4-byte words. The
    four loads share one address register (immediate offsets)."""
    word = Uint32(0)
    for k in cutlass.range_constexpr(TILE_COLS):
        if k < count:
            word = word | ((Uint32(src8[e, row, col + k]) & Uint32(0xFF)) << (8 * k))
    return word


@cute.jit
def byte_mask(count: Int32) -> Uint32:
    """``count`` (0..4) low bytes set: the mask of a tile column holding ``count`` source bytes."""
    mask = Uint32(0)
    if count > 0:
        mask = Uint32(0xFFFFFFFF) >> Uint32(8 * (TILE_COLS - count))
    return mask


@cute.jit
def funnel_word(stage: cute.Tensor, row: Int32, byte_offset: Int32) -> Uint32:
    """The 4 bytes at ``byte_offset`` of staged row ``row`` (raw aligned words, little-endian):
    words ``byte_offset // 4`` and the next one, shifted right by ``byte_offset % 4`` bytes."""
    word = byte_offset >> 2
    pair = (Uint64(stage[row, word + 1]) << Uint64(32)) | Uint64(stage[row, word])
    return Uint32(pair >> Uint64(8 * (byte_offset & 3)))


@cute.jit
def store_chunk(
    frag: cute.Tensor, dst_chunks: cute.Tensor, dst_words: cute.Tensor, chunk: Int32, full_chunks: Int32
):
    """Write the 4 words of ``frag`` as 16-byte chunk ``chunk`` of the output: one 128-bit store when
    the chunk lies inside the output, else word stores of the words below ``size(dst_words)``."""
    if chunk < full_chunks:
        cute.autovec_copy(frag, dst_chunks[chunk, None])
    else:
        for q in cutlass.range_constexpr(TILE_COLS):
            if chunk * TILE_COLS + q < cute.size(dst_words):
                dst_words[chunk * TILE_COLS + q] = frag[q]


@cute.jit
def blocked_offset(row: Int32, col: Int32, tile_cols: Int32) -> Int32:
    """Byte offset of scale ``(row, col)`` in a blocked layout with ``tile_cols`` (Cp / 4) tile
    columns: its 512-byte tile, then ``(row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4``."""
    tile = (row // TILE_ROWS) * tile_cols + col // TILE_COLS
    return tile * TILE_BYTES + (row % 32) * 16 + ((row % TILE_ROWS) // 32) * TILE_COLS + col % TILE_COLS


@cute.jit
def blocked_row_offset(k: Int32) -> Int32:
    """Byte offset of scale row ``k`` inside its 512-byte blocked tile and 128-row block."""
    return (k % 32) * 16 + ((k % TILE_ROWS) // 32) * 4


@cute.jit
def zero_fill_chunks(words: cute.Tensor, first_byte: Int32, end_byte: Int32, index: Int32, stride: Int32):
    """Zero the 16-byte chunks of bytes ``[first_byte, end_byte)`` (both multiples of 16) of the flat
    Uint32 tensor ``words``, chunk ``index``, ``index + stride``, ... (a grid-stride loop)."""
    zero = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    zero.fill(0)
    chunks = cute.make_tensor(words.iterator, cute.make_layout((cute.size(words) // 4, 4), stride=(4, 1)))
    first = first_byte // 16
    for chunk in cutlass.range(first + index, end_byte // 16, stride, unroll=1):
        cute.autovec_copy(zero, chunks[chunk, None])
