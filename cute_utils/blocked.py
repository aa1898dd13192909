"""Blocked (tcgen05 / cuBLAS) scale layout: its one description, and the shared-memory staged tile store.

The layout (SPEC section 3) is a CuTe layout: the 128x4 tile atom ``((32, 4), 4) : ((16, 4), 1)``
in bytes (:data:`ATOM_SHAPE`, :data:`ATOM_STRIDE`: row ``r`` of a tile is coordinate
``(r % 32, r // 32)``, the 16-byte chunk of its 32-row band row and the 4-byte word of its band;
column ``c`` is the byte in that word), tiled to the padded shape (Rp, Cp) with the column tiles
innermost (:func:`blocked_layout`). It is CUTLASS's tcgen05 scale-factor atom
(``BlockScaledBasicChunk``, K-major ``((32, 4), (sf_vec, 4)) : ((16, 4), (0, 1))``) with one scale
per column, tiled as ``tile_atom_to_shape_SF`` tiles it:

    offset(r, c) = ((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4

The kernels evaluate it through the functions below, all written from the atom's constants
(:func:`blocked_offset` and its parts :func:`blocked_tile_index`, :func:`blocked_row_offset`; in
4-byte words, a row's 4 scales of one tile, :func:`blocked_word_slot` and
:func:`blocked_row_word`): integer arithmetic the kernels' SASS was tuned on, which the tests hold
to :func:`blocked_layout` evaluated on the host (tests/cute_utils/test_blocked_layout.py).

So a tile's 16-byte chunk ``lane`` (0..31) holds rows ``lane, lane + 32, lane + 64, lane + 96``,
four columns each: one 16-byte global store per thread once the 128 rows are staged in shared
memory. Staging buffer: 128 rows of ``window_cols`` bytes (a multiple of 4) kept as Int32 words
with one pad word per row, so the column-of-words gathers of the store phase hit 32 distinct banks;
the pad word also holds the 17th aligned word that a misaligned window of raw words spills into
(:func:`funnel_word`).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32, Uint64

from .constants import TILE_COLS, TILE_ROWS

TILE_BYTES = TILE_ROWS * TILE_COLS
CHUNK_BYTES = 16
CHUNKS_PER_TILE = TILE_BYTES // CHUNK_BYTES  # 32: one warp writes one tile

#: Rows of a band: the atom's inner row mode (a tile's 128 rows are 4 bands of 32).
BAND_ROWS = 32
#: Byte stride of a row inside its band (the band row's 16-byte chunk) and of a band (its word).
ROW_BYTES = CHUNK_BYTES
BAND_BYTES = TILE_COLS
#: The tile atom in bytes: (row, column) of a 128 x 4 tile -> byte of its 512.
ATOM_SHAPE = ((BAND_ROWS, TILE_ROWS // BAND_ROWS), TILE_COLS)
ATOM_STRIDE = ((ROW_BYTES, BAND_BYTES), 1)
#: 4-byte words of a tile (a word: one row's 4 scales of the tile).
TILE_WORDS = TILE_BYTES // 4


def blocked_atom() -> cute.Layout:
    """The 128 x 4 tile atom as a CuTe layout (``ATOM_SHAPE : ATOM_STRIDE``, bytes); build it inside
    ``@cute.jit`` code (layouts need the DSL's context)."""
    return cute.make_layout(ATOM_SHAPE, stride=ATOM_STRIDE)


def blocked_layout(rows, cols) -> cute.Layout:
    """The blocked layout of a (``rows``, ``cols``) scale matrix as a CuTe layout: the atom tiled to
    (Rp, Cp) = (128 ceil(rows / 128), 4 ceil(cols / 4)), column tiles innermost. Its value at
    ``(r, c)`` is SPEC section 3's byte offset. Build it inside ``@cute.jit`` code; static sizes
    give a static layout that evaluates at trace time (the tests evaluate it on the host)."""
    padded = (ceil_div(rows, TILE_ROWS) * TILE_ROWS, ceil_div(cols, TILE_COLS) * TILE_COLS)
    return cute.tile_to_shape(blocked_atom(), padded, (2, 1))


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
def blocked_tile_index(row_block: Int32, col_tile: Int32, tile_cols: Int32) -> Int32:
    """Index of tile ``(row_block, col_tile)`` of a blocked layout with ``tile_cols`` (Cp / 4) tile
    columns: the atom's tiling (tiles of :data:`TILE_BYTES` bytes, column tiles innermost)."""
    return row_block * tile_cols + col_tile


@cute.jit
def blocked_row_offset(k: Int32) -> Int32:
    """Byte offset of scale row ``k`` inside its tile: the atom's row mode,
    ``(k % 32) * 16 + ((k % 128) // 32) * 4``."""
    return (k % BAND_ROWS) * ROW_BYTES + ((k % TILE_ROWS) // BAND_ROWS) * BAND_BYTES


@cute.jit
def blocked_word_slot(band_row: Int32, band: Int32) -> Int32:
    """Word of a tile holding row ``32 band + band_row``'s 4 scales: the atom's row mode in words,
    ``band_row * 4 + band``."""
    return band_row * (ROW_BYTES // 4) + band * (BAND_BYTES // 4)


@cute.jit
def blocked_row_word(within: Int32) -> Int32:
    """:func:`blocked_word_slot` of row ``within`` (0..127) of a 128-row block:
    ``(within % 32) * 4 + within // 32``."""
    return (within % BAND_ROWS) * (ROW_BYTES // 4) + (within // BAND_ROWS) * (BAND_BYTES // 4)


@cute.jit
def blocked_offset(row: Int32, col: Int32, tile_cols: Int32) -> Int32:
    """Byte offset of scale ``(row, col)`` in a blocked layout with ``tile_cols`` (Cp / 4) tile
    columns: :func:`blocked_layout` at ``(row, col)``."""
    tile = blocked_tile_index(row // TILE_ROWS, col // TILE_COLS, tile_cols)
    return tile * TILE_BYTES + blocked_row_offset(row) + col % TILE_COLS


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
