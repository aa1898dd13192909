"""``swizzle_scales``: E8M0 scale matrices to the blocked layout (SPEC section 3), one kernel.

Layouts (a compile-time choice, :class:`SwizzleLayout`):

- ``plain``: src (E, R, C) -> E independent blocked matrices (2D is E = 1), dst (E, Rp, Cp).
- ``m_groups``: src (1, R, C), row groups from end offsets -> (R + 128 G, Cp); group g's rows are
  blocked from row ``P_g = 128 * sum_{i<g} ceil(n_i / 128)``.
- ``k_groups``: src (1, R, C), column groups from end offsets -> (Rp, C + 4 G); group g's blocked
  tiles start at flat byte ``Rp * Q_g``, ``Q_g = 4 * sum_{i<g} ceil(k_i / 4)``.

Work decomposition: CTA ``(x, y, z)`` = (128-row output block, window of ``window_cols`` padded
scale columns, expert). The CTA resolves which source rows/columns feed its window (group lookups
in shared memory for the grouped layouts), stages the 128 x window bytes in shared memory with
coalesced byte loads (zeros where nothing maps), then each warp writes whole 512-byte tiles with
16-byte stores. Every output byte is written exactly once, padding and uncovered bytes as 0.

All of E, R, C and the group count are symbolic: one compile per (layout, config, arch).
"""

from dataclasses import dataclass
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_utils.blocked import (
    CHUNKS_PER_TILE,
    TILE_COLS,
    TILE_ROWS,
    allocate_staging,
    byte_or_zero,
    ceil_div,
    store_tile_chunk,
)
from cute_utils.groups import (
    MAX_GROUPS,
    find_group,
    group_bounds,
    prefix_smem_words,
    scan_padded_group_sizes,
)


class SwizzleLayout(str, Enum):
    PLAIN = "plain"
    M_GROUPS = "m_groups"
    K_GROUPS = "k_groups"


@dataclass(frozen=True)
class SwizzleConfig:
    """Launch shape: ``threads`` per CTA and the ``window_cols`` scale columns each CTA stages."""

    threads: int = 256
    window_cols: int = 64

    def __post_init__(self) -> None:
        tiles = self.window_cols // TILE_COLS
        if self.window_cols % TILE_COLS or (tiles * CHUNKS_PER_TILE) % self.threads:
            raise ValueError(f"window_cols={self.window_cols} does not split over {self.threads} threads")
        if (TILE_ROWS * self.window_cols) % self.threads or self.threads % 32:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 dividing the window")


CONFIGS = {"sm_90a": SwizzleConfig(), "sm_100a": SwizzleConfig()}


def output_chunks(layout: SwizzleLayout, num_experts: int, rows: int, cols: int, groups: int) -> int:
    """16-byte chunks of the output buffer (the blocked tensor's bytes rounded up to 16)."""
    rp, cp = TILE_ROWS * ceil_div(rows, TILE_ROWS), TILE_COLS * ceil_div(cols, TILE_COLS)
    if layout is SwizzleLayout.PLAIN:
        nbytes = num_experts * rp * cp
    elif layout is SwizzleLayout.M_GROUPS:
        nbytes = (rows + TILE_ROWS * groups) * cp
    else:
        nbytes = rp * (cols + TILE_COLS * groups)
    return ceil_div(nbytes, 16)


@cute.jit
def _k_group_source_column(offsets, prefix, num_groups, cols, col) -> Int32:
    """Source scale column feeding padded column ``col`` of the K-groups output, or -1 (zero)."""
    tile = col // TILE_COLS
    g = find_group(prefix, num_groups, tile)
    start, end = group_bounds(offsets, g, cols)
    source = start + col - TILE_COLS * prefix[g]
    if source >= end or tile >= prefix[num_groups]:
        source = Int32(-1)
    return source


@cute.jit
def _k_group_tile_chunk(prefix, num_groups, row_blocks, row_block, tile, grid_tiles) -> Int32:
    """First 16-byte chunk of K-groups tile (``row_block``, padded tile column ``tile``), or -1.

    Tiles past the groups' padded width form the zero tail, which starts right after the last
    group's tiles; tiles past the grid's width do not exist.
    """
    covered = prefix[num_groups]
    g = find_group(prefix, num_groups, tile)
    width = prefix[g + 1] - prefix[g]
    chunk = (row_blocks * prefix[g] + row_block * width + tile - prefix[g]) * CHUNKS_PER_TILE
    if tile >= covered:
        tail_slot = row_block * (grid_tiles - covered) + tile - covered
        chunk = (row_blocks * covered + tail_slot) * CHUNKS_PER_TILE
    if tile >= grid_tiles:
        chunk = Int32(-1)
    return chunk


