"""Prefix sums of a CTA over shared memory, with no host synchronization (the EP routing kernels).

:func:`warp_inclusive_sum` scans one value per lane in registers; :func:`cta_exclusive_scan` turns an
Int32 shared-memory array into its exclusive prefix sums, each thread owning a contiguous run of it.
Integer sums: the order of the additions never changes a result (no overflow check: the callers'
totals fit int32).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

WARP = 32


@cute.jit
def warp_inclusive_sum(value: Int32, lane: Int32) -> Int32:
    """Lane ``i`` gets the sum of lanes ``0..i``'s ``value`` (every lane of the warp calls it)."""
    for k in cutlass.range_constexpr(5):
        step = 1 << k
        other = cute.arch.shuffle_sync_up(value, step)
        if lane >= step:
            value = value + other
    return value


@cute.jit
def cta_exclusive_scan(
    values: cute.Tensor, count: Int32, tid: Int32, threads: cutlass.Constexpr, warp_totals: cute.Tensor
) -> Int32:
    """Replace ``values[0:count)`` (Int32, shared memory) by their exclusive prefix sums and return
    the total (in every thread).

    Every one of the CTA's ``threads`` threads calls it; ``warp_totals`` is an Int32 shared scratch of
    ``threads // 32`` words. Thread ``t`` owns the run ``[t n, (t + 1) n)``, ``n = ceil(count /
    threads)``. Starts with a CTA barrier (the values other threads wrote are visible) and ends with
    one (every thread may read any prefix)."""
    cute.arch.sync_threads()
    per_thread = (count + (threads - 1)) // threads
    first = tid * per_thread
    own = Int32(0)
    for i in cutlass.range(per_thread):
        if first + i < count:
            own = own + values[first + i]
    lane = tid % WARP
    warp = cute.arch.make_warp_uniform(tid // WARP)
    inclusive = warp_inclusive_sum(own, lane)
    if lane == WARP - 1:
        warp_totals[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    total = Int32(0)
    for w in cutlass.range_constexpr(threads // WARP):
        words = warp_totals[w]
        if w < warp:
            before = before + words
        total = total + words
    running = before + inclusive - own
    for i in cutlass.range(per_thread):
        if first + i < count:
            value = values[first + i]
            values[first + i] = running
            running = running + value
    cute.arch.sync_threads()
    return total


__all__ = ["WARP", "cta_exclusive_scan", "warp_inclusive_sum"]
