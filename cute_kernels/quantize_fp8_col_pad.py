"""FP8 column quantization into padded token groups: ``Fp8ColPadCastKernel``.

The cast pass of ``pad_and_quantize_fp8_2d_cols`` (``torch_bindings.pad_quantize_fp8``): exactly
``quantize_fp8_2d(pad_token_groups(x, offs, alignment=A)[0], axis="col",
group_end_offsets=padded_end)`` (SPEC sections 4 and 7) in the passes of the grouped column
quantization, with no pad pass: the amax pass is ``Fp8ColAmaxKernel``'s ``groups`` variant on x
itself (padding rows are zeros and change no amax), then this cast writes q (P, K) with strides
(1, P), P = ``A ceil((M + G A) / A)``: group g's rows at ``[padded_start[g], padded_start[g] +
n_g)``, its padding rows scaled as the zeros they are (0, or 0x7F in a NaN column), rows past the
last padded group 0. It also writes the scales (G K,) and the padded offsets.

Tiling: by destination rows, as the unpadded cast tiles by source rows (``quantize_fp8_col``'s
docstring): CTA ``(t, c)`` owns padded rows ``[128 t, 128 t + 128)`` over a run of 256-column tiles,
a thread one column pair. A 16-row half of a 32-row block lies in one padded group (A >= 16 and
every padded group starts on A), so a CTA first scans the groups (``scan_group_sizes``, unit A,
in shared memory) and maps each of its 8 halves to (group, first source row, data rows); a
thread then loads a block's rows of its columns from the two halves' source rows (one unmasked
32-row load when both are whole and contiguous, the common case; else per-row masks, zeros
elsewhere), multiplies each half by its group's ``q_scale`` and stores the 32 bytes of each column
at the block's aligned place in q^T with 16-byte sector stores. CTA (0, 0) writes the padded
offsets. Variants: dtype and ``vector_loads`` (P is a multiple of 16: always 16-byte stores).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float8E4M3FN, Float32, Int32, Uint32
from cutlass.memory import SmemAllocator

from cute_utils.blocked import ceil_div
from cute_utils.columns import PAIR, as_one_expert, column_pair_view
from cute_utils.groups import (
    MAX_GROUPS,
    find_group,
    prefix_smem_words,
    scan_group_sizes,
    search_steps,
    smem_group_bounds,
    store_padded_offsets,
)
from cute_utils.smem import storage_struct

from .base import LoadsInFlight
from .quantize_fp8_col import (
    BLOCK,
    DTYPES,
    PADDED,
    THREADS,
    TILE_K,
    TILE_M,
    WARPS,
    CastSource,
    Columns,
    Fp8ColCastKernel,
    Fp8ColVariant,
    _as_experts,
    _column_loads,
    _fake,
    _fake_x,
    _flat,
    _to_e4m3,
    load_whole_block,
)

HALF = BLOCK // 2  # rows of a half block: the smallest alignment, so a half is in one padded group
HALVES = TILE_M // HALF  # halves of a CTA's row tile
_HALF_WORDS = 3  # per half: group (G: none), first source row, data rows (0 .. HALF)


def _storage():
    """Shared memory: the group scan's prefix (units of A) and clamped ends (MAX_GROUPS + 1 words
    each), its per-warp scratch, and the row tile's halves (HALVES x 3 words)."""
    words = prefix_smem_words(MAX_GROUPS)
    return storage_struct(
        {
            "prefix": cute.struct.Align[cute.struct.MemRange[Int32, words], 16],
            "ends": cute.struct.Align[cute.struct.MemRange[Int32, words], 16],
            "warp_totals": cute.struct.Align[cute.struct.MemRange[Int32, WARPS], 16],
            "halves": cute.struct.Align[cute.struct.MemRange[Int32, HALVES * _HALF_WORDS], 16],
        }
    )


