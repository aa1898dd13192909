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

_SEARCH_STEPS = 12  # 2**11 == MAX_GROUPS: enough halvings to search MAX_GROUPS + 1 entries


def search_steps(max_groups: int = MAX_GROUPS) -> int:
    """Halvings of a binary search over the ``max_groups + 1`` entries of a scan's arrays."""
    return max_groups.bit_length()


_WARP = 32


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
def _warp_inclusive_sum(value: Int32, lane: Int32) -> Int32:
    for k in cutlass.range_constexpr(5):
        step = 1 << k
        other = cute.arch.shuffle_sync_up(value, step)
        if lane >= step:
            value = value + other
    return value


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
    lane = tid % _WARP
    warp = tid // _WARP
    inclusive = _warp_inclusive_sum(own, lane)
    if lane == _WARP - 1:
        warp_totals[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    for w in cutlass.range_constexpr(num_threads // _WARP):
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
def find_group(
    prefix: cute.Tensor, num_groups: Int32, key: Int32, steps: cutlass.Constexpr = _SEARCH_STEPS
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
def m_groups_row_block(
    prefix: cute.Tensor,
    ends: cute.Tensor,
    num_groups: Int32,
    row_block: Int32,
    rows: Int32,
    steps: cutlass.Constexpr = _SEARCH_STEPS,
):
    """Source rows behind output row block ``row_block`` of an M-groups blocked scale layout.

    Needs the 128-row padded prefix and the clamped ends of :func:`scan_padded_group_sizes`.
    Returns ``(first source row, valid rows 0..128, covered, g)``. Blocks below ``prefix[G]``
    belong to group ``g`` (``covered``: their scales are the group's; it is block
    ``row_block - prefix[g]`` of the group). The blocks after them carry no group's scales (they
    are zero) and are paired, in order, with the 128-row chunks of the rows past the last group's
    end, which still need their data quantized: there are always enough of them
    (``ceil((rows + 128 G) / 128) - prefix[G] >= ceil((rows - end[G-1]) / 128)``).
    """
    covered_blocks = prefix[num_groups]
    covered = row_block < covered_blocks
    g = find_group(prefix, num_groups, row_block, steps)
    start, end = smem_group_bounds(ends, g)
    first = start + (row_block - prefix[g]) * 128
    limit = end
    if not covered:
        first = ends[num_groups - 1] + (row_block - covered_blocks) * 128
        limit = rows
    valid = cutlass.max(cutlass.min(limit - first, 128), Int32(0))
    return first, valid, covered, g


@cute.jit
def k_groups_tile_column(group_prefix: Int32, next_prefix: Int32, row_block: Int32, scale_rows: Int32):
    """Where a group-aligned 128-row block lands in a K-groups scale layout with ``scale_rows``
    (Rp) rows: block ``row_block`` (:func:`m_groups_row_block` numbering) of group ``g``
    (``group_prefix`` = prefix[g], ``next_prefix`` = prefix[g + 1]) holds the group's scale columns
    ``4 j .. 4 j + 3``, ``j = row_block - prefix[g]``, which form one 4-byte word of each row of a
    blocked tile column. Returns ``(base, row_block_bytes)``: S[k, 4 j + b] is byte ``b`` of the
    word at byte ``base + (k // 128) * row_block_bytes + (k % 32) * 16 + ((k % 128) // 32) * 4``."""
    base = scale_rows * 4 * group_prefix + (row_block - group_prefix) * 512
    return base, (next_prefix - group_prefix) * 512


#: Most groups :func:`warp_group_scan` takes (one per lane).
WARP_SCAN_GROUPS = _WARP


@cute.jit
def warp_group_scan(offsets: cute.Tensor, num_groups: Int32, rows: Int32, lane: Int32):
    """The 128-row padded group scan for ``num_groups <= 32``, held in registers by one warp (every
    lane calls it; each warp of a CTA computes the same): lane ``g`` loads group ``g``'s end and a
    warp scan gives the prefix, with no shared memory and no barrier. Returns the state
    :func:`warp_group_row_block` reads: this lane's group ``(start, end, prefix[g], prefix[g + 1])``
    and, in every lane, ``(prefix[G], end of the last group)``."""
    live = lane < num_groups
    end = Int32(0)
    if live:
        end = clamped_end(offsets, lane, rows)
    start = cute.arch.shuffle_sync_up(end, 1)
    if lane == 0:
        start = Int32(0)
    own = Int32(0)
    if live:
        own = (cutlass.max(end, start) - start + 127) // 128
    inclusive = _warp_inclusive_sum(own, lane)
    last = num_groups - 1
    totals = (cute.arch.shuffle_sync(inclusive, last), cute.arch.shuffle_sync(end, last))
    return (start, end, inclusive - own, inclusive), totals


@cute.jit
def warp_group_row_block(scan, num_groups: Int32, rows: Int32, row_block: Int32, lane: Int32):
    """:func:`m_groups_row_block` from the registers of :func:`warp_group_scan` (every lane calls it):
    a ballot finds the group, shuffles fetch its bounds. Returns ``(first source row, valid rows
    0..128, covered, prefix[g], prefix[g + 1])``."""
    (start, end, exclusive, inclusive), (covered_blocks, last_end) = scan
    # Prefix sums rise with the lane, so the lanes at or below ``row_block`` are lanes 0 .. g.
    at_or_below = cute.arch.vote_ballot_sync(lane < num_groups and exclusive <= row_block)
    g = cutlass.max(cute.arch.popc(at_or_below) - 1, Int32(0))
    group_prefix = cute.arch.shuffle_sync(exclusive, g)
    next_prefix = cute.arch.shuffle_sync(inclusive, g)
    group_start = cute.arch.shuffle_sync(start, g)
    group_end = cutlass.max(cute.arch.shuffle_sync(end, g), group_start)
    covered = row_block < covered_blocks
    first = group_start + (row_block - group_prefix) * 128
    limit = group_end
    if not covered:
        first = last_end + (row_block - covered_blocks) * 128
        limit = rows
    valid = cutlass.max(cutlass.min(limit - first, 128), Int32(0))
    return first, valid, covered, group_prefix, next_prefix


@cute.jit
def group_row_tile(
    offsets: cute.Tensor,
    num_groups: Int32,
    rows: Int32,
    row_block: Int32,
    tid: Int32,
    num_threads: cutlass.Constexpr,
    prefix: cute.Tensor,
    ends: cute.Tensor,
    warp_totals: cute.Tensor,
):
    """The group scan and :func:`m_groups_row_block` of ``row_block`` for a CTA whose row tiles follow
    the groups: up to 32 groups by :func:`warp_group_scan` in registers (the arrays are not touched),
    more by :func:`scan_group_sizes` into ``prefix``/``ends``/``warp_totals`` (then a CTA barrier
    after every thread read them: the caller may reuse the bytes). Every thread calls it. Returns
    ``(first source row, valid rows 0..128, covered, prefix[g], prefix[g + 1], prefix[G])``."""
    first, valid = Int32(0), Int32(0)
    covered = row_block < 0
    group_prefix, next_prefix, covered_blocks = Int32(0), Int32(0), Int32(0)
    if num_groups <= WARP_SCAN_GROUPS:
        scan = warp_group_scan(offsets, num_groups, rows, tid % _WARP)
        covered_blocks = scan[1][0]
        first, valid, covered, group_prefix, next_prefix = warp_group_row_block(
            scan, num_groups, rows, row_block, tid % _WARP
        )
    else:
        scan_group_sizes(offsets, num_groups, rows, 128, prefix, warp_totals, tid, num_threads, ends)
        first, valid, covered, g = m_groups_row_block(prefix, ends, num_groups, row_block, rows)
        group_prefix, next_prefix, covered_blocks = prefix[g], prefix[g + 1], prefix[num_groups]
        cute.arch.sync_threads()
    return first, valid, covered, group_prefix, next_prefix, covered_blocks


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
    lane = tid % _WARP
    warp = tid // _WARP
    own = Int32(0)
    end = Int32(0)
    if tid < num_groups:
        start = clamped_end(offsets, tid - 1, total)
        end = clamped_end(offsets, tid, total)
        own = (cutlass.max(end, start) - start + (unit - 1)) // unit
    inclusive = _warp_inclusive_sum(own, lane)
    if lane == _WARP - 1:
        warp_totals[warp] = inclusive
    cute.arch.sync_threads()
    before = Int32(0)
    for w in cutlass.range_constexpr(num_threads // _WARP):
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
    steps: cutlass.Constexpr = _SEARCH_STEPS,
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
def uniform_groups_row_block(row_block: Int32, group_rows: Int32):
    """Rows behind output row block ``row_block`` when every group has ``group_rows`` rows and
    ``ceil(group_rows / 128)`` blocks (3D expert weights, per-expert blocked scales):
    ``(first row, valid rows 0..128)``."""
    blocks_per_group = (group_rows + 127) // 128
    group = row_block // blocks_per_group
    local = (row_block - group * blocks_per_group) * 128
    valid = cutlass.max(cutlass.min(group_rows - local, 128), Int32(0))
    return group * group_rows + local, valid


@cute.jit
def find_group_of_position(
    ends: cute.Tensor, num_groups: Int32, position: Int32, steps: cutlass.Constexpr = _SEARCH_STEPS
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
    steps: cutlass.Constexpr = _SEARCH_STEPS,
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
