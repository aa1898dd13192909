"""Launch-shape arithmetic shared by the kernels: SM counts, resident CTAs per SM, grid walks.

Host-side (compile-time) integers, but for the launch grid of :func:`chunk_major_grid` and the
in-kernel row-tile order of :func:`spread_row_tile`.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

#: SM counts assumed when the caller does not give the device's own (H100/H200, B200).
DEFAULT_NUM_SMS = {"sm_90a": 132, "sm_100a": 148}
#: Shared memory per SM that CTAs can take (Hopper and Blackwell: 228 KiB), and what the driver
#: reserves per resident CTA.
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_CTA = 1024
MAX_CTAS_PER_SM = 32


def resident_ctas(register_cap_ctas: int, smem_bytes: int) -> int:
    """CTAs of one kernel resident per SM: at most ``register_cap_ctas`` (the ``min_blocks_per_mp``
    register cap; 0: unknown, taken as 8), at most what ``smem_bytes`` per CTA leaves room for."""
    by_registers = register_cap_ctas or 8
    by_smem = SMEM_PER_SM // (smem_bytes + SMEM_RESERVED_PER_CTA)
    return max(1, min(by_registers, by_smem, MAX_CTAS_PER_SM))


#: Largest grid y (and z) dimension.
MAX_GRID_Y = 65535


def chunk_major_grid(row_units, chunks) -> list:
    """Launch grid ``[chunks, y, z]`` (DSL integers) for ``row_units`` x ``chunks`` CTAs numbered
    chunk-fastest, row unit ``y + MAX_GRID_Y * z`` (grid y is at most 65535; units past
    ``row_units`` find no rows)."""
    return [chunks, cutlass.min(row_units, MAX_GRID_Y), (row_units + MAX_GRID_Y - 1) // MAX_GRID_Y]


#: Row strides (bytes) of a transposed output at which :func:`spread_row_tile` reorders: multiples of 2 ** 17.
SPREAD_STRIDE = 1 << 17


@cute.jit
def spread_row_tile(tile: Int32, tiles: Int32, row_stride_bytes: Int32) -> Int32:
    """Row tile that the CTA numbered ``tile`` (of ``tiles``) takes, for a kernel whose CTAs each
    write a 128-byte piece of many rows of a transposed output with rows ``row_stride_bytes`` apart.

    In order, but where that stride is a multiple of :data:`SPREAD_STRIDE`: there even numbers walk
    the first half of the tiles and odd numbers the second half (``tile // 2``, ``tiles // 2 + tile
    // 2``; an odd count's last tile last), so the CTAs running at once write at two places of each
    output row, not one, and neighbouring tiles still run close together. This gains at such
    strides and loses a little at others (notes/quantize-dual-row-order.md)."""
    half = tiles // 2
    spread = tile
    if row_stride_bytes % SPREAD_STRIDE == 0 and tile < 2 * half:
        spread = (tile % 2) * half + tile // 2
    return spread
