"""1x32 MXFP8 quantization with TMA loads: the same bytes as :mod:`cute_kernels.quantize` for the
``plain`` and ``blocked`` scale layouts (bf16 / fp32 input, floor / rceil), with the per-lane
``cp.async`` ring replaced by one TMA box per pipeline unit (:mod:`cute_utils.tma`). Experimental:
registered as ``quantize_tma`` (compiled and SASS-checked, benchmarked by
``python -m bench.tune quantize_tma``) but run by no public op.

Work decomposition (as in :mod:`cute_kernels.quantize`): each 128-row block of scale rows is split
into four 32-row quarters, one per warp, and its 128-column tiles into runs, one per CTA; with
``warp_tiles = 4`` a CTA's 4 warps share one quarter and take adjacent tiles (rows read in 1 KB runs
for bf16), with 1 they take the four quarters of one tile. A lane holds 8 consecutive elements of a
row (lanes ``16 p .. 16 p + 15`` cover row parity ``p`` of a 2-row step), 4 lanes form a 32-element
block, and lane ``l`` ends each tile holding the 4 scale bytes of row ``l`` of its quarter.

Loads: a warp's 32 x 128 tile is read as ``32 / box_rows`` boxes of ``box_rows`` rows x 128 columns,
each one TMA copy into a slot of the warp's own shared ring of ``stages`` slots with one mbarrier
per slot (``stages - 1`` boxes in flight while one is converted). A lane reads its vector with one
(bf16) or two (fp32) ``LDS.128``; fp32 lanes ``4..7`` of each quarter-warp read their two 16-byte
halves in the other order (so every quarter-warp covers all 32 banks once), which the lane undoes on
the two E4M3 words it stores. Rows past M and columns past K arrive as zeros (TMA out-of-bounds
fill): their data is not stored and their scale bytes are 0 (the blocked layout's padding), exactly
as in the cp.async kernel. No address math or predicate per load in the lanes, no CTA barrier.

Stores of q (``store_stages``): with ``store_stages = n > 0`` (the default, 2) the lanes write each
box's E4M3 bytes with ``STS.64`` into a per-warp staging ring of n slots and one TMA store per box
writes them to q (rows past M and columns past K are dropped by the TMA unit, so the lanes need no
predicate and no 64-bit address); with 0, every lane stores its 8 bytes with an ``STG.64``.

Kernel: :class:`QuantizeTmaKernel` (a :class:`TmaVariant`: dtype, mode, layout; a
:class:`TmaQuantizeConfig`, per arch in ``cute_kernels.configs``); compile it with
``cute_kernels.registry.entry("quantize_tma").compile(variant, arch)`` and call the result as
``compiled(x, q, scales)`` with torch tensors on the current stream. ``x``: (M, K) bf16 / fp32,
row-major, K % 32 == 0, 16-byte aligned, M >= 1. ``q``: (M, K) ``float8_e4m3fn``. ``scales``:
``float8_e8m0fnu``, (M, K/32) for ``plain``, (128 ceil(M/128), 4 ceil(K/128)) for ``blocked``. M and K
are symbolic: one compile per (dtype, mode, layout, config, arch).

It is slower than the cp.async kernel on the same bytes (``python -m bench.tune quantize_tma``, with
TMA or 8-byte stores of q; notes/quantize-tma.md), so the bindings use the cp.async kernel; this one
stays as the TMA alternative (and the user of :mod:`cute_utils.tma`).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_kernels.base import Kernel, LoadsInFlight, ring_units_in_flight
from cute_kernels.quantize import DTYPES, ScaleLayout
from cute_utils import tma
from cute_utils.blocked import TILE_ROWS, TILE_WORDS, blocked_tile_index, blocked_word_slot, ceil_div
from cute_utils.mx import BLOCK_SIZE, e8m0_scale, inverse_scale, lane_group_max, max_abs_bits, scale_values
from cute_utils.mx_rows import (
    LANES_PER_BLOCK,
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
from cute_utils.smem import storage_struct

LAYOUTS = (ScaleLayout.PLAIN, ScaleLayout.BLOCKED)
SMEM_BYTES = 232448  # shared memory per CTA on sm_90 and sm_100


@dataclass(frozen=True)
class TmaQuantizeConfig:
    """``box_rows``: rows of a warp's 32-row quarter per TMA box (pipeline unit; 2, 4, 8, 16 or 32);
    ``stages``: slots in a warp's shared ring (``stages - 1`` boxes in flight while one converts);
    ``warp_tiles``: warps of a CTA side by side along K (1, 2 or 4; see the module docstring);
    ``target_ctas``: grid size aimed for (each CTA loops over a run of column tiles);
    ``min_ctas_per_sm``: register cap through ``__launch_bounds__`` (0: none);
    ``store_stages``: 0: E4M3 data leaves as per-lane 8-byte stores; n > 0: the lanes write each box's
    E4M3 bytes into a per-warp staging ring of n slots and one TMA store per box writes them (n - 1
    stores may still be reading their slots while the lanes fill the next one)."""

    box_rows: int = 8
    stages: int = 3
    warp_tiles: int = 4
    target_ctas: int = 32768
    min_ctas_per_sm: int = 0
    store_stages: int = 2

    def __post_init__(self) -> None:
        if self.box_rows not in (2, 4, 8, 16, 32):
            raise ValueError(f"box_rows={self.box_rows} must be 2, 4, 8, 16 or 32")
        if self.stages < 2:
            raise ValueError(f"stages={self.stages} must be >= 2")
        if self.warp_tiles not in (1, 2, 4):
            raise ValueError(f"warp_tiles={self.warp_tiles} must be 1, 2 or 4")
        if self.store_stages < 0:
            raise ValueError(f"store_stages={self.store_stages} must be >= 0")
        fp32_bytes = shared_storage(Float32, self).size_in_bytes()
        if fp32_bytes > SMEM_BYTES - 1024:
            raise ValueError(f"{self}: the fp32 rings take {fp32_bytes} bytes of shared memory")


def shared_storage(dtype, config: TmaQuantizeConfig):
    """The ``@cute.struct`` of one CTA's shared memory for x of ``dtype``: ``slots``, the warps' load
    rings (``stages`` boxes of ``box_rows`` x 128 elements each, 128-byte aligned), ``barriers``,
    their mbarriers (one per slot), and, with TMA stores (``store_stages > 0``), ``q_slots``, the
    warps' E4M3 staging rings (:mod:`cute_utils.tma`). The kernel allocates it; its size is the
    launch's dynamic shared memory."""
    box_rows, stages = config.box_rows, config.stages
    fields = {
        "slots": tma.slots_field(dtype, box_rows, TILE_K, stages, WARPS),
        "barriers": tma.barriers_field(stages, WARPS),
    }
    if config.store_stages:
        fields["q_slots"] = tma.slots_field(Float8E4M3FN, box_rows, TILE_K, config.store_stages, WARPS)
    return storage_struct(fields)


