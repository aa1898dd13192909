"""FP8 column scales (SPEC section 7) in two passes: ``Fp8ColAmaxKernel`` then ``Fp8ColCastKernel``
(or ``Fp8ColPadCastKernel``, into padded token groups).

They serve ``quantize_fp8_2d(axis="col")`` on x (M, K), with or without row groups, and
``quantize_fp8_3d(axis="N")`` on w (E, N, K). All three are one problem on x seen as (E, R, K) (2-D:
E = 1, R = M): one scale per (group, column), where a group is a run of rows (the row groups' end
offsets, or each expert's N rows, or all M rows), and q is written as q^T (E, K, R) row-major (q
(M, K) with strides (1, M), or (E, N, K) with strides (N K, 1, N)).

A column's amax spans up to M rows: far more than a chip holds, so two passes (notes/fp8-col-kernels.md).

1. **Amax pass** (``Fp8ColAmaxKernel``): CTA ``(t, s, e)`` owns column tile ``t`` (256 columns: each
   of its 128 threads a column pair, one 4-byte (bf16) or 8-byte (fp32) load per row, a warp reading
   128 or 256 contiguous bytes of a row) over row span ``s`` of expert ``e``, read in blocks of 32
   rows with every load in flight. Each thread keeps the bits of ``max |x|`` of its two columns for
   the current group and folds them into the (group, column) amax word in global memory with an
   atomic max (``red.global.max.s32``; bits of non-negative floats order as integers, NaN above Inf)
   when the group ends and at the span's end. The caller zeroes the amax words first.
2. **Cast pass** (``Fp8ColCastKernel``): CTA ``(t, c, e)`` owns row tile ``t`` (128 rows, 4 blocks
   of 32) of expert ``e`` over a run of column tiles; each thread loads a block's 32 rows of its
   column pair, multiplies by its group's ``q_scale`` (``cute_utils.fp8``, from the amax words:
   two fp64 divisions per thread and group), converts to E4M3 and writes each column's 32 bytes
   into q^T: 16-byte stores, lane pairs trading halves so each store instruction fills whole
   32-byte sectors (``store_sector_pairs``), or byte stores when R % 16 != 0. Rows past every
   group quantize to 0. The CTAs of row tile ``t`` also write the dequantization scales
   ``1 / q_scale`` of groups ``t, t + T, ...`` (1.0 for an empty group).

The dual (``quantize_fp8_2d_dual`` and ``quantize_fp8_3d_dual``, variants with ``dual``) adds the
row side to both passes, so x is read twice, not three times: the amax pass also reduces each
32-row block's rows over the CTA's 256 columns (a warp transpose-max: bf16 two rows per word,
``cute_utils.mx.warp_row_maxima_bf16``, 16 shuffles; fp32 ``warp_transpose_max``, 31; then the 4
warps' maxima through shared memory) and folds
them into one row word per row after the column words (M words, or E N for experts: row (e, n) at
``E K + e N + n``; one atomic max per row and CTA); the cast pass computes the row tile's 128 row
``q_scale`` once per CTA into shared memory and writes q row-major ((M, K) or (E, N, K): 2 bytes
per lane and row with vector loads, else bytes) beside q^T, and the CTAs of column chunk 0 write
the row scales ((M,) or (E, N)).

3. **Cast into padded token groups** (``Fp8ColPadCastKernel``, ``pad_and_quantize_fp8_2d_cols``):
   exactly ``quantize_fp8_2d(pad_token_groups(x, offs, alignment=A)[0], axis="col",
   group_end_offsets=padded_end)`` after the ``groups`` amax pass on x itself (padding rows are
   zeros and change no amax): q (P, K) with strides (1, P), P = ``A ceil((M + G A) / A)``, group
   g's rows at ``[padded_start[g], padded_start[g] + n_g)``, its padding rows scaled as the zeros
   they are (0, or 0x7F in a NaN column), rows past the last padded group 0; also the scales and
   the padded offsets. Tiled by padded rows: CTA ``(t, c)`` owns padded rows ``[128 t, 128 t +
   128)`` over a run of column tiles. A 16-row half of a 32-row block lies in one padded group
   (A >= 16 and every padded group starts on A), so a CTA first scans the groups
   (``scan_group_sizes``, unit A, in shared memory) and maps each of its 8 halves to (group,
   first source row, data rows); a thread then loads its column pair's rows of ``load_blocks``
   blocks from the halves' source rows (one unmasked 32-row load when both halves are whole and
   contiguous, the common case; else per-row masks, zeros elsewhere), multiplies each half by its
   group's ``q_scale`` and stores each column's 32 bytes at the block's aligned place with the
   sector stores. CTA (0, 0) writes the padded offsets. Variants: dtype, ``vector_loads`` (P is
   a multiple of 16: always 16-byte stores) and ``dual`` (``pad_and_quantize_fp8_2d_dual``: after
   the ``groups`` dual amax pass, each CTA also takes its padded rows' row ``q_scale`` from their
   source rows' words into shared memory and writes each data row's q row-major at its source row,
   2 bytes per lane and row as the unpadded dual; the CTAs of column chunk 0 write the row scales.
   Rows past the last group end are in no padded row: their q and scales are left as they are).

Groups are found with no scan: a thread looks up the group of its first row with a binary search
of the end offsets in global memory and follows the rows in order; a 32-row block inside the
current group (the common case) takes one multiplier per column, a block that crosses group ends
loops over the groups it touches with per-row masks.

Variants (:class:`Fp8ColVariant`): dtype, ``layout`` (``plain`` x (M, K), ``groups`` x (M, K) with
offsets (G,), ``experts`` w (E, N, K)), ``vector_loads`` (K even and x aligned to a column pair:
one load per row and pair; else element loads) and, for the cast, ``vector_stores`` (R % 16 == 0:
16-byte stores of q^T; else byte stores). The power-of-2 rounding is a run-time mask. M, K, E, N
and G are symbolic: one compile per variant and arch.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, Uint32
from cutlass.memory import SmemAllocator

from cute_utils.blocked import ceil_div
from cute_utils.columns import PAIR, as_one_expert, block_half_view, column_pair_view, store_sector_pairs
from cute_utils.fp8 import fp8_quant_scale_masked, reciprocal_rn
from cute_utils.groups import (
    MAX_GROUPS,
    clamped_end,
    find_group,
    group_bounds,
    group_of_row,
    prefix_smem_words,
    row_group_bounds,
    scan_group_sizes,
    search_steps,
    smem_group_bounds,
    store_padded_offsets,
)
from cute_utils.mx import (
    abs_bits,
    bf16_high_bits,
    bf16_low_bits,
    bf16x2_abs_max,
    bf16x2_magnitudes,
    warp_row_maxima_bf16,
    warp_transpose_max,
)
from cute_utils.smem import storage_struct

from .base import Kernel, LoadsInFlight

THREADS = 128
WARPS = THREADS // 32
TILE_K = THREADS * PAIR  # 256 columns per column tile
BLOCK = 32  # rows per block (one 32-byte run of q^T per column)
TILE_M = 4 * BLOCK  # rows per cast row tile
DTYPES = {"bfloat16": BFloat16, "float32": Float32}
LAYOUTS = ("plain", "groups", "experts")
#: The cast pass's layout that writes q^T into padded token groups (:class:`Fp8ColPadCastKernel`); its
#: amax pass is the ``groups`` one.
PADDED = "padded"


@dataclass(frozen=True)
class Fp8ColVariant:
    """``dtype`` (a :data:`DTYPES` name); ``layout``: ``"plain"`` (x (M, K), scales (K,)),
    ``"groups"`` (x (M, K), int32 end offsets (G,), scales (G K,) group-major), ``"experts"``
    (w (E, N, K), scales (E, K)) or :data:`PADDED` (``"groups"`` with q in padded token groups:
    :class:`Fp8ColPadCastKernel`); ``vector_loads``: K even and x aligned to a column pair (4 bytes
    bf16, 8 bytes fp32); ``vector_stores`` (cast pass): R % 16 == 0 (R = M, or N for experts);
    ``dual``: also one scale per row (``quantize_fp8_2d_dual``; for experts ``quantize_fp8_3d_dual``,
    a row being (e, n)): the amax pass folds each row's max into row words after the column words,
    the cast pass writes q (M, K) or (E, N, K) row-major and the row scales ((M,) or (E, N)) beside
    q^T."""

    dtype: str
    layout: str
    vector_loads: bool = True
    vector_stores: bool = True
    dual: bool = False

    def __post_init__(self) -> None:
        layouts = (*LAYOUTS, PADDED)
        if self.layout not in layouts or self.dtype not in DTYPES:
            raise ValueError(
                f"layout {self.layout!r} / dtype {self.dtype!r}: not one of {layouts} / {tuple(DTYPES)}"
            )

    @property
    def grouped(self) -> bool:
        return self.layout in ("groups", PADDED)

    @property
    def rank(self) -> int:
        return 3 if self.layout == "experts" else 2

    def suffix(self) -> str:
        dual = "_dual" if self.dual else ""
        return f"{self.dtype}_{self.layout}{dual}_{'v2' if self.vector_loads else 'v1'}"


@dataclass(frozen=True)
class Fp8ColAmaxConfig:
    """``target_ctas``: grid size aimed for (the row spans shrink until the grid reaches it);
    ``min_ctas_per_sm``: register cap (0: none)."""

    target_ctas: int = 8192
    min_ctas_per_sm: int = 4


@dataclass(frozen=True)
class Fp8ColCastConfig:
    """``target_ctas``: grid size aimed for (a CTA loops over a run of column tiles);
    ``min_ctas_per_sm``: register cap (0: none); ``load_blocks``: 32-row blocks whose loads a
    thread issues together (1, 2 or 4: more bytes in flight, more registers)."""

    target_ctas: int = 32768
    min_ctas_per_sm: int = 3
    load_blocks: int = 1


def _variants(stores: tuple[bool, ...]) -> list[Fp8ColVariant]:
    """Every dual x dtype x layout x load width (x ``stores``)."""
    return [
        Fp8ColVariant(d, layout, v, s, dual)
        for dual in (False, True)
        for d in DTYPES
        for layout in LAYOUTS
        for v in (True, False)
        for s in stores
    ]


def _fake(dtype, shape, order, align):
    return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)


def _fake_x(variant: Fp8ColVariant, rows, cols):
    """x (M, K) or (E, N, K) row-major, aligned to a column pair for ``vector_loads``."""
    dtype = DTYPES[variant.dtype]
    align = dtype.width // 8 * (PAIR if variant.vector_loads else 1)
    if variant.rank == 3:
        return _fake(dtype, (cute.sym_int(), rows, cols), (2, 1, 0), align)
    return _fake(dtype, (rows, cols), (1, 0), align)


def _fake_offsets(variant: Fp8ColVariant):
    if not variant.grouped:
        return None
    return cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)


def _as_experts(x: cute.Tensor) -> cute.Tensor:
    """x as (E, R, K): a 2-D (M, K) operand is the E = 1 case (same instructions as rank 3)."""
    if cutlass.const_expr(cute.rank(x.layout) == 2):
        return as_one_expert(x, PAIR)
    return x


def _flat(t: cute.Tensor) -> cute.Tensor:
    """A row-major (E, K) or (K,) tensor as 1-D."""
    return cute.make_tensor(t.iterator, cute.make_layout(cute.size(t.shape)))


@dataclass(frozen=True)
class CastSource:
    """What the cast pass reads beside x: the amax pass's words, the row groups' end offsets (None
    without groups), the rounding ``mask`` and ``steps`` of the group search."""

    amax: cute.Tensor
    offsets: object
    mask: Int32
    steps: Int32


@dataclass(frozen=True)
class DualRows:
    """The dual's row side in the cast pass: ``q`` (1, M, K) or (E, N, K) row-major E4M3,
    ``q_scales`` the row tile's 128 row ``q_scale`` in shared memory, ``end`` the rows it writes:
    the groups layout's clamped last end (rows past it are left unwritten, as the bounded row op
    leaves them), else every row (None in the padded cast, whose halves bound it)."""

    q: cute.Tensor
    q_scales: cute.Tensor
    end: object = None


@dataclass(frozen=True)
class Columns:
    """A thread's work: column pair ``pair`` (columns ``2 pair``, ``2 pair + 1``) of expert ``e``,
    whose x has ``rows`` rows and ``cols`` columns."""

    e: Int32
    pair: Int32
    rows: Int32
    cols: Int32


def _column_loads(variant: Fp8ColVariant, blocks: int) -> LoadsInFlight:
    """``blocks`` 32-row blocks of a column pair per thread, all loads before any use."""
    elem = DTYPES[variant.dtype].width // 8
    return LoadsInFlight(
        THREADS,
        THREADS * blocks * BLOCK * PAIR * elem,
        f"{THREADS} thr x {blocks} block(s) x {BLOCK} rows x {PAIR} cols x {elem} B",
    )


def _block_rows(x: cute.Tensor, at: Columns, row0: Int32) -> cute.Tensor:
    """(32, 2) view of rows ``row0 ..`` of the thread's column pair in row-major ``x`` (E, R, K):
    row ``i`` at one row stride past row ``i - 1``, so the 32 addresses cost one add each."""
    first = column_pair_view(x)[at.e, row0, at.pair, None]
    return cute.make_tensor(first.iterator, cute.make_layout((BLOCK, PAIR), stride=(x.layout.stride[1], 1)))


@cute.jit
def load_whole_block(x: cute.Tensor, at: Columns, row0: Int32, raw: cute.Tensor):
    """Rows ``row0 .. row0 + 31`` of the thread's column pair into ``raw`` (32, 2) with no masks
    (the caller knows them in range): one vector load per row (:func:`_block_rows`)."""
    rows = _block_rows(x, at, row0)
    for i in cutlass.range_constexpr(BLOCK):
        cute.autovec_copy(rows[i, None], raw[i, None])


class _ColumnPass:
    """What both passes share: loads and the group walk (module docstring).

    A thread walks rows in order and keeps its current group as three integers ``(g, start, end)``:
    ``g`` the group (``G`` past every group, whose rows are in none), its rows ``[start, end)``.
    Plain and experts layouts have one group per expert ``e``: rows ``[0, R)``."""

    variant: Fp8ColVariant

    @cute.jit
    def _load_block(self, x: cute.Tensor, at: Columns, row0: Int32, last: Int32, raw: cute.Tensor):
        """Rows ``row0 .. row0 + 31`` (those below ``last``) of the thread's columns into ``raw``
        (32, 2), zero elsewhere; every load issued before any is used. A whole block of a column
        pair in range (the common case) loads with no masks, each row one stride past the last."""
        if cutlass.const_expr(self.variant.vector_loads):
            if cutlass.const_expr(self._unmasked_loads()):
                if row0 + BLOCK <= last and at.pair * PAIR < at.cols:
                    load_whole_block(x, at, row0, raw)
                else:
                    self._load_pairs_masked(x, at, row0, last, raw)
            else:
                self._load_pairs_masked(x, at, row0, last, raw)
        else:
            raw.fill(0)
            for i in cutlass.range_constexpr(BLOCK):
                for j in cutlass.range_constexpr(PAIR):
                    if row0 + i < last and at.pair * PAIR + j < at.cols:
                        raw[i, j] = x[at.e, row0 + i, at.pair * PAIR + j]

    @cute.jit
    def _load_pairs_masked(self, x: cute.Tensor, at: Columns, row0: Int32, last: Int32, raw: cute.Tensor):
        """:meth:`_load_block` with vector loads, each row under its mask (zero past ``last`` or K)."""
        raw.fill(0)
        pairs = column_pair_view(x)
        for i in cutlass.range_constexpr(BLOCK):
            if row0 + i < last and at.pair * PAIR < at.cols:
                cute.autovec_copy(pairs[at.e, row0 + i, at.pair, None], raw[i, None])

    def _unmasked_loads(self) -> bool:
        """Whether whole blocks load with no masks: not in the fp32 grouped variants, whose cast pass
        would spill (notes/fp8-col-kernels.md, "lean loads")."""
        return not (self.variant.grouped and self.variant.dtype == "float32")

    @cute.jit
    def _group_at(self, offsets, at: Columns, row: Int32, steps: Int32):
        """``(g, start, end)`` of the group of ``row`` (groups: binary search; else expert ``e``)."""
        g, start, end = at.e, Int32(0), at.rows
        if cutlass.const_expr(self.variant.grouped):
            g = group_of_row(offsets, offsets.shape[0], at.rows, row, steps)
            start, end = row_group_bounds(offsets, g, offsets.shape[0], at.rows)
        return g, start, end

    @cute.jit
    def _last_group(self, offsets, at: Columns, row0: Int32, last: Int32, steps: Int32) -> Int32:
        """The group of the block's last row below ``last``."""
        g, _, _ = self._group_at(offsets, at, cutlass.min(row0 + BLOCK, last) - 1, steps)
        return g

    def _row_words(self, offsets, experts: Int32, e: Int32, rows: Int32, cols: Int32) -> Int32:
        """Dual: index of the row amax word of row 0 (of expert ``e``): after the ``n K`` column
        words (n = G, E or 1), experts' rows (e, n) in order (``E K + e N``)."""
        if cutlass.const_expr(self.variant.layout == "experts"):
            return experts * cols + e * rows
        if offsets is None:
            return cols
        return offsets.shape[0] * cols

    def _real(self, g: Int32, offsets):
        """Whether group ``g`` is a group (not the rows past every group)."""
        if cutlass.const_expr(self.variant.grouped):
            return g < offsets.shape[0]
        return True


