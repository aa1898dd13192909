"""``swizzle_scales``: E8M0 scale matrices to the blocked layout (SPEC section 3), one kernel.

Layouts (a compile-time choice, :class:`SwizzleLayout`):

- ``plain``: src (E, R, C) -> E independent blocked matrices (2D is E = 1), dst (E, Rp, Cp).
- ``m_groups``: src (1, R, C), row groups from end offsets -> (R + 128 G, Cp); group g's rows are
  blocked from row ``P_g = 128 * sum_{i<g} ceil(n_i / 128)``.
- ``k_groups``: src (1, R, C), column groups from end offsets -> (Rp, C + 4 G); group g's blocked
  tiles start at flat byte ``Rp * Q_g``, ``Q_g = 4 * sum_{i<g} ceil(k_i / 4)``.

Work decomposition: CTA ``(x, y, z)`` = (``blocks_per_cta`` consecutive 128-row output blocks,
window of ``window_cols`` padded scale columns, expert). The CTA first resolves what it can once
(the group scan into shared memory, the K-groups column map), then for each of its row blocks
resolves the source rows, stages the 128 x window bytes in shared memory with coalesced loads
(4-byte words when rows are whole words, else bytes; zeros where nothing maps), and each warp
writes whole 512-byte tiles with 16-byte stores. Every output byte is written exactly once,
padding and uncovered bytes as 0.

E, R, C and the group count are symbolic: one compile per (layout, rank, load width, config,
arch). Source and destination are the caller's ``float8_e8m0fnu`` tensors, reinterpreted in-kernel.
"""

from dataclasses import dataclass
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import Float8E8M0FNU, Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_utils.blocked import (
    CHUNKS_PER_TILE,
    TILE_COLS,
    TILE_ROWS,
    allocate_staging,
    ceil_div,
    element_or_zero,
    load_tile_column,
    store_tail_words,
    store_tile_chunk,
)
from cute_utils.groups import (
    MAX_GROUPS,
    find_group,
    prefix_smem_words,
    scan_padded_group_sizes,
    smem_group_bounds,
)


class SwizzleLayout(str, Enum):
    PLAIN = "plain"
    M_GROUPS = "m_groups"
    K_GROUPS = "k_groups"


@dataclass(frozen=True)
class SwizzleConfig:
    """Launch shape: ``threads`` per CTA, ``window_cols`` scale columns staged at a time, and
    ``blocks_per_cta`` 128-row blocks per CTA (amortizes the per-CTA group resolution)."""

    threads: int = 256
    window_cols: int = 64
    blocks_per_cta: int = 1
    min_ctas_per_sm: int = 4  # register cap: 65536 / (4 * 256) = 64 per thread; 0 = no cap

    def __post_init__(self) -> None:
        tiles = self.window_cols // TILE_COLS
        if self.window_cols % TILE_COLS or (tiles * CHUNKS_PER_TILE) % self.threads:
            raise ValueError(f"window_cols={self.window_cols} does not split over {self.threads} threads")
        if (TILE_ROWS * tiles) % self.threads or self.threads % 32 or self.threads < self.window_cols:
            raise ValueError(f"threads={self.threads} must be a multiple of 32 dividing the window")


# Picked with bench/tune_swizzle.py on an H200 (see the notes in bench/README.md): one row block per
# CTA beats looping over several (no overlap between a CTA's iterations); the 64-register cap lets
# more loads be in flight per thread and wins for plain and M-groups, not for K-groups.
_DEFAULT = SwizzleConfig()
CONFIGS = {
    arch: {
        "plain": _DEFAULT,
        "m_groups": _DEFAULT,
        "k_groups": SwizzleConfig(min_ctas_per_sm=0),
    }
    for arch in ("sm_90a", "sm_100a")
}


