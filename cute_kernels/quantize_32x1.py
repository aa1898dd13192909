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
128: byte stores, up to 2x the L2 store transactions of the E4M3 data;
notes/quantize-32x1-grid-and-groups.md). Each CTA finds its tile with a group scan
before its first load; up to 32 groups a warp scan in registers (one offset load per lane, shuffles
and a ballot: no shared memory, no barrier), more in shared memory. An L2 prefetch of guessed rows
during the scan was slower (same note).

Design choice (vs. a TMA tile in shared memory read back column-wise): loads straight into
registers need no barrier and no shared memory, keep 4 KB per warp in flight, and give the same
coalescing on the read side; a CTA's 4 row blocks write each 128-byte line of q^T whole.

M, K, E and G are symbolic: one compile per variant (:class:`Quantize32x1Variant`: dtype, scaling
mode, scale layout), config and arch; :class:`Quantize32x1Kernel` is the registry's
``"quantize_32x1"`` entry. M and K must be multiples of 32, x and q 16-byte aligned, at most
``MAX_GROUPS`` groups (:meth:`Quantize32x1Kernel.can_implement`; the bindings check them). The
launch config per arch and the measurements behind it: ``cute_kernels/configs/sm90.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import QUANTIZE_MXFP8_2D
from cute_utils.blocked import (
    TILE_COLS,
    TILE_ROWS,
    TILE_WORDS,
    blocked_row_offset,
    blocked_tile_index,
    ceil_div,
)
from cute_utils.columns import PAIR, as_one_expert, block_half_view, column_pair_view, store_sector_pairs
from cute_utils.constants import MAX_GROUPS
from cute_utils.group_tiles import (
    group_row_tile,
    grouped_tile_count,
    k_groups_tile_column,
    zero_k_groups_tail,
)
from cute_utils.groups import prefix_smem_words
from cute_utils.mx import BLOCK_SIZE, abs_bits, e8m0_scale, inverse_scale
from cute_utils.smem import storage_struct

from .base import Kernel, LoadsInFlight

THREADS = 128
COLS_PER_THREAD = PAIR
TILE_K = THREADS * COLS_PER_THREAD  # 256 columns of x per column tile
TILE_M = TILE_COLS * BLOCK_SIZE  # 128 rows: the 4 scale columns of one blocked-tile word
BLOCKS = TILE_M // BLOCK_SIZE  # 4 row blocks per tile
DTYPES = {"bfloat16": BFloat16, "float32": Float32}
MODES = ("floor", "rceil")


class ScaleLayout(str, Enum):
    """Where the scales go (module docstring): S row-major, SPEC's blocked layout, or K-groups."""

    PLAIN = "plain"
    BLOCKED = "blocked"
    K_GROUPS = "k_groups"


@dataclass(frozen=True)
class Quantize32x1Config:
    """``target_ctas``: grid size aimed for (a CTA loops over a run of column tiles, which amortizes
    the group scan and lookups); ``min_ctas_per_sm``: register cap (0: none); ``max_groups``: most
    groups the ``k_groups`` variant takes (scan arrays in shared memory); ``pair_stores``: lane
    pairs exchange halves so each store instruction writes whole 32-byte sectors
    (:func:`cute_utils.columns.store_sector_pairs`) instead of each lane writing its own column's
    halves. Each arch's choice and why: ``cute_kernels.configs`` (``quantize_32x1``)."""

    target_ctas: int = 32768
    min_ctas_per_sm: int = 4
    max_groups: int = MAX_GROUPS
    pair_stores: bool = True


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


