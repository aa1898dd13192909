"""MXFP8 quantization in 32x1 blocks (32 consecutive rows): x (E, M, K) -> q^T (E, K, M) + E8M0 scales.

2D ``quantize_mxfp8_2d(block="32x1")`` is the E = 1 case, 3D ``quantize_mxfp8_3d(block="32x1")`` runs
one expert per grid z. Per expert, the logical scale matrix is S = (K, M/32): S[k, c] is the scale
of rows ``[32 c, 32 c + 32)`` of column k. Scale layouts (a compile-time choice, :class:`ScaleLayout`):

- ``plain``: S row-major, (E, K, M/32).
- ``blocked``: SPEC section 3's blocked layout of S, (E, Rp, Cp), every padding byte written 0.
- ``k_groups`` (E = 1): row groups from end offsets (sizes multiples of 32), SPEC's K-groups layout
  with ``kend = end / 32``, (Rp, M/32 + 4 G), every byte written by the kernel (group padding
  columns inside the words below, the zero tail after the last group by a grid-stride loop).

Work decomposition: CTA ``(x, y, z)`` owns row tile ``x`` (128 rows = 4 row blocks = one 4-byte word
of a blocked tile) of expert ``z`` and a run of 256-column tiles. Each of its 128 threads owns two
adjacent columns: it loads a row block's 32 rows of its column pair (one 4-byte load per row for
bf16, 8 bytes for fp32: a warp reads 128 or 256 contiguous bytes per row), so the block max is
thread-local (no shuffles, no shared memory), then writes each column's 32 E4M3 bytes as two
16-byte stores into q^T. The 4 scale bytes of a column over the tile's 4 row blocks form exactly
one word of a blocked tile (``blocked`` and ``k_groups``: one 4-byte store per column and tile;
``plain``: byte stores). Threads of columns in ``[K, Rp)`` write the blocked layout's zero rows.

``k_groups`` row tiles follow the groups, in M-groups numbering: tile ``t`` is 128 rows of one
group from its start (fewer at the group's end; rows past the last group come after all groups'
tiles, with no scales), so its 4 scale columns are exactly one word of the group's blocked tiles,
padding columns included (source-aligned tiles straddle groups whose sizes are not multiples of
128: byte stores, up to 2x the L2 store transactions of the E4M3 data; 0.83 -> 0.86 of copy at
32768 x 2048, notes/quantize-32x1-grid-and-groups.md). Each CTA finds its tile with a group scan
before its first load; up to 32 groups a warp scan in registers (one offset load per lane, shuffles
and a ballot: no shared memory, no barrier), more in shared memory. An L2 prefetch of guessed rows
during the scan was slower (same note).

Design choice (vs. a TMA tile in shared memory read back column-wise): loads straight into
registers need no barrier and no shared memory, keep 4 KB per warp in flight, and give the same
coalescing on the read side; a CTA's 4 row blocks write each 128-byte line of q^T whole.

M, K, E and G are symbolic: one compile per (dtype, scaling mode, scale layout, config, arch).
M and K must be multiples of 32, x and q 16-byte aligned (the bindings check both).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_utils.blocked import (
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
from cute_utils.mx import BLOCK_SIZE, abs_bits, e8m0_scale, inverse_scale

THREADS = 128
COLS_PER_THREAD = 2
TILE_K = THREADS * COLS_PER_THREAD  # 256 columns of x per column tile
TILE_M = TILE_COLS * BLOCK_SIZE  # 128 rows: the 4 scale columns of one blocked-tile word
BLOCKS = TILE_M // BLOCK_SIZE  # 4 row blocks per tile
DTYPES = {"bfloat16": BFloat16, "float32": Float32}
MODES = ("floor", "rceil")


class ScaleLayout(str, Enum):
    PLAIN = "plain"
    BLOCKED = "blocked"
    K_GROUPS = "k_groups"


@dataclass(frozen=True)
class Quantize32x1Config:
    """``target_ctas``: grid size aimed for (a CTA loops over a run of column tiles, which amortizes
    the group scan and lookups); ``min_ctas_per_sm``: register cap (0: none); ``max_groups``: most
    groups the ``k_groups`` variant takes (scan arrays in shared memory); ``pair_stores``: lane
    pairs exchange halves so each store instruction writes whole 32-byte sectors
    (:func:`store_sector_pairs`) instead of each lane writing its own column's halves."""

    target_ctas: int = 32768
    min_ctas_per_sm: int = 4
    max_groups: int = MAX_GROUPS
    pair_stores: bool = True


