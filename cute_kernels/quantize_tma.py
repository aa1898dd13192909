"""1x32 MXFP8 quantization with TMA loads: the same bytes as :mod:`cute_kernels.quantize` for the
``plain`` and ``blocked`` scale layouts (bf16 / fp32 input, floor / rceil), with the per-lane
``cp.async`` ring replaced by one TMA box per pipeline unit (:mod:`cute_utils.tma`).

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

Launcher: ``launch(x, q, scales, stream)`` (TVM-FFI: call ``compiled(x, q, scales)`` with torch
tensors on the current stream). ``x``: (M, K) bf16 / fp32, row-major, K % 32 == 0, 16-byte aligned,
M >= 1. ``q``: (M, K) ``float8_e4m3fn``. ``scales``: ``float8_e8m0fnu``, (M, K/32) for ``plain``,
(128 ceil(M/128), 4 ceil(K/128)) for ``blocked``. M and K are symbolic: one compile per (dtype,
mode, layout, config, arch).

Measured against the cp.async kernel (``bench/tune_quantize_tma.py``, H200, bf16 blocked, same
bytes): 0.97-0.98x its speed with TMA stores and 16-row boxes, 0.94-0.96x with 8-byte stores,
at 8192 x 7168, 32768 x 2048 and 131072 x 7168. The bindings therefore use the cp.async kernel;
this one stays as the TMA alternative (and the user of :mod:`cute_utils.tma`).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float8E4M3FN, Float8E8M0FNU, Float32, Int32, Uint8, Uint32
from cutlass.memory import SmemAllocator

from cute_kernels.quantize import (
    DTYPES,
    LANES_PER_BLOCK,
    LANES_PER_ROW,
    QUARTER_ROWS,
    ROWS_PER_STEP,
    TILE_K,
    VECTOR,
    WARPS,
    ScaleLayout,
    _quantize_vector,
    _row_scale_word,
    _store_plain_scales,
    _vector_view,
)
from cute_utils import tma
from cute_utils.blocked import TILE_COLS, TILE_ROWS, ceil_div
from cute_utils.jit import compile_tvm_ffi
from cute_utils.mx import BLOCK_SIZE, e8m0_scale, inverse_scale, lane_group_max, max_abs_bits, scale_values

LAYOUTS = (ScaleLayout.PLAIN, ScaleLayout.BLOCKED)
SMEM_BYTES = 232448  # shared memory per CTA on sm_90 and sm_100
WORDS_PER_TILE = TILE_ROWS * TILE_COLS // 4  # 128 Uint32 words per 512-byte blocked tile


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
        if self.ring_bytes(4) > SMEM_BYTES - 1024:
            raise ValueError(f"{self}: the fp32 rings take {self.ring_bytes(4)} bytes of shared memory")

    def ring_bytes(self, element_bytes: int) -> int:
        """Shared memory of a CTA's rings (slots and barriers) for elements of ``element_bytes``."""
        load = self.stages * (self.box_rows * TILE_K * element_bytes + 8)
        return WARPS * (load + self.store_stages * self.box_rows * TILE_K)