@cute.jit
def _k_group_source(ends, prefix, num_groups, tile):
    """``(first source column, byte count 0..4)`` feeding padded tile column ``tile`` of K-groups."""
    g = find_group(prefix, num_groups, tile)
    start, end = smem_group_bounds(ends, g)
    source = start + TILE_COLS * (tile - prefix[g])
    count = cutlass.max(cutlass.min(end - source, TILE_COLS), 0)
    if tile >= prefix[num_groups]:
        count = Int32(0)
    return source, count


@cute.jit
def _k_group_tile_base(prefix, num_groups, row_blocks, tile, grid_tiles):
    """``(base, stride)`` in tiles: K-groups tile (row block b, padded tile column ``tile``) is tile
    ``base + b * stride`` of the output; stride -1 marks a tile past the output.

    Tiles past the groups' padded width form the zero tail, right after the last group's tiles.
    """
    covered = prefix[num_groups]
    g = find_group(prefix, num_groups, tile)
    stride = prefix[g + 1] - prefix[g]
    base = row_blocks * prefix[g] + tile - prefix[g]
    if tile >= covered:
        stride = grid_tiles - covered
        base = row_blocks * covered + tile - covered
    if tile >= grid_tiles:
        stride = Int32(-1)
    return base, stride


def _flat_view(ptr, dtype, experts, rows, cols):
    """(E, R, C) row-major view of ``dtype`` elements at ``ptr``."""
    return cute.make_tensor(
        cute.recast_ptr(ptr, dtype=dtype),
        cute.make_layout((experts, rows, cols), stride=(rows * cols, cols, 1)),
    )


