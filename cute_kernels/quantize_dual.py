"""``quantize_mxfp8_2d_dual``: the 1x32 and the 32x1 MXFP8 quantizations of x from one read.

x (M, K) bf16/fp32, M and K multiples of 32, gives

- ``q`` (M, K) E4M3 row-major and its 1x32 scales S = (M, K/32): 32 consecutive elements of a row;
- ``qt``: the 32x1 result (M, K) E4M3 with strides (1, M) (in memory q_32x1^T (K, M) row-major)
  and its 32x1 scales S^T = (K, M/32): 32 consecutive rows of a column.

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
registers would leave as 32-byte pieces per warp (one 32x1 block of rows): slower.
The blocked and grouped scale bytes are staged the same way (1 KiB: one blocked tile of each scale
matrix per step) and leave as 64 16-byte stores; byte stores from every lane were slower
(notes/quantize-dual-kernel.md).
With ``DualConfig.spread_rows`` (the bf16 configs) CTAs take their 128-row tiles in
:func:`~cute_utils.occupancy.spread_row_tile` order: where M is a multiple of 2^17, two runs of tiles
at once, so the q^T lines written at once lie at two places of each q^T row (faster there,
notes/quantize-dual-row-order.md).
Grouped CTAs find their tile with a group scan (up to 32 groups a warp scan in registers, more in
shared memory, in the staging bytes) before their first load. An L2 prefetch of guessed rows
during the scan gained with 2 tiles per CTA but lost with one (same note).

Loads go through a per-lane ``cp.async`` ring in shared memory (``stages`` tiles per warp; each
lane reads back only what it copied, so completion is its own ``wait_group``, no barrier). A tile
is read from shared memory three times rather than kept in registers (80 registers: 3 CTAs per SM):
for both block maxima (bf16: packed 16-bit max on the magnitudes, two rows per word), for q (a
rolled loop over rows) and for q^T. Every element is converted to fp32 exactly and quantized with
``cvt.rn.satfinite.e4m3x2.f32``, pairs along K for q and along M for q^T (no byte transposes).

Code shape (:class:`QuantizeDualKernel`, see ``cute_kernels.base``): one kernel object per
(:class:`DualVariant`, :class:`DualConfig`); ``__call__`` launches ``kernel``, which builds three
small state objects once (:class:`_Cta`: the CTA's tile and this lane's place in it; :class:`_Smem`:
the shared-memory ring and staging tiles; :class:`_Gmem`: the global views) and runs one
:meth:`~QuantizeDualKernel._step` per column tile, each ending in
:meth:`~QuantizeDualKernel._quantize_tile` with that tile's :class:`_Step`. The configs and the
measurements behind them live in ``cute_kernels/configs/sm90.py`` (``quantize_dual``).

M, K and G are symbolic: one compile per (dtype, scaling mode, scale layout, config, arch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import QUANTIZE_MXFP8_2D_DUAL
from cute_utils.blocked import (
    CHUNK_BYTES,
    CHUNKS_PER_TILE,
    TILE_BYTES,
    TILE_COLS,
    TILE_ROWS,
    blocked_row_offset,
    blocked_tile_index,
    ceil_div,
)
from cute_utils.constants import MAX_GROUPS
from cute_utils.group_tiles import group_row_tile, k_groups_tile_column, zero_k_groups_tail
from cute_utils.groups import prefix_smem_words
from cute_utils.mx import (
    BLOCK_SIZE,
    bf16_high,
    bf16_high_bits,
    bf16_low,
    bf16_low_bits,
    bf16_pair_max,
    bf16x2_magnitudes,
    e4m3x2_into,
    e4m3x4,
    e8m0_scale,
    inverse_scale,
    lane_group_max_u16x2,
    max_u16x2,
)
from cute_utils.occupancy import MAX_GRID_Y, chunk_major_grid, spread_row_tile
from cute_utils.smem import storage_struct

from .base import WARP, Kernel, LoadsInFlight, ring_units_in_flight

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


class ScaleLayout(str, Enum):
    PLAIN = "plain"
    BLOCKED = "blocked"
    GROUPS = "groups"  # row groups: M-groups 1x32 scales, K-groups 32x1 scales


@dataclass(frozen=True)
class DualConfig:
    """``stages``: tiles in a warp's shared-memory ring (``stages - 1`` in flight while one
    converts); ``tiles_per_cta``: column tiles a CTA converts in turn (its grid is 128-row tiles x
    runs of that many column tiles); ``min_ctas_per_sm``: register cap (0: none); ``spread_rows``:
    CTAs take their row tiles in :func:`~cute_utils.occupancy.spread_row_tile` order (else in order).

    Each arch's choice and the measurements behind it: ``cute_kernels/configs/sm90.py``
    (``quantize_dual``; tuner ``python -m bench.tune quantize_dual``)."""

    stages: int = 1
    tiles_per_cta: int = 1
    min_ctas_per_sm: int = 3
    spread_rows: bool = True

    def __post_init__(self) -> None:
        if self.stages < 1 or self.tiles_per_cta < 1:
            raise ValueError(f"stages={self.stages} and tiles_per_cta={self.tiles_per_cta} must be >= 1")


@dataclass(frozen=True)
class DualVariant:
    """Compile-time choices: ``dtype`` (a :data:`DTYPES` name), ``mode`` (a :data:`MODES` name: the
    E8M0 scale rounding) and ``layout`` (of both scale matrices)."""

    dtype: str
    mode: str
    layout: ScaleLayout


class _Cta(NamedTuple):
    """The CTA's work and this thread's place in it (made once in ``kernel``)."""

    tid: Any  # thread in the CTA, 0..255
    lane: Any  # lane in the warp
    row_tile: Any  # the CTA's 128-row tile (after the spread order)
    first_row: Any  # x row of the tile's row 0 (grouped: the group-aligned tile's)
    tile_rows: Any  # rows of the tile inside x (grouped: inside its group), may be <= 0
    first_tile: Any  # the CTA's first column tile
    units: Any  # column tiles the CTA converts
    lane_row: Any  # x row of this lane fragment's row 0
    lane_col: Any  # column of this lane fragment's column 0 within a column tile
    rows_live: Any  # whether this warp's rows lie inside x (grouped: inside the tile)
    rows: Any  # M
    cols: Any  # K
    placed: Any  # grouped: (covered, base, stride) of the 32x1 scale tiles (:meth:`_group_tile`); else None


class _Smem(NamedTuple):
    """Shared-memory views (made once in ``kernel``)."""

    ring: cute.Tensor  # this warp's ring in x's dtype: (stages, LANE_ROWS, chunks, 32, chunk_elems)
    ring_words: cute.Tensor  # the same bytes as Uint32: (stages, LANE_ROWS, chunks, 32, 4)
    stage_all: cute.Tensor  # all the staging words (the group scan's scratch before the first tile)
    stage_q: cute.Tensor  # q staging tile, TILE_M x TILE_K bytes as Uint32 words
    stage_qt: cute.Tensor  # q^T staging tile, TILE_K x TILE_M bytes as Uint32 words
    stage_s: cute.Tensor  # staged blocked scale tiles: 2 x TILE_BYTES bytes


class _Gmem(NamedTuple):
    """The copy atom and the global-memory views (made once in ``kernel``)."""

    atom: Any  # 16-byte cp.async, global -> shared
    x_chunks: cute.Tensor  # x as (M, K / chunk_elems, chunk_elems)
    q_words: cute.Tensor  # q as (M, K / 4) Uint32
    qt_words: cute.Tensor  # q^T as (K, M / 4) Uint32
    scale_bytes: cute.Tensor  # 1x32 scales as Uint8, their shape
    scale_bytes_t: cute.Tensor  # 32x1 scales as Uint8, their shape
    scale_chunks: cute.Tensor  # 1x32 scales as (bytes / 16, 4) Uint32
    scale_chunks_t: cute.Tensor  # 32x1 scales as (bytes / 16, 4) Uint32
    scales: cute.Tensor  # the 1x32 scales (their shape places the blocked tiles)
    scales_t: cute.Tensor  # the 32x1 scales


class _ScaleTiles(NamedTuple):
    """Where a step's staged blocked scale tiles go (:meth:`QuantizeDualKernel._store_scale_tiles`)."""

    row_base: Any  # byte of the 1x32 tile in the 1x32 scales
    col_base: Any  # byte of the 32x1 tile in the 32x1 scales
    covered: Any  # whether the 32x1 tile is stored (grouped: rows inside a group)


