"""``quantize_mxfp8_2d`` with 1x32 blocks: bf16/fp32 (M, K) -> E4M3 (M, K) + E8M0 scales, one pass.

Scale layouts (a compile-time choice, :class:`ScaleLayout`):

- ``plain``: the logical (M, K/32) scale matrix, row-major.
- ``blocked``: SPEC section 3's blocked layout of S = (M, K/32), shape (Rp, Cp).
- ``m_groups``: row groups from end offsets, (M + 128 G, Cp); group g's rows blocked from row
  ``P_g = 128 * sum_{i<g} ceil(n_i / 128)``, every byte no group covers written as 0.
- ``experts``: 3D weights (E, N, K) seen as (E N, K), per-expert blocked scales (E, Rp, Cp).
- ``padded``: token-group padding fused in: x's groups are written to their padded rows of q
  (padding rows zero) with the M-groups scales of the padded groups, and CTA 0 writes the padded
  offsets (:func:`padded_group_rows`).

Work decomposition: each row block of 128 rows is split into 32-row quarters, one per warp, and
its 128-column tiles (4 scale columns each) into runs, one per CTA; CTAs are numbered run-fastest
(``chunk_major``), so the blocks past the data come last. Row block b is: source rows
``[128 b, 128 b + 128)`` for ``plain``/``blocked``/``experts`` (an expert's blocks restart at its
first row) and for the grouped layouts ``m_groups`` and ``padded``, whose lanes look up their
row's group after the first loads are issued and store its scale word at the group's scale row
(:func:`m_groups_scale_rows`; padding to an alignment that divides 128 keeps every group's 128-row
blocks, so the padded groups' scales sit where the unpadded ones do), and also zero the rows of
scale block b that no group row fills; ``padded`` also shifts each row of q to its padded row (a
warp shuffle per 2-row step) and zeroes the padding rows of q block b. With ``warp_tiles = 4`` (the
tuned choice) a CTA's 4 warps share one quarter and take adjacent tiles, so each row is read in
1 KB runs; with 1 they take the 4 quarters of one tile. A lane holds 8 consecutive elements (one
16-byte load for bf16): 4 lanes form a 32-element block, so the block max is two butterfly shuffles
away, and a warp covers 2 rows x 128 columns per vector step. Loads go through a per-lane
``cp.async`` ring in shared memory (``batch_vectors`` vectors per unit, ``stages`` units), which
keeps bytes in flight without registers; completion is the lane's own ``wait_group`` (no barrier).
E4M3 data leaves as 8-byte stores; each row's 4 scale bytes are gathered into one word that ends in
lane ``row % 32``, and after a tile each lane stores the one word of the blocked tile its row owns
(``plain``: its row's bytes). A quarter with no row to write only stores zero scale words. The
only CTA barriers are the group scans'.

The kernel is :class:`Quantize1x32Kernel` (registry name ``quantize_1x32``), built from a
:class:`Quantize1x32Variant` (dtype, scaling mode, scale layout, group capacity, SM count) and a
:class:`QuantizeConfig` (per arch in ``cute_kernels.configs``); its launcher is ``__call__`` and its
limits ``can_implement``. M, K and the group count are symbolic: one compile per variant, config and
arch. K must be a multiple of 32 and x 16-byte aligned (the bindings check both).
"""

from dataclasses import dataclass, replace
from enum import Enum

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from cute_kernels.op_specs import QUANTIZE_MXFP8_2D
from cute_utils.blocked import (
    TILE_ROWS,
    TILE_WORDS,
    blocked_row_word,
    blocked_tile_index,
    blocked_word_slot,
    ceil_div,
)
from cute_utils.constants import SMALL_GROUPS
from cute_utils.group_tiles import uniform_groups_row_block
from cute_utils.groups import (
    MAX_GROUPS,
    m_groups_scale_rows,
    padded_group_rows,
    prefix_smem_words,
    scan_padded_group_sizes,
    scan_padded_group_sizes_small,
    search_steps,
    store_padded_offsets,
)
from cute_utils.mx import (
    BLOCK_SIZE,
)
from cute_utils.mx_rows import (
    LANES_PER_ROW,
    QUARTER_ROWS,
    ROWS_PER_STEP,
    TILE_K,
    VECTOR,
    WARPS,
    mx_vector_view,
    quantize_lane_vector,
    row_scale_word,
    store_plain_scales,
)
from cute_utils.occupancy import DEFAULT_NUM_SMS, MAX_GRID_Y, chunk_major_grid, resident_ctas
from cute_utils.smem import storage_struct

from .base import Kernel, LoadsInFlight, ring_units_in_flight

STEPS = QUARTER_ROWS // ROWS_PER_STEP  # 16 steps of 2 rows


