"""Row work of the kernels that move or reduce whole rows: step views, row chunks of vectors, the
CTA-wide maximum.

- :func:`row_steps`: a row-major (rows, K) tensor as (rows, K / width, width) steps (the FP8 row
  kernel, SwiGLU, the FP8 row dequantization).
- Row chunks (the pad, unpad and row-scatter kernels): a row is cut into vectors of 16, 4 or
  element-size bytes (:func:`row_vector_view`), moved as words (:func:`word_and_count`); a lane
  moves ``per_lane`` vectors of a chunk, ``32 u + lane`` (:func:`chunk_fragment`,
  :func:`load_row_chunk`, :func:`store_row_chunk`).
- :func:`cta_max`: the max of the warps' maxima through shared memory.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint8, Uint16, Uint32

from .scan import WARP

_WORD_BY_BYTES = {1: Uint8, 2: Uint16, 4: Uint32}


def row_steps(t: cute.Tensor, width: int) -> cute.Tensor:
    """(rows, K / width, width) view of a row-major (rows, K) tensor: ``[r, v, None]`` is step v."""
    rows, cols = t.shape
    layout = cute.make_layout((rows, cols // width, width), stride=(t.stride[0], width, 1))
    return cute.make_tensor(t.iterator, layout)


@cute.jit
def cta_max(amax: Int32, warp_max: cute.Tensor, tid: Int32, warps: cutlass.Constexpr) -> Int32:
    """Max of every warp's ``amax`` (each already warp-reduced), through shared memory: ``warp_max``
    is an Int32 scratch of ``warps`` words; one CTA barrier (every thread must call it)."""
    if tid % WARP == 0:
        warp_max[tid // WARP] = amax
    cute.arch.barrier()
    for w in cutlass.range_constexpr(warps):
        amax = cutlass.max(amax, warp_max[w])
    return amax


def word_and_count(vector_bytes: int):
    """(integer word type, words per vector): a vector moves as ``count`` words (one access)."""
    word_bytes = min(vector_bytes, 4)
    return _WORD_BY_BYTES[word_bytes], vector_bytes // word_bytes


def row_vector_view(t: cute.Tensor, vector_bytes: int) -> cute.Tensor:
    """(rows, vectors per row, words per vector) view of a row-major (rows, D) tensor whose row size
    in bytes is a multiple of ``vector_bytes`` (the fake tensors' divisibility says so; it is restated
    with ``cute.assume`` because integer arithmetic on strides drops it)."""
    word, count = word_and_count(vector_bytes)
    element_bytes = t.element_type.width // 8
    word_bytes = vector_bytes // count
    rows, cols = t.shape
    row_stride = cute.assume(t.stride[0] * element_bytes // word_bytes, divby=count)
    row_vectors = cols * element_bytes // vector_bytes
    layout = cute.make_layout((rows, row_vectors, count), stride=(row_stride, count, 1))
    return cute.make_tensor(cute.recast_ptr(t.iterator, dtype=word), layout)


def chunk_fragment(dst, per_lane: int):
    """Registers of one lane's row chunk: ``per_lane`` vectors of ``dst``'s words (``dst``: a
    :func:`row_vector_view`)."""
    count = dst.shape[2]
    return cute.make_rmem_tensor(cute.make_layout((count, per_lane), stride=(1, count)), dst.element_type)


@cute.jit
def load_row_chunk(src, frag, src_row, first, valid, lane, per_lane: cutlass.Constexpr):
    """Load vectors ``first + 32 u + lane`` (u < ``per_lane``) of ``src`` row ``src_row`` into
    ``frag``, zeros when not ``valid`` or past the row end."""
    count = src.shape[2]
    row_vectors = src.shape[1]
    for u in cutlass.range_constexpr(per_lane):
        for q in cutlass.range_constexpr(count):
            frag[q, u] = frag.element_type(0)
        col = first + u * WARP + lane
        if valid and col < row_vectors:
            cute.autovec_copy(src[src_row, col, None], frag[None, u])


@cute.jit
def store_row_chunk(frag, dst, dst_row, first, lane, per_lane: cutlass.Constexpr):
    """Store ``frag`` (see :func:`load_row_chunk`) to vectors ``first + 32 u + lane`` of ``dst`` row
    ``dst_row``; vectors past the row end are skipped."""
    row_vectors = dst.shape[1]
    for u in cutlass.range_constexpr(per_lane):
        col = first + u * WARP + lane
        if col < row_vectors:
            cute.autovec_copy(frag[None, u], dst[dst_row, col, None])


__all__ = [
    "chunk_fragment",
    "cta_max",
    "load_row_chunk",
    "row_steps",
    "row_vector_view",
    "store_row_chunk",
    "word_and_count",
]