class _Step(NamedTuple):
    """One column tile's conversion (:meth:`QuantizeDualKernel._quantize_tile`)."""

    slot: Any  # ring slot holding the tile
    inv_r0: Any  # inverse scale of this lane's row 2 (lane % 4) (its 1x32 block)
    inv_r1: Any  # ... and of row 2 (lane % 4) + 1
    inv_c: cute.Tensor  # inverse scales of this lane's 8 columns (Float32 registers)
    tile_row: Any  # this lane fragment's row 0 within the tile
    col0: Any  # x column of the tile's column 0
    rows_end: Any  # q rows stored: up to here
    has_rows: Any  # whether the tile has rows (grouped: else only its zero scales are written)
    scale_tiles: Any  # :class:`_ScaleTiles`, or None when the scales were stored already (plain)


def _col_tiles(cols):
    """CTA steps along K: up to K rounded to 128, so each blocked tile is written whole."""
    return ceil_div(cols, TILE_K)


def _row_tiles(scales):
    """128-row tiles of the grid: those of the 1x32 scales' rows (M-groups: 128 G rows past M)."""
    return ceil_div(scales.shape[0], TILE_M)


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


def _stage_words(layout: ScaleLayout, warps: int) -> int:
    """Words of the staging area: the q and q^T tiles and, for blocked or grouped scales, their two
    scale tiles; the group scan's arrays (two prefix arrays and a word per warp) share its bytes."""
    tiles = 2 * (TILE_M * TILE_K // 4)
    scale_tiles = 2 * TILE_BYTES // 4 if layout is not ScaleLayout.PLAIN else 0
    scan = 2 * prefix_smem_words(MAX_GROUPS) + warps if layout is ScaleLayout.GROUPS else 0
    return max(tiles + scale_tiles, scan)


def shared_storage(variant: DualVariant, config: DualConfig):
    """The ``@cute.struct`` of one CTA's shared memory: ``ring``, the warps' ``cp.async`` rings
    (``config.stages`` tiles of 8 x 8 fragments per lane, as words), then ``stage``
    (:func:`_stage_words`), each 128-byte aligned. Its size is the launch's dynamic shared memory."""
    warps = WARPS_M * WARPS_K
    chunks = LANE_COLS // (128 // DTYPES[variant.dtype].width)  # 16-byte copies per fragment row
    ring = warps * config.stages * LANE_ROWS * chunks * 32 * 4
    fields = {
        "ring": cute.struct.Align[cute.struct.MemRange[Uint32, ring], 128],
        "stage": cute.struct.Align[cute.struct.MemRange[Uint32, _stage_words(variant.layout, warps)], 128],
    }
    return storage_struct(fields)


class QuantizeDualKernel(Kernel):
    """The dual kernel of one :class:`DualVariant` and :class:`DualConfig` (module docstring).

    Launch: ``kernel(x, q, scales, qt, scales_t, offsets)`` with ``x`` (M, K) bf16/fp32 row-major,
    M and K multiples of 32, 16-byte aligned; ``q`` (M, K) Float8E4M3FN row-major and ``qt`` (M, K)
    with strides (1, M), 16-byte aligned; ``scales`` / ``scales_t`` Float8E8M0FNU: (M, K/32) /
    (K, M/32) for ``plain``, their blocked layouts (Rp, Cp) for ``blocked``, the M-groups / K-groups
    layouts for ``groups``; ``offsets``: Int32 (G,) group end rows (``groups``), else ``None``.
    """

    name = "quantize_dual"

    @classmethod
    def loads_in_flight(cls, variant: DualVariant, config: DualConfig, cols: int) -> LoadsInFlight:
        """Per lane an 8 x 8 fragment per ring unit; one stage: the tile issued, then waited for."""
        elem = DTYPES[variant.dtype].width // 8
        warps = WARPS_M * WARPS_K
        units = ring_units_in_flight(config.stages)
        return LoadsInFlight(
            WARP * warps,
            warps * WARP * units * LANE_ROWS * LANE_COLS * elem,
            f"{warps} warps x {WARP} lanes x {units} tile (stages {config.stages}: max(stages - 1, 1)) x "
            f"{LANE_ROWS} rows x {LANE_COLS} cols x {elem} B",
        )

    @classmethod
    def shared_bytes(cls, variant: DualVariant, config: DualConfig) -> int:
        """The size of :func:`shared_storage`, the struct the kernel allocates."""
        return shared_storage(variant, config).size_in_bytes()

    def __init__(self, variant: DualVariant, config: DualConfig) -> None:
        super().__init__(variant, config)
        if variant.mode not in MODES:
            raise ValueError(f"mode must be 'floor' or 'rceil', got {variant.mode!r}")
        self.dtype = DTYPES[variant.dtype]
        self.mode = variant.mode
        self.chunk_elems = 128 // self.dtype.width  # elements per 16-byte copy
        self.chunks = LANE_COLS // self.chunk_elems  # 16-byte copies per fragment row
        self.stages = config.stages
        self.ahead = config.stages - 1
        self.packed = self.dtype is BFloat16  # two values per word
        self.warps = WARPS_M * WARPS_K
        self.blocked = variant.layout is ScaleLayout.BLOCKED
        self.grouped = variant.layout is ScaleLayout.GROUPS
        self.storage = shared_storage(variant, config)

    @classmethod
    def variants(cls) -> list[DualVariant]:
        return [DualVariant(d, m, layout) for d in DTYPES for m in MODES for layout in ScaleLayout]

    @classmethod
    def target_name(cls, variant: DualVariant) -> str:
        return f"{cls.name}_{variant.dtype}_{variant.mode}_{variant.layout.value}"

    @classmethod
    def fake_arguments(cls, variant: DualVariant) -> tuple:
        """Fake tensors for ``__call__`` (M, K multiples of 32 and the scale shapes symbolic) and the
        env stream."""
        rows, cols = cute.sym_int(divisibility=BLOCK_SIZE), cute.sym_int(divisibility=BLOCK_SIZE)
        x = cute.runtime.make_fake_compact_tensor(
            DTYPES[variant.dtype], (rows, cols), stride_order=(1, 0), assumed_align=16
        )
        q = cute.runtime.make_fake_compact_tensor(
            Float8E4M3FN, (rows, cols), stride_order=(1, 0), assumed_align=16
        )
        qt = cute.runtime.make_fake_compact_tensor(  # the public 32x1 q as it is: no view per call
            Float8E4M3FN, (rows, cols), stride_order=(0, 1), assumed_align=16
        )

        def scale_tensor():
            shape = (cute.sym_int(), cute.sym_int())
            return cute.runtime.make_fake_compact_tensor(
                Float8E8M0FNU, shape, stride_order=(1, 0), assumed_align=16
            )

        offsets = None
        if variant.layout is ScaleLayout.GROUPS:
            offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return x, q, scale_tensor(), qt, scale_tensor(), offsets, stream

    @staticmethod
    def can_implement(rows: int, cols: int, num_groups: int | None = None, data_ptrs: tuple = ()) -> bool:
        """M and K multiples of 32, at most ``MAX_GROUPS`` groups (the group scan's shared-memory
        arrays), and 16-byte aligned data pointers (16-byte ``cp.async`` loads and stores)."""
        spec = QUANTIZE_MXFP8_2D_DUAL
        sizes_ok = rows % spec.divisor("x", "M") == 0 and cols % spec.divisor("x", "K") == 0
        return sizes_ok and spec.limits.accepts(num_groups, ptrs=data_ptrs)

    # ------------------------------------------------------------------------------------------
    # Host launcher and kernel
    # ------------------------------------------------------------------------------------------

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (M, K) bf16/fp32 row-major
        q: cute.Tensor,  # (M, K) Float8E4M3FN row-major
        scales: cute.Tensor,  # Float8E8M0FNU 1x32 scales: (M, K/32), (Rp, Cp) or (M + 128 G, Cp)
        qt: cute.Tensor,  # (M, K) Float8E4M3FN, strides (1, M) (read through its iterator)
        scales_t: cute.Tensor,  # Float8E8M0FNU 32x1 scales: (K, M/32), (Rp, Cp) or (Rp, M/32 + 4 G)
        offsets,  # Int32 (G,) group end rows (groups layout), else None
        stream,
    ):
        rows, cols = x.shape
        row_tiles = _row_tiles(scales)
        col_tiles = _col_tiles(cols)
        tiles_per_cta = cutlass.min(col_tiles, self.config.tiles_per_cta)
        chunks = ceil_div(col_tiles, tiles_per_cta)
        self.kernel(x, q, scales, qt, scales_t, offsets, tiles_per_cta).launch(
            grid=chunk_major_grid(row_tiles, chunks),
            block=[32 * self.warps, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=100 if self.config.min_ctas_per_sm else None,
        )

    @cute.kernel
    def kernel(
        self,
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
        if cutlass.const_expr(self.config.spread_rows):  # q^T rows are M bytes apart
            row_tile = spread_row_tile(row_tile, _row_tiles(scales), rows)
        lane, warp = tid % 32, tid // 32
        col_tiles = _col_tiles(cols)
        warp_row = (warp % WARPS_M) * BLOCK_SIZE  # the warp's 32x1 block within the tile
        lane_col = (warp // WARPS_M) * WARP_COLS + (lane % COL_LANES) * LANE_COLS  # within a tile
        lane_row = row_tile * TILE_M + warp_row + (lane // COL_LANES) * LANE_ROWS  # fragment's first row
        rows_live = row_tile * TILE_M + warp_row < rows
        smem = self._shared_memory(warp)
        gmem = self._global_views(x, q, scales, qt, scales_t)

        first_tile = col_chunk * tiles_per_cta
        units = cutlass.max(cutlass.min(first_tile + tiles_per_cta, col_tiles) - first_tile, 0)
        # The CTA's rows: 128 from ``128 row_tile`` (grouped: the group-aligned tile of the scan).
        first_row = row_tile * TILE_M
        tile_rows = cutlass.min(rows - first_row, TILE_M)
        placed = None  # ungrouped: derived from row_tile where the scales are staged
        if cutlass.const_expr(self.grouped):
            first_row, tile_rows, placed = self._group_tile(
                smem.stage_all, offsets, scales_t, tid, row_tile, rows
            )
            lane_row = first_row + warp_row + (lane // COL_LANES) * LANE_ROWS
            rows_live = warp_row < tile_rows
        cta = _Cta(
            tid, lane, row_tile, first_row, tile_rows, first_tile, units, lane_row, lane_col, rows_live,
            rows, cols, placed,
        )  # fmt: skip
        for u in cutlass.range_constexpr(self.ahead):
            self._issue(cta, smem, gmem, u)
        row_bits = cute.make_rmem_tensor(cute.make_layout(LANE_ROWS), Int32)
        col_bits = cute.make_rmem_tensor(cute.make_layout(LANE_COLS), Int32)
        inv_c = cute.make_rmem_tensor(cute.make_layout(LANE_COLS), Float32)
        for u in cutlass.range(units, unroll=1):
            self._step(cta, smem, gmem, u, row_bits, col_bits, inv_c)

    # ------------------------------------------------------------------------------------------
    # Set-up: shared memory, global views, the group scan
    # ------------------------------------------------------------------------------------------

    @cute.jit
    def _shared_memory(self, warp) -> _Smem:
        """This warp's ``cp.async`` ring and the CTA's staging tiles (q, q^T, the blocked scales),
        views of :func:`shared_storage`; the group scan's arrays use the staging bytes before the
        first tile."""
        warps, stages, chunks = self.warps, self.stages, self.chunks
        storage = SmemAllocator().allocate(self.storage)
        ring_layout = cute.make_ordered_layout(
            (warps, stages, LANE_ROWS, chunks, 32, 4), order=(5, 4, 3, 2, 1, 0)
        )
        ring_all = storage.ring.get_tensor(ring_layout)
        ring_words = ring_all[warp, None, None, None, None, None]
        stage_words = TILE_M * TILE_K // 4
        stage_all = storage.stage.get_tensor(cute.make_layout(_stage_words(self.variant.layout, warps)))
        stage_q = cute.make_tensor(stage_all.iterator, cute.make_layout(stage_words))
        stage_qt = cute.make_tensor(stage_all.iterator + stage_words, cute.make_layout(stage_words))
        stage_s = cute.make_tensor(
            cute.recast_ptr(stage_all.iterator + 2 * stage_words, dtype=Uint8),
            cute.make_layout(2 * TILE_BYTES),
        )
        ring = cute.make_tensor(
            cute.recast_ptr(ring_words.iterator, dtype=self.dtype),
            cute.make_ordered_layout(
                (stages, LANE_ROWS, chunks, 32, self.chunk_elems), order=(4, 3, 2, 1, 0)
            ),
        )
        return _Smem(ring, ring_words, stage_all, stage_q, stage_qt, stage_s)

    @cute.jit
    def _global_views(self, x, q, scales, qt, scales_t) -> _Gmem:
        """The ``cp.async`` atom and word / byte / chunk views of the global tensors."""
        chunk_elems = self.chunk_elems
        rows, cols = x.shape
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=128
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
        return _Gmem(
            atom, x_chunks, q_words, qt_words, scale_bytes, scale_bytes_t, scale_chunks, scale_chunks_t,
            scales, scales_t,
        )  # fmt: skip

    @cute.jit
    def _group_tile(self, scratch: cute.Tensor, offsets, scales_t, tid, row_tile, rows):
        """Group scan (in 128-row units: the M-groups blocks and the K-groups 4-column runs alike;
        every thread calls it) and the CTA's group-aligned row tile ``row_tile``: ``(first row,
        rows 0..128, placed)`` with ``placed`` = (covered, base, stride): ``covered`` false for rows
        past every group (1x32 scales 0, no 32x1 scales), the step at column tile ``j`` puts its 32x1
        tile at byte ``base + j * stride`` (M-groups numbering: the tile is block ``row_tile`` of the
        1x32 scales and one 4-column word run of its group's 32x1 scales). Also zeroes the K-groups
        bytes past the last group (a grid-stride loop over all CTAs)."""
        warps = self.warps
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
        zero_k_groups_tail(
            cute.make_tensor(
                cute.recast_ptr(scales_t.iterator, dtype=Uint32), cute.make_layout(cute.size(scales_t) // 4)
            ),
            scale_rows_t,
            scale_cols_t,
            covered_blocks,
            cta * 32 * warps + tid,
            grid_x * grid_y * grid_z * 32 * warps,
        )
        # Garbage offsets (group sizes not multiples of 32) must still give aligned, in-bounds rows.
        first_row = first_row - first_row % BLOCK_SIZE
        tile_rows = cutlass.min(tile_rows, rows - first_row)
        return first_row, tile_rows, (covered, col_base, col_stride)

    # ------------------------------------------------------------------------------------------
    # One column tile: loads, maxima and scales, conversion, stores
    # ------------------------------------------------------------------------------------------

    @cute.jit
    def _issue(self, cta: _Cta, smem: _Smem, gmem: _Gmem, u):
        """Start the copies of this lane's fragment of tile ``first_tile + u`` into ring slot
        ``u % stages`` (nothing past ``units`` or outside x) and commit them as one group."""
        lane = cute.arch.lane_idx()
        col0 = (cta.first_tile + u) * TILE_K + cta.lane_col
        if u < cta.units and cta.rows_live and col0 < cta.cols:
            for i in cutlass.range_constexpr(LANE_ROWS):
                for h in cutlass.range_constexpr(self.chunks):
                    cute.copy(
                        gmem.atom,
                        gmem.x_chunks[cta.lane_row + i, col0 // self.chunk_elems + h, None],
                        smem.ring[u % self.stages, i, h, lane, None],
                    )
        cute.arch.cp_async_commit_group()

    @cute.jit
    def _step(self, cta: _Cta, smem: _Smem, gmem: _Gmem, u, row_bits, col_bits, inv_c):
        """Column tile ``first_tile + u``: issue the ring's next load, wait for this one, compute the
        block maxima and scales, stage (or store, plain) the scales, then :meth:`_quantize_tile`."""
        lane = cta.lane
        self._issue(cta, smem, gmem, u + self.ahead)
        cute.arch.cp_async_wait_group(self.ahead)
        slot = u % self.stages
        tile = cta.first_tile + u
        col0 = tile * TILE_K + cta.lane_col
        live = cta.rows_live and col0 < cta.cols
        self._block_maxima(smem.ring_words, slot, lane, row_bits, col_bits)
        s_r0, s_r1, inv_r0, inv_r1 = self._shared_scales(
            row_bits, lane % ROW_BLOCK_LANES, lane - lane % ROW_BLOCK_LANES, 1, live, None
        )
        s_c0, s_c1, _, _ = self._shared_scales(
            col_bits, lane // COL_LANES, lane % COL_LANES, COL_LANES, live, inv_c
        )
        row_scales, col_scales = (s_r0, s_r1), (s_c0, s_c1)
        # Recomputed per tile, not kept from the prologue: one register fewer across the loop
        # (the fp32 variants spill at the 80-register cap otherwise).
        tile_row = cta.lane_row - cta.first_row
        scale_tiles = None
        if cutlass.const_expr(self.blocked or self.grouped):
            covered, base, stride = (
                True,
                cta.row_tile * TILE_BYTES,
                (gmem.scales_t.shape[1] // TILE_COLS) * TILE_BYTES,
            )
            if cutlass.const_expr(self.grouped):
                covered, base, stride = cta.placed
            _stage_scales(smem.stage_s, row_scales, col_scales, lane, tile_row, cta.lane_col, covered)
            tile_cols = gmem.scales.shape[1] // TILE_COLS
            row_base = blocked_tile_index(cta.row_tile, tile, tile_cols) * TILE_BYTES
            scale_tiles = _ScaleTiles(row_base, base + tile * stride, covered)
        else:
            _store_plain_scales(
                gmem.scale_bytes, gmem.scale_bytes_t, row_scales, col_scales, lane, cta.lane_row, col0, live
            )
        rows_end, has_rows = cta.rows, True
        if cutlass.const_expr(self.grouped):  # tiles past every group's rows only write their zero scales
            rows_end, has_rows = cta.first_row + cta.tile_rows, cta.tile_rows > 0
        step = _Step(slot, inv_r0, inv_r1, inv_c, tile_row, tile * TILE_K, rows_end, has_rows, scale_tiles)
        self._quantize_tile(cta, smem, gmem, step)

    @cute.jit
    def _load_row(self, ring_words: cute.Tensor, slot, i: cutlass.Constexpr, lane, frag: cute.Tensor):
        """Row ``i`` of this lane's fragment from ring slot ``slot`` into ``frag`` (chunks, 4) words."""
        for h in cutlass.range_constexpr(self.chunks):
            cute.autovec_copy(ring_words[slot, i, h, lane, None], frag[h, None])

    @cute.jit
    def _block_maxima(
        self, ring_words: cute.Tensor, slot, lane, row_bits: cute.Tensor, col_bits: cute.Tensor
    ):
        """``max |x|`` bits (fp32 bits, NaN-propagating) of this lane's 8 rows over their 1x32 blocks
        into ``row_bits`` and of its 8 columns over the warp's 32 rows into ``col_bits``."""
        frag = cute.make_rmem_tensor(cute.make_layout((self.chunks, 4), stride=(4, 1)), Uint32)
        if cutlass.const_expr(self.packed):
            pairs = cute.make_rmem_tensor(cute.make_layout(LANE_ROWS // 2), Uint32)
            cols = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
            cols.fill(0)
            prev = Uint32(0)
            for i in cutlass.range_constexpr(LANE_ROWS):
                self._load_row(ring_words, slot, i, lane, frag)
                m = Uint32(0)
                for j in cutlass.range_constexpr(4):
                    w = bf16x2_magnitudes(frag[0, j])
                    cols[j] = max_u16x2(cols[j], w)
                    m = max_u16x2(m, w)
                if cutlass.const_expr(i % 2 == 0):
                    prev = m
                else:  # rows i - 1 (low half) and i (high half): the max of each row's two halves
                    pairs[i // 2] = bf16_pair_max(prev, m)
            for p in cutlass.range_constexpr(LANE_ROWS // 2):
                pairs[p] = lane_group_max_u16x2(pairs[p], 4)
                row_bits[2 * p] = bf16_low_bits(pairs[p])
                row_bits[2 * p + 1] = bf16_high_bits(pairs[p])
            for j in cutlass.range_constexpr(4):
                for k in cutlass.range_constexpr(2):
                    cols[j] = max_u16x2(cols[j], Uint32(cute.arch.shuffle_sync_bfly(cols[j], 8 << k)))
                col_bits[2 * j] = bf16_low_bits(cols[j])
                col_bits[2 * j + 1] = bf16_high_bits(cols[j])
        else:
            col_bits.fill(0)
            for i in cutlass.range_constexpr(LANE_ROWS):
                self._load_row(ring_words, slot, i, lane, frag)
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
        self, bits: cute.Tensor, own: Int32, first_lane: Int32, lane_step: cutlass.Constexpr, live, inv
    ):
        """Scales of the 8 blocks whose maxima ``bits`` the 4 lanes ``first_lane + lane_step * p``
        (p = 0..3) share: lane p computes those of blocks ``2 own``, ``2 own + 1`` (``own`` = p) and
        returns their bytes (0 where not ``live``: padding); the inverse scales of all 8 reach every
        lane of the 4 through shuffles (``inv``)."""
        lo, hi = bits[0], bits[1]
        for p in cutlass.range_constexpr(1, LANE_ROWS // 2):
            if own == p:
                lo, hi = bits[2 * p], bits[2 * p + 1]
        s_lo, s_hi = e8m0_scale(lo, self.mode), e8m0_scale(hi, self.mode)
        if not live:
            s_lo, s_hi = Int32(0), Int32(0)
        inv_lo, inv_hi = inverse_scale(s_lo), inverse_scale(s_hi)
        if cutlass.const_expr(inv is not None):
            for i in cutlass.range_constexpr(LANE_ROWS):
                mine = inv_lo if i % 2 == 0 else inv_hi
                inv[i] = cute.arch.shuffle_sync(mine, first_lane + lane_step * (i // 2))
        return s_lo, s_hi, inv_lo, inv_hi

    @cute.jit
    def _unpack_row(self, frag: cute.Tensor, values: cute.Tensor, r: cutlass.Constexpr):
        """Row ``r`` of ``values`` (2, 8) fp32 from a fragment row of raw words (exact)."""
        for c in cutlass.range_constexpr(LANE_COLS):
            if cutlass.const_expr(self.packed):
                w = frag[0, c // 2]
                values[r, c] = bf16_low(w) if cutlass.const_expr(c % 2 == 0) else bf16_high(w)
            else:
                values[r, c] = frag[c // 4, c % 4].bitcast(Float32)

    @cute.jit
    def _quantize_tile(self, cta: _Cta, smem: _Smem, gmem: _Gmem, step: _Step):
        """Quantize the ring's tile both ways into the staging tiles, then store q rows ``first_row
        .. rows_end - 1`` (columns from ``step.col0``) and the matching q^T columns (a CTA barrier
        between, and one after: the staging tiles are free again). Nothing but the staged scales when
        not ``has_rows``; the staged scale tiles leave here unless ``step.scale_tiles`` is None."""
        if step.has_rows:
            cute.arch.sync_warp()  # a memory fence: the tile is read again, not kept in registers
            self._convert_rows(
                smem.ring_words, step.slot, cta.lane, step.inv_r0, step.inv_r1, smem.stage_q, step.tile_row,
                cta.lane_col,
            )  # fmt: skip
            cute.arch.sync_warp()
            self._convert_cols(
                smem.ring_words, step.slot, cta.lane, step.inv_c, smem.stage_qt, step.tile_row, cta.lane_col
            )
        cute.arch.sync_threads()  # the staged tiles are complete
        if step.has_rows:
            self._store_staged(
                smem.stage_q, False, gmem.q_words, cta.first_row, step.col0, step.rows_end, cta.cols, cta.tid
            )
            self._store_staged(
                smem.stage_qt, True, gmem.qt_words, step.col0, cta.first_row, cta.cols, step.rows_end, cta.tid
            )
        if cutlass.const_expr(step.scale_tiles is not None):
            self._store_scale_tiles(smem, gmem, step.scale_tiles, cta.tid)
        cute.arch.sync_threads()

    @cute.jit
    def _convert_rows(self, ring_words, slot, lane, inv_lo, inv_hi, stage, tile_row, tile_col):
        """1x32-quantize this lane's fragment and put each row's 8 bytes of q into the staging tile
        at ``(tile_row + i, tile_col)``. A rolled loop: row i's inverse scale comes from lane ``i // 2`` of
        the 1x32 block's 4 (``inv_lo`` / ``inv_hi``: this lane's rows ``2 (lane % 4)``, ``+ 1``)."""
        frag = cute.make_rmem_tensor(cute.make_layout((self.chunks, 4), stride=(4, 1)), Uint32)
        values = cute.make_rmem_tensor(cute.make_layout((1, LANE_COLS), stride=(LANE_COLS, 1)), Float32)
        first_lane = lane - lane % ROW_BLOCK_LANES
        pairs = cute.make_tensor(stage.iterator, cute.make_layout((cute.size(stage) // 2, 2), stride=(2, 1)))
        for i in cutlass.range(LANE_ROWS, unroll=2):
            mine = inv_lo
            if i % 2 == 1:
                mine = inv_hi
            inv = cute.arch.shuffle_sync(mine, first_lane + i // 2)
            for h in cutlass.range_constexpr(self.chunks):
                cute.autovec_copy(ring_words[slot, i, h, lane, None], frag[h, None])
            self._unpack_row(frag, values, 0)
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
    def _convert_cols(self, ring_words, slot, lane, inv_c, stage, tile_row, tile_col):
        """32x1-quantize this lane's fragment and put each column's 8 bytes of q^T into the staging
        tile at ``(tile_col + c, tile_row)``. Rows are taken two at a time: each column's pair of E4M3 bytes
        goes into its q^T word right away."""
        frag = cute.make_rmem_tensor(cute.make_layout((self.chunks, 4), stride=(4, 1)), Uint32)
        qt_frag = cute.make_rmem_tensor(cute.make_layout((LANE_COLS, 2), stride=(2, 1)), Uint32)
        qt_frag.fill(0)
        for pr in cutlass.range_constexpr(LANE_ROWS // 2):
            values = cute.make_rmem_tensor(cute.make_layout((2, LANE_COLS), stride=(LANE_COLS, 1)), Float32)
            for r in cutlass.range_constexpr(2):
                self._load_row(ring_words, slot, 2 * pr + r, lane, frag)
                self._unpack_row(frag, values, r)
            for c in cutlass.range_constexpr(LANE_COLS):
                qt_frag[c, pr // 2] = e4m3x2_into(
                    qt_frag[c, pr // 2], pr % 2 == 1, values[0, c] * inv_c[c], values[1, c] * inv_c[c]
                )
        pairs = cute.make_tensor(stage.iterator, cute.make_layout((cute.size(stage) // 2, 2), stride=(2, 1)))
        for c in cutlass.range_constexpr(LANE_COLS):
            cute.autovec_copy(qt_frag[c, None], pairs[_stage_qt_offset(tile_col + c, tile_row) // 8, None])

    @cute.jit
    def _store_staged(
        self,
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
        threads = 32 * self.warps
        width = TILE_M if transposed else TILE_K
        chunks_per_row = width // 16
        chunk4 = cute.make_tensor(stage.iterator, cute.make_layout((cute.size(stage) // 4, 4), stride=(4, 1)))
        words = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
        for k in cutlass.range_constexpr(cute.size(stage) // 4 // threads):
            n = tid + k * threads
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
    def _store_scale_tiles(self, smem: _Smem, gmem: _Gmem, tiles: _ScaleTiles, tid):
        """Threads 0..31 copy the staged 1x32 tile to byte ``tiles.row_base`` of the 1x32 scales,
        threads 32..63 the 32x1 tile to byte ``tiles.col_base`` of the 32x1 scales (when
        ``tiles.covered``): one 16-byte store each.

        Grouped: the M-groups scales have ``M + 128 G`` rows, not a multiple of 128 when M is not,
        so the last row tile (past every group: zeros) is cut at the tensor's end. Its size is a
        multiple of 16 bytes (M % 32 == 0, Cp % 4 == 0): a chunk is wholly inside or outside."""
        staged = cute.make_tensor(
            cute.recast_ptr(smem.stage_s.iterator, dtype=Uint32),
            cute.make_layout((2 * CHUNKS_PER_TILE, 4), stride=(4, 1)),
        )
        words = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
        chunk = tiles.row_base // CHUNK_BYTES + tid
        inside = True
        if cutlass.const_expr(self.grouped):
            inside = chunk < gmem.scale_chunks.shape[0]
        if tid < CHUNKS_PER_TILE and inside:
            cute.autovec_copy(staged[tid, None], words)
            cute.autovec_copy(words, gmem.scale_chunks[chunk, None])
        if tid >= CHUNKS_PER_TILE and tid < 2 * CHUNKS_PER_TILE and tiles.covered:
            cute.autovec_copy(staged[tid, None], words)
            cute.autovec_copy(
                words, gmem.scale_chunks_t[tiles.col_base // CHUNK_BYTES + tid - CHUNKS_PER_TILE, None]
            )


__all__ = [
    "DTYPES",
    "MODES",
    "DualConfig",
    "DualVariant",
    "QuantizeDualKernel",
    "ScaleLayout",
]