@cute.jit
def _group_index(offsets: cute.Tensor, g: Int32, rows: Int32):
    """``(g, start, end)`` of group ``g`` (groups layout; ``G``: past every group)."""
    start, end = row_group_bounds(offsets, g, offsets.shape[0], rows)
    return g, start, end


@cute.jit
def _masked_amax(raw: cute.Tensor, row0: Int32, start: Int32, end: Int32, acc: cute.Tensor):
    """``acc[j] = max(acc[j], |raw[i, j]|)`` (bits) over the block rows ``row0 + i`` in ``[start, end)``."""
    for i in cutlass.range_constexpr(BLOCK):
        if row0 + i >= start and row0 + i < end:
            for j in cutlass.range_constexpr(PAIR):
                acc[j] = cutlass.max(acc[j], abs_bits(Float32(raw[i, j])))


@cute.jit
def _masked_scale(
    raw: cute.Tensor, j: cutlass.Constexpr, row0: Int32, start: Int32, end: Int32, q_scale, scaled
):
    """``scaled[i] = raw[i, j] * q_scale`` for the block rows ``row0 + i`` in ``[start, end)``."""
    for i in cutlass.range_constexpr(BLOCK):
        if row0 + i >= start and row0 + i < end:
            scaled[i] = Float32(raw[i, j]) * q_scale


