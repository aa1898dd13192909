"""Device-side token-group lookups computed from end offsets, with no host synchronization.

Groups are given as an int32 tensor of *end* offsets (length G). Offset values are never trusted:
every end is clamped to ``[0, total]`` and a group whose end is below its start is empty, so any
offsets give in-bounds reads and writes (just meaningless data when the offsets are garbage).

The central building block is :func:`scan_padded_group_sizes`: the CTA cooperatively computes, in
shared memory, the exclusive prefix sum of each group's size rounded up to a unit (128 rows for the
M-groups scale layout, 4 scale columns for K-groups, the alignment for token padding). Lookups are
then binary searches in shared memory (:func:`find_group`).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .constants import MAX_GROUPS  # prefix and ends arrays of MAX_GROUPS + 1 words in shared memory
from .scan import WARP, warp_inclusive_sum

SEARCH_STEPS = 12  # 2**11 == MAX_GROUPS: enough halvings to search MAX_GROUPS + 1 entries


def search_steps(max_groups: int = MAX_GROUPS) -> int:
    """Halvings of a binary search over the ``max_groups + 1`` entries of a scan's arrays."""
    return max_groups.bit_length()


def prefix_smem_words(max_groups: int = MAX_GROUPS) -> int:
    """Int32 words of shared memory a prefix (or ends) array for up to ``max_groups`` groups needs."""
    return max_groups + 1


@cute.jit
def smem_group_bounds(ends: cute.Tensor, g: Int32):
    """``(start, end)`` of group ``g`` from the clamped ends that the scan stored in shared memory."""
    start = Int32(0)
    if g > 0:
        start = ends[g - 1]
    return start, cutlass.max(ends[g], start)


@cute.jit
def clamped_end(offsets: cute.Tensor, g: Int32, total: Int32) -> Int32:
    """End offset of group ``g`` clamped to ``[0, total]``; ``g == -1`` gives 0."""
    end = Int32(0)
    if g >= 0:
        end = cutlass.min(cutlass.max(offsets[g], Int32(0)), total)
    return end


@cute.jit
def group_bounds(offsets: cute.Tensor, g: Int32, total: Int32):
    """``(start, end)`` of group ``g`` after clamping; ``end >= start`` always holds."""
    start = clamped_end(offsets, g - 1, total)
    end = cutlass.max(clamped_end(offsets, g, total), start)
    return start, end


