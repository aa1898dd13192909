"""L2 prefetch of a kernel's first reads, for prologues (group scans) whose result the reads wait on.

A CTA that must finish a group scan before it knows what to load can still guess most of it (the
rows or columns it would read if no group padded anything) and ask the L2 for those lines at
launch: the scan's latency then overlaps the DRAM latency of the first loads, which hit the L2
when they are issued. A prefetch is only a hint: wrong guesses cost a little bandwidth, never
correctness.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

LINE_BYTES = 128


@dsl_user_op
def prefetch_l2(address: Int64, *, loc=None, ip=None) -> None:
    """``prefetch.global.L2 [address]``: bring the 128-byte line holding global byte ``address``
    into the L2 (no register result, no ordering)."""
    llvm.inline_asm(
        None,
        [Int64(address).ir_value(loc=loc, ip=ip)],
        "prefetch.global.L2 [$0];",
        "l",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


@cute.jit
def prefetch_row_ranges(
    base: Int64,
    row0: Int32,
    rows: Int32,
    row_bytes: Int32,
    first: Int32,
    last: Int32,
    tid: Int32,
    threads: cutlass.Constexpr,
    block_rows: cutlass.Constexpr,
    lines_per_row: cutlass.Constexpr,
):
    """Prefetch bytes ``[first, last)`` of rows ``row0 .. row0 + block_rows - 1`` (below ``rows``)
    of a row-major byte matrix at global address ``base`` with ``row_bytes`` per row (the range is
    clipped to the row), at most ``lines_per_row`` lines per row. Every thread of the CTA calls it:
    thread ``t`` takes row ``t % block_rows`` and every ``threads / block_rows``-th line of it."""
    row = row0 + tid % block_rows
    lo = cutlass.max(first, 0)
    hi = cutlass.min(last, row_bytes)
    if row < rows and lo < hi:
        start = Int64(row) * Int64(row_bytes) + Int64(lo)
        first_line = (base + start) // LINE_BYTES
        last_line = (base + start + Int64(hi - lo - 1)) // LINE_BYTES
        for k in cutlass.range_constexpr((lines_per_row * block_rows + threads - 1) // threads):
            line = first_line + Int64(tid // block_rows + k * (threads // block_rows))
            if line <= last_line:
                prefetch_l2(line * LINE_BYTES)