def make_swizzle(layout: SwizzleLayout, config: SwizzleConfig):
    """Build the ``@cute.jit`` host launcher ``launch(src, dst, offsets, stream)`` for ``layout``.

    ``src``: Uint8 (E, R, C) row-major scale bytes. ``dst``: Uint32 (n, 4), the output buffer in
    16-byte chunks (see :func:`output_chunks`). ``offsets``: Int32 (G,) end offsets (rows for
    ``m_groups``, scale columns for ``k_groups``), ``None`` for ``plain``.
    """
    threads = config.threads
    window = config.window_cols
    window_tiles = window // TILE_COLS
    grouped = layout is not SwizzleLayout.PLAIN

    @cute.kernel
    def swizzle_kernel(src: cute.Tensor, dst: cute.Tensor, offsets):
        tid, _, _ = cute.arch.thread_idx()
        row_block, col_window, expert = cute.arch.block_idx()
        _, rows, cols = src.shape
        num_chunks = dst.shape[0]
        row_blocks = ceil_div(rows, TILE_ROWS)
        col_tiles = ceil_div(cols, TILE_COLS)

        smem = SmemAllocator()
        stage, stage8 = allocate_staging(smem, window)
        first_tile = col_window * window_tiles

        src_row0 = row_block * TILE_ROWS
        valid_rows = cutlass.min(rows - src_row0, TILE_ROWS)
        if cutlass.const_expr(grouped):
            num_groups = offsets.shape[0]
            prefix = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
            warp_totals = smem.allocate_tensor(Int32, cute.make_layout(threads // 32), 16)
            col_source = smem.allocate_tensor(Int32, cute.make_layout(window), 16)
            tile_chunk = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)

        if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS):
            scan_padded_group_sizes(offsets, num_groups, rows, TILE_ROWS, prefix, warp_totals, tid, threads)
            g = find_group(prefix, num_groups, row_block)
            start, end = group_bounds(offsets, g, rows)
            src_row0 = start + (row_block - prefix[g]) * TILE_ROWS
            valid_rows = Int32(0)
            if row_block < prefix[g + 1]:
                valid_rows = cutlass.min(end - src_row0, TILE_ROWS)

        if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
            scan_padded_group_sizes(offsets, num_groups, cols, TILE_COLS, prefix, warp_totals, tid, threads)
            grid_tiles = ceil_div(cols + TILE_COLS * num_groups, TILE_COLS)
            if tid < window:
                col_source[tid] = _k_group_source_column(
                    offsets, prefix, num_groups, cols, first_tile * TILE_COLS + tid
                )
            if tid < window_tiles:
                tile_chunk[tid] = _k_group_tile_chunk(
                    prefix, num_groups, row_blocks, row_block, first_tile + tid, grid_tiles
                )
            cute.arch.sync_threads()

        for i in cutlass.range_constexpr(TILE_ROWS * window // threads):
            idx = i * threads + tid
            r = idx // window
            c = idx % window
            if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
                col = col_source[c]
                stage8[r, c] = byte_or_zero(src, expert, src_row0 + r, col, r < valid_rows and col >= 0)
            else:
                col = first_tile * TILE_COLS + c
                stage8[r, c] = byte_or_zero(src, expert, src_row0 + r, col, r < valid_rows and col < cols)
        cute.arch.sync_threads()

        for i in cutlass.range_constexpr(window_tiles * CHUNKS_PER_TILE // threads):
            j = i * threads + tid
            tile = j // CHUNKS_PER_TILE
            lane = j % CHUNKS_PER_TILE
            if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
                chunk = tile_chunk[tile]
            else:
                t = first_tile + tile
                chunk = ((expert * row_blocks + row_block) * col_tiles + t) * CHUNKS_PER_TILE
                if t >= col_tiles:
                    chunk = Int32(-1)
            if chunk >= 0 and chunk + lane < num_chunks:
                store_tile_chunk(stage, tile, lane, dst, chunk + lane)

    @cute.jit
    def launch(src: cute.Tensor, dst: cute.Tensor, offsets, stream):
        experts, rows, cols = src.shape
        row_blocks = ceil_div(rows, TILE_ROWS)
        padded_cols = TILE_COLS * ceil_div(cols, TILE_COLS)
        if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS):
            row_blocks = ceil_div(rows + TILE_ROWS * offsets.shape[0], TILE_ROWS)
        if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
            padded_cols = cols + TILE_COLS * offsets.shape[0]
        swizzle_kernel(src, dst, offsets).launch(
            grid=[row_blocks, ceil_div(padded_cols, window), experts],
            block=[threads, 1, 1],
            stream=stream,
        )

    return launch


def fake_arguments(layout: SwizzleLayout):
    """Fake tensors (symbolic E, R, C, n, G) and the env stream that ``launch`` compiles against."""
    src = cute.runtime.make_fake_compact_tensor(
        Uint8, (cute.sym_int(), cute.sym_int(), cute.sym_int()), stride_order=(2, 1, 0), assumed_align=1
    )
    dst = cute.runtime.make_fake_compact_tensor(
        Uint32, (cute.sym_int(), TILE_COLS), stride_order=(1, 0), assumed_align=16
    )
    offsets = None
    if layout is not SwizzleLayout.PLAIN:
        offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return src, dst, offsets, stream


def compile_swizzle(layout: SwizzleLayout, arch: str, config: SwizzleConfig | None = None, options: str = ""):
    """``cute.compile`` the launcher for ``layout`` on ``arch`` (TVM-FFI, env stream)."""
    config = config or CONFIGS[arch]
    launch = make_swizzle(layout, config)
    return cute.compile(
        launch, *fake_arguments(layout), options=f"--enable-tvm-ffi --gpu-arch {arch} {options}".strip()
    )


__all__ = [
    "CONFIGS",
    "MAX_GROUPS",
    "SwizzleConfig",
    "SwizzleLayout",
    "compile_swizzle",
    "make_swizzle",
    "output_chunks",
]