def shared_storage(layout: ScaleLayout, config: Quantize32x1Config):
    """The ``@cute.struct`` of one CTA's shared memory, ``None`` for the layouts that take none:
    ``k_groups`` holds the shared-memory group scan's Int32 arrays ``prefix`` and ``ends``
    (``max_groups + 1`` words each) and its scratch ``warp_totals`` (a word per warp), each 16-byte
    aligned (up to 32 groups the scan runs in registers and leaves them unused). The kernel
    allocates it; its size is the launch's dynamic shared memory."""
    if layout is not ScaleLayout.K_GROUPS:
        return None
    words = prefix_smem_words(config.max_groups)
    fields = {
        "prefix": cute.struct.Align[cute.struct.MemRange[Int32, words], 16],
        "ends": cute.struct.Align[cute.struct.MemRange[Int32, words], 16],
        "warp_totals": cute.struct.Align[cute.struct.MemRange[Int32, THREADS // 32], 16],
    }
    return storage_struct(fields)


@dataclass(frozen=True)
class Quantize32x1Variant:
    """Compile-time choices: ``dtype`` (a :data:`DTYPES` name), ``mode`` (``"floor"`` or
    ``"rceil"``: the E8M0 scale's rounding) and ``layout`` (:class:`ScaleLayout`)."""

    dtype: str
    mode: str
    layout: ScaleLayout
    #: 3: (E, M, K) operands; 2: one matrix's x (M, K), q (M, K) column-major and 2-D scales, seen
    #: by the launcher as E = 1 operands (no host-side views per call; the device code is the
    #: rank-3 variant's: tests/cute_kernels/test_quantize_32x1_compile.py).
    rank: int = 3

    def __post_init__(self) -> None:
        if self.rank not in (2, 3):
            raise ValueError(f"rank must be 2 or 3, got {self.rank}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be 'floor' or 'rceil', got {self.mode!r}")


@dataclass(frozen=True)
class RowSpan:
    """A CTA's work: rows ``first_row .. first_row + rows - 1`` (at most 128) of expert ``e``, whose
    scales are word column ``row_tile`` of a blocked tile, over column tiles
    ``first_tile .. last_tile - 1``."""

    e: Int32
    row_tile: Int32
    first_row: Int32
    rows: Int32
    first_tile: Int32
    last_tile: Int32


@dataclass(frozen=True)
class GroupPlacement:
    """Where a K-groups row tile's scale words go (:func:`cute_utils.group_tiles.k_groups_tile_column`):
    ``covered`` (no scale stores when not), ``base`` and ``row_block_bytes``."""

    covered: cutlass.Boolean
    base: Int32
    row_block_bytes: Int32


class Quantize32x1Kernel(Kernel):
    """32x1 MXFP8 quantization (module docstring): x (E, M, K) -> q^T (E, K, M) + E8M0 scales.

    Launch: ``kernel(x, qt, scales, offsets)`` (see :meth:`__call__` for the shapes);
    :meth:`can_implement` gives the limits.
    """

    name = "quantize_32x1"

    @classmethod
    def loads_in_flight(
        cls, variant: Quantize32x1Variant, config: Quantize32x1Config, cols: int
    ) -> LoadsInFlight:
        """Per thread one 32-row block of its column pair, all loads before the block max."""
        elem = DTYPES[variant.dtype].width // 8
        return LoadsInFlight(
            THREADS,
            THREADS * BLOCK_SIZE * COLS_PER_THREAD * elem,
            f"{THREADS} thr x {BLOCK_SIZE} rows x {COLS_PER_THREAD} cols x {elem} B",
        )

    @classmethod
    def shared_bytes(cls, variant: Quantize32x1Variant, config: Quantize32x1Config) -> int:
        """The size of :func:`shared_storage`, the struct the ``k_groups`` kernel allocates (the group
        scan's arrays); 0 for the other layouts, which take no shared memory."""
        storage = shared_storage(variant.layout, config)
        return 0 if storage is None else storage.size_in_bytes()

    def __init__(self, variant: Quantize32x1Variant, config: Quantize32x1Config) -> None:
        super().__init__(variant, config)
        self.mode = variant.mode
        self.layout = variant.layout
        self.grouped = variant.layout is ScaleLayout.K_GROUPS
        self.storage = shared_storage(variant.layout, config)

    @classmethod
    def variants(cls) -> list[Quantize32x1Variant]:
        return [
            Quantize32x1Variant(d, m, layout, rank)
            for d in DTYPES
            for m in MODES
            for layout in ScaleLayout
            for rank in (3, 2)
        ]

    @classmethod
    def target_name(cls, variant: Quantize32x1Variant) -> str:
        suffix = "_2d" if variant.rank == 2 else ""
        return f"{cls.name}_{variant.dtype}_{variant.mode}_{variant.layout.value}{suffix}"

    @classmethod
    def fake_arguments(cls, variant: Quantize32x1Variant) -> tuple:
        """Fake tensors (E, M, K, scale shapes and G symbolic; M and K multiples of 32) and the env
        stream."""
        rows, cols = cute.sym_int(divisibility=BLOCK_SIZE), cute.sym_int(divisibility=BLOCK_SIZE)

        def fake(dtype, shape, order):
            return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

        if variant.rank == 3:
            experts = cute.sym_int()
            x = fake(DTYPES[variant.dtype], (experts, rows, cols), (2, 1, 0))
            qt = fake(Float8E4M3FN, (experts, rows, cols), (2, 0, 1))  # q: (N K, 1, N) strides
            scales = fake(Float8E8M0FNU, (experts, cute.sym_int(), cute.sym_int()), (2, 1, 0))
        else:  # x (M, K) row-major, q (M, K) column-major (strides (1, M)), scales 2-D
            x = fake(DTYPES[variant.dtype], (rows, cols), (1, 0))
            qt = fake(Float8E4M3FN, (rows, cols), (0, 1))
            scales = fake(Float8E8M0FNU, (cute.sym_int(), cute.sym_int()), (1, 0))
        offsets = None
        if variant.layout is ScaleLayout.K_GROUPS:
            offsets = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return x, qt, scales, offsets, stream

    @staticmethod
    def can_implement(rows: int, cols: int, num_groups: int | None = None) -> bool:
        """M (``rows``) and K (``cols``) multiples of 32 and at most ``MAX_GROUPS`` groups (x and q
        must also be 16-byte aligned)."""
        spec = QUANTIZE_MXFP8_2D
        m_ok = rows % spec.divisor("x", "M") == 0
        return m_ok and cols % BLOCK_SIZE == 0 and spec.limits.accepts(num_groups)

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (E, M, K) bf16/fp32 row-major, M and K multiples of 32 (rank 2: (M, K))
        qt: cute.Tensor,  # Float8E4M3FN q (E, M, K), strides (M K, 1, M) (rank 2: (M, K), strides (1, M))
        scales: cute.Tensor,  # E8M0 (E, K, M/32) plain, (E, Rp, Cp) blocked, (1, Rp, M/32 + 4 G)
        # k_groups (rank 2: the same without E)
        offsets,  # Int32 (G,) row end offsets (k_groups), else None
        stream,
    ):
        if cutlass.const_expr(self.variant.rank == 2):  # one matrix: x (M, K), q (M, K) column-major
            x, qt = as_one_expert(x, 1024), as_one_expert(qt, 1024, transpose=True)
            scales = as_one_expert(scales, 1)
        else:  # q (E, M, K) with strides (M K, 1, M), seen as its row-major transpose (E, K, M)
            qt = cute.make_tensor(qt.iterator, cute.select(qt.layout, mode=[0, 2, 1]))
        experts, rows, cols = x.shape
        row_tiles = ceil_div(rows, TILE_M)
        col_tiles = ceil_div(cols, TILE_K)
        chunks = cutlass.min(col_tiles, cutlass.max(self.config.target_ctas // (row_tiles * experts), 1))
        tiles_per_cta = ceil_div(col_tiles, chunks)
        chunks = ceil_div(col_tiles, tiles_per_cta)
        if cutlass.const_expr(self.grouped):  # group-aligned row tiles (M-groups numbering)
            row_tiles = grouped_tile_count(rows, offsets.shape[0], TILE_M)
        self.kernel(x, qt, scales, offsets, tiles_per_cta).launch(
            grid=[row_tiles, chunks, experts],
            block=[THREADS, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=100 if self.config.min_ctas_per_sm else None,
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, qt: cute.Tensor, scales: cute.Tensor, offsets, tiles_per_cta: Int32):
        tid, _, _ = cute.arch.thread_idx()
        row_tile, col_chunk, e = cute.arch.block_idx()
        _, rows, cols = x.shape
        first_tile = col_chunk * tiles_per_cta
        last_tile = cutlass.min(first_tile + tiles_per_cta, ceil_div(cols, TILE_K))
        if cutlass.const_expr(not self.grouped):
            first_row = row_tile * TILE_M
            tile_rows = cutlass.min(rows - first_row, TILE_M)
            span = RowSpan(e, row_tile, first_row, tile_rows, first_tile, last_tile)
            self._row_tile(x, qt, scales, span, None)
        else:
            first_row, tile_rows, placed = self._group_row_tile(x, scales, offsets, row_tile, col_chunk, tid)
            span = RowSpan(e, row_tile, first_row, tile_rows, first_tile, last_tile)
            self._row_tile(x, qt, scales, span, placed)

    @cute.jit
    def _group_row_tile(self, x, scales, offsets, row_tile: Int32, col_chunk: Int32, tid: Int32):
        """K-groups: ``(first_row, tile_rows, placement)`` of row tile ``row_tile``, and this CTA's
        share of the zero tail after the last group (all threads: the scan may use a barrier).

        Row tiles follow the groups (M-groups numbering): 128 rows of one group from its start, so
        their 4 scale columns are one word of the group's blocked tiles (padding included). Up to 32
        groups, each warp scans them in registers (no shared memory, no barrier)."""
        _, rows, _ = x.shape
        _, scale_rows, scale_cols = scales.shape
        num_groups = offsets.shape[0]
        storage = SmemAllocator().allocate(self.storage)
        words = prefix_smem_words(self.config.max_groups)
        first_row, tile_rows, covered, group_prefix, next_prefix, covered_blocks = group_row_tile(
            offsets,
            num_groups,
            rows,
            row_tile,
            tid,
            THREADS,
            storage.prefix.get_tensor(cute.make_layout(words)),
            storage.ends.get_tensor(cute.make_layout(words)),
            storage.warp_totals.get_tensor(cute.make_layout(THREADS // 32)),
        )
        # Bytes past the last group's region are zero: a grid-stride loop over all CTAs.
        grid_x, grid_y, _ = cute.arch.grid_dim()
        zero_k_groups_tail(
            _flat_view(scales, Uint32, 4)[0, None],
            scale_rows,
            scale_cols,
            covered_blocks,
            (row_tile * grid_y + col_chunk) * THREADS + tid,
            grid_x * grid_y * THREADS,
        )
        base, row_block_bytes = k_groups_tile_column(group_prefix, next_prefix, row_tile, scale_rows)
        return first_row, tile_rows, GroupPlacement(covered, base, row_block_bytes)

    @cute.jit
    def _row_tile(self, x, qt, scales, span: RowSpan, placed):
        """Quantize the rows of ``span`` over its column tiles; ``placed`` (K-groups): the
        :class:`GroupPlacement` of its scale words, else ``None``."""
        tid, _, _ = cute.arch.thread_idx()
        _, rows, cols = x.shape
        e, first_row, tile_rows = span.e, span.first_row, span.rows
        pairs = column_pair_view(x)
        q_blocks = _block_view(qt)
        q_halves = block_half_view(qt)
        if cutlass.const_expr(self.layout is ScaleLayout.PLAIN):
            scale_out = _flat_view(scales, Uint8, 1)
        else:
            scale_out = _flat_view(scales, Uint32, 4)
        scale_cols = scales.shape[2]
        raw = cute.make_rmem_tensor(
            cute.make_layout((BLOCK_SIZE, COLS_PER_THREAD), stride=(2, 1)), x.element_type
        )
        for tile in cutlass.range(span.first_tile, span.last_tile, unroll=1):
            pair = tile * THREADS + tid
            k0 = pair * COLS_PER_THREAD
            words = [Uint32(0), Uint32(0)]
            for b in cutlass.range(BLOCKS, unroll=1):
                row0 = first_row + b * BLOCK_SIZE
                block = row0 // BLOCK_SIZE
                valid = b * BLOCK_SIZE < tile_rows and k0 < cols
                if cutlass.const_expr(self.grouped):
                    valid = valid and row0 + BLOCK_SIZE <= rows  # garbage offsets: stay inside x
                if valid:
                    load_column_pair_block(pairs, e, row0, pair, raw)
                q_words = cute.make_rmem_tensor(cute.make_layout((COLS_PER_THREAD, 8), stride=(8, 1)), Uint32)
                for j in cutlass.range_constexpr(COLS_PER_THREAD):
                    amax = column_amax_bits(raw, j)
                    if not valid:
                        amax = Int32(0)
                    s = e8m0_scale(amax, self.mode)
                    q = cute.recast_tensor(q_words[j, None], Float8E4M3FN)
                    quantize_column(raw, j, s, q)
                    if cutlass.const_expr(not self.config.pair_stores):
                        if valid:
                            cute.autovec_copy(q, q_blocks[e, k0 + j, block, None])
                    if cutlass.const_expr(self.layout is ScaleLayout.PLAIN):
                        if valid:
                            scale_out[e, (k0 + j) * scale_cols + block] = Uint8(s)
                    else:
                        words[j] = words[j] | (Uint32(s) << Uint32(8 * b))
                if cutlass.const_expr(self.config.pair_stores):
                    store_sector_pairs(q_words, q_halves, e, k0, block, valid)
            if cutlass.const_expr(self.layout is not ScaleLayout.PLAIN):
                self._store_scale_words(scale_out, scales, words, k0, span, placed)

    @cute.jit
    def _store_scale_words(self, scale_out, scales, words, k0: Int32, span: RowSpan, placed):
        """One word per column ``k0 + j`` (``words[j]``): the tile's 4 scales, zero for row blocks
        past the rows or the group; columns in ``[K, Rp)`` write the blocked layout's zero rows."""
        _, scale_rows, scale_cols = scales.shape
        for j in cutlass.range_constexpr(COLS_PER_THREAD):
            k = k0 + j
            if cutlass.const_expr(self.layout is ScaleLayout.BLOCKED):
                if k < scale_rows:
                    tile = blocked_tile_index(k // TILE_ROWS, span.row_tile, scale_cols // TILE_COLS)
                    word = tile * TILE_WORDS
                    scale_out[span.e, word + blocked_row_offset(k) // 4] = words[j]
            else:
                if placed.covered and k < scale_rows:
                    offset = placed.base + (k // TILE_ROWS) * placed.row_block_bytes + blocked_row_offset(k)
                    scale_out[0, offset // 4] = words[j]


__all__ = [
    "DTYPES",
    "MODES",
    "GroupPlacement",
    "Quantize32x1Config",
    "Quantize32x1Kernel",
    "Quantize32x1Variant",
    "RowSpan",
    "ScaleLayout",
    "column_amax_bits",
    "load_column_pair_block",
    "quantize_column",
    "shared_storage",
]