def make_swizzle(layout: SwizzleLayout, config: SwizzleConfig, rank: int = 2, word_loads: bool = False):
    """Build the ``@cute.jit`` host launcher ``launch(src, dst, offsets, stream)`` for ``layout``.

    ``src``: Float8E8M0FNU (R, C) or, for ``plain`` with ``rank=3``, (E, R, C), row-major.
    ``word_loads`` (needs C % 4 == 0 and a 4-byte aligned src; not for ``k_groups``) loads one
    4-byte word per tile column. ``dst``: the blocked Float8E8M0FNU output of the same rank,
    16-byte aligned (its byte count is a multiple of 4). ``offsets``: Int32 (G,) end offsets
    (rows for ``m_groups``, scale columns for ``k_groups``), ``None`` for ``plain``.
    """
    threads = config.threads
    window = config.window_cols
    window_tiles = window // TILE_COLS
    blocks_per_cta = config.blocks_per_cta
    grouped = layout is not SwizzleLayout.PLAIN
    if word_loads and layout is SwizzleLayout.K_GROUPS:
        raise ValueError("k_groups windows start at arbitrary columns: word loads do not apply")
    if rank == 3 and grouped:
        raise ValueError("grouped layouts take 2-D scales")

    @cute.kernel
    def swizzle_kernel(src: cute.Tensor, dst: cute.Tensor, offsets):
        tid, _, _ = cute.arch.thread_idx()
        cta_rows, col_window, expert = cute.arch.block_idx()
        experts = 1
        if cutlass.const_expr(rank == 3):
            experts, rows, cols = src.shape
        else:
            rows, cols = src.shape
        src8 = _flat_view(src.iterator, Uint8, experts, rows, cols)
        src32 = _flat_view(src.iterator, Uint32, experts, rows, cols // TILE_COLS)
        total_words = cute.size(dst) // TILE_COLS
        dst_words = cute.make_tensor(
            cute.recast_ptr(dst.iterator, dtype=Uint32), cute.make_layout(total_words)
        )
        dst_chunks = cute.make_tensor(
            cute.recast_ptr(dst.iterator, dtype=Uint32),
            cute.make_layout((total_words // TILE_COLS, TILE_COLS), stride=(TILE_COLS, 1)),
        )
        full_chunks = total_words // TILE_COLS
        row_blocks = ceil_div(rows, TILE_ROWS)
        col_tiles = ceil_div(cols, TILE_COLS)
        out_row_blocks = row_blocks

        smem = SmemAllocator()
        stage = allocate_staging(smem, window)
        first_tile = col_window * window_tiles

        if cutlass.const_expr(grouped):
            num_groups = offsets.shape[0]
            prefix = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
            ends = smem.allocate_tensor(Int32, cute.make_layout(prefix_smem_words()), 16)
            warp_totals = smem.allocate_tensor(Int32, cute.make_layout(threads // 32), 16)
            total = rows if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS) else cols
            unit = TILE_ROWS if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS) else TILE_COLS
            scan_padded_group_sizes(offsets, num_groups, total, unit, prefix, warp_totals, tid, threads, ends)

        if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS):
            out_row_blocks = ceil_div(rows + TILE_ROWS * num_groups, TILE_ROWS)

        if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
            col_source = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
            col_count = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
            tile_base = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
            tile_stride = smem.allocate_tensor(Int32, cute.make_layout(window_tiles), 16)
            grid_tiles = ceil_div(cols + TILE_COLS * num_groups, TILE_COLS)
            if tid < window_tiles:
                source, count = _k_group_source(ends, prefix, num_groups, first_tile + tid)
                col_source[tid] = source
                col_count[tid] = count
                base, stride = _k_group_tile_base(
                    prefix, num_groups, row_blocks, first_tile + tid, grid_tiles
                )
                tile_base[tid] = base
                tile_stride[tid] = stride
            cute.arch.sync_threads()

        for b in cutlass.range(blocks_per_cta):
            row_block = cta_rows * blocks_per_cta + b
            if row_block < out_row_blocks:
                src_row0 = row_block * TILE_ROWS
                valid_rows = cutlass.min(rows - src_row0, TILE_ROWS)
                if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS):
                    g = find_group(prefix, num_groups, row_block)
                    start, end = smem_group_bounds(ends, g)
                    src_row0 = start + (row_block - prefix[g]) * TILE_ROWS
                    valid_rows = Int32(0)
                    if row_block < prefix[g + 1]:
                        valid_rows = cutlass.min(end - src_row0, TILE_ROWS)

                for i in cutlass.range_constexpr(TILE_ROWS * window_tiles // threads):
                    idx = i * threads + tid
                    r = idx // window_tiles
                    w = idx % window_tiles
                    row_ok = r < valid_rows
                    if cutlass.const_expr(word_loads):
                        valid = row_ok and first_tile + w < col_tiles
                        stage[r, w] = element_or_zero(src32, expert, src_row0 + r, first_tile + w, valid)
                    else:
                        if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
                            col = col_source[w]
                            count = col_count[w]
                        else:
                            col = (first_tile + w) * TILE_COLS
                            count = cutlass.max(cutlass.min(cols - col, TILE_COLS), 0)
                        if not row_ok:
                            count = Int32(0)
                        stage[r, w] = load_tile_column(src8, expert, src_row0 + r, col, count)
                cute.arch.sync_threads()

                for i in cutlass.range_constexpr(window_tiles * CHUNKS_PER_TILE // threads):
                    j = i * threads + tid
                    tile = j // CHUNKS_PER_TILE
                    lane = j % CHUNKS_PER_TILE
                    if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
                        stride = tile_stride[tile]
                        chunk = (tile_base[tile] + row_block * stride) * CHUNKS_PER_TILE
                        if stride < 0:
                            chunk = Int32(-1)
                    else:
                        t = first_tile + tile
                        chunk = ((expert * row_blocks + row_block) * col_tiles + t) * CHUNKS_PER_TILE
                        if t >= col_tiles:
                            chunk = Int32(-1)
                    if chunk >= 0:
                        if chunk + lane < full_chunks:
                            store_tile_chunk(stage, tile, lane, dst_chunks, chunk + lane)
                        else:
                            store_tail_words(stage, tile, lane, dst_words, (chunk + lane) * TILE_COLS)
                cute.arch.sync_threads()

    @cute.jit
    def launch(src: cute.Tensor, dst: cute.Tensor, offsets, stream):
        experts = 1
        if cutlass.const_expr(rank == 3):
            experts, rows, cols = src.shape
        else:
            rows, cols = src.shape
        row_blocks = ceil_div(rows, TILE_ROWS)
        padded_cols = TILE_COLS * ceil_div(cols, TILE_COLS)
        if cutlass.const_expr(layout is SwizzleLayout.M_GROUPS):
            row_blocks = ceil_div(rows + TILE_ROWS * offsets.shape[0], TILE_ROWS)
        if cutlass.const_expr(layout is SwizzleLayout.K_GROUPS):
            padded_cols = cols + TILE_COLS * offsets.shape[0]
        swizzle_kernel(src, dst, offsets).launch(
            grid=[ceil_div(row_blocks, blocks_per_cta), ceil_div(padded_cols, window), experts],
            block=[threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=config.min_ctas_per_sm,
            preferred_smem_carveout=100 if config.min_ctas_per_sm else None,
        )

    return launch


def fake_arguments(layout: SwizzleLayout, rank: int = 2, word_loads: bool = False):
    """Fake tensors (all sizes symbolic) and the env stream that ``launch`` compiles against."""
    order = tuple(range(rank - 1, -1, -1))
    src = cute.runtime.make_fake_compact_tensor(
        Float8E8M0FNU,
        tuple(cute.sym_int() for _ in range(rank)),
        stride_order=order,
        assumed_align=4 if word_loads else 1,
    )
    dst = cute.runtime.make_fake_compact_tensor(
        Float8E8M0FNU, tuple(cute.sym_int() for _ in range(rank)), stride_order=order, assumed_align=16
    )
    offsets = None
    if layout is not SwizzleLayout.PLAIN:
        offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return src, dst, offsets, stream


def compile_swizzle(
    layout: SwizzleLayout,
    arch: str,
    rank: int = 2,
    word_loads: bool = False,
    config: SwizzleConfig | None = None,
    options: str = "",
):
    """``cute.compile`` the launcher for one variant on ``arch`` (TVM-FFI, env stream)."""
    config = config or CONFIGS[arch][layout.value]
    launch = make_swizzle(layout, config, rank, word_loads)
    return cute.compile(
        launch,
        *fake_arguments(layout, rank, word_loads),
        options=f"--enable-tvm-ffi --gpu-arch {arch} {options}".strip(),
    )


def variants() -> list[tuple[SwizzleLayout, int, bool]]:
    """Every (layout, rank, word_loads) variant the bindings may ask for."""
    return [
        (SwizzleLayout.PLAIN, 2, False),
        (SwizzleLayout.PLAIN, 2, True),
        (SwizzleLayout.PLAIN, 3, False),
        (SwizzleLayout.PLAIN, 3, True),
        (SwizzleLayout.M_GROUPS, 2, False),
        (SwizzleLayout.M_GROUPS, 2, True),
        (SwizzleLayout.K_GROUPS, 2, False),
    ]


def sass_targets() -> dict:
    """SASS-inspection targets of this module: ``swizzle_<layout>_<rank>d[_words]`` -> build(arch)."""
    from cute_utils.sass import compile_options

    def target(layout: SwizzleLayout, rank: int, word_loads: bool):
        return lambda arch: compile_swizzle(layout, arch, rank, word_loads, options=compile_options(arch))

    return {
        f"swizzle_{layout.value}_{rank}d{'_words' if word_loads else ''}": target(layout, rank, word_loads)
        for layout, rank, word_loads in variants()
    }


__all__ = [
    "CONFIGS",
    "MAX_GROUPS",
    "SwizzleConfig",
    "SwizzleLayout",
    "compile_swizzle",
    "make_swizzle",
    "sass_targets",
    "variants",
]