@cute.jit
def _to_e4m3(scaled: cute.Tensor, q_words: cute.Tensor, j: cutlass.Constexpr):
    """The 32 values of ``scaled`` as E4M3 bytes into ``q_words[j, None]`` (8 words)."""
    q = cute.recast_tensor(q_words[j, None], Float8E4M3FN)
    q.store(scaled.load().to(Float8E4M3FN))


@cute.jit
def _scale_column(raw, j: cutlass.Constexpr, row0: Int32, start: Int32, end: Int32, q_scale, q_words):
    """Column ``j`` of the block times ``q_scale`` for rows in ``[start, end)`` (0 elsewhere), as
    E4M3 bytes into ``q_words[j, None]``."""
    scaled = cute.make_rmem_tensor(cute.make_layout(BLOCK), Float32)
    scaled.fill(0)
    _masked_scale(raw, j, row0, start, end, q_scale, scaled)
    _to_e4m3(scaled, q_words, j)


@cute.jit
def _scale_whole_column(raw, j: cutlass.Constexpr, q_scale, q_words):
    """:func:`_scale_column` of a block whose rows all share ``q_scale``, with no row masks: rows
    past R are scaled too but never stored."""
    scaled = cute.make_rmem_tensor(cute.make_layout(BLOCK), Float32)
    for i in cutlass.range_constexpr(BLOCK):
        scaled[i] = Float32(raw[i, j]) * q_scale
    _to_e4m3(scaled, q_words, j)


@cute.jit
def _row_pair_e4m3(raw: cute.Tensor, i: cutlass.Constexpr, q_scale: Float32) -> cute.Tensor:
    """Row ``i`` of the block's column pair times ``q_scale`` as two E4M3 (a (2,) fragment)."""
    pair = cute.make_rmem_tensor(cute.make_layout(PAIR), Float32)
    for j in cutlass.range_constexpr(PAIR):
        pair[j] = Float32(raw[i, j]) * q_scale
    q_pair = cute.make_rmem_tensor(cute.make_layout(PAIR), Float8E4M3FN)
    q_pair.store(pair.load().to(Float8E4M3FN))
    return q_pair


@cute.jit
def _block_amax(raw: cute.Tensor, acc: cute.Tensor):
    """``acc[j] = max(acc[j], |raw[i, j]|)`` (bits) over all 32 block rows (rows past the data hold
    0). bf16: the column pair's two maxima in one word (:func:`bf16x2_abs_max`), split at the end."""
    if cutlass.const_expr(raw.element_type == BFloat16):
        pair = bf16x2_abs_max(cute.recast_tensor(raw, Uint32))
        acc[0] = cutlass.max(acc[0], bf16_low_bits(pair))
        acc[1] = cutlass.max(acc[1], bf16_high_bits(pair))
    else:
        for i in cutlass.range_constexpr(BLOCK):
            for j in cutlass.range_constexpr(PAIR):
                acc[j] = cutlass.max(acc[j], abs_bits(Float32(raw[i, j])))


@cute.jit
def _row_maxima(raw: cute.Tensor) -> Int32:
    """Lane ``i``: row ``i``'s max over the warp's 64 columns of ``raw`` (32, 2) per lane, as bits.
    bf16: two rows per word through the warp (:func:`warp_row_maxima_bf16`); else 32 words."""
    if cutlass.const_expr(raw.element_type == BFloat16):
        words = cute.recast_tensor(raw, Uint32)
        magnitudes = cute.make_rmem_tensor(cute.make_layout(BLOCK), Uint32)
        for i in cutlass.range_constexpr(BLOCK):
            magnitudes[i] = bf16x2_magnitudes(words[i])
        row_max = warp_row_maxima_bf16(magnitudes)
    else:
        rows_max = cute.make_rmem_tensor(cute.make_layout(BLOCK), Int32)
        for i in cutlass.range_constexpr(BLOCK):
            rows_max[i] = cutlass.max(abs_bits(Float32(raw[i, 0])), abs_bits(Float32(raw[i, 1])))
        row_max = warp_transpose_max(rows_max)
    return row_max


