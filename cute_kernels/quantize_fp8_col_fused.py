"""``pad_and_quantize_fp8_2d_cols`` in one persistent launch: ``Fp8ColPadFusedKernel``.

The two-pass form (``cute_kernels.quantize_fp8_col``: a zero fill, an amax pass over all of x, then
the cast into padded groups) needs a column's amax over its whole group before any of it is cast.
This kernel does the same two passes' work per (row span or row tile, column tile) unit, in one
launch, in an order meant to find the cast's rows still in L2:

- Columns are split into **bands** of ``band_tiles`` 256-column tiles, sized so that a band of x
  (all M rows) is about ``config.band_bytes``.
- **Units**: an amax unit is one column tile over ``config.span_rows`` rows (the amax pass's
  ``_span``: its (group, column) maxima folded into the amax words by atomic max); a cast unit is
  one column tile over 128 padded rows (the padded cast's row tile).
- **Order** (a global ticket counter; a CTA takes its next unit with one atomic add): the amax
  units of the first ``config.lookahead`` bands; then, for each later band b, the amax units of b
  followed by the cast units of band ``b - lookahead``; then the casts of the last bands.
- **Waits**: an amax unit ends with a CTA barrier and a release add on its band's counter; a cast
  unit's thread 0 spins on an acquire load of that counter until all the band's amax units have
  posted, then a CTA barrier (CUTLASS's generic-barrier pattern). Every unit a cast waits for
  holds an earlier ticket, taken by a CTA that is running and never waits on an amax unit: no
  deadlock at any grid size or occupancy (a CTA that is not resident has taken no ticket).

At the shapes the op sends here the cast's re-read mostly misses L2 (the grid works on a few
hundred units at once): the gain over the two passes is the single launch, whose phases overlap
(notes/fp8-col-kernels.md, "One launch").

Words after the G K amax words (zeroed by the caller with them): the ticket counter, then one
counter per band (at most one per column tile: ``cute_utils.constants.fp8_col_counter_words``).
Outputs, numerics and variants (dtype, ``vector_loads``) are the padded cast's: bit for bit the
two-pass op.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.memory import SmemAllocator

from cute_utils.blocked import ceil_div
from cute_utils.constants import FP8_COL_TILE, fp8_col_counter_words
from cute_utils.groups import store_padded_offsets

from .base import LoadsInFlight
from .quantize_fp8_col import (
    DTYPES,
    HALF,
    HALVES,
    PADDED,
    PAIR,
    THREADS,
    TILE_K,
    TILE_M,
    CastSource,
    Columns,
    Fp8ColAmaxKernel,
    Fp8ColPadCastKernel,
    Fp8ColVariant,
    _as_experts,
    _column_loads,
    _fake,
    _fake_x,
    _flat,
    _storage,
    as_one_expert,
    map_half,
    padded_smem,
    scan_padded,
)


@dataclass(frozen=True)
class Fp8ColFusedConfig:
    """``min_ctas_per_sm``: CTAs per SM of the persistent grid (also the register cap);
    ``span_rows``: x rows per amax unit (a multiple of 32); ``band_bytes``: x bytes per band;
    ``load_blocks``: 32-row blocks of loads in flight in a cast unit (as the cast pass's);
    ``lookahead``: bands whose amax units are handed out before a band's casts (so that a cast
    rarely waits)."""

    min_ctas_per_sm: int = 4
    span_rows: int = 128
    band_bytes: int = 8 << 20
    load_blocks: int = 1
    lookahead: int = 3


@cute.jit
def _unit(ticket: Int32, amax_units: Int32, cast_units: Int32, bands: Int32, lookahead: cutlass.Constexpr):
    """``(band, is_cast, index)`` of work ticket ``ticket`` (module docstring's order, the amax
    units ``lookahead`` bands ahead of the casts)."""
    ahead = cutlass.min(bands, lookahead)
    mixed = bands - ahead  # segments of a band's amax units then an earlier band's casts
    head = ahead * amax_units
    segment = amax_units + cast_units
    band, is_cast, index = ticket // amax_units, False, ticket % amax_units
    if ticket >= head:
        rest = ticket - head
        if rest < mixed * segment:
            band, index = rest // segment, rest % segment
            if index < amax_units:
                band = band + ahead
            else:
                is_cast = True
                index = index - amax_units
        else:
            rest = rest - mixed * segment
            band, index, is_cast = mixed + rest // cast_units, rest % cast_units, True
    return band, is_cast, index


class Fp8ColPadFusedKernel(Fp8ColPadCastKernel, Fp8ColAmaxKernel):
    """One launch of ``pad_and_quantize_fp8_2d_cols`` (module docstring). Launch: ``kernel(x, q,
    amax, scales, offsets, padded_start, padded_end, mask, steps, alignment, sms)``: as the padded
    cast's (non-dual), with ``amax`` int32 (G K + ``fp8_col_counter_words(K)``,) zeroed and ``sms`` the
    device's SM count (the grid is ``sms * min_ctas_per_sm`` CTAs)."""

    name = "quantize_fp8_col_pad_fused"

    @classmethod
    def variants(cls) -> list[Fp8ColVariant]:
        return [Fp8ColVariant(dtype, PADDED, vector) for dtype in DTYPES for vector in (True, False)]

    @classmethod
    def target_name(cls, variant: Fp8ColVariant) -> str:
        return f"{cls.name}_{variant.suffix()}"

    @classmethod
    def loads_in_flight(cls, variant: Fp8ColVariant, config: Fp8ColFusedConfig, cols: int) -> LoadsInFlight:
        """The DRAM reads are the amax units': one 32-row block of its column pair per thread."""
        return _column_loads(variant, 1)

    @classmethod
    def shared_bytes(cls, variant: Fp8ColVariant, config) -> int:
        return _storage(ticket=True).size_in_bytes()

    @classmethod
    def fake_arguments(cls, variant: Fp8ColVariant) -> tuple:
        """The padded cast's (non-dual) without the row outputs, then ``sms``, the env stream."""
        rows, padded = cute.sym_int(), cute.sym_int(divisibility=16)
        cols = cute.sym_int(divisibility=PAIR if variant.vector_loads else 1)
        x = _fake_x(variant, rows, cols)
        q = _fake(cutlass.Float8E4M3FN, (padded, cols), (0, 1), 16)
        amax = _fake(Int32, (cute.sym_int(),), (0,), 4)
        scales = _fake(cutlass.Float32, (cute.sym_int(),), (0,), 4)
        groups = cute.sym_int()
        offsets, padded_start, padded_end = (_fake(Int32, (groups,), (0,), 4) for _ in range(3))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        mask, steps, alignment, sms = Int32(-1), Int32(1), Int32(16), Int32(1)
        return (x, q, amax, scales, offsets, padded_start, padded_end, mask, steps, alignment, sms, stream)

    def launcher(self):
        return self.launch_fused

    @cute.jit
    def launch_fused(
        self, x, q, amax, scales, offsets, padded_start, padded_end, mask: Int32, steps: Int32,
        alignment: Int32, sms: Int32, stream,
    ):  # fmt: skip
        qt = as_one_expert(q, 16, transpose=True)  # (1, K, P) row-major
        x = _as_experts(x)
        _, rows, cols = x.shape
        col_tiles = ceil_div(cols, TILE_K)
        band_rows = self.config.band_bytes // (TILE_K * (x.element_type.width // 8))  # rows x one tile
        band_tiles = cutlass.min(cutlass.max(band_rows // cutlass.max(rows, 1), 1), col_tiles)
        bands = ceil_div(col_tiles, band_tiles)
        spans = cutlass.max(ceil_div(rows, self.config.span_rows), 1)
        args = (x, qt, amax, _flat(scales), offsets, padded_start, padded_end, mask, steps, alignment)
        self.kernel_fused(*args, band_tiles, spans, bands).launch(
            grid=[sms * self.config.min_ctas_per_sm, 1, 1],
            block=[THREADS, 1, 1],
            smem=_storage(ticket=True).size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=self.config.min_ctas_per_sm,
            preferred_smem_carveout=100,
        )

    @cute.kernel
    def kernel_fused(
        self, x, qt, amax, scales, offsets, padded_start, padded_end, mask, steps, alignment,
        band_tiles: Int32, spans: Int32, bands: Int32,
    ):  # fmt: skip
        tid, _, _ = cute.arch.thread_idx()
        _, rows, cols = x.shape
        storage = SmemAllocator().allocate(_storage(ticket=True))
        smem = padded_smem(storage)
        slot = storage.ticket.get_tensor(cute.make_layout(1))
        num_groups = offsets.shape[0]
        scan_padded(smem, offsets, rows, alignment, tid)
        row_tiles = ceil_div(qt.shape[2], TILE_M)
        amax_units, cast_units = band_tiles * spans, band_tiles * row_tiles
        total = bands * (amax_units + cast_units)
        counters = amax.iterator + num_groups * cols  # the ticket, then one word per band
        src = CastSource(amax, offsets, mask, steps)
        if tid == 0:
            slot[0] = cute.arch.atomic_add(counters, Int32(1), sem="relaxed", scope="gpu")
        cute.arch.barrier()
        ticket = slot[0]
        while ticket < total:
            following = Int32(0)
            if tid == 0:  # taken now, so its latency hides behind this unit
                following = cute.arch.atomic_add(counters, Int32(1), sem="relaxed", scope="gpu")
            band, is_cast, index = _unit(ticket, amax_units, cast_units, bands, self.config.lookahead)
            tile = band * band_tiles + index % band_tiles
            done = counters + (1 + band)
            if is_cast:
                self._cast_unit(x, qt, src, scales, smem, padded_start, padded_end, alignment, tile,
                                index // band_tiles, row_tiles, done, amax_units)  # fmt: skip
            else:
                self._amax_unit(x, amax, offsets, steps, tile, index // band_tiles, done)
            cute.arch.barrier()  # the halves and the slot are free
            if tid == 0:
                slot[0] = following
            cute.arch.barrier()
            ticket = slot[0]

    @cute.jit
    def _amax_unit(self, x, amax, offsets, steps: Int32, tile: Int32, span: Int32, done):
        """Column tile ``tile`` over row span ``span``: the amax pass's ``_span``, then the band's
        counter ``done`` raised by one (release, after a CTA barrier)."""
        tid, _, _ = cute.arch.thread_idx()
        _, rows, cols = x.shape
        at = Columns(Int32(0), tile * THREADS + tid, rows, cols)
        first = span * self.config.span_rows
        last = cutlass.min(first + self.config.span_rows, rows)
        if at.pair * PAIR < cols:
            self._span(x, amax, offsets, steps, at, first, last)
        cute.arch.barrier()
        if tid == 0:
            cute.arch.atomic_add(done, Int32(1), sem="release", scope="gpu")

    @cute.jit
    def _cast_unit(
        self, x, qt, src: CastSource, scales, smem, padded_start, padded_end, alignment,
        tile: Int32, row_tile: Int32, row_tiles: Int32, done, amax_units: Int32,
    ):  # fmt: skip
        """Padded row tile ``row_tile`` of column tile ``tile``, once the band's ``amax_units`` have
        posted to ``done``: the padded cast's row tile and scales (unit (0, 0) also writes the
        padded offsets)."""
        tid, _, _ = cute.arch.thread_idx()
        _, rows, cols = x.shape
        num_groups = src.offsets.shape[0]
        if tid == 0:
            posted = cute.arch.load(done, Int32, sem="acquire", scope="gpu")
            while posted < amax_units:
                posted = cute.arch.load(done, Int32, sem="acquire", scope="gpu")
        first_row = row_tile * TILE_M
        if tid < HALVES:
            map_half(smem, num_groups, alignment, first_row + tid * HALF, smem.halves[tid, None])
        if row_tile == 0 and tile == 0:
            store_padded_offsets(smem.prefix, num_groups, alignment, padded_start, padded_end, tid, THREADS)
        cute.arch.barrier()
        at = Columns(Int32(0), tile * THREADS + tid, rows, cols)
        self._store_scales(src, scales, at, row_tile, row_tiles)
        self._padded_row_tile(x, qt, src, at, first_row, smem.halves, None)


assert TILE_K == FP8_COL_TILE, "the counter words assume the column kernels' tile"
__all__ = ["Fp8ColFusedConfig", "Fp8ColPadFusedKernel", "fp8_col_counter_words"]