# The default config (``TmaQuantizeConfig()``, not tuned: the reasons are in
# ``cute_kernels/configs/sm90.py``, ``quantize_tma``): TMA stores of q as well as TMA loads of x,
# because that takes the per-lane 64-bit address math and store predicates out of the loop (SASS of
# the bf16 rceil blocked main loop on sm_90a: ~86 instructions per 8-element step, 100 with 8-byte
# STG, 122 for the cp.async kernel). 8-row boxes, 3 stages: 2 KB (bf16) per box, 4 KB in flight per
# warp, 32 KB of shared memory per CTA (`shared_storage`: 6 CTAs, 24 warps per SM).


@cute.jit
def _quantize_swapped_halves(
    first: cute.Tensor,
    second: cute.Tensor,
    swap,
    q_words: cute.Tensor,
    row: Int32,
    vec: Int32,
    store,
    mode: cutlass.Constexpr,
):
    """:func:`cute_utils.mx_rows.quantize_lane_vector` for a lane whose 8 elements were read as two
    4-element halves in a per-lane order: ``first`` is half ``swap`` (0 or 1) of the vector and
    ``second`` the other one. The block max and scale do not depend on the order; the two E4M3
    words are put back in order before the 8-byte store to ``q_words[row, vec, :]`` (a (M, K/8, 2)
    Uint32 view of q). Returns the block's scale byte (0 when not ``store``)."""
    xf = cute.make_rmem_tensor(cute.make_layout(VECTOR), Float32)
    half = VECTOR // 2
    a = first.load().to(Float32)
    b = second.load().to(Float32)
    for i in cutlass.range_constexpr(half):
        xf[i] = a[i]
        xf[half + i] = b[i]
    amax = lane_group_max(max_abs_bits(xf), LANES_PER_BLOCK)
    s = e8m0_scale(amax, mode)
    if not store:
        s = Int32(0)
    scale_values(xf, inverse_scale(s))
    q_frag = cute.make_rmem_tensor(cute.make_layout(VECTOR), Float8E4M3FN)
    q_frag.store(xf.load().to(Float8E4M3FN))
    q_pair = cute.recast_tensor(q_frag, Uint32)
    lo = q_pair[0]
    hi = q_pair[1]
    if swap:
        lo = q_pair[1]
        hi = q_pair[0]
    out = cute.make_rmem_tensor(cute.make_layout(2), Uint32)
    out[0] = lo
    out[1] = hi
    if store:
        cute.autovec_copy(out, q_words[row, vec, None])
    return s