@cute.jit
def _fold_row_maxima(raw: cute.Tensor, amax: cute.Tensor, row_words: Int32, row0: Int32, last: Int32, stage):
    """Dual: each block row's max over the CTA's 256 columns (``raw`` (32, 2) per lane, zero past
    the data) folded into its row word with one atomic max per row and CTA: each warp's maxima
    (lane ``i``: row ``row0 + i``) go to ``stage`` (32, warps) in shared memory, warp 0 combines
    them. ``stage`` is one of two buffers the caller alternates, so one barrier per block does."""
    lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
    stage[lane, warp] = _row_maxima(raw)
    cute.arch.barrier()
    if warp == 0:
        row_max = stage[lane, 0]
        for w in cutlass.range_constexpr(1, WARPS):
            row_max = cutlass.max(row_max, stage[lane, w])
        if row0 + lane < last:
            ptr = amax.iterator + (row_words + row0 + lane)
            cute.arch.red(ptr, row_max, op="max", dtype=Int32, sem="relaxed", scope="gpu")


@cute.jit
def _dequant_scale(amax_bits: Int32, mask: Int32, nonempty) -> Float32:
    """``1 / q_scale`` of a group's column (SPEC section 7), 1.0 for an empty group."""
    scale = reciprocal_rn(fp8_quant_scale_masked(amax_bits, mask))
    if not nonempty:
        scale = Float32(1.0)
    return scale