# Not tuned yet (bench/tune_quantize_tma.py): TMA stores of q as well as TMA loads of x, because that
# takes the per-lane 64-bit address math and store predicates out of the loop (SASS of the bf16 rceil
# blocked main loop on sm_90a: ~86 instructions per 8-element step, 100 with 8-byte STG, 122 for
# the cp.async kernel). 8-row boxes, 3 stages: 2 KB (bf16) per box, 4 KB in flight per warp, 32 KB
# of shared memory per CTA (7 CTAs, 28 warps per SM).
DEFAULT_CONFIG = TmaQuantizeConfig()
CONFIGS = {arch: {"bfloat16": DEFAULT_CONFIG, "float32": DEFAULT_CONFIG} for arch in ("sm_90a", "sm_100a")}


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
    """:func:`cute_kernels.quantize._quantize_vector` for a lane whose 8 elements were read as two
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
    index = (row_block * col_tiles + tile) * WORDS_PER_TILE + lane * WARPS + quarter
    if index < cute.size(scale_words):
        scale_words[index] = word


def make_quantize_tma(dtype_name: str, mode: str, layout: ScaleLayout, config: TmaQuantizeConfig):
    """Build the ``@cute.jit`` launcher ``launch(x, q, scales, stream)`` (contract in the module
    docstring)."""
    if mode not in ("floor", "rceil"):
        raise ValueError(f"mode must be 'floor' or 'rceil', got {mode!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"the TMA kernel takes plain or blocked scales, not {layout}")
    dtype = DTYPES[dtype_name]
    box_rows = config.box_rows
    stages = config.stages
    warp_tiles = config.warp_tiles
    warp_rows = WARPS // warp_tiles  # quarters of a row block per CTA
    boxes = QUARTER_ROWS // box_rows  # boxes (pipeline units) per warp tile
    box_steps = box_rows // ROWS_PER_STEP  # 2-row vector steps per box
    nbytes = tma.box_bytes(dtype, box_rows, TILE_K)
    wide = dtype.width == 32  # fp32: a lane's vector is two 16-byte halves
    threads = 32 * WARPS
    store_stages = config.store_stages
    tma_store = store_stages > 0
    if config.ring_bytes(dtype.width // 8) > SMEM_BYTES - 1024:
        raise ValueError(f"{config}: the rings do not fit in shared memory for {dtype_name}")

    @cute.kernel
    def quantize_kernel(
        atom, tma_x: cute.Tensor, store_atom, tma_q, q: cute.Tensor, scales: cute.Tensor, tiles_per_cta: Int32
    ):
        tid, _, _ = cute.arch.thread_idx()
        row_unit, col_chunk, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = cute.arch.make_warp_uniform(tid // 32)
        row_block = row_unit // warp_tiles
        quarter = (row_unit % warp_tiles) * warp_rows + warp // warp_tiles
        rows, cols = q.shape
        col_tiles = ceil_div(cols, TILE_K)
        quarter_row = row_block * TILE_ROWS + quarter * QUARTER_ROWS  # first row of x of this warp
        lane_row = lane // LANES_PER_ROW  # row parity of the lane within a 2-row step
        lane_vec = lane % LANES_PER_ROW  # the lane's 8-element vector within the 128-column tile

        if cutlass.const_expr(layout is ScaleLayout.PLAIN):
            scale_bytes = cute.make_tensor(
                cute.recast_ptr(scales.iterator, dtype=Uint8),
                cute.make_layout((rows, cols // BLOCK_SIZE), stride=(cols // BLOCK_SIZE, 1)),
            )
        else:
            scale_words = cute.make_tensor(
                cute.recast_ptr(scales.iterator, dtype=Uint32), cute.make_layout(cute.size(scales) // 4)
            )
        smem = SmemAllocator()
        slots, barriers = tma.allocate_warp_ring(smem, dtype, box_rows, TILE_K, stages, WARPS, warp)
        src, dst = tma.partition_ring(atom, tma_x, slots, box_rows, TILE_K)
        # Where the lanes write E4M3 data: q itself, or this warp's staging ring (row = slot row).
        if cutlass.const_expr(tma_store):
            q_slots = tma.allocate_warp_slots(smem, Float8E4M3FN, box_rows, TILE_K, store_stages, WARPS, warp)
            q_boxes, q_stages = tma.partition_ring(store_atom, tma_q, q_slots, box_rows, TILE_K)
            out_rows = store_stages * box_rows
            q_base = q_slots
        else:
            out_rows = rows
            q_base = q
        if cutlass.const_expr(wide):
            q_out = cute.make_tensor(
                cute.recast_ptr(q_base.iterator, dtype=Uint32),
                cute.make_layout((out_rows, cols // VECTOR, 2), stride=(TILE_K // 4, 2, 1)),
            )
            if cutlass.const_expr(not tma_store):
                q_out = cute.make_tensor(
                    q_out.iterator, cute.make_layout((rows, cols // VECTOR, 2), stride=(cols // 4, 2, 1))
                )
        else:
            q_out = _vector_view(q_base, out_rows, TILE_K if tma_store else cols)
        # The lane's view of a slot: [row in box, vector, half (fp32), element, stage].
        halves = 2 if wide else 1
        lane_view = cute.make_tensor(
            slots.iterator,
            cute.make_layout(
                (box_rows, LANES_PER_ROW, halves, VECTOR // halves, stages),
                stride=(TILE_K, VECTOR, VECTOR // halves, 1, box_rows * TILE_K),
            ),
        )
        swap = Int32(0)
        if cutlass.const_expr(wide):
            swap = (lane // 4) % 2  # lanes 4..7 of each quarter-warp read their upper half first

        chunk_tile = col_chunk * tiles_per_cta
        first_tile = chunk_tile + warp % warp_tiles  # this warp's tiles: first_tile + warp_tiles * j
        last_tile = cutlass.min(chunk_tile + tiles_per_cta, col_tiles)
        tiles = cutlass.max(ceil_div(last_tile - first_tile, warp_tiles), 0)
        units = tiles * boxes  # unit u: box (u % boxes) of the warp's tile (u // boxes)
        box_row0 = quarter_row // box_rows

        tma.ring_init(barriers, stages)
        for u in cutlass.range_constexpr(stages):
            if u < units:
                tile = first_tile + (u // boxes) * warp_tiles
                tma.ring_issue(atom, src, dst, barriers, Int32(u), box_row0 + u % boxes, tile, nbytes)

        my_word = Uint32(0)
        for u in cutlass.range(units, unroll=1):
            stage = tma.ring_stage(u, stages)
            tma.ring_wait(barriers, stage, tma.ring_phase(u, stages))
            tile = first_tile + (u // boxes) * warp_tiles
            b = u % boxes
            vec = tile * LANES_PER_ROW + lane_vec
            in_cols = vec * VECTOR < cols
            q_stage = Int32(0)
            if cutlass.const_expr(tma_store):
                q_stage = u % store_stages
                tma.store_slot_wait(store_stages - 1)
            for i in cutlass.range_constexpr(box_steps):
                r_box = i * ROWS_PER_STEP + lane_row  # the lane's row in the box
                row = quarter_row + b * box_rows + r_box
                # Out-of-bounds elements arrived as zeros (scale byte 0); TMA stores drop them.
                store = True
                out_row, out_vec = q_stage * box_rows + r_box, lane_vec
                if cutlass.const_expr(not tma_store):
                    store = row < rows and in_cols
                    out_row, out_vec = row, vec
                if cutlass.const_expr(wide):
                    s = _quantize_swapped_halves(
                        lane_view[r_box, lane_vec, swap, None, stage],
                        lane_view[r_box, lane_vec, 1 - swap, None, stage],
                        swap,
                        q_out,
                        out_row,
                        out_vec,
                        store,
                        mode,
                    )
                else:
                    s = _quantize_vector(
                        lane_view[r_box, lane_vec, 0, None, stage],
                        q_out,
                        out_row,
                        out_vec,
                        store,
                        mode,
                    )
                # Route the row's scale word to lane (row % 32) of the quarter.
                word = cute.arch.shuffle_sync(
                    _row_scale_word(s, lane), (lane % ROWS_PER_STEP) * LANES_PER_ROW
                )
                if lane // ROWS_PER_STEP == b * box_steps + i:
                    my_word = word
            tma.ring_release()
            if cutlass.const_expr(tma_store):
                tma.store_issue(store_atom, q_stages, q_boxes, q_stage, box_row0 + b, tile)
            if u + stages < units:
                nxt = u + stages
                tma.ring_issue(
                    atom,
                    src,
                    dst,
                    barriers,
                    stage,
                    box_row0 + nxt % boxes,
                    first_tile + (nxt // boxes) * warp_tiles,
                    nbytes,
                )
            if b == boxes - 1:
                if cutlass.const_expr(layout is ScaleLayout.PLAIN):
                    row = quarter_row + lane
                    _store_plain_scales(scale_bytes, row, tile, my_word, row < rows)
                else:
                    _store_blocked_word(scale_words, row_block, col_tiles, tile, quarter, lane, my_word)
        if cutlass.const_expr(tma_store):
            tma.store_drain()

    @cute.jit
    def launch(x: cute.Tensor, q: cute.Tensor, scales: cute.Tensor, stream):
        atom, tma_x = tma.make_row_tile_load(x, box_rows, TILE_K)
        store_atom, tma_q = None, None
        if cutlass.const_expr(tma_store):
            store_atom, tma_q = tma.make_row_tile_store(q, box_rows, TILE_K)
        row_units = ceil_div(scales.shape[0], TILE_ROWS) * warp_tiles
        col_tiles = ceil_div(x.shape[1], TILE_K)
        chunks = cutlass.min(col_tiles, cutlass.max(config.target_ctas // row_units, 1))
        tiles_per_cta = ceil_div(ceil_div(col_tiles, chunks), warp_tiles) * warp_tiles  # whole warp rounds
        chunks = ceil_div(col_tiles, tiles_per_cta)
        quantize_kernel(atom, tma_x, store_atom, tma_q, q, scales, tiles_per_cta).launch(
            grid=[row_units, chunks, 1],
            block=[threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=config.min_ctas_per_sm,
        )

    return launch


def fake_arguments(dtype_name: str):
    """Fake tensors for ``launch``: x and q (M, K) with M and K symbolic (K a multiple of 32, shared
    by x and q), scales with symbolic shape, and the env stream."""
    rows = cute.sym_int()
    cols = cute.sym_int(divisibility=BLOCK_SIZE)
    x = cute.runtime.make_fake_compact_tensor(
        DTYPES[dtype_name], (rows, cols), stride_order=(1, 0), assumed_align=16
    )
    q = cute.runtime.make_fake_compact_tensor(
        Float8E4M3FN, (rows, cols), stride_order=(1, 0), assumed_align=16
    )
    scales = cute.runtime.make_fake_compact_tensor(
        Float8E8M0FNU, (cute.sym_int(), cute.sym_int()), stride_order=(1, 0), assumed_align=4
    )
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, q, scales, stream


def compile_quantize_tma(
    dtype_name: str,
    mode: str,
    layout: ScaleLayout | str,
    arch: str,
    config: TmaQuantizeConfig | None = None,
    options: str = "",
):
    """``cute.compile`` the TMA launcher for one variant on ``arch`` (TVM-FFI, env stream); without a
    ``config``, ``CONFIGS[arch][dtype_name]``. Call the result as ``compiled(x, q, scales)``."""
    layout = ScaleLayout(layout)
    config = config or CONFIGS[arch][dtype_name]
    launch = make_quantize_tma(dtype_name, mode, layout, config)
    return compile_tvm_ffi(launch, fake_arguments(dtype_name), arch, options)


def variants() -> list[tuple[str, str, ScaleLayout]]:
    """Every (dtype, mode, scale layout) variant of the TMA kernel."""
    return [(d, m, layout) for d in DTYPES for m in ("floor", "rceil") for layout in LAYOUTS]


def sass_targets() -> dict:
    """SASS-inspection targets ``quantize_tma_1x32_<dtype>_<mode>_<layout>`` -> build(arch) (not
    registered in ``cute_kernels.KERNEL_MODULES``; the compile test uses them directly)."""
    from cute_utils.sass import compile_options

    def target(dtype_name: str, mode: str, layout: ScaleLayout):
        return lambda arch: compile_quantize_tma(
            dtype_name, mode, layout, arch, options=compile_options(arch)
        )

    return {f"quantize_tma_1x32_{d}_{m}_{layout.value}": target(d, m, layout) for d, m, layout in variants()}