@cute.jit
def scan_padded_group_sizes(
    offsets: cute.Tensor,
    num_groups: Int32,
    total: Int32,
    unit: cutlass.Constexpr,
    prefix: cute.Tensor,
    warp_totals: cute.Tensor,
    tid: Int32,
    num_threads: cutlass.Constexpr,
    ends: cute.Tensor,
):
    """Fill ``prefix[g] = sum_{i<g} ceil(n_i / unit)`` for ``g`` in ``0..G`` (G + 1 entries).

    Also stores each group's clamped end in ``ends[g]`` so later lookups
    (:func:`smem_group_bounds`) need no global loads. Called by all ``num_threads`` threads of the
    CTA; ends with a CTA barrier, after which every thread may read both arrays. ``warp_totals`` is
    an Int32 shared-memory scratch of ``num_threads // 32`` words. Each thread owns a contiguous
    run of groups.
    """
    per_thread = (num_groups + (num_threads - 1)) // num_threads
    first = tid * per_thread
    own = Int32(0)
    for i in cutlass.range(per_thread):
        g = first + i
        if g < num_groups:
            start, end = group_bounds(offsets, g, total)
            own = own + (end - start + (unit - 1)) // unit
    lane = tid % WARP
    warp = tid // WARP
    inclusive = warp_inclusive_sum(own, lane)
    if lane == WARP - 1:
        warp_totals[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    for w in cutlass.range_constexpr(num_threads // WARP):
        if w < warp:
            before = before + warp_totals[w]
    running = before + inclusive - own
    for i in cutlass.range(per_thread):
        g = first + i
        if g < num_groups:
            prefix[g] = running
            start, end = group_bounds(offsets, g, total)
            ends[g] = clamped_end(offsets, g, total)
            running = running + (end - start + (unit - 1)) // unit
    if tid == num_threads - 1:
        prefix[num_groups] = before + inclusive
    cute.arch.sync_threads()


@cute.jit
def scan_group_sizes(
    offsets: cute.Tensor,
    num_groups: Int32,
    total: Int32,
    unit,
    prefix: cute.Tensor,
    warp_totals: cute.Tensor,
    tid: Int32,
    num_threads: cutlass.Constexpr,
    ends: cute.Tensor,
):
    """:func:`scan_padded_group_sizes` (same arguments and results) for any group count, taking the
    straight-line :func:`scan_padded_group_sizes_small` when ``num_groups <= num_threads`` (a
    run-time choice: both are compiled in)."""
    if num_groups <= num_threads:
        scan_padded_group_sizes_small(
            offsets, num_groups, total, unit, prefix, warp_totals, tid, num_threads, ends
        )
    else:
        scan_padded_group_sizes(offsets, num_groups, total, unit, prefix, warp_totals, tid, num_threads, ends)


@cute.jit
def store_padded_offsets(
    aligned: cute.Tensor,
    num_groups: Int32,
    alignment,
    padded_start: cute.Tensor,
    padded_end: cute.Tensor,
    tid: Int32,
    threads: cutlass.Constexpr,
):
    """``padded_start[g] = A * aligned[g]``, ``padded_end[g] = A * aligned[g + 1]`` from the prefix
    of :func:`scan_padded_group_sizes` in units of the alignment A (SPEC section 4's padded
    offsets); the ``threads`` threads calling it take the groups round-robin."""
    for g in cutlass.range(tid, num_groups, threads):
        padded_start[g] = aligned[g] * alignment
        padded_end[g] = aligned[g + 1] * alignment


@cute.jit
def find_group(
    prefix: cute.Tensor, num_groups: Int32, key: Int32, steps: cutlass.Constexpr = SEARCH_STEPS
) -> Int32:
    """Largest ``g`` in ``[0, G)`` with ``prefix[g] <= key`` (0 when none; needs ``G >= 1``).

    With the padded prefix of :func:`scan_padded_group_sizes`, ``key`` lies in group ``g`` when
    ``key < prefix[g + 1]``; empty groups are skipped because their prefix equals the next one's.
    """
    pos = Int32(0)
    for k in cutlass.range_constexpr(steps):
        candidate = pos + (1 << (steps - 1 - k))
        if candidate < num_groups:
            if prefix[candidate] <= key:
                pos = candidate
    return pos


@cute.jit
def scan_padded_group_sizes_small(
    offsets: cute.Tensor,
    num_groups: Int32,
    total: Int32,
    unit: cutlass.Constexpr,
    prefix: cute.Tensor,
    warp_totals: cute.Tensor,
    tid: Int32,
    num_threads: cutlass.Constexpr,
    ends: cute.Tensor,
):
    """:func:`scan_padded_group_sizes` (same arguments and results) for ``num_groups <= num_threads``:
    thread ``g`` owns group ``g``, so the scan is straight-line code (two offset loads per thread,
    one warp scan, two CTA barriers) instead of loops over runs of groups. The caller checks the
    group count; every thread of the CTA must call it."""
    lane = tid % WARP
    warp = tid // WARP
    own = Int32(0)
    end = Int32(0)
    if tid < num_groups:
        start = clamped_end(offsets, tid - 1, total)
        end = clamped_end(offsets, tid, total)
        own = (cutlass.max(end, start) - start + (unit - 1)) // unit
    inclusive = warp_inclusive_sum(own, lane)
    if lane == WARP - 1:
        warp_totals[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    for w in cutlass.range_constexpr(num_threads // WARP):
        if w < warp:
            before = before + warp_totals[w]
    if tid < num_groups:
        prefix[tid] = before + inclusive - own
        ends[tid] = end
    if tid == num_threads - 1:
        prefix[num_groups] = before + inclusive
    cute.arch.sync_threads()


@cute.jit
def padded_group_rows(
    aligned_prefix: cute.Tensor,
    ends: cute.Tensor,
    num_groups: Int32,
    row: Int32,
    alignment: Int32,
    out_rows: Int32,
    steps: cutlass.Constexpr = SEARCH_STEPS,
):
    """Token-group padding tiled by source rows (SPEC section 4): ``(q_row, q_zero)`` for ``row``.

    Needs the prefix of :func:`scan_padded_group_sizes` in units of ``alignment`` rows (group g's
    padded rows start at ``alignment * aligned_prefix[g]``) and the clamped ``ends``. ``q_row``: the
    padded row that source row ``row`` goes to, -1 when it is in no group (past the last end: dropped).
    ``q_zero``: whether padded row ``row`` (below ``out_rows``) holds no group's data (a group's
    alignment padding or the rows after the last padded group): it must be written as zero. Over all
    rows, every padded row is written exactly once (valid offsets)."""
    q_row = Int32(-1)
    g = find_group_of_position(ends, num_groups, row, steps)
    if g < num_groups:
        start, end = smem_group_bounds(ends, g)
        if row >= start and row < end:
            q_row = aligned_prefix[g] * alignment + row - start
    h = find_group(aligned_prefix, num_groups, row // alignment, steps)
    start, end = smem_group_bounds(ends, h)
    q_zero = row < out_rows
    if row < aligned_prefix[num_groups] * alignment and row - aligned_prefix[h] * alignment < end - start:
        q_zero = False
    return q_row, q_zero


@cute.jit
def find_group_of_position(
    ends: cute.Tensor, num_groups: Int32, position: Int32, steps: cutlass.Constexpr = SEARCH_STEPS
) -> Int32:
    """Number of groups whose clamped end (``ends`` from :func:`scan_padded_group_sizes`) is
    ``<= position``: for valid (non-decreasing) offsets, the group that owns ``position`` when it is
    below ``ends[G - 1]`` (empty groups are skipped), ``G`` when it is past every group. Garbage
    offsets give some index in ``[0, G]``; callers check ``smem_group_bounds`` before using it."""
    pos = Int32(0)
    for k in cutlass.range_constexpr(steps):
        step = 1 << (steps - 1 - k)
        if pos + step <= num_groups:
            if ends[pos + step - 1] <= position:
                pos = pos + step
    return pos


@cute.jit
def m_groups_scale_rows(
    prefix: cute.Tensor,
    ends: cute.Tensor,
    num_groups: Int32,
    row: Int32,
    out_row: Int32,
    steps: cutlass.Constexpr = SEARCH_STEPS,
):
    """The two scale rows of an M-groups blocked layout a thread fills when the data is tiled by source
    rows: ``(data_row, zero_row)``.

    Needs the 128-row padded prefix and the clamped ends of :func:`scan_padded_group_sizes`.
    ``data_row``: where source row ``row``'s scales go, ``128 prefix[g] + row - start_g`` for its
    group ``g``; -1 when the row is in no group (past the last end, or garbage offsets). ``zero_row``:
    ``out_row`` when no group row's scales land on that scale row (a group's last block past its size,
    or a block past ``prefix[G]``): it must be written as zero; else -1. Over all source rows and all
    scale rows, every scale row is written exactly once (valid offsets). ``steps``: binary-search
    halvings, :func:`search_steps` of the group count the arrays were sized for."""
    data_row = Int32(-1)
    g = find_group_of_position(ends, num_groups, row, steps)
    if g < num_groups:
        start, end = smem_group_bounds(ends, g)
        if row >= start and row < end:
            data_row = prefix[g] * 128 + row - start
    block = out_row // 128
    zero_row = out_row
    if block < prefix[num_groups]:
        h = find_group(prefix, num_groups, block, steps)
        start, end = smem_group_bounds(ends, h)
        if out_row - prefix[h] * 128 < end - start:
            zero_row = Int32(-1)
    return data_row, zero_row


#: End of the no-group "group" ``G`` (rows past every group): above any row index.
NO_GROUP_END = 0x7FFFFFFF


@cute.jit
def group_of_row(offsets: cute.Tensor, num_groups: Int32, total: Int32, row: Int32, steps: Int32) -> Int32:
    """Number of groups whose clamped end (:func:`clamped_end`, read from global ``offsets``) is
    ``<= row``: a binary search of ``steps`` halvings (``G.bit_length()``, a run-time value, so any
    group count works). For valid (non-decreasing) offsets it is the group that owns ``row``, or
    ``G`` past every group; garbage offsets give some index in ``[0, G]``."""
    pos = Int32(0)
    for k in cutlass.range(steps, unroll=1):
        step = Int32(1) << (steps - 1 - k)
        if pos + step <= num_groups:
            if clamped_end(offsets, pos + step - 1, total) <= row:
                pos = pos + step
    return pos


@cute.jit
def row_group_bounds(offsets: cute.Tensor, g: Int32, num_groups: Int32, total: Int32):
    """``(start, end)`` of group ``g`` (:func:`group_bounds`); ``g == G`` (past every group) gives
    ``(clamped end of G - 1, NO_GROUP_END)``."""
    start = clamped_end(offsets, cutlass.min(g, num_groups) - 1, total)
    end = Int32(NO_GROUP_END)
    if g < num_groups:
        start, end = group_bounds(offsets, g, total)
    return start, end
