"""Blocked (tcgen05 / cuBLAS) scale layout: constants and the shared-memory staged tile store.

A scale matrix S (R x C bytes) is stored as 128x4 tiles of 512 bytes; inside a tile, byte
``(r, c)`` sits at ``(r % 32) * 16 + (r // 32) * 4 + c``. So the tile's 16-byte chunk ``lane``
(0..31) holds rows ``lane, lane + 32, lane + 64, lane + 96``, four columns each: one 16-byte
global store per thread once the 128 rows are staged in shared memory.

Staging buffer: 128 rows of ``window_cols`` bytes (a multiple of 4) kept as Int32 words with one
pad word per row, so the column-of-words gathers of the store phase hit 32 distinct banks.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

TILE_ROWS = 128
TILE_COLS = 4
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
