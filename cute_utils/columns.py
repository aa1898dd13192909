"""Column-pair work of the kernels that quantize down columns: views of x and q^T, and the sector
stores of 32-row E4M3 blocks (the 32x1 MXFP8 kernel and the FP8 column cast pass).

A thread owns a pair of adjacent columns of x (E, R, K) row-major (:data:`PAIR`): one 4-byte (bf16)
or 8-byte (fp32) load per row through :func:`column_pair_view`. Its quantized columns are rows of
q^T (E, K, R) row-major, written 32 rows (one block) at a time as two 16-byte halves
(:func:`block_half_view`, :func:`store_sector_pairs`). :func:`as_one_expert` lets a 2-D operand
take the rank-3 code path with the same instructions.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from .constants import BLOCK_SIZE

#: Columns of x a thread owns.
PAIR = 2


def column_pair_view(x: cute.Tensor) -> cute.Tensor:
    """(E, M, K/2, 2) view of a row-major (E, M, K) tensor: ``[e, m, p, None]`` is columns 2p, 2p+1."""
    experts, rows, cols = x.shape
    return cute.make_tensor(
        x.iterator,
        cute.make_layout(
            (experts, rows, cols // PAIR, PAIR),
            stride=(x.layout.stride[0], x.layout.stride[1], PAIR, 1),
        ),
    )


def block_half_view(qt: cute.Tensor) -> cute.Tensor:
    """(E, K, M/32, 2, 4) Uint32 view of q^T (E, K, M): ``[e, k, c, h, None]`` is the 16-byte half h
    of block c of column k."""
    experts, cols, rows = qt.shape
    return cute.make_tensor(
        cute.recast_ptr(qt.iterator, dtype=Uint32),
        cute.make_layout(
            (experts, cols, rows // BLOCK_SIZE, 2, 4),
            stride=(qt.layout.stride[0] // 4, qt.layout.stride[1] // 4, 8, 4, 1),
        ),
    )


def as_one_expert(t: cute.Tensor, divby: int, transpose: bool = False) -> cute.Tensor:
    """A 2-D operand as a kernel's (1, R, C) one: row-major (R, C) ``t``, or with ``transpose`` a
    column-major (C, R) ``t`` seen as its row-major (R, C) transpose. The leading extent is a
    dynamic 1 and its stride a 64-bit R C divisible by ``divby``: the types of a 3-D operand's
    layout, so the kernel compiles to the rank-3 variant's instructions."""
    cols, rows = t.shape if transpose else t.shape[::-1]
    row_stride = t.stride[1] if transpose else t.stride[0]
    wide = cutlass.Int64(rows) * cols
    stride = cute.assume(wide, divby=divby) if divby > 1 else wide
    layout = cute.make_layout((Int32(1), rows, cols), stride=(stride, row_stride, 1))
    return cute.make_tensor(t.iterator, layout)


@cute.jit
def store_sector_pairs(
    words: cute.Tensor, dst: cute.Tensor, e: Int32, k0: Int32, block: Int32, valid, cols=None
):
    """Store the E4M3 blocks of a thread's two columns (``words``: (2, 8) Uint32, column ``k0 + j``
    in row j) so that lanes ``2i`` and ``2i + 1`` write the two 16-byte halves of one 32-byte sector
    in each store instruction (whole sectors into L2, not half ones).

    ``dst``: (E, K, M/32, 2, 4) Uint32 view of q^T (``[e, k, c, h, None]``: half h of block c of
    column k; :func:`block_half_view`). Lane pairs own columns ``k_even .. k_even + 3``; each lane
    gives its partner the halves the partner stores (4 shuffles per column). Every lane must call
    this (shuffles); only lanes with ``valid`` store, and with ``cols`` given only columns below it
    (a lane stores into its partner's columns too: with K % 4 == 2 one of the pair may be past K).
    """
    odd = cute.arch.lane_idx() % 2
    received = cute.make_rmem_tensor(cute.make_layout((PAIR, 4), stride=(4, 1)), Uint32)
    for j in cutlass.range_constexpr(PAIR):
        for i in cutlass.range_constexpr(4):
            send = words[j, 4 + i]
            if odd != 0:
                send = words[j, i]
            received[j, i] = cute.arch.shuffle_sync_bfly(send, 1)
    first = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    second = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    for j in cutlass.range_constexpr(PAIR):
        for i in cutlass.range_constexpr(4):
            first[i] = words[j, i]
            second[i] = received[j, i]
            if odd != 0:
                first[i] = received[j, i]
                second[i] = words[j, 4 + i]
        if cutlass.const_expr(cols is None):
            if valid:
                cute.autovec_copy(first, dst[e, k0 - 2 * odd + j, block, odd, None])
                cute.autovec_copy(second, dst[e, k0 + 2 - 2 * odd + j, block, odd, None])
        else:
            if valid and k0 - 2 * odd + j < cols:
                cute.autovec_copy(first, dst[e, k0 - 2 * odd + j, block, odd, None])
            if valid and k0 + 2 - 2 * odd + j < cols:
                cute.autovec_copy(second, dst[e, k0 + 2 - 2 * odd + j, block, odd, None])


__all__ = ["PAIR", "as_one_expert", "block_half_view", "column_pair_view", "store_sector_pairs"]