class ScaleLayout(str, Enum):
    PLAIN = "plain"
    BLOCKED = "blocked"
    M_GROUPS = "m_groups"
    EXPERTS = "experts"  # 3D weights as (E N, K): per-expert blocked scales (E, Rp, Cp)
    PADDED = "padded"  # token-group padding fused: M-groups scales of the padded groups

    @property
    def scans_groups(self) -> bool:
        return self in (ScaleLayout.M_GROUPS, ScaleLayout.PADDED)


DTYPES = {"bfloat16": BFloat16, "float32": Float32}


@dataclass(frozen=True)
class QuantizeConfig:
    """``batch_vectors``: 8-element vectors (2-row steps of a 128-column tile) per pipeline unit;
    ``stages``: units in a lane's shared-memory ring (``stages - 1`` in flight while one converts);
    ``target_ctas``: grid size aimed for (each CTA loops over a run of column tiles, which amortizes
    the group scan); ``min_ctas_per_sm``: register cap (0: none); ``max_groups``: most groups the
    M-groups variant takes (its scan arrays live in shared memory, which bounds occupancy);
    ``warp_tiles``: warps of a CTA side by side along K (1: the 4 warps take the 4 quarters of a
    128-row block on one tile; 4: one quarter, 4 adjacent tiles, so a row is read in 1 KB runs);
    ``chunk_major``: consecutive CTAs take consecutive column runs of one row unit (else
    consecutive row units of one column run); ``fit_waves`` (the grouped layouts only): when the
    grid would take between one and two waves of resident CTAs, CTAs take twice the column tiles
    if that splits the columns evenly (one wave and a bit leaves most SMs idle at the end; an
    uneven split was slower: notes/quantize-1x32-groups-and-padding.md)."""

    batch_vectors: int = 2
    stages: int = 3
    target_ctas: int = 32768
    min_ctas_per_sm: int = 12
    max_groups: int = MAX_GROUPS  # m_groups: shared-memory size of the group scan
    warp_tiles: int = 4
    chunk_major: bool = True
    fit_waves: bool = True

    def __post_init__(self) -> None:
        if self.warp_tiles not in (1, 2, 4):
            raise ValueError(f"warp_tiles={self.warp_tiles} must be 1, 2 or 4")
        if self.batch_vectors < 1 or STEPS % self.batch_vectors:
            raise ValueError(f"batch_vectors={self.batch_vectors} must divide {STEPS}")
        if self.stages < 2:
            raise ValueError(f"stages={self.stages} must be >= 2")


# The tuned configs (and the reasons for them) live per arch in ``cute_kernels/configs/sm90.py``
# (``quantize_1x32``; sm100 uses the same): 2 vectors per unit x 3 stages, warps side by side along K,
# ~32768 CTAs numbered run-fastest, a 40-register cap (none for fp32). ``SMALL_GROUPS``
# (``cute_utils.constants``) is the M-groups variant for G <= 64: its smaller scan arrays leave room
# for more CTAs per SM (notes/quantize-1x32-groups-and-padding.md).


def _staging_ring(storage, x: cute.Tensor, batch: int, stages: int):
    """Per-lane cp.async staging: ``(ring, atom)``.

    ``ring``: this warp's shared slots (stages, batch, lane, 8), row-major, one unit of ``batch``
    vectors per stage, in ``storage.ring`` (:func:`shared_storage`); ``atom``: the 16-byte
    ``cp.async`` (L2 only) copy. The loads in flight cost no registers, and each lane reads back
    only what it copied itself, so completion is the lane's own ``cp.async.wait_group``: no barrier.
    """
    ring = storage.ring.get_tensor(
        cute.make_ordered_layout((WARPS, stages, batch, 32, VECTOR), order=(4, 3, 2, 1, 0))
    )
    warp = cute.arch.thread_idx()[0] // 32
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), x.element_type, num_bits_per_copy=128
    )
    return ring[warp, None, None, None, None], atom


