"""The group-tile scheduler: which group and rows (or columns) a grouped kernel's tile is, from end
offsets, with no host synchronization.

Every grouped kernel that tiles its output by groups numbers the tiles as the M-groups scale layout
numbers its 128-row blocks: group ``g`` owns ``ceil(n_g / unit)`` tiles, ``[prefix[g], prefix[g + 1])``
with ``prefix`` the padded scan of ``cute_utils.groups`` (units of ``unit`` positions), and its tile
``prefix[g] + j`` holds positions ``start_g + unit j`` up to ``unit`` of them (:func:`group_tile`,
:func:`tile_count`). Tiles from ``prefix[G]`` on are the tail, past every group. A launch takes the
static bound :func:`grouped_tile_count` of tiles, ``ceil((total + unit G) / unit)``: no offsets are
read on the host. (The varlen schedulers of attention kernels map CTAs to (sequence, tile) the same
way.)

Users: the swizzle's M-groups row blocks (:func:`m_groups_row_block`) and K-groups tile columns
(:func:`group_tile`, unit 4); the 32x1 and dual kernels' group-aligned row tiles
(:func:`group_row_tile`: a warp scan in registers up to :data:`WARP_SCAN_GROUPS` groups,
:func:`warp_group_row_block`, else the shared-memory scan) and where their K-groups scale words go
(:func:`k_groups_tile_column`), and the zero tail of their K-groups scales past the last group
(:func:`zero_k_groups_tail`); the sm_90a grouped GEMM's 2d3d output tiles (:func:`group_tile`,
unit 128); 3D experts, all groups of one size (:func:`uniform_groups_row_block`).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .blocked import TILE_BYTES, ceil_div, zero_fill_chunks
from .constants import TILE_COLS, TILE_ROWS
from .groups import SEARCH_STEPS, clamped_end, find_group, scan_group_sizes, smem_group_bounds
from .scan import WARP, warp_inclusive_sum


def grouped_tile_count(total, num_groups, unit: int):
    """Tiles of ``unit`` positions a grouped launch takes for ``total`` positions in ``num_groups``
    groups: ``ceil((total + unit G) / unit)``, at least the groups' padded tiles plus the tiles of
    the positions past the last group, whatever the offsets (launchers: DSL or Python integers)."""
    return ceil_div(total + unit * num_groups, unit)


@cute.jit
def group_tile(
    prefix: cute.Tensor,
    ends: cute.Tensor,
    num_groups: Int32,
    tile: Int32,
    unit: cutlass.Constexpr,
    steps: cutlass.Constexpr = SEARCH_STEPS,
):
    """Tile ``tile`` of the groups: ``(g, first, end)``, its group ``g`` (:func:`find_group` in the
    padded ``prefix``, clamped ``ends`` of the scan), its first position
    ``start_g + unit (tile - prefix[g])`` and the group's end. Below ``prefix[G]`` the tile holds
    :func:`tile_count` ``(first, end, unit)`` positions of group ``g``; from ``prefix[G]`` on it is
    in the tail (``g`` is then ``G - 1``: the caller decides what a tail tile does)."""
    g = find_group(prefix, num_groups, tile, steps)
    start, end = smem_group_bounds(ends, g)
    return g, start + (tile - prefix[g]) * unit, end


@cute.jit
def tile_count(first: Int32, limit: Int32, unit: cutlass.Constexpr) -> Int32:
    """Positions of a tile from ``first`` below ``limit``: ``limit - first`` clamped to ``[0, unit]``."""
    return cutlass.max(cutlass.min(limit - first, unit), Int32(0))


@cute.jit
def m_groups_row_block(
    prefix: cute.Tensor,
    ends: cute.Tensor,
    num_groups: Int32,
    row_block: Int32,
    rows: Int32,
    steps: cutlass.Constexpr = SEARCH_STEPS,
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
    g, first, limit = group_tile(prefix, ends, num_groups, row_block, TILE_ROWS, steps)
    if not covered:
        first = ends[num_groups - 1] + (row_block - covered_blocks) * TILE_ROWS
        limit = rows
    return first, tile_count(first, limit, TILE_ROWS), covered, g


@cute.jit
def k_groups_tile_column(group_prefix: Int32, next_prefix: Int32, row_block: Int32, scale_rows: Int32):
    """Where a group-aligned 128-row block lands in a K-groups scale layout with ``scale_rows``
    (Rp) rows: block ``row_block`` (:func:`m_groups_row_block` numbering) of group ``g``
    (``group_prefix`` = prefix[g], ``next_prefix`` = prefix[g + 1]) holds the group's scale columns
    ``4 j .. 4 j + 3``, ``j = row_block - prefix[g]``, which form one 4-byte word of each row of a
    blocked tile column. Returns ``(base, row_block_bytes)``: S[k, 4 j + b] is byte ``b`` of the
    word at byte ``base + (k // 128) * row_block_bytes + (k % 32) * 16 + ((k % 128) // 32) * 4``."""
    base = scale_rows * TILE_COLS * group_prefix + (row_block - group_prefix) * TILE_BYTES
    return base, (next_prefix - group_prefix) * TILE_BYTES


@cute.jit
def zero_k_groups_tail(
    words: cute.Tensor,
    scale_rows: Int32,
    scale_cols: Int32,
    covered_blocks: Int32,
    index: Int32,
    stride: Int32,
):
    """Zero the bytes of a K-groups scale layout ((Rp, M/32 + 4 G) bytes with ``scale_rows`` = Rp,
    ``scale_cols`` = M/32 + 4 G; ``words``: the same bytes as flat Uint32) past the groups' padded
    128-row blocks (``covered_blocks`` = prefix[G], from :func:`group_row_tile`), as the chunks
    ``index``, ``index + stride``, ... of a grid-stride loop over every thread of the grid."""
    zero_fill_chunks(
        words,
        cutlass.min(scale_rows * TILE_COLS * covered_blocks, scale_rows * scale_cols),
        scale_rows * scale_cols,
        index,
        stride,
    )


#: Most groups :func:`warp_group_scan` takes (one per lane).
WARP_SCAN_GROUPS = WARP


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
    inclusive = warp_inclusive_sum(own, lane)
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
    first = group_start + (row_block - group_prefix) * TILE_ROWS
    limit = group_end
    if not covered:
        first = last_end + (row_block - covered_blocks) * TILE_ROWS
        limit = rows
    return first, tile_count(first, limit, TILE_ROWS), covered, group_prefix, next_prefix


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
        scan = warp_group_scan(offsets, num_groups, rows, tid % WARP)
        covered_blocks = scan[1][0]
        first, valid, covered, group_prefix, next_prefix = warp_group_row_block(
            scan, num_groups, rows, row_block, tid % WARP
        )
    else:
        scan_group_sizes(offsets, num_groups, rows, TILE_ROWS, prefix, warp_totals, tid, num_threads, ends)
        first, valid, covered, g = m_groups_row_block(prefix, ends, num_groups, row_block, rows)
        group_prefix, next_prefix, covered_blocks = prefix[g], prefix[g + 1], prefix[num_groups]
        cute.arch.sync_threads()
    return first, valid, covered, group_prefix, next_prefix, covered_blocks


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


__all__ = [
    "WARP_SCAN_GROUPS",
    "group_row_tile",
    "group_tile",
    "grouped_tile_count",
    "k_groups_tile_column",
    "m_groups_row_block",
    "tile_count",
    "uniform_groups_row_block",
    "warp_group_row_block",
    "warp_group_scan",
]