@cute.jit
def _store_blocked_word(
    scale_words: cute.Tensor, row_block: Int32, col_tiles: Int32, tile: Int32, quarter: Int32, lane, word
):
    """Store the 4 scale bytes (``word``) of row ``32 quarter + lane`` of row block ``row_block`` and
    128-column tile ``tile`` into the blocked layout (SPEC section 3): word
    ``(row_block * col_tiles + tile) * 128 + lane * 4 + quarter`` of ``scale_words`` (a flat Uint32
    view of the (Rp, Cp) scales, ``col_tiles = Cp / 4``); words past its end are skipped."""
    index = blocked_tile_index(row_block, tile, col_tiles) * TILE_WORDS + blocked_word_slot(lane, quarter)
    if index < cute.size(scale_words):
        scale_words[index] = word


def _scale_view(scales: cute.Tensor, layout: ScaleLayout, rows, cols) -> cute.Tensor:
    """Where the kernel writes scales: ``plain``, the (M, K/32) scale bytes; ``blocked``, the
    (Rp, Cp) scales as flat Uint32 words (:func:`_store_blocked_word`)."""
    if layout is ScaleLayout.PLAIN:
        return cute.make_tensor(
            cute.recast_ptr(scales.iterator, dtype=Uint8),
            cute.make_layout((rows, cols // BLOCK_SIZE), stride=(cols // BLOCK_SIZE, 1)),
        )
    return cute.make_tensor(
        cute.recast_ptr(scales.iterator, dtype=Uint32), cute.make_layout(cute.size(scales) // 4)
    )


# --- The kernel's per-warp state (DSL values, bundled to keep argument lists short) -------------


@dataclass(frozen=True)
class _Warp:
    """Where a lane works: ``lane``; ``lane_row``, its row parity in a 2-row step; ``lane_vec``, its
    vector of a 128-column tile; the warp's ``quarter`` of row block ``row_block``, whose first row
    of x is ``quarter_row``; its tiles ``first_tile + warp_tiles * j``; q's ``rows`` and ``cols``
    and the ``col_tiles`` 128-column tiles of K."""

    lane: Int32
    lane_row: Int32
    lane_vec: Int32
    quarter: Int32
    quarter_row: Int32
    row_block: Int32
    first_tile: Int32
    rows: Int32
    cols: Int32
    col_tiles: Int32


@dataclass(frozen=True)
class _Ring:
    """The warp's TMA load ring: the load ``atom``, the ``src`` boxes and ``dst`` slots
    (:func:`cute_utils.tma.partition_ring`), the slots' ``barriers``, ``box_row0`` (the box row of
    the quarter's first row) and the warp's ``units`` (boxes to load)."""

    atom: object
    src: cute.Tensor
    dst: cute.Tensor
    barriers: object
    box_row0: Int32
    units: Int32


@dataclass(frozen=True)
class _Outputs:
    """What the lanes write: ``lane_view`` of the load slots ([row in box, vector, half, element,
    stage]), ``swap`` (fp32: which half the lane reads first), ``q_out`` (q, or the staging slots
    with TMA stores, as 8-element vectors or fp32 word pairs), the TMA store's ``store_atom``,
    ``q_boxes`` and ``q_stages`` (``None`` without TMA stores), and ``scale_view``
    (:func:`_scale_view`)."""

    lane_view: cute.Tensor
    swap: Int32
    q_out: cute.Tensor
    store_atom: object
    q_boxes: object
    q_stages: object
    scale_view: cute.Tensor


@dataclass(frozen=True)
class _Unit:
    """One pipeline unit in the main loop: its ring ``stage``, its ``box`` of the warp's tile, the
    lane's vector ``vec`` of K and whether it is ``in_cols``, and the staging slot ``q_stage``."""

    stage: Int32
    box: Int32
    vec: Int32
    in_cols: object
    q_stage: Int32


# --- The kernel -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TmaVariant:
    """Compile-time choices of the TMA kernel: ``dtype`` (a :data:`DTYPES` name), ``mode``
    (``"floor"`` or ``"rceil"``) and ``layout`` (one of :data:`LAYOUTS`)."""

    dtype: str
    mode: str
    layout: ScaleLayout


class QuantizeTmaKernel(Kernel):
    """The TMA-load 1x32 quantization kernel (module docstring); launch contract in :meth:`__call__`."""

    name = "quantize_tma"

    @classmethod
    def loads_in_flight(cls, variant: TmaVariant, config: TmaQuantizeConfig, cols: int) -> LoadsInFlight:
        """Per warp ``stages - 1`` TMA boxes of ``box_rows`` x 128 columns."""
        elem = DTYPES[variant.dtype].width // 8
        units = ring_units_in_flight(config.stages)
        return LoadsInFlight(
            32 * WARPS,
            WARPS * units * config.box_rows * TILE_K * elem,
            f"{WARPS} warps x {units} boxes (stages {config.stages} - 1) x {config.box_rows} rows x "
            f"{TILE_K} cols x {elem} B",
        )

    @classmethod
    def shared_bytes(cls, variant: TmaVariant, config: TmaQuantizeConfig) -> int:
        """The size of :func:`shared_storage`, the struct the kernel allocates: the warps' load rings
        with their mbarriers and, with TMA stores, their E4M3 staging rings."""
        return shared_storage(DTYPES[variant.dtype], config).size_in_bytes()

    def __init__(self, variant: TmaVariant, config: TmaQuantizeConfig) -> None:
        if variant.mode not in ("floor", "rceil"):
            raise ValueError(f"mode must be 'floor' or 'rceil', got {variant.mode!r}")
        layout = ScaleLayout(variant.layout)
        if layout not in LAYOUTS:
            raise ValueError(f"the TMA kernel takes plain or blocked scales, not {layout}")
        dtype = DTYPES[variant.dtype]
        if self.shared_bytes(variant, config) > SMEM_BYTES - 1024:
            raise ValueError(f"{config}: the rings do not fit in shared memory for {variant.dtype}")
        super().__init__(variant, config)
        self.mode = variant.mode
        self.layout = layout
        self.dtype = dtype
        self.box_rows = config.box_rows
        self.stages = config.stages
        self.warp_tiles = config.warp_tiles
        self.warp_rows = WARPS // config.warp_tiles  # quarters of a row block per CTA
        self.boxes = QUARTER_ROWS // config.box_rows  # boxes (pipeline units) per warp tile
        self.box_steps = config.box_rows // ROWS_PER_STEP  # 2-row vector steps per box
        self.nbytes = tma.box_bytes(dtype, config.box_rows, TILE_K)
        self.wide = dtype.width == 32  # fp32: a lane's vector is two 16-byte halves
        self.threads = 32 * WARPS
        self.store_stages = config.store_stages
        self.tma_store = config.store_stages > 0
        self.storage = shared_storage(dtype, config)

    @classmethod
    def variants(cls) -> list[TmaVariant]:
        """Every (dtype, mode, layout) variant (``python -m bench.tune quantize_tma`` and the SASS checks)."""
        return [TmaVariant(d, m, layout) for d in DTYPES for m in ("floor", "rceil") for layout in LAYOUTS]

    @classmethod
    def target_name(cls, variant: TmaVariant) -> str:
        """``quantize_tma_1x32_<dtype>_<mode>_<layout>``."""
        return f"quantize_tma_1x32_{variant.dtype}_{variant.mode}_{ScaleLayout(variant.layout).value}"

    @classmethod
    def fake_arguments(cls, variant: TmaVariant) -> tuple:
        """Fake tensors for :meth:`__call__`: x and q (M, K) with M and K symbolic (K a multiple of
        32, shared by x and q), scales with symbolic shape, and the env stream."""
        rows = cute.sym_int()
        cols = cute.sym_int(divisibility=BLOCK_SIZE)
        x = cute.runtime.make_fake_compact_tensor(
            DTYPES[variant.dtype], (rows, cols), stride_order=(1, 0), assumed_align=16
        )
        q = cute.runtime.make_fake_compact_tensor(
            Float8E4M3FN, (rows, cols), stride_order=(1, 0), assumed_align=16
        )
        scales = cute.runtime.make_fake_compact_tensor(
            Float8E8M0FNU, (cute.sym_int(), cute.sym_int()), stride_order=(1, 0), assumed_align=4
        )
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return x, q, scales, stream

    @staticmethod
    def can_implement(rows: int, cols: int, *data_ptrs: int) -> bool:
        """M >= 1, K a multiple of 32, and x and q (their ``data_ptrs``) 16-byte aligned (TMA)."""
        return rows >= 1 and cols % BLOCK_SIZE == 0 and all(ptr % 16 == 0 for ptr in data_ptrs)

    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,  # (M, K) bf16 / fp32 row-major, K % 32 == 0, 16-byte aligned, M >= 1
        q: cute.Tensor,  # (M, K) Float8E4M3FN row-major
        scales: cute.Tensor,  # Float8E8M0FNU (M, K/32) plain, (128 ceil(M/128), 4 ceil(K/128)) blocked
        stream,
    ):
        box_rows, warp_tiles = self.box_rows, self.warp_tiles
        atom, tma_x = tma.make_row_tile_load(x, box_rows, TILE_K)
        store_atom, tma_q = None, None
        if cutlass.const_expr(self.tma_store):
            store_atom, tma_q = tma.make_row_tile_store(q, box_rows, TILE_K)
        row_units = ceil_div(scales.shape[0], TILE_ROWS) * warp_tiles
        col_tiles = ceil_div(x.shape[1], TILE_K)
        chunks = cutlass.min(col_tiles, cutlass.max(self.config.target_ctas // row_units, 1))
        tiles_per_cta = ceil_div(ceil_div(col_tiles, chunks), warp_tiles) * warp_tiles  # whole warp rounds
        chunks = ceil_div(col_tiles, tiles_per_cta)
        self.kernel(atom, tma_x, store_atom, tma_q, q, scales, tiles_per_cta).launch(
            grid=[row_units, chunks, 1],
            block=[self.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
        )

    def _q_out(self, storage, store_atom, tma_q, q: cute.Tensor, warp, rows, cols):
        """``(q_out, q_boxes, q_stages)``: where the lanes write E4M3 data, q itself or (TMA stores)
        this warp's staging ring (row = slot row), as 8-element vectors (bf16) or pairs of Uint32
        words (fp32), and the staging ring's TMA views (``None`` without TMA stores)."""
        box_rows = self.box_rows
        q_boxes = q_stages = None
        if self.tma_store:
            q_slots = tma.warp_slots(storage.q_slots, box_rows, TILE_K, self.store_stages, WARPS, warp)
            q_boxes, q_stages = tma.partition_ring(store_atom, tma_q, q_slots, box_rows, TILE_K)
            out_rows = self.store_stages * box_rows
            q_base = q_slots
        else:
            out_rows = rows
            q_base = q
        if self.wide:
            q_out = cute.make_tensor(
                cute.recast_ptr(q_base.iterator, dtype=Uint32),
                cute.make_layout((out_rows, cols // VECTOR, 2), stride=(TILE_K // 4, 2, 1)),
            )
            if not self.tma_store:
                q_out = cute.make_tensor(
                    q_out.iterator, cute.make_layout((rows, cols // VECTOR, 2), stride=(cols // 4, 2, 1))
                )
        else:
            q_out = mx_vector_view(q_base, out_rows, TILE_K if self.tma_store else cols)
        return q_out, q_boxes, q_stages

    def _lane_view(self, slots: cute.Tensor) -> cute.Tensor:
        """The lane's view of the load slots: [row in box, vector, half (fp32), element, stage]."""
        box_rows = self.box_rows
        halves = 2 if self.wide else 1
        return cute.make_tensor(
            slots.iterator,
            cute.make_layout(
                (box_rows, LANES_PER_ROW, halves, VECTOR // halves, self.stages),
                stride=(TILE_K, VECTOR, VECTOR // halves, 1, box_rows * TILE_K),
            ),
        )

    @cute.jit
    def _quantize_box(self, warp: _Warp, out: _Outputs, unit: _Unit, my_word):
        """Quantize the lane's vectors of one box (its 2-row steps) into ``out.q_out`` and return
        ``my_word`` with the lane's row word of the quarter, if that row is in this box."""
        lane, lane_vec, stage, swap = warp.lane, warp.lane_vec, unit.stage, out.swap
        for i in cutlass.range_constexpr(self.box_steps):
            r_box = i * ROWS_PER_STEP + warp.lane_row  # the lane's row in the box
            row = warp.quarter_row + unit.box * self.box_rows + r_box
            # Out-of-bounds elements arrived as zeros (scale byte 0); TMA stores drop them.
            store = True
            out_row, out_vec = unit.q_stage * self.box_rows + r_box, lane_vec
            if cutlass.const_expr(not self.tma_store):
                store = row < warp.rows and unit.in_cols
                out_row, out_vec = row, unit.vec
            if cutlass.const_expr(self.wide):
                s = _quantize_swapped_halves(
                    out.lane_view[r_box, lane_vec, swap, None, stage],
                    out.lane_view[r_box, lane_vec, 1 - swap, None, stage],
                    swap,
                    out.q_out,
                    out_row,
                    out_vec,
                    store,
                    self.mode,
                )
            else:
                values = out.lane_view[r_box, lane_vec, 0, None, stage]
                s = quantize_lane_vector(values, out.q_out, out_row, out_vec, store, self.mode)
            # Route the row's scale word to lane (row % 32) of the quarter.
            word = cute.arch.shuffle_sync(row_scale_word(s, lane), (lane % ROWS_PER_STEP) * LANES_PER_ROW)
            if lane // ROWS_PER_STEP == unit.box * self.box_steps + i:
                my_word = word
        return my_word

    @cute.jit
    def _store_tile_scales(self, warp: _Warp, scale_view: cute.Tensor, tile, word):
        """After the warp's last box of ``tile``: the lane's row word (``plain``: its row's bytes)."""
        if cutlass.const_expr(self.layout is ScaleLayout.PLAIN):
            row = warp.quarter_row + warp.lane
            store_plain_scales(scale_view, row, tile, word, row < warp.rows)
        else:
            _store_blocked_word(
                scale_view, warp.row_block, warp.col_tiles, tile, warp.quarter, warp.lane, word
            )

    @cute.jit
    def _quantize_units(self, ring: _Ring, warp: _Warp, out: _Outputs):
        """The warp's main loop over its boxes (see ``cute_utils.tma``'s pipeline protocol): wait,
        quantize (and TMA-store) box u, refill its slot with box u + stages, and store the scale
        words after a tile's last box."""
        stages, boxes, warp_tiles = self.stages, self.boxes, self.warp_tiles
        my_word = Uint32(0)
        for u in cutlass.range(ring.units, unroll=1):
            stage = tma.ring_stage(u, stages)
            tma.ring_wait(ring.barriers, stage, tma.ring_phase(u, stages))
            tile = warp.first_tile + (u // boxes) * warp_tiles
            b = u % boxes
            vec = tile * LANES_PER_ROW + warp.lane_vec
            in_cols = vec * VECTOR < warp.cols
            q_stage = Int32(0)
            if cutlass.const_expr(self.tma_store):
                q_stage = u % self.store_stages
                tma.store_slot_wait(self.store_stages - 1)
            my_word = self._quantize_box(warp, out, _Unit(stage, b, vec, in_cols, q_stage), my_word)
            tma.ring_release()
            if cutlass.const_expr(self.tma_store):
                tma.store_issue(out.store_atom, out.q_stages, out.q_boxes, q_stage, ring.box_row0 + b, tile)
            if u + stages < ring.units:
                nxt = u + stages
                tma.ring_issue(
                    ring.atom,
                    ring.src,
                    ring.dst,
                    ring.barriers,
                    stage,
                    ring.box_row0 + nxt % boxes,
                    warp.first_tile + (nxt // boxes) * warp_tiles,
                    self.nbytes,
                )
            if b == boxes - 1:
                self._store_tile_scales(warp, out.scale_view, tile, my_word)

    @cute.kernel
    def kernel(
        self,
        atom,
        tma_x: cute.Tensor,
        store_atom,
        tma_q,
        q: cute.Tensor,
        scales: cute.Tensor,
        tiles_per_cta: Int32,
    ):
        box_rows, stages, warp_tiles = self.box_rows, self.stages, self.warp_tiles
        tid, _, _ = cute.arch.thread_idx()
        row_unit, col_chunk, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = cute.arch.make_warp_uniform(tid // 32)
        row_block = row_unit // warp_tiles
        quarter = (row_unit % warp_tiles) * self.warp_rows + warp // warp_tiles
        rows, cols = q.shape
        col_tiles = ceil_div(cols, TILE_K)
        quarter_row = row_block * TILE_ROWS + quarter * QUARTER_ROWS  # first row of x of this warp
        lane_row = lane // LANES_PER_ROW  # row parity of the lane within a 2-row step
        lane_vec = lane % LANES_PER_ROW  # the lane's 8-element vector within the 128-column tile

        scale_view = _scale_view(scales, self.layout, rows, cols)
        storage = SmemAllocator().allocate(self.storage)
        slots, barriers = tma.warp_ring(
            storage.slots, storage.barriers, box_rows, TILE_K, stages, WARPS, warp
        )
        src, dst = tma.partition_ring(atom, tma_x, slots, box_rows, TILE_K)
        q_out, q_boxes, q_stages = self._q_out(storage, store_atom, tma_q, q, warp, rows, cols)
        lane_view = self._lane_view(slots)
        swap = Int32(0)
        if cutlass.const_expr(self.wide):
            swap = (lane // 4) % 2  # lanes 4..7 of each quarter-warp read their upper half first

        chunk_tile = col_chunk * tiles_per_cta
        first_tile = chunk_tile + warp % warp_tiles  # this warp's tiles: first_tile + warp_tiles * j
        last_tile = cutlass.min(chunk_tile + tiles_per_cta, col_tiles)
        tiles = cutlass.max(ceil_div(last_tile - first_tile, warp_tiles), 0)
        units = tiles * self.boxes  # unit u: box (u % boxes) of the warp's tile (u // boxes)
        box_row0 = quarter_row // box_rows

        tma.ring_init(barriers, stages)
        for u in cutlass.range_constexpr(stages):
            if u < units:
                tile = first_tile + (u // self.boxes) * warp_tiles
                tma.ring_issue(
                    atom, src, dst, barriers, Int32(u), box_row0 + u % self.boxes, tile, self.nbytes
                )

        state = _Warp(
            lane, lane_row, lane_vec, quarter, quarter_row, row_block, first_tile, rows, cols, col_tiles
        )
        outputs = _Outputs(lane_view, swap, q_out, store_atom, q_boxes, q_stages, scale_view)
        self._quantize_units(_Ring(atom, src, dst, barriers, box_row0, units), state, outputs)
        if cutlass.const_expr(self.tma_store):
            tma.store_drain()


__all__ = [
    "LAYOUTS",
    "QuantizeTmaKernel",
    "TmaQuantizeConfig",
    "TmaVariant",
    "shared_storage",
]