@cute.jit
def _issue_unit(atom, x_vec: cute.Tensor, slots: cute.Tensor, row: Int32, rows_left: Int32, vec: Int32, cols):
    """Start the copies of one unit into ``slots`` (batch, lane, 8) of this lane: vector i is
    ``x[row + 2 i, 8 vec : 8 vec + 8]`` for rows below ``row + rows_left`` and columns below K
    (others are not copied), in 16-byte pieces; then commit them as one group (also when empty, so
    that groups count units)."""
    lane = cute.arch.thread_idx()[0] % 32
    chunk = 128 // x_vec.element_type.width  # elements per 16-byte copy
    for i in cutlass.range_constexpr(cute.size(slots, mode=[0])):
        if i * ROWS_PER_STEP < rows_left and vec * VECTOR < cols:
            src = x_vec[row + i * ROWS_PER_STEP, vec, None]
            dst = slots[i, lane, None]
            for c in cutlass.range_constexpr(VECTOR // chunk):
                cute.copy(atom, cute.local_tile(src, (chunk,), (c,)), cute.local_tile(dst, (chunk,), (c,)))
    cute.arch.cp_async_commit_group()


@cute.jit
def _scale_word_place(scale_row: Int32):
    """``(block, slot)`` of blocked scale row ``scale_row``: row ``128 b + 32 q + l`` is word
    ``slot = 4 l + q`` of the 512-byte tiles of row block ``b`` (SPEC section 3); block -1 for a
    negative row (nothing to store)."""
    within = scale_row % TILE_ROWS
    block = Int32(-1)
    if scale_row >= 0:
        block = scale_row // TILE_ROWS
    return block, blocked_row_word(within)


@cute.jit
def _store_scale_word(scale_words: cute.Tensor, place, col_tiles: Int32, tile: Int32, word: Uint32):
    """Store a row's word (its 4 scale bytes of 128-column tile ``tile``) at ``place`` (from
    :func:`_scale_word_place`) of a blocked layout with ``col_tiles`` tile columns.
    ``scale_words``: the blocked scales as flat words; words past the end are skipped."""
    block, slot = place
    word_index = blocked_tile_index(block, tile, col_tiles) * TILE_WORDS + slot
    if block >= 0 and word_index < cute.size(scale_words):
        scale_words[word_index] = word


def shared_storage(dtype_name: str, layout: ScaleLayout, config: QuantizeConfig):
    """The ``@cute.struct`` of one CTA's shared memory: ``ring``, the warps' cp.async rings
    (WARPS x stages x batch_vectors x 32 lanes x 8 elements of x's dtype, 128-byte aligned); for the
    grouped layouts the group scans' Int32 arrays ``prefix`` and ``ends`` (``max_groups + 1``
    words), their scratch ``warp_totals`` (a word per warp) and, ``padded``, the aligned scan's
    ``aligned``. The kernel allocates it; its size is the launch's dynamic shared memory."""
    words = prefix_smem_words(config.max_groups)
    ring = WARPS * config.stages * config.batch_vectors * 32 * VECTOR
    fields = {"ring": cute.struct.Align[cute.struct.MemRange[DTYPES[dtype_name], ring], 128]}
    if layout.scans_groups:
        fields["prefix"] = cute.struct.Align[cute.struct.MemRange[Int32, words], 16]
        fields["ends"] = cute.struct.Align[cute.struct.MemRange[Int32, words], 16]
        fields["warp_totals"] = cute.struct.Align[cute.struct.MemRange[Int32, WARPS], 16]
    if layout is ScaleLayout.PADDED:
        fields["aligned"] = cute.struct.Align[cute.struct.MemRange[Int32, words], 16]
    return storage_struct(fields)


def _scale_view(scales: cute.Tensor, layout: ScaleLayout, rows, scale_cols) -> cute.Tensor:
    """Where the kernel writes scales: ``plain``, the (M, K/32) scale bytes; else the blocked scales
    as flat Uint32 words."""
    if layout is ScaleLayout.PLAIN:
        return cute.make_tensor(
            cute.recast_ptr(scales.iterator, dtype=Uint8),
            cute.make_layout((rows, scale_cols), stride=(scale_cols, 1)),
        )
    return cute.make_tensor(
        cute.recast_ptr(scales.iterator, dtype=Uint32), cute.make_layout(cute.size(scales) // 4)
    )


@cute.jit
def _zero_padding_rows(q_vec, q_zero, q_first_row, warp, warp_tiles: cutlass.Constexpr):
    """Zero this warp's columns of the rows of its quarter (from q row ``q_first_row``; lane l holds
    ``q_zero`` of row l) that are padding rows of q (``padded``: no group's data lands there)."""
    zero_mask = cute.arch.vote_ballot_sync(q_zero)
    if zero_mask != 0:
        zeros = cute.make_rmem_tensor(cute.make_layout(VECTOR), Float8E4M3FN)
        zeros.fill(0.0)
        for t in cutlass.range(warp.tiles, unroll=1):
            vec = (warp.first_tile + t * warp_tiles) * LANES_PER_ROW + warp.lane_vec
            for step in cutlass.range_constexpr(STEPS):
                r = warp.lane // LANES_PER_ROW + step * ROWS_PER_STEP
                if (zero_mask >> r) & 1 and vec * VECTOR < warp.cols:
                    cute.autovec_copy(zeros, q_vec[q_first_row + r, vec, None])


# --- The kernel's per-thread state (DSL values, bundled to keep argument lists short) ------------


@dataclass(frozen=True)
class _WarpWork:
    """Where a lane works: ``lane``; ``quarter_row``, the first row of its warp's quarter inside the
    row block; ``lane_row``, the lane's row in the block at step 0; ``lane_vec``, its vector of a
    128-column tile; the warp's ``tiles`` tiles ``first_tile + warp_tiles * j``; ``cols`` (K)."""

    lane: Int32
    quarter_row: Int32
    lane_row: Int32
    lane_vec: Int32
    first_tile: Int32
    tiles: Int32
    cols: Int32


@dataclass(frozen=True)
class _Loads:
    """A warp's cp.async pipeline: the copy ``atom``, ``x_vec`` (:func:`~cute_utils.mx_rows.mx_vector_view`
    of x), the lane's ``ring`` (:func:`_staging_ring`), its ``units`` (0: nothing to load), and the
    row block's rows of x, ``[src_row, src_row + src_rows)``."""

    atom: object
    x_vec: cute.Tensor
    ring: cute.Tensor
    units: Int32
    src_row: Int32
    src_rows: Int32


@dataclass(frozen=True)
class _Groups:
    """The grouped layouts' inputs: ``offsets`` (group end rows), ``padded_start`` / ``padded_end``
    (``padded``'s outputs), ``alignment`` (``padded``), and the row counts of x and q."""

    offsets: cute.Tensor
    padded_start: object
    padded_end: object
    alignment: Int32
    rows: Int32
    out_rows: Int32


@dataclass(frozen=True)
class _ScaleStores:
    """Where a lane's scale words go: ``view`` (:func:`_scale_view`), ``col_tiles`` (128-column tiles
    of K), and the blocked layouts' ``place`` of the lane's row word and ``zero_place`` of the row
    it zeroes (:func:`_scale_word_place`)."""

    view: cute.Tensor
    col_tiles: Int32
    place: tuple
    zero_place: tuple


# --- The kernel -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quantize1x32Variant:
    """Compile-time choices of the 1x32 kernel: ``dtype`` (a :data:`DTYPES` name), ``mode``
    (``"floor"`` or ``"rceil"``), ``layout``, ``max_groups`` (the grouped layouts' scan arrays:
    ``SMALL_GROUPS`` or ``MAX_GROUPS``; the config takes it) and ``num_sms`` (the device's SM count,
    which sizes the waves of ``QuantizeConfig.fit_waves``; 0: the arch's usual count)."""

    dtype: str
    mode: str
    layout: ScaleLayout
    max_groups: int = MAX_GROUPS
    num_sms: int = 0
    #: 2: x and q (M, K), scales 2-D; 3 (``experts`` and ``plain``): w and q (E, N, K), scales
    #: (E, R, C), flattened to rows inside the launcher, so the 3-D op makes no host-side views
    #: per call; the device code is the rank-2 variant's (tests/cute_kernels/test_quantize_compile.py).
    rank: int = 2

    def __post_init__(self) -> None:
        if self.rank == 3 and self.layout not in (ScaleLayout.EXPERTS, ScaleLayout.PLAIN):
            raise ValueError(f"rank 3 takes the experts or plain layout, got {self.layout.value}")


def _rows_view(t: cute.Tensor) -> cute.Tensor:
    """A row-major (E, R, C) tensor as (E R, C)."""
    experts, rows, cols = t.shape
    return cute.make_tensor(t.iterator, cute.make_layout((experts * rows, cols), stride=(t.stride[1], 1)))


class Quantize1x32Kernel(Kernel):
    """The 1x32 quantization kernel (module docstring); launch contract in :meth:`__call__`."""

    name = "quantize_1x32"

    @classmethod
    def loads_in_flight(
        cls, variant: Quantize1x32Variant, config: QuantizeConfig, cols: int
    ) -> LoadsInFlight:
        """Per lane ``stages - 1`` ring units of ``batch_vectors`` 8-element vectors."""
        elem = DTYPES[variant.dtype].width // 8
        units = ring_units_in_flight(config.stages)
        return LoadsInFlight(
            32 * WARPS,
            WARPS * 32 * units * config.batch_vectors * VECTOR * elem,
            f"{WARPS} warps x 32 lanes x {units} units (stages {config.stages} - 1) x "
            f"{config.batch_vectors} vectors x {VECTOR} elem x {elem} B",
        )

    @classmethod
    def shared_bytes(cls, variant: Quantize1x32Variant, config: QuantizeConfig) -> int:
        """The size of :func:`shared_storage`, the struct the kernel allocates: the warps'
        ``cp.async`` rings (``config.stages`` units each) and the group scans' arrays."""
        return shared_storage(variant.dtype, variant.layout, config).size_in_bytes()

    def __init__(self, variant: Quantize1x32Variant, config: QuantizeConfig) -> None:
        if variant.mode not in ("floor", "rceil"):
            raise ValueError(f"mode must be 'floor' or 'rceil', got {variant.mode!r}")
        super().__init__(variant, config)
        layout = variant.layout
        self.mode = variant.mode
        self.layout = layout
        self.padded = layout is ScaleLayout.PADDED
        self.batch = config.batch_vectors
        self.batches = STEPS // config.batch_vectors
        self.ring_units = config.stages
        self.ahead = config.stages - 1  # units in flight while one converts
        self.warp_tiles = config.warp_tiles
        self.warp_rows = WARPS // config.warp_tiles  # quarters of a row block per CTA
        self.threads = 32 * WARPS
        self.storage = shared_storage(variant.dtype, layout, config)
        self.fit_waves = config.fit_waves and layout.scans_groups
        num_sms = variant.num_sms or DEFAULT_NUM_SMS["sm_90a"]
        self.wave_ctas = num_sms * resident_ctas(config.min_ctas_per_sm, self.shared_bytes(variant, config))
        # One round of offset loads (a thread per group) when the variant's group count allows it.
        small = config.max_groups <= self.threads
        self.scan = scan_padded_group_sizes_small if small else scan_padded_group_sizes

    @classmethod
    def variants(cls) -> list[Quantize1x32Variant]:
        """Every (dtype, mode, layout, max groups) the bindings may ask for, with ``num_sms=0`` (the
        SM count changes only the launcher's wave sizing: the bindings pass the device's)."""
        out = []
        for d in DTYPES:
            for m in ("floor", "rceil"):
                for layout in ScaleLayout:
                    for g in (SMALL_GROUPS, MAX_GROUPS) if layout.scans_groups else (MAX_GROUPS,):
                        out.append(Quantize1x32Variant(d, m, layout, g))
                    if layout in (ScaleLayout.EXPERTS, ScaleLayout.PLAIN):  # the 3-D op's operands
                        out.append(Quantize1x32Variant(d, m, layout, rank=3))
        return out

    @classmethod
    def target_name(cls, variant: Quantize1x32Variant) -> str:
        """``quantize_1x32_<dtype>_<mode>_<layout>[_g<max groups>][_3d]``."""
        suffix = f"_g{variant.max_groups}" if variant.layout.scans_groups else ""
        suffix += "_3d" if variant.rank == 3 else ""
        return f"{cls.name}_{variant.dtype}_{variant.mode}_{variant.layout.value}{suffix}"

    @classmethod
    def compile(cls, variant: Quantize1x32Variant, arch: str, *, config=None, options: str = ""):
        """:meth:`Kernel.compile`, with ``num_sms=0`` read as the arch's usual SM count."""
        if not variant.num_sms:
            variant = replace(variant, num_sms=DEFAULT_NUM_SMS[arch])
        return super().compile(variant, arch, config=config, options=options)

    @classmethod
    def fake_arguments(cls, variant: Quantize1x32Variant) -> tuple:
        """Fake tensors for :meth:`__call__` (M, K, G and the q / scale row counts symbolic; K a
        multiple of 32), the group parameter and the env stream."""
        layout = variant.layout
        rows = cute.sym_int()
        cols = cute.sym_int(divisibility=BLOCK_SIZE)
        lead = (cute.sym_int(),) if variant.rank == 3 else ()
        order = (2, 1, 0) if variant.rank == 3 else (1, 0)
        x = cute.runtime.make_fake_compact_tensor(
            DTYPES[variant.dtype], (*lead, rows, cols), stride_order=order, assumed_align=16
        )
        q_rows = cute.sym_int() if layout is ScaleLayout.PADDED else rows
        q = cute.runtime.make_fake_compact_tensor(
            Float8E4M3FN, (*lead, q_rows, cols), stride_order=order, assumed_align=16
        )
        scale_shape = (*lead, cute.sym_int(), cute.sym_int())
        scales = cute.runtime.make_fake_compact_tensor(
            Float8E8M0FNU, scale_shape, stride_order=order, assumed_align=4
        )
        offsets = padded_start = padded_end = None
        if layout.scans_groups:
            groups = cute.sym_int()
            offsets = cute.runtime.make_fake_compact_tensor(Int32, (groups,), assumed_align=4)
            if layout is ScaleLayout.PADDED:
                padded_start = cute.runtime.make_fake_compact_tensor(Int32, (groups,), assumed_align=4)
                padded_end = cute.runtime.make_fake_compact_tensor(Int32, (groups,), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return x, q, scales, offsets, padded_start, padded_end, Int32(0), stream

    @staticmethod
    def can_implement(cols: int, num_groups: int | None, *data_ptrs: int) -> bool:
        """K a multiple of 32, at most ``MAX_GROUPS`` groups (grouped layouts), and x and q (their
        ``data_ptrs``) 16-byte aligned: the kernel's vector accesses."""
        spec = QUANTIZE_MXFP8_2D
        return cols % spec.divisor("x", "K") == 0 and spec.limits.accepts(num_groups, ptrs=data_ptrs)

    def _grid(self, row_units, chunks):
        """Launch grid of ``row_units`` x ``chunks`` CTAs: ``[row_units, chunks]``, or chunk-major
        (:func:`chunk_major_grid`)."""
        if self.config.chunk_major:
            return chunk_major_grid(row_units, chunks)
        return [row_units, chunks, 1]

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (M, K) bf16/fp32 row-major, K % 32 == 0, 16-byte aligned (rank 3: (E, N, K))
        q: cute.Tensor,  # Float8E4M3FN (M, K), or (padded rows, K) for ``padded`` (rank 3: (E, N, K))
        scales: cute.Tensor,  # Float8E8M0FNU, 4-byte aligned (see below; rank 3: (E, R, C))
        offsets,  # Int32 (G,) row end offsets for ``m_groups`` and ``padded``, else None
        padded_start,  # Int32 (G,) output for ``padded`` (written by CTA 0), else None
        padded_end,  # Int32 (G,) output for ``padded`` (written by CTA 0), else None
        group_param: Int32,  # rows per expert (``experts``), the alignment (``padded``), else ignored
        stream,
    ):
        """Launch on ``stream``. ``scales``: (M, K/32) for ``plain``; otherwise blocked with 128-row
        blocks: (Rp, Cp), M-groups (M + 128 G, Cp), experts (E Rp, Cp) (the (E, Rp, Cp) tensor seen
        as 2-D), padded (padded rows + 128 G, Cp)."""
        if cutlass.const_expr(self.variant.rank == 3):  # (E, N, K) operands: rows of all experts
            x, q, scales = _rows_view(x), _rows_view(q), _rows_view(scales)
        config, warp_tiles = self.config, self.warp_tiles
        row_units = ceil_div(scales.shape[0], TILE_ROWS) * warp_tiles
        col_tiles = ceil_div(x.shape[1], TILE_K)
        chunks = cutlass.min(col_tiles, cutlass.max(config.target_ctas // row_units, 1))
        tiles_per_cta = ceil_div(ceil_div(col_tiles, chunks), warp_tiles) * warp_tiles  # whole warp rounds
        if cutlass.const_expr(self.fit_waves):
            wave_ctas = self.wave_ctas
            ctas = row_units * ceil_div(col_tiles, tiles_per_cta)
            if ctas > wave_ctas and ctas < 2 * wave_ctas and col_tiles % (2 * tiles_per_cta) == 0:
                tiles_per_cta = tiles_per_cta * 2
        chunks = ceil_div(col_tiles, tiles_per_cta)
        self.kernel(x, q, scales, offsets, padded_start, padded_end, group_param, tiles_per_cta).launch(
            grid=self._grid(row_units, chunks),
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=config.min_ctas_per_sm,
            preferred_smem_carveout=100 if config.min_ctas_per_sm else None,
        )

    @cute.jit
    def _issue(self, loads: _Loads, warp: _WarpWork, u):
        """Issue pipeline unit ``u`` (batch ``u % batches`` of this warp's tile
        ``first_tile + warp_tiles * (u // batches)``) into ring slot ``u % ring_units``; past
        ``loads.units`` only an empty group is committed (groups count units)."""
        batches = self.batches
        rows_left = Int32(0)
        vec = (warp.first_tile + (u // batches) * self.warp_tiles) * LANES_PER_ROW + warp.lane_vec
        row = warp.lane_row + (u % batches) * self.batch * ROWS_PER_STEP
        if u < loads.units:
            rows_left = loads.src_rows - row
        slots = loads.ring[u % self.ring_units, None, None, None]
        _issue_unit(loads.atom, loads.x_vec, slots, loads.src_row + row, rows_left, vec, warp.cols)

    @cute.jit
    def _block_rows(self, group_param, row_block, rows):
        """``(src_row, src_rows)`` of row block ``row_block``: its first row of x and how many it
        reads, which are also the rows of q it writes (but for ``padded``, whose rows of q are
        shifted per row). For the grouped layouts this is the plain row block (they tile the data
        by source rows)."""
        src_row = row_block * TILE_ROWS
        src_rows = cutlass.max(cutlass.min(rows - src_row, TILE_ROWS), Int32(0))
        if cutlass.const_expr(self.layout is ScaleLayout.EXPERTS):
            src_row, src_rows = uniform_groups_row_block(row_block, group_param)
        return src_row, src_rows

    @cute.jit
    def _row_block_scan(self, storage, offsets, tid, rows):
        """``(prefix, ends, warp_totals)``: the group scan in units of 128 rows (all threads; ends
        with a CTA barrier) into shared arrays sized for ``config.max_groups``; ``warp_totals`` is
        its scratch, reusable by a later scan."""
        words = prefix_smem_words(self.config.max_groups)
        prefix = storage.prefix.get_tensor(cute.make_layout(words))
        ends = storage.ends.get_tensor(cute.make_layout(words))
        warp_totals = storage.warp_totals.get_tensor(cute.make_layout(WARPS))
        self.scan(offsets, offsets.shape[0], rows, TILE_ROWS, prefix, warp_totals, tid, self.threads, ends)
        return prefix, ends, warp_totals

    @cute.jit
    def _group_rows(self, storage, groups: _Groups, row: Int32, tid: Int32):
        """The rows this thread's row ``row`` maps to in the grouped layouts, which tile the data by
        source rows: ``(data_row, zero_row, q_row, q_zero)``.

        ``data_row`` / ``zero_row``: :func:`m_groups_scale_rows` of source row ``row`` (also this
        thread's scale row). ``padded`` only (else ``(row, False)``): ``q_row``, the padded row of
        q that source row ``row`` goes to (-1: in no group, dropped), and ``q_zero``, whether row
        ``row`` of q is a padding row (:func:`padded_group_rows`); CTA 0 also writes the padded
        offsets. Runs the group scans (every thread of the CTA calls it)."""
        offsets, alignment = groups.offsets, groups.alignment
        prefix, ends, warp_totals = self._row_block_scan(storage, offsets, tid, groups.rows)
        num_groups = offsets.shape[0]
        steps = search_steps(self.config.max_groups)
        data_row, zero_row = m_groups_scale_rows(prefix, ends, num_groups, row, row, steps)
        q_row, q_zero = row, False
        if cutlass.const_expr(self.padded):
            words = prefix_smem_words(self.config.max_groups)
            aligned = storage.aligned.get_tensor(cute.make_layout(words))
            self.scan(
                offsets, num_groups, groups.rows, alignment, aligned, warp_totals, tid, self.threads, ends
            )
            q_row, q_zero = padded_group_rows(
                aligned, ends, num_groups, row, alignment, groups.out_rows, steps
            )
            bx, by, bz = cute.arch.block_idx()
            if bx == 0 and by == 0 and bz == 0:  # CTA 0 (grid z > 1 beyond 65535 row units)
                store_padded_offsets(
                    aligned, num_groups, alignment, groups.padded_start, groups.padded_end, tid, self.threads
                )
        return data_row, zero_row, q_row, q_zero

    @cute.jit
    def _store_tile_scales(self, stores: _ScaleStores, loads: _Loads, warp: _WarpWork, tile, word):
        """After the warp's last unit of ``tile``: the lane's row word (``plain``: its row's bytes),
        and for the grouped layouts a zero word at its ``zero_place``."""
        if cutlass.const_expr(self.layout is ScaleLayout.PLAIN):
            row = warp.quarter_row + warp.lane
            store_plain_scales(stores.view, loads.src_row + row, tile, word, row < loads.src_rows)
        else:
            _store_scale_word(stores.view, stores.place, stores.col_tiles, tile, word)
            if cutlass.const_expr(self.layout.scans_groups):
                _store_scale_word(stores.view, stores.zero_place, stores.col_tiles, tile, Uint32(0))

    @cute.jit
    def _quantize_units(self, loads: _Loads, warp: _WarpWork, stores: _ScaleStores, q_vec, q_row):
        """The warp's main loop over its pipeline units: wait for unit u, issue unit u + ahead,
        quantize the unit's vectors into q (``padded``: row r of the quarter goes to ``q_row`` of
        lane r), gather each row's scale word in lane ``row % 32`` and store it after a tile."""
        batch, batches, ahead, lane = self.batch, self.batches, self.ahead, warp.lane
        my_word = Uint32(0)
        for u in cutlass.range(loads.units, unroll=1):
            self._issue(loads, warp, u + ahead)
            cute.arch.cp_async_wait_group(ahead)
            tile = warp.first_tile + (u // batches) * self.warp_tiles
            b = u % batches
            vec = tile * LANES_PER_ROW + warp.lane_vec
            for i in cutlass.range_constexpr(batch):
                step = b * batch + i
                r = warp.lane_row + step * ROWS_PER_STEP
                in_cols = vec * VECTOR < warp.cols
                out_row = loads.src_row + r
                store = r < loads.src_rows and in_cols
                if cutlass.const_expr(self.padded):  # the padded row of source row r (-1: dropped)
                    out_row = cute.arch.shuffle_sync(q_row, r - warp.quarter_row)
                    store = out_row >= 0 and in_cols
                values = loads.ring[u % self.ring_units, i, lane, None]
                s = quantize_lane_vector(values, q_vec, out_row, vec, store, self.mode)
                # Route the row's scale word to lane (row % 32) of the quarter.
                word = cute.arch.shuffle_sync(row_scale_word(s, lane), (lane % ROWS_PER_STEP) * LANES_PER_ROW)
                if lane // ROWS_PER_STEP == step:
                    my_word = word
            if b == batches - 1:
                self._store_tile_scales(stores, loads, warp, tile, my_word)

    @cute.kernel
    def kernel(
        self,
        x: cute.Tensor,
        q: cute.Tensor,
        scales: cute.Tensor,
        offsets,
        padded_start,
        padded_end,
        group_param: Int32,
        tiles_per_cta: Int32,
    ):
        layout, warp_tiles = self.layout, self.warp_tiles
        tid, _, _ = cute.arch.thread_idx()
        row_unit, col_chunk, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.config.chunk_major):
            col_chunk, row_unit, row_unit_hi = cute.arch.block_idx()
            row_unit = row_unit + row_unit_hi * MAX_GRID_Y
        lane = tid % 32
        warp = tid // 32
        row_block = row_unit // warp_tiles
        quarter = (row_unit % warp_tiles) * self.warp_rows + warp // warp_tiles
        rows, cols = x.shape
        out_rows = q.shape[0]
        scale_cols = cols // BLOCK_SIZE
        col_tiles = ceil_div(cols, TILE_K)
        q_vec = mx_vector_view(q, out_rows, cols)

        storage = SmemAllocator().allocate(self.storage)
        src_row, src_rows = self._block_rows(group_param, row_block, rows)
        scale_view = _scale_view(scales, layout, rows, scale_cols)

        quarter_row = quarter * QUARTER_ROWS  # first row of this warp inside the block
        lane_row = quarter_row + lane // LANES_PER_ROW  # the lane's row in the block at step 0
        lane_vec = lane % LANES_PER_ROW
        chunk_tile = col_chunk * tiles_per_cta
        first_tile = chunk_tile + warp % warp_tiles  # this warp's tiles: first_tile + warp_tiles * j
        last_tile = cutlass.min(chunk_tile + tiles_per_cta, col_tiles)

        # Per-lane cp.async pipeline: unit u = batch (u % batches) of this warp's tile u // batches, in
        # ring slot u % ring_units; ``ahead`` units are in flight while one converts.
        x_vec = mx_vector_view(x, rows, cols)
        ring, atom = _staging_ring(storage, x, self.batch, self.ring_units)
        tiles = cutlass.max(ceil_div(last_tile - first_tile, warp_tiles), 0)
        units = tiles * self.batches
        # A quarter with no source row (the zero row blocks of the grouped layouts) only zeroes its
        # scale words (and, ``padded``, its padding rows of q): no loads, no conversions.
        zero_tiles = Int32(0)
        if cutlass.const_expr(layout.scans_groups):
            if quarter_row >= src_rows:
                zero_tiles = tiles
                units = Int32(0)
        work = _WarpWork(lane, quarter_row, lane_row, lane_vec, first_tile, tiles, cols)
        loads = _Loads(atom, x_vec, ring, units, src_row, src_rows)
        for u in cutlass.range_constexpr(self.ahead):
            self._issue(loads, work, u)
        # The scale row this lane's row word goes to, and one it zeroes (grouped layouts: the data is
        # tiled by source rows, so the group scans run while the first loads are in flight).
        scale_place = (row_block, blocked_word_slot(lane, quarter))  # _scale_word_place of the lane's row
        zero_place = scale_place
        q_row, q_zero = Int32(0), False
        if cutlass.const_expr(layout.scans_groups):
            own_row = row_block * TILE_ROWS + quarter_row + lane
            groups = _Groups(offsets, padded_start, padded_end, group_param, rows, out_rows)
            data_row, zero_row, q_row, q_zero = self._group_rows(storage, groups, own_row, tid)
            scale_place = _scale_word_place(data_row)
            zero_place = _scale_word_place(zero_row)
        stores = _ScaleStores(scale_view, col_tiles, scale_place, zero_place)
        self._quantize_units(loads, work, stores, q_vec, q_row)
        if cutlass.const_expr(layout.scans_groups):
            for t in cutlass.range(zero_tiles, unroll=1):
                _store_scale_word(scale_view, zero_place, col_tiles, first_tile + t * warp_tiles, Uint32(0))
        if cutlass.const_expr(self.padded):
            q_first_row = row_block * TILE_ROWS + quarter_row
            _zero_padding_rows(q_vec, q_zero, q_first_row, work, warp_tiles)


__all__ = [
    "DTYPES",
    "QuantizeConfig",
    "Quantize1x32Kernel",
    "Quantize1x32Variant",
    "ScaleLayout",
]
