"""1x32 MXFP8 blocks held by a warp's lanes along rows (the 1x32 quantize kernels: cp.async and TMA).

A lane holds :data:`VECTOR` (8) consecutive elements of a row, so :data:`LANES_PER_BLOCK` (4) lanes
form a 32-element block (its max two butterfly shuffles away) and :data:`LANES_PER_ROW` (16) lanes
cover the 128 columns of one blocked tile column group (:data:`TILE_K`): a warp covers
:data:`ROWS_PER_STEP` (2) rows per vector step. A 128-row block of scale rows is split into
:data:`WARPS` (4) quarters of :data:`QUARTER_ROWS` (32) rows, one per warp: the 32-row bands of the
blocked layout's tile (``cute_utils.blocked``).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float8E4M3FN, Float32, Int32, Uint8, Uint32

from .constants import BLOCK_SIZE, TILE_COLS, TILE_ROWS
from .mx import e8m0_scale, inverse_scale, lane_group_max, max_abs_bits, scale_values

VECTOR = 8  # elements per lane and vector step
LANES_PER_BLOCK = BLOCK_SIZE // VECTOR  # 4
TILE_K = TILE_COLS * BLOCK_SIZE  # 128 elements of K per blocked tile column group
LANES_PER_ROW = TILE_K // VECTOR  # 16: a warp covers 2 rows of a tile per vector step
ROWS_PER_STEP = 32 // LANES_PER_ROW
QUARTER_ROWS = 32  # rows per warp: one lane per row of the quarter when scales are stored
WARPS = TILE_ROWS // QUARTER_ROWS


def mx_vector_view(tensor: cute.Tensor, rows, cols, dtype=None) -> cute.Tensor:
    """(rows, cols / 8, 8) view of a row-major (rows, cols) tensor: ``[r, v, None]`` is vector v
    (recast to ``dtype`` when given)."""
    ptr = tensor.iterator if dtype is None else cute.recast_ptr(tensor.iterator, dtype=dtype)
    return cute.make_tensor(
        ptr, cute.make_layout((rows, cols // VECTOR, VECTOR), stride=(tensor.layout.stride[0], VECTOR, 1))
    )


@cute.jit
def row_scale_word(s: Int32, lane: Int32) -> Uint32:
    """Word of the 4 scale bytes of the row a lane works on (byte c = block c of the 128-column
    tile), in all 16 lanes of that row: shift each block's byte into place and OR across blocks."""
    word = Uint32(s) << (8 * ((lane % LANES_PER_ROW) // LANES_PER_BLOCK))
    for k in cutlass.range_constexpr(2):
        word = word | cute.arch.shuffle_sync_bfly(word, LANES_PER_BLOCK << k)
    return word


@cute.jit
def store_plain_scales(scale_bytes: cute.Tensor, row: Int32, tile: Int32, word: Uint32, valid):
    """Row ``row``'s scale bytes of 128-column tile ``tile`` (packed in ``word``) into the (M, K/32)
    scale matrix, skipping columns past K/32."""
    if valid:
        for c in cutlass.range_constexpr(TILE_COLS):
            if tile * TILE_COLS + c < scale_bytes.shape[1]:
                scale_bytes[row, tile * TILE_COLS + c] = Uint8((word >> (8 * c)) & 0xFF)


@cute.jit
def quantize_lane_vector(values, q_vec, row, vec, store, mode: cutlass.Constexpr):
    """E4M3-quantize one lane's 8 elements as a quarter of a 32-element block (the 4 lanes of a block
    agree on the scale through shuffles), store them to ``q_vec[row, vec, :]`` when ``store``, and
    return the block's scale byte (0 when not ``store``: the 4 lanes of a block agree on that too)."""
    xf = cute.make_rmem_tensor(cute.make_layout(VECTOR), Float32)
    xf.store(values.load().to(Float32))
    amax = lane_group_max(max_abs_bits(xf), LANES_PER_BLOCK)
    s = e8m0_scale(amax, mode)
    if not store:
        s = Int32(0)  # a block outside the tensor (stale data): padding scale
    scale_values(xf, inverse_scale(s))
    q_frag = cute.make_rmem_tensor(cute.make_layout(VECTOR), Float8E4M3FN)
    q_frag.store(xf.load().to(Float8E4M3FN))
    if store:
        cute.autovec_copy(q_frag, q_vec[row, vec, None])
    return s


__all__ = [
    "LANES_PER_BLOCK",
    "LANES_PER_ROW",
    "QUARTER_ROWS",
    "ROWS_PER_STEP",
    "TILE_K",
    "VECTOR",
    "WARPS",
    "mx_vector_view",
    "quantize_lane_vector",
    "row_scale_word",
    "store_plain_scales",
]
