"""Row scatter through a table of destination buffers: the data movement of expert-parallel
dispatch and combine (SPEC section 9, ``torch_bindings.ep``).

``src`` (M, D) rows go to R destination buffers of one shape (P, D) whose base addresses are in
``buffer_ptrs`` (Int64 (R,), device): on one GPU R local tensors (the R = 1 path and the simulated
multi-rank tests), across GPUs the peers' symmetric-memory buffers mapped into this process. Item
``i`` moves source row ``src_rows[i]`` to row ``d % P`` of buffer ``d // P`` with ``d = dst_index[i] +
dst_bias`` (or ``dst_index[src_rows[i]] + dst_bias`` with ``dst_by_src``: the destination of the
source row itself, as combine sends rows in a permuted order by their tags, ``dst_bias`` -1); ``d <
0`` skips the item (so does a source row outside ``dst_index`` with ``dst_by_src``), and a source row
outside ``[0, M)`` writes a zero row (the receiver's padding rows are zeroed this way). Every index
is checked against the shapes: a bad index never reads or writes out of bounds.

Work decomposition: the pad kernel's (``cute_kernels.pad``): an item's row is cut into row chunks of
``32 U`` vectors; a CTA takes a contiguous run of ``items_per_warp`` chunks per warp, its warps
round-robin; each lane loads its ``U`` vectors (16 or 4 bytes, a compile-time choice), then stores
them to the destination row (peer stores go over NVLink as plain global stores).

All sizes are symbolic (M, D, P, N, R): one compile per (dtype, vector width, config, arch).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from cute_utils.blocked import ceil_div
from cute_utils.constants import SCATTER_VARIANTS
from cute_utils.rows import chunk_fragment, load_row_chunk, row_vector_view, store_row_chunk, word_and_count
from cute_utils.scan import WARP

from .pad import ELEMENT_TYPES, RowGatherKernel, RowGatherVariant


class RowScatterKernel(RowGatherKernel):
    """Row scatter (module docstring), on the pad kernels' launch shape and row-chunk loop. Launch:
    ``kernel(src, dst, src_rows, dst_index, buffer_ptrs, dst_bias, dst_by_src)``: ``src`` (M, D) and
    ``dst`` (P, D) row-major of one dtype (``dst`` is this process's own buffer: it gives the
    destinations' shape), ``src_rows`` Int32 (N,), ``dst_index`` Int32: (N,) with ``dst_by_src`` 0
    (the binding checks; an item past it is skipped), any length with ``dst_by_src``;
    ``buffer_ptrs`` Int64 (R,) base addresses of R buffers shaped like ``dst``, each aligned to the
    vector width. ``R * P`` must fit in int32."""

    name = "row_scatter"

    @classmethod
    def variants(cls) -> list[RowGatherVariant]:
        return [RowGatherVariant(name, width) for name, width in SCATTER_VARIANTS]

    @staticmethod
    def can_implement(row_bytes: int, vector_bytes: int, *data_ptrs: int) -> bool:
        """Rows a whole number of vectors, every data pointer aligned to the vector."""
        return row_bytes % vector_bytes == 0 and all(p % vector_bytes == 0 for p in data_ptrs)

    @classmethod
    def fake_arguments(cls, variant: RowGatherVariant) -> tuple:
        dtype = ELEMENT_TYPES[variant.dtype]
        elements = max(variant.vector_bytes // (dtype.width // 8), 1)
        cols = cute.sym_int(divisibility=elements)

        def data():
            return cute.runtime.make_fake_compact_tensor(
                dtype, (cute.sym_int(), cols), stride_order=(1, 0), assumed_align=variant.vector_bytes
            )

        src_rows = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        dst_index = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        buffer_ptrs = cute.runtime.make_fake_compact_tensor(Int64, (cute.sym_int(),), assumed_align=8)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return data(), data(), src_rows, dst_index, buffer_ptrs, Int32(0), Int32(0), stream

    @cute.jit
    def __call__(
        self,
        src: cute.Tensor,  # (M, D) row-major
        dst: cute.Tensor,  # (P, D) row-major, src's dtype: this process's buffer (the shape of all R)
        src_rows: cute.Tensor,  # Int32 (N,) source row of item i (outside [0, M): a zero row)
        dst_index: cute.Tensor,  # Int32 buffer * P + row of item i, or of source row (dst_by_src)
        buffer_ptrs: cute.Tensor,  # Int64 (R,) base addresses of the R destination buffers
        dst_bias: Int32,  # added to every dst_index entry before the < 0 test
        dst_by_src: Int32,  # 1: item i's destination is dst_index[src_rows[i]]
        stream,
    ):
        row_bytes = dst.shape[1] * (dst.element_type.width // 8)
        chunks = ceil_div(ceil_div(row_bytes, self.vector_bytes), self.row_chunk)
        ctas = cutlass.max(ceil_div(src_rows.shape[0] * chunks, self.cta_items), 1)
        self.kernel(src, dst, src_rows, dst_index, buffer_ptrs, dst_bias, dst_by_src).launch(
            grid=[ctas, 1, 1], stream=stream, **self._launch_options()
        )

    @cute.jit
    def _destination(self, dst_v: cute.Tensor, buffer_ptrs: cute.Tensor, buffer):
        """``dst_v``'s vector view of buffer ``buffer`` (the same layout at that buffer's address)."""
        word, _ = word_and_count(self.vector_bytes)
        ptr = cute.make_ptr(
            word, buffer_ptrs[buffer], cute.AddressSpace.gmem, assumed_align=self.vector_bytes
        )
        return cute.make_tensor(ptr, dst_v.layout)

    @cute.kernel
    def kernel(
        self, src: cute.Tensor, dst: cute.Tensor, src_rows, dst_index, buffer_ptrs, dst_bias, dst_by_src
    ):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warps, row_chunk = self.warps, self.row_chunk
        src_v = row_vector_view(src, self.vector_bytes)
        dst_v = row_vector_view(dst, self.vector_bytes)
        chunks = ceil_div(dst_v.shape[1], row_chunk)
        rows_out = dst.shape[0]
        buffers = buffer_ptrs.shape[0]
        warp = cute.arch.make_warp_uniform(tid // WARP)
        lane = tid % WARP
        first_item = cta * self.cta_items
        last_item = cutlass.min(first_item + self.cta_items, src_rows.shape[0] * chunks)
        frag = chunk_fragment(dst_v, self.per_lane)
        for item in cutlass.range(first_item + warp, last_item, warps):
            i = item // chunks
            src_row = src_rows[i]
            j = i
            if dst_by_src != 0:
                j = src_row
            index = Int32(-1)
            if j >= 0 and j < dst_index.shape[0]:
                index = dst_index[j] + dst_bias
            buffer = index // rows_out
            if index >= 0 and buffer < buffers:
                row = index - buffer * rows_out
                valid = src_row >= 0 and src_row < src.shape[0]
                first = (item - i * chunks) * row_chunk
                load_row_chunk(src_v, frag, src_row, first, valid, lane, self.per_lane)
                target = self._destination(dst_v, buffer_ptrs, buffer)
                store_row_chunk(frag, target, row, first, lane, self.per_lane)


__all__ = ["SCATTER_VARIANTS", "RowScatterKernel"]
