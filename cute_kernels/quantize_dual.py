"""``quantize_mxfp8_2d_dual``: the 1x32 and the 32x1 MXFP8 quantizations of x from one read.

x (M, K) bf16/fp32, M and K multiples of 32, gives

- ``q`` (M, K) E4M3 row-major and its 1x32 scales S = (M, K/32): 32 consecutive elements of a row;
- ``qt`` = q_32x1^T (K, M) E4M3 row-major (the (M, K) result with strides (1, M)) and its 32x1
  scales S^T = (K, M/32): 32 consecutive rows of a column.

Scale layouts (:class:`ScaleLayout`): ``plain`` (the logical matrices, row-major), ``blocked``
(SPEC section 3, every padding byte written 0) or ``groups`` (row groups from end offsets, sizes
multiples of 32: M-groups 1x32 scales (M + 128 G, Cp), K-groups 32x1 scales (Rp, M/32 + 4 G), every
byte written). Grouped row tiles follow the groups in M-groups numbering (tile ``t``: 128 rows of
one group from its start, or of the rows past the last group), so a tile's 1x32 scales are block
row ``t`` of the M-groups layout and its 32x1 scales one 4-column word run of its group's K-groups
tiles: the same stores as the blocked layout, at other places.

Work decomposition: a CTA of 8 warps owns a 128-row tile and a run of ``DualConfig.tiles_per_cta``
column tiles of 128 columns; one 128 x 128 step gives exactly one 512-byte blocked tile of each
scale matrix (staged in shared memory, then one 16-byte store per thread of 64). Warp ``(wm, wk)``
takes rows ``32 wm .. 32 wm + 31`` (one 32x1 block) and 64 columns (two 1x32 blocks); lane
``8 r + c`` holds an 8 x 8 fragment: rows ``8 r .. 8 r + 7``, columns ``8 c .. 8 c + 7``. So a 1x32
block is 4 lanes (lane bits 0-1) and a 32x1 block 4 lanes (lane bits 3-4): both maxima are two
butterfly shuffles away. Each of a block's 4 lanes computes 2 of its 8 scales, stages (plain
layout: stores) their bytes and hands out the inverse scales by shuffles.

Stores: each lane puts its 8-byte runs of q rows and of q^T rows into two shared-memory staging
tiles (128 x 128 bytes each, 16-byte chunks permuted so a warp's stores hit distinct banks);
after a CTA barrier every thread copies 16-byte chunks out, 8 threads per 128-byte line. q^T from
registers would leave as 32-byte pieces per warp (one 32x1 block of rows): 2-3% slower.
The blocked and grouped scale bytes are staged the same way (1 KiB: one blocked tile of each scale
matrix per step) and leave as 64 16-byte stores; byte stores from every lane were 1-4% slower
(notes/quantize-dual-kernel.md).
With ``DualConfig.spread_rows`` (the bf16 configs) CTAs take their 128-row tiles in
:func:`~cute_utils.occupancy.spread_row_tile` order: where M is a multiple of 2^17, two runs of tiles
at once, so the q^T lines written at once lie at two places of each q^T row (1.5-3% faster there,
notes/quantize-dual-row-order.md).
Grouped CTAs find their tile with a group scan (up to 32 groups a warp scan in registers, more in
shared memory, in the staging bytes) before their first load. An L2 prefetch of guessed rows
during the scan gained 1-2% with 2 tiles per CTA but lost 0-1.5% with one (same note).

Loads go through a per-lane ``cp.async`` ring in shared memory (``stages`` tiles per warp; each
lane reads back only what it copied, so completion is its own ``wait_group``, no barrier). A tile
is read from shared memory three times rather than kept in registers (80 registers: 3 CTAs per SM):
for both block maxima (bf16: packed 16-bit max on the magnitudes, two rows per word), for q (a
rolled loop over rows) and for q^T. Every element is converted to fp32 exactly and quantized with
``cvt.rn.satfinite.e4m3x2.f32``, pairs along K for q and along M for q^T (no byte transposes).

M, K and G are symbolic: one compile per (dtype, scaling mode, scale layout, config, arch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from cute_utils.blocked import (
    CHUNK_BYTES,
    CHUNKS_PER_TILE,
    TILE_BYTES,
    TILE_COLS,
    TILE_ROWS,
    blocked_row_offset,
    ceil_div,
    zero_fill_chunks,
)
from cute_utils.groups import (
    MAX_GROUPS,
    group_row_tile,
    k_groups_tile_column,
    prefix_smem_words,
)
from cute_utils.jit import compile_tvm_ffi
from cute_utils.mx import BLOCK_SIZE, e4m3x2_into, e4m3x4, e8m0_scale, inverse_scale, max_u16x2
from cute_utils.occupancy import MAX_GRID_Y, chunk_major_grid, spread_row_tile

WARPS_M = 4  # warps along M: one 32-row block each
LANE_ROWS = 8  # rows of a lane's fragment
LANE_COLS = 8  # columns of a lane's fragment
COL_LANES = 8  # lanes of a warp along K
WARP_COLS = COL_LANES * LANE_COLS  # 64
WARPS_K = 2  # warps along K
TILE_K = WARP_COLS * WARPS_K  # columns of a CTA step: 128, one blocked tile of 1x32 scales
TILE_M = TILE_ROWS  # rows of a CTA step
ROW_BLOCK_LANES = BLOCK_SIZE // LANE_COLS  # 4 lanes per 1x32 block
DTYPES = {"bfloat16": BFloat16, "float32": Float32}
MODES = ("floor", "rceil")
_ABS_MASK = 0x7FFFFFFF
_ABS_MASK_X2 = 0x7FFF7FFF


class ScaleLayout(str, Enum):
    PLAIN = "plain"
    BLOCKED = "blocked"
    GROUPS = "groups"  # row groups: M-groups 1x32 scales, K-groups 32x1 scales


@dataclass(frozen=True)
class DualConfig:
    """``stages``: tiles in a warp's shared-memory ring (``stages - 1`` in flight while one
    converts); ``tiles_per_cta``: column tiles a CTA converts in turn (its grid is 128-row tiles x
    runs of that many column tiles); ``min_ctas_per_sm``: register cap (0: none); ``spread_rows``:
    CTAs take their row tiles in :func:`~cute_utils.occupancy.spread_row_tile` order (else in order)."""

    stages: int = 1
    tiles_per_cta: int = 1
    min_ctas_per_sm: int = 3
    spread_rows: bool = True

    def __post_init__(self) -> None:
        if self.stages < 1 or self.tiles_per_cta < 1:
            raise ValueError(f"stages={self.stages} and tiles_per_cta={self.tiles_per_cta} must be >= 1")


# Picked with bench/tune_quantize_dual.py on an H200 (notes/quantize-dual-kernel.md,
# notes/quantize-dual-row-order.md). bf16: one tile per CTA and no ring beyond it (65 KiB of shared
# memory with the staging tiles: 3 CTAs per SM at the 80-register cap); longer CTAs lost 2-10%
# ungrouped. Grouped, with the staged scale tiles (G = 8, two runs): one tile per CTA 0.82-0.92 of
# copy, worst 1.39x the two single calls; 2 tiles with a 2-stage ring 0.80-0.91, but 0.84-0.86 at
# 131072 x 7168. The spread row-tile order: 131072 x 5120 / 7168 0.874-0.898 -> 0.899-0.912 of
# copy, grouped and not; no change elsewhere. fp32 (tuned ungrouped only): one tile per CTA;
# grouped, 2 tiles and no ring (a 2-stage ring of fp32 tiles would leave one CTA per SM); tiles in
# order (the spread order's one register more spills the blocked variant at the cap; grouped fp32
# with it, and without the grouped L2 prefetch, is not measured).
_ONE_TILE = DualConfig(stages=1, tiles_per_cta=1)
_FP32_ONE_TILE = DualConfig(stages=1, tiles_per_cta=1, spread_rows=False)
CONFIGS = {arch: {"bfloat16": _ONE_TILE, "float32": _FP32_ONE_TILE} for arch in ("sm_90a", "sm_100a")}
GROUP_CONFIGS = {
    arch: {"bfloat16": _ONE_TILE, "float32": DualConfig(stages=1, tiles_per_cta=2, spread_rows=False)}
    for arch in ("sm_90a", "sm_100a")
}


def make_quantize_dual(dtype_name: str, mode: str, layout: ScaleLayout, config: DualConfig):
    """Build the ``@cute.jit`` launcher ``launch(x, q, scales, qt, scales_t, stream)``.

    ``x``: (M, K) bf16/fp32 row-major, M and K multiples of 32, 16-byte aligned. ``q``: (M, K)
    Float8E4M3FN row-major; ``qt``: (K, M) Float8E4M3FN row-major; both 16-byte aligned.
    ``scales`` / ``scales_t``: Float8E8M0FNU, (M, K/32) / (K, M/32) for ``plain``, their blocked
    layouts (Rp, Cp) for ``blocked``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be 'floor' or 'rceil', got {mode!r}")
    dtype = DTYPES[dtype_name]
    chunk_elems = 128 // dtype.width  # elements per 16-byte copy
    chunks = LANE_COLS // chunk_elems  # 16-byte copies per fragment row
    stages = config.stages
    ahead = stages - 1
    packed = dtype is BFloat16  # two values per word
    warps = WARPS_M * WARPS_K
    blocked = layout is ScaleLayout.BLOCKED
    grouped = layout is ScaleLayout.GROUPS

    def _col_tiles(cols):
        """CTA steps along K: up to K rounded to 128, so each blocked tile is written whole."""
        return ceil_div(cols, TILE_K)

    def _row_tiles(scales):
        """128-row tiles of the grid: those of the 1x32 scales' rows (M-groups: 128 G rows past M)."""
        return ceil_div(scales.shape[0], TILE_M)

    @cute.jit
    def _load_row(ring_words: cute.Tensor, slot, i: cutlass.Constexpr, lane, frag: cute.Tensor):
        """Row ``i`` of this lane's fragment from ring slot ``slot`` into ``frag`` (chunks, 4) words."""
        for h in cutlass.range_constexpr(chunks):
            cute.autovec_copy(ring_words[slot, i, h, lane, None], frag[h, None])

    @cute.jit
    def _issue(atom, x_chunks, ring, u, units, first_tile, lane_row, lane_col, rows_live, cols):
        """Start the copies of this lane's fragment of tile ``first_tile + u`` into ring slot
        ``u % stages`` (nothing past ``units`` or outside x) and commit them as one group."""
        lane = cute.arch.lane_idx()
        col0 = (first_tile + u) * TILE_K + lane_col
        if u < units and rows_live and col0 < cols:
            for i in cutlass.range_constexpr(LANE_ROWS):
                for h in cutlass.range_constexpr(chunks):
                    cute.copy(
                        atom,
                        x_chunks[lane_row + i, col0 // chunk_elems + h, None],
                        ring[u % stages, i, h, lane, None],
                    )
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _block_maxima(ring_words: cute.Tensor, slot, lane, row_bits: cute.Tensor, col_bits: cute.Tensor):
        """``max |x|`` bits (fp32 bits, NaN-propagating) of this lane's 8 rows over their 1x32 blocks
        into ``row_bits`` and of its 8 columns over the warp's 32 rows into ``col_bits``."""
        frag = cute.make_rmem_tensor(cute.make_layout((chunks, 4), stride=(4, 1)), Uint32)
        if cutlass.const_expr(packed):
            pairs = cute.make_rmem_tensor(cute.make_layout(LANE_ROWS // 2), Uint32)
            cols = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
            cols.fill(0)
            prev = Uint32(0)
            for i in cutlass.range_constexpr(LANE_ROWS):
                _load_row(ring_words, slot, i, lane, frag)
                m = Uint32(0)
                for j in cutlass.range_constexpr(4):
                    w = frag[0, j] & Uint32(_ABS_MASK_X2)
                    cols[j] = max_u16x2(cols[j], w)
                    m = max_u16x2(m, w)
                if cutlass.const_expr(i % 2 == 0):
                    prev = m
                else:  # rows i - 1 (low half) and i (high half): the max of each row's two halves
                    lo = Uint32(cute.arch.prmt(prev, m, 0x5410))
                    hi = Uint32(cute.arch.prmt(prev, m, 0x7632))
                    pairs[i // 2] = max_u16x2(lo, hi)
            for p in cutlass.range_constexpr(LANE_ROWS // 2):
                for k in cutlass.range_constexpr(2):
                    pairs[p] = max_u16x2(pairs[p], Uint32(cute.arch.shuffle_sync_bfly(pairs[p], 1 << k)))
                row_bits[2 * p] = Int32(pairs[p] << 16)
                row_bits[2 * p + 1] = Int32(pairs[p] & Uint32(0xFFFF0000))
            for j in cutlass.range_constexpr(4):
                for k in cutlass.range_constexpr(2):
                    cols[j] = max_u16x2(cols[j], Uint32(cute.arch.shuffle_sync_bfly(cols[j], 8 << k)))
                col_bits[2 * j] = Int32(cols[j] << 16)
                col_bits[2 * j + 1] = Int32(cols[j] & Uint32(0xFFFF0000))
        else:
            col_bits.fill(0)
            for i in cutlass.range_constexpr(LANE_ROWS):
                _load_row(ring_words, slot, i, lane, frag)
                m = Int32(0)
                for c in cutlass.range_constexpr(LANE_COLS):
                    a = Int32(frag[c // 4, c % 4]) & Int32(_ABS_MASK)
                    col_bits[c] = cutlass.max(col_bits[c], a)
                    m = cutlass.max(m, a)
                for k in cutlass.range_constexpr(2):
                    m = cutlass.max(m, cute.arch.shuffle_sync_bfly(m, 1 << k))
                row_bits[i] = m
            for c in cutlass.range_constexpr(LANE_COLS):
                for k in cutlass.range_constexpr(2):
                    col_bits[c] = cutlass.max(col_bits[c], cute.arch.shuffle_sync_bfly(col_bits[c], 8 << k))

    @cute.jit
    def _shared_scales(
        bits: cute.Tensor, own: Int32, first_lane: Int32, lane_step: cutlass.Constexpr, live, inv
    ):
        """Scales of the 8 blocks whose maxima ``bits`` the 4 lanes ``first_lane + lane_step * p``
        (p = 0..3) share: lane p computes those of blocks ``2 own``, ``2 own + 1`` (``own`` = p) and
        returns their bytes (0 where not ``live``: padding); the inverse scales of all 8 reach every
        lane of the 4 through shuffles (``inv``)."""
        lo, hi = bits[0], bits[1]
        for p in cutlass.range_constexpr(1, LANE_ROWS // 2):
            if own == p:
                lo, hi = bits[2 * p], bits[2 * p + 1]
        s_lo, s_hi = e8m0_scale(lo, mode), e8m0_scale(hi, mode)
        if not live:
            s_lo, s_hi = Int32(0), Int32(0)
        inv_lo, inv_hi = inverse_scale(s_lo), inverse_scale(s_hi)
        if cutlass.const_expr(inv is not None):
            for i in cutlass.range_constexpr(LANE_ROWS):
                mine = inv_lo if i % 2 == 0 else inv_hi
                inv[i] = cute.arch.shuffle_sync(mine, first_lane + lane_step * (i // 2))
        return s_lo, s_hi, inv_lo, inv_hi

    @cute.jit
    def _unpack_row(frag: cute.Tensor, values: cute.Tensor, r: cutlass.Constexpr):
        """Row ``r`` of ``values`` (2, 8) fp32 from a fragment row of raw words (exact)."""
        for c in cutlass.range_constexpr(LANE_COLS):
            if cutlass.const_expr(packed):
                w = frag[0, c // 2]
                if cutlass.const_expr(c % 2 == 0):
                    bits = w << 16
                else:
                    bits = w & Uint32(0xFFFF0000)
            else:
                bits = frag[c // 4, c % 4]
            values[r, c] = bits.bitcast(Float32)

    @cute.jit
    def _stage_q_offset(row, byte):
        """Byte of the q staging tile (TILE_M x TILE_K, row-major) holding (row, byte): bit 6 of the
        offset flipped on odd 8-row bands, so a warp's stores of 4 rows x 64 bytes (rows 8 apart)
        take the 2 bank passes they need, not 4."""
        return (row * TILE_K + byte) ^ (((row >> 3) & 1) << 6)

    @cute.jit
    def _stage_qt_offset(row, byte):
        """Byte of the q^T staging tile (TILE_K x TILE_M, row-major) holding (row, byte), 16-byte
        chunks permuted by the row's 8-row band: a warp's stores of 8 rows x 32 bytes are
        conflict-free."""
        return row * TILE_M + (byte ^ (((row >> 3) & 7) << 4))

    @cute.jit
    def _store_staged(
        stage: cute.Tensor,
        transposed: cutlass.Constexpr,
        out_words: cute.Tensor,
        out_row0,
        out_col0,
        rows_valid,
        cols_valid,
        tid,
    ):
        """Copy the staged q tile (TILE_M x TILE_K bytes) or q^T tile (``transposed``: TILE_K x
        TILE_M) to ``out_words`` at byte ``(out_row0, out_col0)`` in 16-byte chunks, 8 threads per
        128 bytes. Row ``r`` is stored when ``out_row0 + r < rows_valid``, the chunk at byte ``b``
        when ``out_col0 + b < cols_valid``."""
        width = TILE_M if transposed else TILE_K
        chunks_per_row = width // 16
        chunk4 = cute.make_tensor(stage.iterator, cute.make_layout((cute.size(stage) // 4, 4), stride=(4, 1)))
        words = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
        for k in cutlass.range_constexpr(cute.size(stage) // 4 // (32 * warps)):
            n = tid + k * 32 * warps
            row, byte = n // chunks_per_row, (n % chunks_per_row) * 16
            offset = _stage_q_offset(row, byte)
            if cutlass.const_expr(transposed):
                offset = _stage_qt_offset(row, byte)
            cute.autovec_copy(chunk4[offset // 16, None], words)
            if out_row0 + row < rows_valid and out_col0 + byte < cols_valid:
                cute.autovec_copy(
                    words, cute.local_tile(out_words[out_row0 + row, None], (4,), ((out_col0 + byte) // 16,))
                )

    @cute.jit
    def _convert_rows(ring_words, slot, lane, inv_lo, inv_hi, stage, tile_row, tile_col):
        """1x32-quantize this lane's fragment and put each row's 8 bytes of q into the staging tile
        at ``(tile_row + i, tile_col)``. A rolled loop: row i's inverse scale comes from lane ``i // 2`` of
        the 1x32 block's 4 (``inv_lo`` / ``inv_hi``: this lane's rows ``2 (lane % 4)``, ``+ 1``)."""
        frag = cute.make_rmem_tensor(cute.make_layout((chunks, 4), stride=(4, 1)), Uint32)
        values = cute.make_rmem_tensor(cute.make_layout((1, LANE_COLS), stride=(LANE_COLS, 1)), Float32)
        first_lane = lane - lane % ROW_BLOCK_LANES
        pairs = cute.make_tensor(stage.iterator, cute.make_layout((cute.size(stage) // 2, 2), stride=(2, 1)))
        for i in cutlass.range(LANE_ROWS, unroll=2):
            mine = inv_lo
            if i % 2 == 1:
                mine = inv_hi
            inv = cute.arch.shuffle_sync(mine, first_lane + i // 2)
            for h in cutlass.range_constexpr(chunks):
                cute.autovec_copy(ring_words[slot, i, h, lane, None], frag[h, None])
            _unpack_row(frag, values, 0)
            q_frag = cute.make_rmem_tensor(cute.make_layout(2), Uint32)
            for h in cutlass.range_constexpr(2):
                q_frag[h] = e4m3x4(
                    values[0, 4 * h] * inv,
                    values[0, 4 * h + 1] * inv,
                    values[0, 4 * h + 2] * inv,
                    values[0, 4 * h + 3] * inv,
                )
            cute.autovec_copy(q_frag, pairs[_stage_q_offset(tile_row + i, tile_col) // 8, None])

    @cute.jit
    def _convert_cols(ring_words, slot, lane, inv_c, stage, tile_row, tile_col):
        """32x1-quantize this lane's fragment and put each column's 8 bytes of q^T into the staging
        tile at ``(tile_col + c, tile_row)``. Rows are taken two at a time: each column's pair of E4M3 bytes
        goes into its q^T word right away."""
        frag = cute.make_rmem_tensor(cute.make_layout((chunks, 4), stride=(4, 1)), Uint32)
        qt_frag = cute.make_rmem_tensor(cute.make_layout((LANE_COLS, 2), stride=(2, 1)), Uint32)
        qt_frag.fill(0)
        for pr in cutlass.range_constexpr(LANE_ROWS // 2):
            values = cute.make_rmem_tensor(cute.make_layout((2, LANE_COLS), stride=(LANE_COLS, 1)), Float32)
            for r in cutlass.range_constexpr(2):
                _load_row(ring_words, slot, 2 * pr + r, lane, frag)
                _unpack_row(frag, values, r)
            for c in cutlass.range_constexpr(LANE_COLS):
                qt_frag[c, pr // 2] = e4m3x2_into(
                    qt_frag[c, pr // 2], pr % 2 == 1, values[0, c] * inv_c[c], values[1, c] * inv_c[c]
                )
        pairs = cute.make_tensor(stage.iterator, cute.make_layout((cute.size(stage) // 2, 2), stride=(2, 1)))
        for c in cutlass.range_constexpr(LANE_COLS):
            cute.autovec_copy(qt_frag[c, None], pairs[_stage_qt_offset(tile_col + c, tile_row) // 8, None])

    @cute.jit
    def _store_plain_scales(scale_bytes, scale_bytes_t, row_scales, col_scales, lane, lane_row, col0, live):
        """Plain layouts: store this lane's 2 row scales (x rows ``lane_row + 2 p``, ``+ 1``, p = lane
        % 4; ``lane_row``: the lane fragment's first row) and 2 column scales (x columns ``col0 + 2
        r``, ``+ 1``, r = lane // 8) as bytes, when ``live`` (inside x)."""
        if live:
            row = lane_row + 2 * (lane % ROW_BLOCK_LANES)
            col = col0 + 2 * (lane // COL_LANES)
            for h in cutlass.range_constexpr(2):
                scale_bytes[row + h, col0 // BLOCK_SIZE] = Uint8(row_scales[h])
                scale_bytes_t[col + h, lane_row // BLOCK_SIZE] = Uint8(col_scales[h])

    @cute.jit
    def _stage_scales(stage_s: cute.Tensor, row_scales, col_scales, lane, tile_row, lane_col, covered):
        """Put this lane's 2 row scales (rows ``tile_row + 2 p``, ``+ 1``, p = lane % 4; 0 when not
        ``covered``) and 2 column scales (columns ``lane_col + 2 r``, ``+ 1``, r = lane // 8) at their
        places in the staged blocked tiles ``stage_s`` (bytes): the step's 1x32 scales (128 rows x 4
        blocks) in bytes 0..511, its 32x1 scales (128 columns x 4 row blocks) in 512..1023."""
        first = blocked_row_offset(tile_row + 2 * (lane % ROW_BLOCK_LANES)) + lane_col // BLOCK_SIZE
        first_t = TILE_BYTES + blocked_row_offset(lane_col + 2 * (lane // COL_LANES)) + tile_row // BLOCK_SIZE
        for h in cutlass.range_constexpr(2):  # rows (columns) 2 p, 2 p + 1: one 32-row band, 16 bytes apart
            value = Uint8(row_scales[h])
            if not covered:
                value = Uint8(0)
            stage_s[first + 16 * h] = value
            stage_s[first_t + 16 * h] = Uint8(col_scales[h])

    @cute.jit
    def _store_scale_tiles(
        stage_s: cute.Tensor, scale_chunks, scale_chunks_t, row_base, col_base, covered, tid
    ):
        """Threads 0..31 copy the staged 1x32 tile to byte ``row_base`` of the 1x32 scales, threads
        32..63 the 32x1 tile to byte ``col_base`` of the 32x1 scales (when ``covered``): one 16-byte
        store each (``scale_chunks*``: (bytes / 16, 4) Uint32 views).

        Grouped: the M-groups scales have ``M + 128 G`` rows, not a multiple of 128 when M is not,
        so the last row tile (past every group: zeros) is cut at the tensor's end. Its size is a
        multiple of 16 bytes (M % 32 == 0, Cp % 4 == 0): a chunk is wholly inside or outside."""
        staged = cute.make_tensor(
            cute.recast_ptr(stage_s.iterator, dtype=Uint32),
            cute.make_layout((2 * CHUNKS_PER_TILE, 4), stride=(4, 1)),
        )
        words = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
        chunk = row_base // CHUNK_BYTES + tid
        inside = True
        if cutlass.const_expr(grouped):
            inside = chunk < scale_chunks.shape[0]
        if tid < CHUNKS_PER_TILE and inside:
            cute.autovec_copy(staged[tid, None], words)
            cute.autovec_copy(words, scale_chunks[chunk, None])
        if tid >= CHUNKS_PER_TILE and tid < 2 * CHUNKS_PER_TILE and covered:
            cute.autovec_copy(staged[tid, None], words)
            cute.autovec_copy(words, scale_chunks_t[col_base // CHUNK_BYTES + tid - CHUNKS_PER_TILE, None])

    @cute.jit
    def _quantize_tile(
        ring_words,
        slot,
        lane,
        inv_r0,
        inv_r1,
        inv_c,
        stage_q,
        stage_qt,
        tile_row,
        lane_col,
        q_words,
        qt_words,
        row0,
        col0,
        cols,
        tid,
        rows_end,
        has_rows,
        scale_tiles,
    ):
        """Quantize the ring's tile both ways into the staging tiles, then store q rows ``row0 ..
        rows_end - 1`` (columns from ``col0``) and the matching q^T columns (a CTA barrier between,
        and one after: the staging tiles are free again). Nothing but the staged scales when not
        ``has_rows``; ``scale_tiles``: the arguments of :func:`_store_scale_tiles` after ``stage_s``,
        ``None`` when the scales were stored already."""
        if has_rows:
            cute.arch.sync_warp()  # a memory fence: the tile is read again, not kept in registers
            _convert_rows(ring_words, slot, lane, inv_r0, inv_r1, stage_q, tile_row, lane_col)
            cute.arch.sync_warp()
            _convert_cols(ring_words, slot, lane, inv_c, stage_qt, tile_row, lane_col)
        cute.arch.sync_threads()  # the staged tiles are complete
        if has_rows:
            _store_staged(stage_q, False, q_words, row0, col0, rows_end, cols, tid)
            _store_staged(stage_qt, True, qt_words, col0, row0, cols, rows_end, tid)
        if cutlass.const_expr(scale_tiles is not None):
            _store_scale_tiles(*scale_tiles, tid)
        cute.arch.sync_threads()

    @cute.jit
    def _group_tile(scratch: cute.Tensor, offsets, scales_t, tid, row_tile, rows):
        """Group scan (in 128-row units: the M-groups blocks and the K-groups 4-column runs alike;
        every thread calls it) and the CTA's group-aligned row tile ``row_tile``: ``(first row,
        rows 0..128, placed)`` with ``placed`` = (covered, base, stride): ``covered`` false for rows
        past every group (1x32 scales 0, no 32x1 scales), the step at column tile ``j`` puts its 32x1
        tile at byte ``base + j * stride`` (M-groups numbering: the tile is block ``row_tile`` of the
        1x32 scales and one 4-column word run of its group's 32x1 scales). Also zeroes the K-groups
        bytes past the last group (a grid-stride loop over all CTAs)."""
        words = prefix_smem_words(MAX_GROUPS)
        base = cute.recast_ptr(scratch.iterator, dtype=Int32)
        first_row, tile_rows, covered, group_prefix, next_prefix, covered_blocks = group_row_tile(
            offsets,
            offsets.shape[0],
            rows,
            row_tile,
            tid,
            32 * warps,
            cute.make_tensor(base, cute.make_layout(words)),
            cute.make_tensor(base + words, cute.make_layout(words)),
            cute.make_tensor(base + 2 * words, cute.make_layout(warps)),
        )
        scale_rows_t, scale_cols_t = scales_t.shape
        col_base, col_stride = k_groups_tile_column(group_prefix, next_prefix, row_tile, scale_rows_t)
        grid_x, grid_y, grid_z = cute.arch.grid_dim()
        bx, by, bz = cute.arch.block_idx()
        cta = (bz * grid_y + by) * grid_x + bx
        zero_fill_chunks(
            cute.make_tensor(
                cute.recast_ptr(scales_t.iterator, dtype=Uint32), cute.make_layout(cute.size(scales_t) // 4)
            ),
            cutlass.min(scale_rows_t * TILE_COLS * covered_blocks, scale_rows_t * scale_cols_t),
            scale_rows_t * scale_cols_t,
            cta * 32 * warps + tid,
            grid_x * grid_y * grid_z * 32 * warps,
        )
        # Garbage offsets (group sizes not multiples of 32) must still give aligned, in-bounds rows.
        first_row = first_row - first_row % BLOCK_SIZE
        tile_rows = cutlass.min(tile_rows, rows - first_row)
        return first_row, tile_rows, (covered, col_base, col_stride)

    @cute.kernel
    def dual_kernel(
        x: cute.Tensor,
        q: cute.Tensor,
        scales: cute.Tensor,
        qt: cute.Tensor,
        scales_t: cute.Tensor,
        offsets,
        tiles_per_cta: Int32,
    ):
        tid, _, _ = cute.arch.thread_idx()
        col_chunk, row_tile, row_tile_hi = cute.arch.block_idx()
        row_tile = row_tile + row_tile_hi * MAX_GRID_Y
        rows, cols = x.shape
        if cutlass.const_expr(config.spread_rows):  # q^T rows are M bytes apart
            row_tile = spread_row_tile(row_tile, _row_tiles(scales), rows)
        lane, warp = tid % 32, tid // 32
        col_tiles = _col_tiles(cols)
        warp_row = (warp % WARPS_M) * BLOCK_SIZE  # the warp's 32x1 block within the tile
        lane_col = (warp // WARPS_M) * WARP_COLS + (lane % COL_LANES) * LANE_COLS  # within a tile
        lane_row = row_tile * TILE_M + warp_row + (lane // COL_LANES) * LANE_ROWS  # fragment's first row
        rows_live = row_tile * TILE_M + warp_row < rows

        smem = SmemAllocator()
        ring_layout = cute.make_ordered_layout(
            (warps, stages, LANE_ROWS, chunks, 32, 4), order=(5, 4, 3, 2, 1, 0)
        )
        ring_all = smem.allocate_tensor(Uint32, ring_layout, byte_alignment=128)
        ring_words = ring_all[warp, None, None, None, None, None]
        # The q and q^T staging tiles; the group scan's arrays use the same bytes before the first tile.
        stage_words = TILE_M * TILE_K // 4
        scan_words = 2 * prefix_smem_words(MAX_GROUPS) + warps if grouped else 0
        scale_stage_words = 2 * TILE_BYTES // 4 if blocked or grouped else 0
        stage_all = smem.allocate_tensor(
            Uint32, cute.make_layout(max(2 * stage_words + scale_stage_words, scan_words)), byte_alignment=128
        )
        stage_q = cute.make_tensor(stage_all.iterator, cute.make_layout(stage_words))
        stage_qt = cute.make_tensor(stage_all.iterator + stage_words, cute.make_layout(stage_words))
        stage_s = cute.make_tensor(
            cute.recast_ptr(stage_all.iterator + 2 * stage_words, dtype=Uint8),
            cute.make_layout(2 * TILE_BYTES),
        )
        ring = cute.make_tensor(
            cute.recast_ptr(ring_words.iterator, dtype=dtype),
            cute.make_ordered_layout((stages, LANE_ROWS, chunks, 32, chunk_elems), order=(4, 3, 2, 1, 0)),
        )
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128
        )
        x_chunks = cute.make_tensor(
            x.iterator,
            cute.make_layout(
                (rows, cols // chunk_elems, chunk_elems), stride=(x.layout.stride[0], chunk_elems, 1)
            ),
        )
        q_words = cute.make_tensor(
            cute.recast_ptr(q.iterator, dtype=Uint32),
            cute.make_layout((rows, cols // 4), stride=(cols // 4, 1)),
        )
        qt_words = cute.make_tensor(
            cute.recast_ptr(qt.iterator, dtype=Uint32),
            cute.make_layout((cols, rows // 4), stride=(rows // 4, 1)),
        )
        scale_bytes = cute.make_tensor(
            cute.recast_ptr(scales.iterator, dtype=Uint8),
            cute.make_layout(scales.shape, stride=(scales.shape[1], 1)),
        )
        scale_bytes_t = cute.make_tensor(
            cute.recast_ptr(scales_t.iterator, dtype=Uint8),
            cute.make_layout(scales_t.shape, stride=(scales_t.shape[1], 1)),
        )
        scale_chunks, scale_chunks_t = (
            cute.make_tensor(
                cute.recast_ptr(t.iterator, dtype=Uint32),
                cute.make_layout((cute.size(t) // CHUNK_BYTES, 4), stride=(4, 1)),
            )
            for t in (scales, scales_t)
        )

        first_tile = col_chunk * tiles_per_cta
        units = cutlass.max(cutlass.min(first_tile + tiles_per_cta, col_tiles) - first_tile, 0)
        # The CTA's rows: 128 from ``128 row_tile`` (grouped: the group-aligned tile of the scan).
        first_row = row_tile * TILE_M
        tile_rows = cutlass.min(rows - first_row, TILE_M)
        placed = None  # ungrouped: derived from row_tile where the scales are staged
        if cutlass.const_expr(grouped):
            first_row, tile_rows, placed = _group_tile(stage_all, offsets, scales_t, tid, row_tile, rows)
            lane_row = first_row + warp_row + (lane // COL_LANES) * LANE_ROWS
            rows_live = warp_row < tile_rows
        for u in cutlass.range_constexpr(ahead):
            _issue(atom, x_chunks, ring, u, units, first_tile, lane_row, lane_col, rows_live, cols)
        row_bits = cute.make_rmem_tensor(cute.make_layout(LANE_ROWS), Int32)
        col_bits = cute.make_rmem_tensor(cute.make_layout(LANE_COLS), Int32)
        inv_c = cute.make_rmem_tensor(cute.make_layout(LANE_COLS), Float32)
        for u in cutlass.range(units, unroll=1):
            _issue(atom, x_chunks, ring, u + ahead, units, first_tile, lane_row, lane_col, rows_live, cols)
            cute.arch.cp_async_wait_group(ahead)
            slot = u % stages
            tile = first_tile + u
            col0 = tile * TILE_K + lane_col
            live = rows_live and col0 < cols
            _block_maxima(ring_words, slot, lane, row_bits, col_bits)
            s_r0, s_r1, inv_r0, inv_r1 = _shared_scales(
                row_bits, lane % ROW_BLOCK_LANES, lane - lane % ROW_BLOCK_LANES, 1, live, None
            )
            s_c0, s_c1, _, _ = _shared_scales(
                col_bits, lane // COL_LANES, lane % COL_LANES, COL_LANES, live, inv_c
            )
            row_scales, col_scales = (s_r0, s_r1), (s_c0, s_c1)
            # Recomputed per tile, not kept from the prologue: one register fewer across the loop
            # (the fp32 variants spill at the 80-register cap otherwise).
            tile_row = lane_row - first_row
            scale_tiles = None
            if cutlass.const_expr(blocked or grouped):
                covered, base, stride = (
                    True,
                    row_tile * TILE_BYTES,
                    (scales_t.shape[1] // TILE_COLS) * TILE_BYTES,
                )
                if cutlass.const_expr(grouped):
                    covered, base, stride = placed
                _stage_scales(stage_s, row_scales, col_scales, lane, tile_row, lane_col, covered)
                row_base = (row_tile * (scales.shape[1] // TILE_COLS) + tile) * TILE_BYTES
                scale_tiles = (stage_s, scale_chunks, scale_chunks_t, row_base, base + tile * stride, covered)
            else:
                _store_plain_scales(
                    scale_bytes, scale_bytes_t, row_scales, col_scales, lane, lane_row, col0, live
                )
            rows_end, has_rows = rows, True
            if cutlass.const_expr(grouped):  # tiles past every group's rows only write their zero scales
                rows_end, has_rows = first_row + tile_rows, tile_rows > 0
            _quantize_tile(
                ring_words, slot, lane, inv_r0, inv_r1, inv_c, stage_q, stage_qt, tile_row, lane_col,
                q_words, qt_words, first_row, tile * TILE_K, cols, tid, rows_end, has_rows, scale_tiles,
            )  # fmt: skip

    @cute.jit
    def launch(
        x: cute.Tensor,
        q: cute.Tensor,
        scales: cute.Tensor,
        qt: cute.Tensor,
        scales_t: cute.Tensor,
        offsets,
        stream,
    ):
        rows, cols = x.shape
        row_tiles = _row_tiles(scales)
        col_tiles = _col_tiles(cols)
        tiles_per_cta = cutlass.min(col_tiles, config.tiles_per_cta)
        chunks = ceil_div(col_tiles, tiles_per_cta)
        dual_kernel(x, q, scales, qt, scales_t, offsets, tiles_per_cta).launch(
            grid=chunk_major_grid(row_tiles, chunks),
            block=[32 * warps, 1, 1],
            stream=stream,
            min_blocks_per_mp=config.min_ctas_per_sm,
            preferred_smem_carveout=100 if config.min_ctas_per_sm else None,
        )

    return launch


def fake_arguments(dtype_name: str, layout: ScaleLayout):
    """Fake tensors for ``launch`` (M, K multiples of 32 and the scale shapes symbolic) and the env
    stream."""
    rows, cols = cute.sym_int(divisibility=BLOCK_SIZE), cute.sym_int(divisibility=BLOCK_SIZE)
    x = cute.runtime.make_fake_compact_tensor(
        DTYPES[dtype_name], (rows, cols), stride_order=(1, 0), assumed_align=16
    )
    q = cute.runtime.make_fake_compact_tensor(
        Float8E4M3FN, (rows, cols), stride_order=(1, 0), assumed_align=16
    )
    qt = cute.runtime.make_fake_compact_tensor(
        Float8E4M3FN, (cols, rows), stride_order=(1, 0), assumed_align=16
    )

    def scale_tensor():
        shape = (cute.sym_int(), cute.sym_int())
        return cute.runtime.make_fake_compact_tensor(
            Float8E8M0FNU, shape, stride_order=(1, 0), assumed_align=16
        )

    offsets = None
    if layout is ScaleLayout.GROUPS:
        offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, q, scale_tensor(), qt, scale_tensor(), offsets, stream


def compile_quantize_dual(
    dtype_name: str,
    mode: str,
    layout: ScaleLayout,
    arch: str,
    config: DualConfig | None = None,
    options: str = "",
):
    """``cute.compile`` the launcher for one variant on ``arch`` (TVM-FFI, env stream)."""
    config = config or (GROUP_CONFIGS if layout is ScaleLayout.GROUPS else CONFIGS)[arch][dtype_name]
    launch = make_quantize_dual(dtype_name, mode, layout, config)
    return compile_tvm_ffi(launch, fake_arguments(dtype_name, layout), arch, options)


def variants() -> list[tuple[str, str, ScaleLayout]]:
    """Every (dtype, mode, scale layout) variant the bindings may ask for."""
    return [(d, m, layout) for d in DTYPES for m in MODES for layout in ScaleLayout]


def sass_targets() -> dict:
    """SASS-inspection targets: ``quantize_dual_<dtype>_<mode>_<layout>`` -> build(arch)."""
    from cute_utils.sass import compile_options

    def target(dtype_name: str, mode: str, layout: ScaleLayout):
        return lambda arch: compile_quantize_dual(
            dtype_name, mode, layout, arch, options=compile_options(arch)
        )

    return {f"quantize_dual_{d}_{m}_{layout.value}": target(d, m, layout) for d, m, layout in variants()}