class Fp8ColPadCastKernel(Fp8ColCastKernel):
    """Cast pass into padded groups (module docstring). Launch: ``kernel(x, q, amax, scales,
    offsets, padded_start, padded_end, mask, steps, alignment)``: x (M, K) bf16 or fp32 row-major;
    q E4M3 (P, K) with strides (1, P), P a multiple of 16; ``amax`` the ``groups`` amax pass's
    (G K,) words; scales fp32 (G K,); offsets, padded_start, padded_end int32 (G,), G at most
    ``MAX_GROUPS``; ``mask`` the rounding; ``steps = G.bit_length()``; ``alignment`` A in {16, 32,
    64, 128}."""

    name = "quantize_fp8_col_pad_cast"

    @classmethod
    def variants(cls) -> list[Fp8ColVariant]:
        return [Fp8ColVariant(dtype, PADDED, vector) for dtype in DTYPES for vector in (True, False)]

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
        return _storage().size_in_bytes()

    @classmethod
    def fake_arguments(cls, variant: Fp8ColVariant) -> tuple:
        """x (M, K), q (P, K) column-major with P % 16 == 0, amax, scales, offsets and the padded
        offsets (G,), mask, steps, alignment, the env stream."""
        rows, padded = cute.sym_int(), cute.sym_int(divisibility=16)
        cols = cute.sym_int(divisibility=PAIR if variant.vector_loads else 1)
        x = _fake_x(variant, rows, cols)
        q = _fake(Float8E4M3FN, (padded, cols), (0, 1), 16)
        amax = _fake(Int32, (cute.sym_int(),), (0,), 4)
        scales = _fake(Float32, (cute.sym_int(),), (0,), 4)
        groups = cute.sym_int()
        offsets, padded_start, padded_end = (_fake(Int32, (groups,), (0,), 4) for _ in range(3))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        mask, steps, alignment = Int32(-1), Int32(1), Int32(16)
        return x, q, amax, scales, offsets, padded_start, padded_end, mask, steps, alignment, stream

    def launcher(self):
        return self.launch_padded

    @cute.jit
    def launch_padded(
        self, x, q, amax, scales, offsets, padded_start, padded_end, mask: Int32, steps: Int32,
        alignment: Int32, stream,
    ):  # fmt: skip
        qt = as_one_expert(q, 16, transpose=True)  # (1, K, P) row-major
        x = _as_experts(x)
        row_tiles = ceil_div(q.shape[0], TILE_M)
        chunks, tiles_per_cta = self._column_chunks(row_tiles, x.shape[2])
        args = (x, qt, amax, _flat(scales), offsets, padded_start, padded_end, mask, steps, alignment)
        self.kernel_padded(*args, tiles_per_cta).launch(
            grid=[row_tiles, chunks, 1],
            block=[THREADS, 1, 1],
            smem=_storage().size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=100,  # the scan arrays: 16 KB a CTA
        )

    @cute.kernel
    def kernel_padded(
        self, x, qt, amax, scales, offsets, padded_start, padded_end, mask, steps, alignment,
        tiles_per_cta: Int32,
    ):  # fmt: skip
        tid, _, _ = cute.arch.thread_idx()
        row_tile, chunk, _ = cute.arch.block_idx()
        _, rows, cols = x.shape
        storage = SmemAllocator().allocate(_storage())
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
        first_tile = chunk * tiles_per_cta
        last_tile = cutlass.min(first_tile + tiles_per_cta, ceil_div(cols, TILE_K))
        for tile in cutlass.range(first_tile, last_tile, unroll=1):
            at = Columns(Int32(0), tile * THREADS + tid, rows, cols)
            self._store_scales(src, scales, at, row_tile)
            self._padded_row_tile(x, qt, src, at, first_row, halves)

    @cute.jit
    def _padded_row_tile(self, x, qt, src: CastSource, at: Columns, first_row: Int32, halves):
        """Padded rows ``first_row .. first_row + 127`` (those below P) of the thread's columns into
        q^T, ``load_blocks`` blocks of loads in flight at a time, then block by block; a group's
        ``q_scale`` is computed again only when a half's group differs from the last one met."""
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


__all__ = ["HALF", "Fp8ColPadCastKernel"]