# Measured on an H200 (bench/tune_quantize_32x1.py): 4 CTAs per SM (128 registers; the K-groups
# variant wants more and spills nothing at 128) beat no cap by 5-10%; a grid of ~32768 CTAs beat
# ~16384 by 6% and 4096 by 15% at 131072 x 5120/7168 (0.90 vs 0.85 vs 0.78 of copy), the same at
# 32768 rows; lane-pair sector stores beat per-lane stores by 1.35x.
_DEFAULT = Quantize32x1Config()
CONFIGS = {arch: {"bfloat16": _DEFAULT, "float32": _DEFAULT} for arch in ("sm_90a", "sm_100a")}


def _pair_view(x: cute.Tensor) -> cute.Tensor:
    """(E, M, K/2, 2) view of a row-major (E, M, K) tensor: ``[e, m, p, None]`` is columns 2p, 2p+1."""
    experts, rows, cols = x.shape
    return cute.make_tensor(
        x.iterator,
        cute.make_layout(
            (experts, rows, cols // COLS_PER_THREAD, COLS_PER_THREAD),
            stride=(x.layout.stride[0], x.layout.stride[1], COLS_PER_THREAD, 1),
        ),
    )


def _block_view(qt: cute.Tensor) -> cute.Tensor:
    """(E, K, M/32, 32) view of q^T (E, K, M): ``[e, k, c, None]`` is the 32 bytes of block c."""
    experts, cols, rows = qt.shape
    return cute.make_tensor(
        qt.iterator,
        cute.make_layout(
            (experts, cols, rows // BLOCK_SIZE, BLOCK_SIZE),
            stride=(qt.layout.stride[0], qt.layout.stride[1], BLOCK_SIZE, 1),
        ),
    )


def _half_view(qt: cute.Tensor) -> cute.Tensor:
    """(E, K, M/32, 2, 4) Uint32 view of q^T (E, K, M): ``[e, k, c, h, None]`` is the 16-byte half h
    of block c of column k."""
    experts, cols, rows = qt.shape
    return cute.make_tensor(
        cute.recast_ptr(qt.iterator, dtype=Uint32),
        cute.make_layout(
            (experts, cols, rows // BLOCK_SIZE, 2, 4),
            stride=(qt.layout.stride[0] // 4, qt.layout.stride[1] // 4, 8, 4, 1),
        ),
    )


def _flat_view(scales: cute.Tensor, dtype, per: int) -> cute.Tensor:
    """(E, R*C/per) view of the scale tensor (E, R, C) in units of ``dtype`` (``per`` bytes)."""
    experts, rows, cols = scales.shape
    size = rows * cols // per
    return cute.make_tensor(
        cute.recast_ptr(scales.iterator, dtype=dtype), cute.make_layout((experts, size), stride=(size, 1))
    )


@cute.jit
def load_column_pair_block(pairs: cute.Tensor, e: Int32, row0: Int32, pair: Int32, raw: cute.Tensor):
    """Load rows ``row0 .. row0 + 31`` of column pair ``pair`` into ``raw`` (32, 2): one 4-byte
    (bf16) or 8-byte (fp32) load per row, all issued before any is used."""
    for i in cutlass.range_constexpr(BLOCK_SIZE):
        cute.autovec_copy(pairs[e, row0 + i, pair, None], raw[i, None])


@cute.jit
def column_amax_bits(values: cute.Tensor, j: cutlass.Constexpr) -> Int32:
    """``max |v|`` (bits, NaN-propagating) of column ``j`` of a (32, 2) bf16/fp32 fragment."""
    amax = Int32(0)
    for i in cutlass.range_constexpr(BLOCK_SIZE):
        amax = cutlass.max(amax, abs_bits(Float32(values[i, j])))
    return amax


@cute.jit
def quantize_column(values: cute.Tensor, j: cutlass.Constexpr, s: Int32, q: cute.Tensor):
    """E4M3 bytes of column ``j`` of the (32, 2) bf16/fp32 fragment with scale byte ``s`` into the
    32-byte register fragment ``q`` (Float8E4M3FN)."""
    inv = inverse_scale(s)
    scaled = cute.make_rmem_tensor(cute.make_layout(BLOCK_SIZE), Float32)
    for i in cutlass.range_constexpr(BLOCK_SIZE):
        scaled[i] = Float32(values[i, j]) * inv
    q.store(scaled.load().to(Float8E4M3FN))


@cute.jit
def store_sector_pairs(words: cute.Tensor, dst: cute.Tensor, e: Int32, k0: Int32, block: Int32, valid):
    """Store the E4M3 blocks of a thread's two columns (``words``: (2, 8) Uint32, column ``k0 + j``
    in row j) so that lanes ``2i`` and ``2i + 1`` write the two 16-byte halves of one 32-byte sector
    in each store instruction (whole sectors into L2, not half ones).

    ``dst``: (E, K, M/32, 2, 4) Uint32 view of q^T (``[e, k, c, h, None]``: half h of block c of
    column k). Lane pairs own columns ``k_even .. k_even + 3``; each lane gives its partner the
    halves the partner stores (4 shuffles per column). Every lane must call this (shuffles);
    only lanes with ``valid`` store.
    """
    odd = cute.arch.lane_idx() % 2
    received = cute.make_rmem_tensor(cute.make_layout((COLS_PER_THREAD, 4), stride=(4, 1)), Uint32)
    for j in cutlass.range_constexpr(COLS_PER_THREAD):
        for i in cutlass.range_constexpr(4):
            send = words[j, 4 + i]
            if odd != 0:
                send = words[j, i]
            received[j, i] = cute.arch.shuffle_sync_bfly(send, 1)
    first = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    second = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    for j in cutlass.range_constexpr(COLS_PER_THREAD):
        for i in cutlass.range_constexpr(4):
            first[i] = words[j, i]
            second[i] = received[j, i]
            if odd != 0:
                first[i] = received[j, i]
                second[i] = words[j, 4 + i]
        if valid:
            cute.autovec_copy(first, dst[e, k0 - 2 * odd + j, block, odd, None])
            cute.autovec_copy(second, dst[e, k0 + 2 - 2 * odd + j, block, odd, None])


def make_quantize_32x1(dtype_name: str, mode: str, layout: ScaleLayout, config: Quantize32x1Config):
    """Build the ``@cute.jit`` launcher ``launch(x, qt, scales, offsets, stream)``.

    ``x``: (E, M, K) bf16/fp32 row-major, M and K multiples of 32. ``qt``: (E, K, M) Float8E4M3FN
    row-major (q^T). ``scales``: Float8E8M0FNU (E, K, M/32) for ``plain``, (E, Rp, Cp) for
    ``blocked``, (1, Rp, M/32 + 4 G) for ``k_groups``. ``offsets``: Int32 (G,) row end offsets for
    ``k_groups``, else ``None``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be 'floor' or 'rceil', got {mode!r}")
    grouped = layout is ScaleLayout.K_GROUPS

    @cute.jit
    def _row_tile(x, qt, scales, e, first_tile, last_tile, row_tile, first_row, tile_rows, placed):
        """Quantize rows ``first_row .. first_row + tile_rows - 1`` (at most 128: scale column word
        ``row_tile`` of blocked scales) over column tiles ``first_tile .. last_tile - 1``.
        ``placed`` (K-groups): ``(covered, base, row_block_bytes)`` of :func:`k_groups_tile_column`
        (no scale stores when not covered)."""
        tid, _, _ = cute.arch.thread_idx()
        _, rows, cols = x.shape
        _, scale_rows, scale_cols = scales.shape
        pairs = _pair_view(x)
        q_blocks = _block_view(qt)
        q_halves = _half_view(qt)
        if cutlass.const_expr(layout is ScaleLayout.PLAIN):
            scale_out = _flat_view(scales, Uint8, 1)
        else:
            scale_out = _flat_view(scales, Uint32, 4)
        raw = cute.make_rmem_tensor(
            cute.make_layout((BLOCK_SIZE, COLS_PER_THREAD), stride=(2, 1)), x.element_type
        )
        for tile in cutlass.range(first_tile, last_tile, unroll=1):
            pair = tile * THREADS + tid
            k0 = pair * COLS_PER_THREAD
            words = [Uint32(0), Uint32(0)]
            for b in cutlass.range(BLOCKS, unroll=1):
                row0 = first_row + b * BLOCK_SIZE
                block = row0 // BLOCK_SIZE
                valid = b * BLOCK_SIZE < tile_rows and k0 < cols
                if cutlass.const_expr(grouped):
                    valid = valid and row0 + BLOCK_SIZE <= rows  # garbage offsets: stay inside x
                if valid:
                    load_column_pair_block(pairs, e, row0, pair, raw)
                q_words = cute.make_rmem_tensor(cute.make_layout((COLS_PER_THREAD, 8), stride=(8, 1)), Uint32)
                for j in cutlass.range_constexpr(COLS_PER_THREAD):
                    amax = column_amax_bits(raw, j)
                    if not valid:
                        amax = Int32(0)
                    s = e8m0_scale(amax, mode)
                    q = cute.recast_tensor(q_words[j, None], Float8E4M3FN)
                    quantize_column(raw, j, s, q)
                    if cutlass.const_expr(not config.pair_stores):
                        if valid:
                            cute.autovec_copy(q, q_blocks[e, k0 + j, block, None])
                    if cutlass.const_expr(layout is ScaleLayout.PLAIN):
                        if valid:
                            scale_out[e, (k0 + j) * scale_cols + block] = Uint8(s)
                    else:
                        words[j] = words[j] | (Uint32(s) << Uint32(8 * b))
                if cutlass.const_expr(config.pair_stores):
                    store_sector_pairs(q_words, q_halves, e, k0, block, valid)
            # One word per column: the tile's 4 scales (zero for row blocks past the rows or the group).
            for j in cutlass.range_constexpr(COLS_PER_THREAD):
                k = k0 + j
                if cutlass.const_expr(layout is ScaleLayout.BLOCKED):
                    if k < scale_rows:
                        word = ((k // TILE_ROWS) * (scale_cols // TILE_COLS) + row_tile) * (TILE_BYTES // 4)
                        scale_out[e, word + blocked_row_offset(k) // 4] = words[j]
                elif cutlass.const_expr(grouped):
                    covered, group_base, group_row_block_bytes = placed
                    if covered and k < scale_rows:
                        offset = group_base + (k // TILE_ROWS) * group_row_block_bytes + blocked_row_offset(k)
                        scale_out[0, offset // 4] = words[j]

    @cute.kernel
    def quantize_32x1_kernel(
        x: cute.Tensor,
        qt: cute.Tensor,
        scales: cute.Tensor,
        offsets,
        tiles_per_cta: Int32,
    ):
        tid, _, _ = cute.arch.thread_idx()
        row_tile, col_chunk, e = cute.arch.block_idx()
        _, rows, cols = x.shape
        _, scale_rows, scale_cols = scales.shape
        first_tile = col_chunk * tiles_per_cta
        last_tile = cutlass.min(first_tile + tiles_per_cta, ceil_div(cols, TILE_K))
        if cutlass.const_expr(not grouped):
            first_row = row_tile * TILE_M
            tile_rows = cutlass.min(rows - first_row, TILE_M)
            _row_tile(x, qt, scales, e, first_tile, last_tile, row_tile, first_row, tile_rows, None)
        else:
            # Row tiles follow the groups (M-groups numbering): 128 rows of one group from its start,
            # so their 4 scale columns are one word of the group's blocked tiles (padding included).
            # Up to 32 groups, each warp scans them in registers (no shared memory, no barrier).
            num_groups = offsets.shape[0]
            smem = SmemAllocator()
            words = prefix_smem_words(config.max_groups)
            first_row, tile_rows, covered, group_prefix, next_prefix, covered_blocks = group_row_tile(
                offsets,
                num_groups,
                rows,
                row_tile,
                tid,
                THREADS,
                smem.allocate_tensor(Int32, cute.make_layout(words), 16),
                smem.allocate_tensor(Int32, cute.make_layout(words), 16),
                smem.allocate_tensor(Int32, cute.make_layout(THREADS // 32), 16),
            )
            # Bytes past the last group's region are zero: a grid-stride loop over all CTAs.
            grid_x, grid_y, _ = cute.arch.grid_dim()
            zero_fill_chunks(
                _flat_view(scales, Uint32, 4)[0, None],
                cutlass.min(scale_rows * TILE_COLS * covered_blocks, scale_rows * scale_cols),
                scale_rows * scale_cols,
                (row_tile * grid_y + col_chunk) * THREADS + tid,
                grid_x * grid_y * THREADS,
            )
            base, row_block_bytes = k_groups_tile_column(group_prefix, next_prefix, row_tile, scale_rows)
            placed = (covered, base, row_block_bytes)
            _row_tile(x, qt, scales, e, first_tile, last_tile, row_tile, first_row, tile_rows, placed)

    @cute.jit
    def launch(x: cute.Tensor, qt: cute.Tensor, scales: cute.Tensor, offsets, stream):
        experts, rows, cols = x.shape
        row_tiles = ceil_div(rows, TILE_M)
        col_tiles = ceil_div(cols, TILE_K)
        chunks = cutlass.min(col_tiles, cutlass.max(config.target_ctas // (row_tiles * experts), 1))
        tiles_per_cta = ceil_div(col_tiles, chunks)
        chunks = ceil_div(col_tiles, tiles_per_cta)
        if cutlass.const_expr(grouped):  # group-aligned row tiles (M-groups numbering)
            row_tiles = ceil_div(rows + TILE_M * offsets.shape[0], TILE_M)
        quantize_32x1_kernel(x, qt, scales, offsets, tiles_per_cta).launch(
            grid=[row_tiles, chunks, experts],
            block=[THREADS, 1, 1],
            stream=stream,
            min_blocks_per_mp=config.min_ctas_per_sm,
            preferred_smem_carveout=100 if config.min_ctas_per_sm else None,
        )

    return launch


def fake_arguments(dtype_name: str, layout: ScaleLayout):
    """Fake tensors (E, M, K, scale shapes and G symbolic; M and K multiples of 32) and the env stream."""
    experts = cute.sym_int()
    rows, cols = cute.sym_int(divisibility=BLOCK_SIZE), cute.sym_int(divisibility=BLOCK_SIZE)
    x = cute.runtime.make_fake_compact_tensor(
        DTYPES[dtype_name], (experts, rows, cols), stride_order=(2, 1, 0), assumed_align=16
    )
    qt = cute.runtime.make_fake_compact_tensor(
        Float8E4M3FN, (experts, cols, rows), stride_order=(2, 1, 0), assumed_align=16
    )
    scale_shape = (experts, cute.sym_int(), cute.sym_int())
    scales = cute.runtime.make_fake_compact_tensor(
        Float8E8M0FNU, scale_shape, stride_order=(2, 1, 0), assumed_align=16
    )
    offsets = None
    if layout is ScaleLayout.K_GROUPS:
        offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, qt, scales, offsets, stream


def compile_quantize_32x1(
    dtype_name: str,
    mode: str,
    layout: ScaleLayout,
    arch: str,
    config: Quantize32x1Config | None = None,
    options: str = "",
):
    """``cute.compile`` the launcher for one variant on ``arch`` (TVM-FFI, env stream)."""
    config = config or CONFIGS[arch][dtype_name]
    launch = make_quantize_32x1(dtype_name, mode, layout, config)
    return compile_tvm_ffi(launch, fake_arguments(dtype_name, layout), arch, options)


def variants() -> list[tuple[str, str, ScaleLayout]]:
    """Every (dtype, mode, scale layout) variant the bindings may ask for."""
    return [(d, m, layout) for d in DTYPES for m in MODES for layout in ScaleLayout]


def sass_targets() -> dict:
    """SASS-inspection targets: ``quantize_32x1_<dtype>_<mode>_<layout>`` -> build(arch)."""
    from cute_utils.sass import compile_options

    def target(dtype_name: str, mode: str, layout: ScaleLayout):
        return lambda arch: compile_quantize_32x1(
            dtype_name, mode, layout, arch, options=compile_options(arch)
        )

    return {f"quantize_32x1_{d}_{m}_{layout.value}": target(d, m, layout) for d, m, layout in variants()}


__all__ = [
    "CONFIGS",
    "Quantize32x1Config",
    "ScaleLayout",
    "compile_quantize_32x1",
    "fake_arguments",
    "make_quantize_32x1",
    "sass_targets",
    "variants",
]
