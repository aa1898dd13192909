"""Rows of R destination buffers addressed through a table of base addresses (SPEC section 9).

Expert-parallel sends write rows into R buffers of one shape: across GPUs the peers' symmetric-memory
buffers mapped into this process (their addresses are ``buffer_ptrs`` on the device; the stores are
plain global stores that travel over NVLink), on one GPU R local tensors. A destination is one
flat index ``buffer * P + row`` (P rows per buffer). Nothing here trusts an index: a negative one
or one past ``R * P`` is no destination.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64


@cute.jit
def destination(index: Int32, rows: Int32, buffers: Int32):
    """``(valid, buffer, row)`` of the flat destination ``index = buffer * rows + row``: valid when
    ``0 <= index < buffers * rows`` (the product taken in 64 bits, so it cannot wrap); ``buffer``
    and ``row`` are 0 when not valid (no division by a zero ``rows``)."""
    valid = index >= 0 and Int64(index) < Int64(buffers) * Int64(rows)
    buffer = Int32(0)
    row = Int32(0)
    if valid:
        buffer = index // rows
        row = index - buffer * rows
    return valid, buffer, row


def buffer_view(buffer_ptrs: cute.Tensor, buffer, dtype, layout, align: int) -> cute.Tensor:
    """A tensor of ``layout`` over ``dtype`` elements at the base address ``buffer_ptrs[buffer]``
    (Int64 table of R addresses, each aligned to ``align`` bytes): buffer ``buffer`` seen with the
    layout of this process's own buffer of the same kind."""
    ptr = cute.make_ptr(dtype, buffer_ptrs[buffer], cute.AddressSpace.gmem, assumed_align=align)
    return cute.make_tensor(ptr, layout)


__all__ = ["buffer_view", "destination"]