class Fp8ColAmaxKernel(_ColumnPass, Kernel):
    """Amax pass (module docstring). Launch: ``kernel(x, amax, offsets, steps)``: ``amax`` int32
    (n K,) zeroed (n = G, E or 1; dual: (n K + M,) or (E K + E N,), the row words last), ``steps =
    G.bit_length()`` (groups; else ignored)."""

    name = "quantize_fp8_col_amax"

    @classmethod
    def loads_in_flight(cls, variant: Fp8ColVariant, config: Fp8ColAmaxConfig, cols: int) -> LoadsInFlight:
        """Amax pass: one 32-row block of its column pair per thread, all loads before any use."""
        return _column_loads(variant, 1)

    @classmethod
    def variants(cls) -> list[Fp8ColVariant]:
        return _variants(stores=(True,))  # the amax pass stores no q

    @classmethod
    def target_name(cls, variant: Fp8ColVariant) -> str:
        return f"{cls.name}_{variant.suffix()}"

    @classmethod
    def fake_arguments(cls, variant: Fp8ColVariant) -> tuple:
        """x (symbolic sizes; K even for ``vector_loads``), amax int32 (n K,), offsets, steps, the
        env stream."""
        cols = cute.sym_int(divisibility=PAIR if variant.vector_loads else 1)
        x = _fake_x(variant, cute.sym_int(), cols)
        amax = _fake(Int32, (cute.sym_int(),), (0,), 4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return x, amax, _fake_offsets(variant), Int32(1), stream

    @cute.jit
    def __call__(self, x: cute.Tensor, amax: cute.Tensor, offsets, steps: Int32, stream):
        x = _as_experts(x)
        experts, rows, cols = x.shape
        col_tiles = ceil_div(cols, TILE_K)
        spans = cutlass.max(self.config.target_ctas // (col_tiles * experts), 1)
        span_rows = cutlass.max(ceil_div(ceil_div(rows, spans), BLOCK) * BLOCK, BLOCK)
        spans = cutlass.max(ceil_div(rows, span_rows), 1)
        self.kernel(x, amax, offsets, span_rows, steps).launch(
            grid=[col_tiles, spans, experts],
            block=[THREADS, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=0,
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, amax: cute.Tensor, offsets, span_rows: Int32, steps: Int32):
        tid, _, _ = cute.arch.thread_idx()
        tile, span, e = cute.arch.block_idx()
        _, rows, cols = x.shape
        at = Columns(e, tile * THREADS + tid, rows, cols)
        first = span * span_rows
        last = cutlass.min(first + span_rows, rows)
        if cutlass.const_expr(self.variant.dual):  # every lane takes part in the row maxima
            self._span(x, amax, offsets, steps, at, first, last)
        else:
            if at.pair * PAIR < cols:
                self._span(x, amax, offsets, steps, at, first, last)

    @cute.jit
    def _span(self, x, amax, offsets, steps: Int32, at: Columns, first: Int32, last: Int32):
        """Rows ``[first, last)`` of the thread's columns: their (group, column) maxima into the
        amax words, and (dual) each row's max over the CTA's 256 columns into its row word."""
        raw = cute.make_rmem_tensor(cute.make_layout((BLOCK, PAIR), stride=(PAIR, 1)), x.element_type)
        acc = cute.make_rmem_tensor(cute.make_layout(PAIR), Int32)
        acc.fill(0)
        stages = None
        if cutlass.const_expr(self.variant.dual):  # two (32, warps) buffers of row maxima
            stages = SmemAllocator().allocate_tensor(Int32, cute.make_layout((BLOCK, WARPS, 2)), 16)
        g, start, end = self._group_at(offsets, at, first, steps)
        for row0 in cutlass.range(first, last, BLOCK, unroll=1):
            self._load_block(x, at, row0, last, raw)
            if cutlass.const_expr(self.variant.dual):
                stage = stages[None, None, (row0 - first) // BLOCK % 2]
                row_words = self._row_words(offsets, x.shape[0], at.e, at.rows, at.cols)
                _fold_row_maxima(raw, amax, row_words, row0, last, stage)
            if cutlass.const_expr(not self.variant.grouped):
                _block_amax(raw, acc)
            else:
                if row0 + BLOCK <= end:  # the whole block in the current group
                    _block_amax(raw, acc)
                else:
                    g_last = self._last_group(offsets, at, row0, last, steps)
                    self._across_groups(amax, offsets, at, raw, row0, g, g_last, acc)
                    g, start, end = _group_index(offsets, g_last, at.rows)
        self._flush(amax, offsets, at, g, acc)

    @cute.jit
    def _across_groups(
        self, amax, offsets, at: Columns, raw, row0: Int32, g_first: Int32, g_last: Int32, acc
    ):
        """A block that crosses group ends: each group's rows into ``acc``, flushed for every group
        before ``g_last`` (whose rows go on in the next block)."""
        part = cute.make_rmem_tensor(cute.make_layout(PAIR), Int32)
        for g in cutlass.range(g_first, g_last + 1, unroll=1):
            start, end = row_group_bounds(offsets, g, offsets.shape[0], at.rows)
            part.fill(0)
            _masked_amax(raw, row0, start, end, part)
            for j in cutlass.range_constexpr(PAIR):
                acc[j] = cutlass.max(acc[j], part[j])
            if g < g_last:
                self._flush(amax, offsets, at, g, acc)
                acc.fill(0)

    @cute.jit
    def _flush(self, amax: cute.Tensor, offsets, at: Columns, g: Int32, acc: cute.Tensor):
        """Atomic max of ``acc`` into the amax words of (group ``g``, the thread's columns)."""
        if self._real(g, offsets):
            for j in cutlass.range_constexpr(PAIR):
                col = at.pair * PAIR + j
                if col < at.cols:
                    ptr = amax.iterator + (g * at.cols + col)
                    cute.arch.red(ptr, acc[j], op="max", dtype=Int32, sem="relaxed", scope="gpu")


class Fp8ColCastKernel(_ColumnPass, Kernel):
    """Cast pass (module docstring). Launch: ``kernel(x, q, amax, scales, offsets, mask, steps,
    q_rows, row_scales)`` (the last two: the dual's row outputs, else None: q_rows E4M3 (M, K) or
    (E, N, K) row-major, row_scales fp32 (M,) or (E, N)): q (M, K) strides (1, M) or (E, N, K)
    strides (N K, 1, N); ``amax`` the amax pass's words; scales fp32 (K,), (G K,) or (E, K);
    ``mask`` the rounding (``cute_utils.fp8.POW2_MASK`` or -1)."""

    name = "quantize_fp8_col_cast"

    @classmethod
    def loads_in_flight(cls, variant: Fp8ColVariant, config: Fp8ColCastConfig, cols: int) -> LoadsInFlight:
        """Cast pass: ``load_blocks`` 32-row blocks of its column pair per thread, all loads before
        any use."""
        return _column_loads(variant, config.load_blocks)

    @classmethod
    def variants(cls) -> list[Fp8ColVariant]:
        return _variants(stores=(True, False))

    @classmethod
    def target_name(cls, variant: Fp8ColVariant) -> str:
        return f"{cls.name}_{variant.suffix()}_{'s16' if variant.vector_stores else 's1'}"

    @classmethod
    def fake_arguments(cls, variant: Fp8ColVariant) -> tuple:
        """x, q (q^T rows 16-byte aligned for ``vector_stores``), amax, scales, offsets, mask,
        steps, (dual) q_rows (M, K) or (E, N, K) row-major and row_scales (M,) or (E, N), the env
        stream."""
        rows = cute.sym_int(divisibility=16 if variant.vector_stores else 1)
        cols = cute.sym_int(divisibility=PAIR if variant.vector_loads else 1)
        x = _fake_x(variant, rows, cols)
        q_align = 16 if variant.vector_stores else 1
        if variant.rank == 3:
            experts = x.shape[0]
            q = _fake(Float8E4M3FN, (experts, rows, cols), (2, 0, 1), q_align)
            scales = _fake(Float32, (experts, cols), (1, 0), 4)
        else:
            q = _fake(Float8E4M3FN, (rows, cols), (0, 1), q_align)
            scales = _fake(Float32, (cute.sym_int(),), (0,), 4)
        amax = _fake(Int32, (cute.sym_int(),), (0,), 4)
        q_rows = row_scales = None
        if variant.dual:
            pair_align = PAIR if variant.vector_loads else 1
            if variant.rank == 3:
                q_rows = _fake(Float8E4M3FN, (x.shape[0], rows, cols), (2, 1, 0), pair_align)
                row_scales = _fake(Float32, (x.shape[0], rows), (1, 0), 4)
            else:
                q_rows = _fake(Float8E4M3FN, (rows, cols), (1, 0), pair_align)
                row_scales = _fake(Float32, (rows,), (0,), 4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        mask, steps = Int32(-1), Int32(1)
        return x, q, amax, scales, _fake_offsets(variant), mask, steps, q_rows, row_scales, stream

    @cute.jit
    def __call__(self, x, q, amax, scales, offsets, mask: Int32, steps: Int32, q_rows, row_scales, stream):
        if cutlass.const_expr(self.variant.dual and self.variant.rank == 2):  # q_rows (M, K) as (1, M, K)
            q_rows = as_one_expert(q_rows, PAIR if self.variant.vector_loads else 1)
        if cutlass.const_expr(self.variant.rank == 2):  # q (M, K) column-major: its transpose row-major
            qt = as_one_expert(q, 16 if self.variant.vector_stores else 1, transpose=True)
        else:  # q (E, N, K) with strides (N K, 1, N) seen as (E, K, N) row-major
            qt = cute.make_tensor(q.iterator, cute.select(q.layout, mode=[0, 2, 1]))
        x = _as_experts(x)
        experts, rows, cols = x.shape
        row_tiles = cutlass.max(ceil_div(rows, TILE_M), 1)
        chunks, tiles_per_cta = self._column_chunks(row_tiles * experts, cols)
        scales = _flat(scales)
        self.kernel(x, qt, amax, scales, offsets, mask, steps, tiles_per_cta, q_rows, row_scales).launch(
            grid=[row_tiles, chunks, experts],
            block=[THREADS, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=0,
        )

    def _column_chunks(self, row_ctas, cols):
        """``(chunks, tiles_per_cta)``: the column tiles of K split into runs of ``tiles_per_cta``,
        as many runs as bring the grid (``row_ctas`` x chunks) near ``config.target_ctas``."""
        col_tiles = ceil_div(cols, TILE_K)
        chunks = cutlass.min(col_tiles, cutlass.max(self.config.target_ctas // row_ctas, 1))
        tiles_per_cta = ceil_div(col_tiles, chunks)
        return ceil_div(col_tiles, tiles_per_cta), tiles_per_cta

    @cute.kernel
    def kernel(self, x, qt, amax, scales, offsets, mask, steps, tiles_per_cta: Int32, q_rows, row_scales):
        tid, _, _ = cute.arch.thread_idx()
        row_tile, chunk, e = cute.arch.block_idx()
        experts, rows, cols = x.shape
        src = CastSource(amax, offsets, mask, steps)
        dual = None
        if cutlass.const_expr(self.variant.dual):
            end = rows
            if cutlass.const_expr(self.variant.grouped):
                end = clamped_end(offsets, offsets.shape[0] - 1, rows)
            rows_at = Columns(e, tid, rows, cols)
            row_q = self._row_q_scales(src, row_scales, row_tile * TILE_M, rows_at, experts, end)
            dual = DualRows(q_rows, row_q, end)
        first_tile = chunk * tiles_per_cta
        last_tile = cutlass.min(first_tile + tiles_per_cta, ceil_div(cols, TILE_K))
        for tile in cutlass.range(first_tile, last_tile, unroll=1):
            at = Columns(e, tile * THREADS + tid, rows, cols)
            self._store_scales(src, scales, at, row_tile)
            self._row_tile(x, qt, src, at, row_tile * TILE_M, dual)

    @cute.jit
    def _row_q_scales(
        self, src: CastSource, row_scales, first_row: Int32, at: Columns, experts: Int32, end: Int32
    ):
        """Dual: the ``q_scale`` of each of the row tile's 128 rows of expert ``at.e`` (thread ``t``:
        row ``first_row + t``; 0 from row ``end`` on) into shared memory, returned as a (128,)
        tensor; the CTAs of column chunk 0 also store the dequantization scales ``1 / q_scale`` of
        the rows below ``end`` in ``row_scales`` (M,) or (E, N). Ends with a CTA barrier."""
        tid, _, _ = cute.arch.thread_idx()
        _, chunk, _ = cute.arch.block_idx()
        row_q_scales = SmemAllocator().allocate_tensor(Float32, cute.make_layout(TILE_M), 16)
        row = first_row + tid
        q_scale = Float32(0.0)
        if row < end:
            row_words = self._row_words(src.offsets, experts, at.e, at.rows, at.cols)
            q_scale = fp8_quant_scale_masked(src.amax[row_words + row], src.mask)
            if chunk == 0:
                if cutlass.const_expr(self.variant.rank == 3):
                    row_scales[at.e, row] = reciprocal_rn(q_scale)
                else:
                    row_scales[row] = reciprocal_rn(q_scale)
        row_q_scales[tid] = q_scale
        cute.arch.barrier()
        return row_q_scales

    @cute.jit
    def _row_tile(self, x, qt, src: CastSource, at: Columns, first_row: Int32, dual):
        """Rows ``first_row .. first_row + 127`` of the thread's columns into q^T (``dual``: also
        into q row-major), ``load_blocks`` blocks of loads in flight at a time."""
        loads = self.config.load_blocks
        raw = cute.make_rmem_tensor(
            cute.make_layout((BLOCK, PAIR, loads), stride=(PAIR, 1, BLOCK * PAIR)), x.element_type
        )
        q_words = cute.make_rmem_tensor(cute.make_layout((PAIR, 8), stride=(8, 1)), Uint32)
        q_scale = cute.make_rmem_tensor(cute.make_layout(PAIR), Float32)
        g, start, end = self._group_at(src.offsets, at, first_row, src.steps)
        self._q_scale(src, at, g, q_scale)
        for b0 in cutlass.range(0, TILE_M // BLOCK, loads, unroll=1):
            for lb in cutlass.range_constexpr(loads):
                row0 = first_row + (b0 + lb) * BLOCK
                if row0 < at.rows:
                    self._load_block(x, at, row0, at.rows, raw[None, None, lb])
            for lb in cutlass.range_constexpr(loads):
                row0 = first_row + (b0 + lb) * BLOCK
                block = raw[None, None, lb]
                if row0 < at.rows:
                    if cutlass.const_expr(not self.variant.grouped):
                        self._scale_in_group(block, row0, True, q_scale, q_words)
                    else:
                        if row0 + BLOCK <= end:  # the whole block in the current group
                            self._scale_in_group(block, row0, self._real(g, src.offsets), q_scale, q_words)
                        else:
                            g_last = self._last_group(src.offsets, at, row0, at.rows, src.steps)
                            self._scale_across_groups(src, at, block, row0, g, g_last, q_words)
                            g, start, end = _group_index(src.offsets, g_last, at.rows)
                            self._q_scale(src, at, g, q_scale)
                    self._store_block(q_words, qt, at, row0)
                    if cutlass.const_expr(self.variant.dual):
                        self._store_rows(block, dual, at, row0, first_row)

    @cute.jit
    def _scale_in_group(self, block, row0: Int32, real, q_scale: cute.Tensor, q_words: cute.Tensor):
        """``q_words`` of a block inside one group: each column times its ``q_scale`` (``real``: a DSL
        Boolean, or Python ``True`` for the layouts without groups, a constant branch), or 0 (rows
        past every group, whatever they hold). Vector-load variants scale with no row masks
        (rows past the data hold 0); the element variants keep them (fewer registers there)."""
        if cutlass.const_expr(self.variant.vector_loads):
            if real:
                for j in cutlass.range_constexpr(PAIR):
                    _scale_whole_column(block, j, q_scale[j], q_words)
            else:
                q_words.fill(0)
        else:
            stop = row0
            if real:
                stop = row0 + BLOCK
            for j in cutlass.range_constexpr(PAIR):
                _scale_column(block, j, row0, row0, stop, q_scale[j], q_words)

    @cute.jit
    def _store_scales(self, src: CastSource, scales, at: Columns, row_tile: Int32):
        """The dequantization scales ``1 / q_scale`` of the thread's columns for row tile
        ``row_tile``'s groups: ``row_tile, row_tile + T, ...`` (T row tiles), or expert ``e``'s one
        group in row tile 0; 1.0 for an empty group."""
        row_tiles, _, _ = cute.arch.grid_dim()
        for j in cutlass.range_constexpr(PAIR):
            col = at.pair * PAIR + j
            if col < at.cols:
                if cutlass.const_expr(self.variant.grouped):
                    for g in cutlass.range(row_tile, src.offsets.shape[0], row_tiles, unroll=1):
                        start, end = group_bounds(src.offsets, g, at.rows)
                        scales[g * at.cols + col] = _dequant_scale(
                            src.amax[g * at.cols + col], src.mask, end > start
                        )
                else:
                    if row_tile == 0:
                        word = src.amax[at.e * at.cols + col]
                        scales[at.e * at.cols + col] = _dequant_scale(word, src.mask, at.rows > 0)

    @cute.jit
    def _q_scale(self, src: CastSource, at: Columns, g: Int32, q_scale: cute.Tensor):
        """``q_scale[j]`` of (group ``g``, column ``2 pair + j``); 0 past every group and past K."""
        q_scale.fill(0)
        if self._real(g, src.offsets):
            for j in cutlass.range_constexpr(PAIR):
                col = at.pair * PAIR + j
                if col < at.cols:
                    q_scale[j] = fp8_quant_scale_masked(src.amax[g * at.cols + col], src.mask)

    @cute.jit
    def _scale_across_groups(self, src: CastSource, at: Columns, raw, row0, g_first, g_last, q_words):
        """``q_words`` of a block that crosses group ends: each group it touches scales its own rows
        (rows in no group give 0)."""
        scaled = cute.make_rmem_tensor(cute.make_layout(BLOCK), Float32)
        for j in cutlass.range_constexpr(PAIR):
            col = at.pair * PAIR + j
            scaled.fill(0)
            for g in cutlass.range(g_first, g_last + 1, unroll=1):
                if g < src.offsets.shape[0] and col < at.cols:
                    start, end = group_bounds(src.offsets, g, at.rows)
                    q_scale = fp8_quant_scale_masked(src.amax[g * at.cols + col], src.mask)
                    _masked_scale(raw, j, row0, start, end, q_scale, scaled)
            _to_e4m3(scaled, q_words, j)

    @cute.jit
    def _store_rows(self, raw, dual: DualRows, at: Columns, row0: Int32, first_row: Int32):
        """Dual: the block's rows below ``dual.end`` times their row ``q_scale`` as E4M3 into q
        (1, M, K) or (E, N, K) row-major: each lane's column pair, one 2-byte store per row
        (``vector_loads``; else per column)."""
        k0 = at.pair * PAIR
        rows = None
        if cutlass.const_expr(self.variant.vector_loads):
            rows = _block_rows(dual.q, at, row0)  # addressed from row0, stored below the end only
        for i in cutlass.range_constexpr(BLOCK):
            row = row0 + i
            if row < dual.end:
                q_pair = _row_pair_e4m3(raw, i, dual.q_scales[row - first_row])
                if cutlass.const_expr(self.variant.vector_loads):
                    if k0 < at.cols:
                        cute.autovec_copy(q_pair, rows[i, None])
                else:
                    for j in cutlass.range_constexpr(PAIR):
                        if k0 + j < at.cols:
                            dual.q[at.e, row, k0 + j] = q_pair[j]

    @cute.jit
    def _store_block(self, q_words, qt, at: Columns, row0: Int32):
        """The block's E4M3 bytes (``q_words[j, None]``: column ``2 pair + j``) into q^T, rows
        ``row0 ..`` below R."""
        k0 = at.pair * PAIR
        if cutlass.const_expr(self.variant.vector_stores):  # R % 16 == 0: each 16-row half whole
            odd = cute.arch.lane_idx() % 2
            valid = row0 + 16 * odd < at.rows
            store_sector_pairs(q_words, block_half_view(qt), at.e, k0, row0 // BLOCK, valid, at.cols)
        else:
            for j in cutlass.range_constexpr(PAIR):
                q = cute.recast_tensor(q_words[j, None], Float8E4M3FN)
                for i in cutlass.range_constexpr(BLOCK):
                    if row0 + i < at.rows and k0 + j < at.cols:
                        qt[at.e, k0 + j, row0 + i] = q[i]


# ---- the cast into padded token groups ----------------------------------------------------------

HALF = BLOCK // 2  # rows of a half block: the smallest alignment, so a half is in one padded group
HALVES = TILE_M // HALF  # halves of a CTA's row tile
_HALF_WORDS = 3  # per half: group (G: none), first source row, data rows (0 .. HALF)


def _storage(dual: bool = False):
    """Shared memory: the group scan's prefix (units of A) and clamped ends (MAX_GROUPS + 1 words
    each), its per-warp scratch, the row tile's halves (HALVES x 3 words) and (dual) the row
    ``q_scale`` of each of its 128 padded rows."""
    words = prefix_smem_words(MAX_GROUPS)
    fields = {
        "prefix": cute.struct.Align[cute.struct.MemRange[Int32, words], 16],
        "ends": cute.struct.Align[cute.struct.MemRange[Int32, words], 16],
        "warp_totals": cute.struct.Align[cute.struct.MemRange[Int32, WARPS], 16],
        "halves": cute.struct.Align[cute.struct.MemRange[Int32, HALVES * _HALF_WORDS], 16],
    }
    if dual:
        fields["row_q"] = cute.struct.Align[cute.struct.MemRange[Float32, TILE_M], 16]
    return storage_struct(fields)


class Fp8ColPadCastKernel(Fp8ColCastKernel):
    """Cast pass into padded groups (module docstring). Launch: ``kernel(x, q, amax, scales,
    offsets, padded_start, padded_end, mask, steps, alignment, q_rows, row_scales)``: x (M, K) bf16
    or fp32 row-major; q E4M3 (P, K) with strides (1, P), P a multiple of 16; ``amax`` the
    ``groups`` amax pass's (G K,) words (dual: (G K + M,), the row words last); scales fp32 (G K,);
    offsets, padded_start, padded_end int32 (G,), G at most ``MAX_GROUPS``; ``mask`` the rounding;
    ``steps = G.bit_length()``; ``alignment`` A in {16, 32, 64, 128}; ``q_rows`` E4M3 (M, K)
    row-major and ``row_scales`` fp32 (M,) (dual; else None): the rows of every group, each once
    (rows past the last group end are left as they are)."""

    name = "quantize_fp8_col_pad_cast"

    @classmethod
    def variants(cls) -> list[Fp8ColVariant]:
        return [
            Fp8ColVariant(dtype, PADDED, vector, True, dual)
            for dual in (False, True)
            for dtype in DTYPES
            for vector in (True, False)
        ]

    @classmethod
    def target_name(cls, variant: Fp8ColVariant) -> str:
        return f"{cls.name}_{variant.suffix()}"

    @classmethod
    def loads_in_flight(cls, variant: Fp8ColVariant, config, cols: int) -> LoadsInFlight:
        """``load_blocks`` 32-row blocks of its column pair per thread, all loads before any use (as
        the unpadded cast)."""
        return _column_loads(variant, config.load_blocks)

    @classmethod
    def shared_bytes(cls, variant: Fp8ColVariant, config) -> int:
        return _storage(variant.dual).size_in_bytes()

    @classmethod
    def fake_arguments(cls, variant: Fp8ColVariant) -> tuple:
        """x (M, K), q (P, K) column-major with P % 16 == 0, amax, scales, offsets and the padded
        offsets (G,), mask, steps, alignment, (dual) q_rows (M, K) row-major and row_scales (M,),
        the env stream."""
        rows, padded = cute.sym_int(), cute.sym_int(divisibility=16)
        cols = cute.sym_int(divisibility=PAIR if variant.vector_loads else 1)
        x = _fake_x(variant, rows, cols)
        q = _fake(Float8E4M3FN, (padded, cols), (0, 1), 16)
        amax = _fake(Int32, (cute.sym_int(),), (0,), 4)
        scales = _fake(Float32, (cute.sym_int(),), (0,), 4)
        groups = cute.sym_int()
        offsets, padded_start, padded_end = (_fake(Int32, (groups,), (0,), 4) for _ in range(3))
        q_rows = row_scales = None
        if variant.dual:
            q_rows = _fake(Float8E4M3FN, (rows, cols), (1, 0), PAIR if variant.vector_loads else 1)
            row_scales = _fake(Float32, (rows,), (0,), 4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        mask, steps, alignment = Int32(-1), Int32(1), Int32(16)
        args = (x, q, amax, scales, offsets, padded_start, padded_end, mask, steps, alignment)
        return (*args, q_rows, row_scales, stream)

    def launcher(self):
        return self.launch_padded

    @cute.jit
    def launch_padded(
        self, x, q, amax, scales, offsets, padded_start, padded_end, mask: Int32, steps: Int32,
        alignment: Int32, q_rows, row_scales, stream,
    ):  # fmt: skip
        qt = as_one_expert(q, 16, transpose=True)  # (1, K, P) row-major
        if cutlass.const_expr(self.variant.dual):  # q_rows (M, K) as (1, M, K)
            q_rows = as_one_expert(q_rows, PAIR if self.variant.vector_loads else 1)
        x = _as_experts(x)
        row_tiles = ceil_div(q.shape[0], TILE_M)
        chunks, tiles_per_cta = self._column_chunks(row_tiles, x.shape[2])
        args = (x, qt, amax, _flat(scales), offsets, padded_start, padded_end, mask, steps, alignment)
        self.kernel_padded(*args, tiles_per_cta, q_rows, row_scales).launch(
            grid=[row_tiles, chunks, 1],
            block=[THREADS, 1, 1],
            smem=_storage(self.variant.dual).size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=100,  # the scan arrays: 16 KB a CTA
        )

    @cute.kernel
    def kernel_padded(
        self, x, qt, amax, scales, offsets, padded_start, padded_end, mask, steps, alignment,
        tiles_per_cta: Int32, q_rows, row_scales,
    ):  # fmt: skip
        tid, _, _ = cute.arch.thread_idx()
        row_tile, chunk, _ = cute.arch.block_idx()
        _, rows, cols = x.shape
        storage = SmemAllocator().allocate(_storage(self.variant.dual))
        prefix = storage.prefix.get_tensor(cute.make_layout(prefix_smem_words(MAX_GROUPS)))
        ends = storage.ends.get_tensor(cute.make_layout(prefix_smem_words(MAX_GROUPS)))
        warp_totals = storage.warp_totals.get_tensor(cute.make_layout(WARPS))
        halves = storage.halves.get_tensor(cute.make_layout((HALVES, _HALF_WORDS), stride=(_HALF_WORDS, 1)))
        num_groups = offsets.shape[0]
        scan_group_sizes(offsets, num_groups, rows, alignment, prefix, warp_totals, tid, THREADS, ends)
        if row_tile == 0 and chunk == 0:
            store_padded_offsets(prefix, num_groups, alignment, padded_start, padded_end, tid, THREADS)
        first_row = row_tile * TILE_M
        if tid < HALVES:
            _map_half(prefix, ends, num_groups, alignment, first_row + tid * HALF, halves[tid, None])
        cute.arch.barrier()
        src = CastSource(amax, offsets, mask, steps)
        dual = None
        if cutlass.const_expr(self.variant.dual):
            row_q = storage.row_q.get_tensor(cute.make_layout(TILE_M))
            self._padded_row_q_scales(src, row_scales, halves, row_q, num_groups * cols)
            dual = DualRows(q_rows, row_q)
        first_tile = chunk * tiles_per_cta
        last_tile = cutlass.min(first_tile + tiles_per_cta, ceil_div(cols, TILE_K))
        for tile in cutlass.range(first_tile, last_tile, unroll=1):
            at = Columns(Int32(0), tile * THREADS + tid, rows, cols)
            self._store_scales(src, scales, at, row_tile)
            self._padded_row_tile(x, qt, src, at, first_row, halves, dual)

    @cute.jit
    def _padded_row_q_scales(self, src: CastSource, row_scales, halves, row_q: cute.Tensor, row_words: Int32):
        """Dual: thread ``t`` puts the row ``q_scale`` of padded row ``128 T + t`` (its source row's,
        from the row word at ``row_words + row``; 0 for a padding row) into ``row_q[t]``; the CTAs
        of column chunk 0 also store the source rows' ``1 / q_scale`` in ``row_scales``. Every
        source row of a group has one padded row, so each scale is written once. Ends with a CTA
        barrier."""
        tid, _, _ = cute.arch.thread_idx()
        _, chunk, _ = cute.arch.block_idx()
        half = halves[tid // HALF, None]
        q_scale = Float32(0.0)
        if tid % HALF < half[2]:
            row = half[1] + tid % HALF
            q_scale = fp8_quant_scale_masked(src.amax[row_words + row], src.mask)
            if chunk == 0:
                row_scales[row] = reciprocal_rn(q_scale)
        row_q[tid] = q_scale
        cute.arch.barrier()

    @cute.jit
    def _padded_row_tile(self, x, qt, src: CastSource, at: Columns, first_row: Int32, halves, dual):
        """Padded rows ``first_row .. first_row + 127`` (those below P) of the thread's columns into
        q^T (``dual``: also the data rows into q row-major), ``load_blocks`` blocks of loads in
        flight at a time, then block by block; a group's ``q_scale`` is computed again only when a
        half's group differs from the last one met."""
        loads = self.config.load_blocks
        padded_rows = qt.shape[2]
        dst = Columns(at.e, at.pair, padded_rows, at.cols)
        raw = cute.make_rmem_tensor(
            cute.make_layout((BLOCK, PAIR, loads), stride=(PAIR, 1, BLOCK * PAIR)), x.element_type
        )
        q_words = cute.make_rmem_tensor(cute.make_layout((PAIR, 8), stride=(8, 1)), Uint32)
        q_lo = cute.make_rmem_tensor(cute.make_layout(PAIR), Float32)
        q_hi = cute.make_rmem_tensor(cute.make_layout(PAIR), Float32)
        g_lo, g_hi = Int32(-1), Int32(-1)
        for b0 in cutlass.range(0, TILE_M // BLOCK, loads, unroll=1):
            for lb in cutlass.range_constexpr(loads):
                b = b0 + lb
                if first_row + b * BLOCK < padded_rows:
                    self._load_halves(
                        x, at, halves[2 * b, None], halves[2 * b + 1, None], raw[None, None, lb]
                    )
            for lb in cutlass.range_constexpr(loads):
                b = b0 + lb
                row0 = first_row + b * BLOCK
                if row0 < padded_rows:
                    lo, hi = halves[2 * b, None], halves[2 * b + 1, None]
                    if lo[0] != g_lo:
                        g_lo = lo[0]
                        self._q_scale(src, at, g_lo, q_lo)
                    if hi[0] != g_hi:
                        g_hi = hi[0]
                        if g_hi == g_lo:
                            q_hi.store(q_lo.load())
                        else:
                            self._q_scale(src, at, g_hi, q_hi)
                    for j in cutlass.range_constexpr(PAIR):
                        _scale_halves(raw[None, None, lb], j, q_lo[j], q_hi[j], q_words)
                    self._store_block(q_words, qt, dst, row0)
                    if cutlass.const_expr(self.variant.dual):
                        self._store_half_rows(raw[None, None, lb], dual, at, lo, hi, b * BLOCK)

    @cute.jit
    def _store_half_rows(self, raw, dual: DualRows, at: Columns, lo, hi, first: Int32):
        """Dual: the block's data rows (row ``i`` of half ``lo`` / ``hi``: source row ``first + i %
        16`` below the half's data rows) times their row ``q_scale`` (``dual.q_scales[first + i]``,
        ``first`` the block's place in the row tile) as E4M3 into q (1, M, K) row-major: the lane's
        column pair, one 2-byte store per row (``vector_loads``; else per column). Both halves whole
        and contiguous: the 32 addresses from one base (:func:`_block_rows`)."""
        k0 = at.pair * PAIR
        if cutlass.const_expr(self.variant.vector_loads):
            whole = lo[2] == HALF and hi[2] == HALF and hi[1] == lo[1] + HALF
            if k0 < at.cols:
                if whole:
                    rows = _block_rows(dual.q, at, lo[1])
                    for i in cutlass.range_constexpr(BLOCK):
                        cute.autovec_copy(_row_pair_e4m3(raw, i, dual.q_scales[first + i]), rows[i, None])
                else:
                    pairs = column_pair_view(dual.q)
                    for i in cutlass.range_constexpr(BLOCK):
                        half = lo if i < HALF else hi
                        if i % HALF < half[2]:
                            q_pair = _row_pair_e4m3(raw, i, dual.q_scales[first + i])
                            cute.autovec_copy(q_pair, pairs[at.e, half[1] + i % HALF, at.pair, None])
        else:
            for i in cutlass.range_constexpr(BLOCK):
                half = lo if i < HALF else hi
                if i % HALF < half[2]:
                    q_pair = _row_pair_e4m3(raw, i, dual.q_scales[first + i])
                    for j in cutlass.range_constexpr(PAIR):
                        if k0 + j < at.cols:
                            dual.q[at.e, half[1] + i % HALF, k0 + j] = q_pair[j]

    @cute.jit
    def _load_halves(self, x, at: Columns, lo: cute.Tensor, hi: cute.Tensor, raw: cute.Tensor):
        """The block's rows of the thread's columns into ``raw`` (32, 2): row ``i`` of half ``h``
        (``lo`` for i < 16, else ``hi``: (group, first source row, data rows)) from source row
        ``first + i % 16`` when ``i % 16`` is below the half's data rows, else 0. Both halves whole
        and contiguous (a block inside one group's data): one unmasked 32-row load."""
        whole = lo[2] == HALF and hi[2] == HALF and hi[1] == lo[1] + HALF
        if cutlass.const_expr(self.variant.vector_loads and self._unmasked_loads()):
            if whole and at.pair * PAIR < at.cols:
                load_whole_block(x, at, lo[1], raw)
            else:
                self._load_halves_masked(x, at, lo, hi, raw)
        else:
            self._load_halves_masked(x, at, lo, hi, raw)

    @cute.jit
    def _load_halves_masked(self, x, at: Columns, lo: cute.Tensor, hi: cute.Tensor, raw: cute.Tensor):
        """:meth:`_load_halves` with a mask per row (and, element loads, per column)."""
        raw.fill(0)
        pairs = column_pair_view(x)
        for i in cutlass.range_constexpr(BLOCK):
            half = lo if i < HALF else hi
            r = i % HALF
            if r < half[2]:
                row = half[1] + r
                if cutlass.const_expr(self.variant.vector_loads):
                    if at.pair * PAIR < at.cols:
                        cute.autovec_copy(pairs[at.e, row, at.pair, None], raw[i, None])
                else:
                    for j in cutlass.range_constexpr(PAIR):
                        if at.pair * PAIR + j < at.cols:
                            raw[i, j] = x[at.e, row, at.pair * PAIR + j]


@cute.jit
def _map_half(prefix, ends, num_groups: Int32, alignment: Int32, row: Int32, half: cute.Tensor):
    """``half`` = (group, first source row, data rows) of padded rows ``[row, row + 16)``: the
    padded group g that holds them (``prefix`` in units of A, :func:`scan_group_sizes`) and its
    source rows there, ``start_g + row - A prefix[g]`` for up to ``n_g`` minus that offset (0 when
    the half is all padding); group G and no rows past the last padded group. With garbage offsets
    every value stays inside x (the ends are clamped)."""
    g, first, count = num_groups, Int32(0), Int32(0)
    unit = row // alignment
    if unit < prefix[num_groups]:
        g = find_group(prefix, num_groups, unit, search_steps(MAX_GROUPS))
        start, end = smem_group_bounds(ends, g)
        first = start + row - prefix[g] * alignment
        count = cutlass.min(cutlass.max(end - first, 0), HALF)
    half[0] = g
    half[1] = first
    half[2] = count


@cute.jit
def _scale_halves(raw: cute.Tensor, j: cutlass.Constexpr, q_lo: Float32, q_hi: Float32, q_words):
    """Column ``j`` of the block, rows 0-15 times ``q_lo`` and 16-31 times ``q_hi`` (rows with no
    data hold 0), as E4M3 bytes into ``q_words[j, None]``."""
    scaled = cute.make_rmem_tensor(cute.make_layout(BLOCK), Float32)
    for i in cutlass.range_constexpr(BLOCK):
        scaled[i] = Float32(raw[i, j]) * (q_lo if i < HALF else q_hi)
    _to_e4m3(scaled, q_words, j)


__all__ = [
    "DTYPES",
    "LAYOUTS",
    "PADDED",
    "load_whole_block",
    "Columns",
    "Fp8ColAmaxConfig",
    "Fp8ColAmaxKernel",
    "Fp8ColCastConfig",
    "Fp8ColCastKernel",
    "Fp8ColPadCastKernel",
    "HALF",
    "Fp8ColVariant",
]
