"""Global-memory load bytes one CTA keeps in flight, per registered kernel the model
covers (``registry.modelled()``: the bandwidth-bound ones), for a Little's-law model.

What the number means: ``bytes_per_cta`` is how many bytes of x (the input the kernel reads, at its
own dtype's size: bf16 2 bytes, fp32 4, E8M0 scales and E4M3 data 1) one CTA has asked the memory
system for and not yet used, once every warp of the CTA is in its steady-state loop. A latency
model divides the bytes it needs in flight per SM (bandwidth x latency) by this to get the CTAs per
SM a kernel needs (and compares that with the CTAs its config lets reside). Small loads (group
offsets, amax and scale words) are left out.

How it was derived: by reading each kernel's ``kernel`` method and the helpers its main loop calls,
and counting what a thread issues before it waits for the first of those loads:

- ``cp.async`` and TMA rings (``quantize_1x32``, ``quantize_dual``, ``quantize_tma``): the units the
  code keeps ahead while one converts, ``stages - 1`` (a one-stage ring issues its tile and waits
  for it at once: that one tile);
- register-staged loads (every other kernel): everything a thread issues before the first use, e.g.
  32 rows of a column pair (``quantize_32x1``, the FP8 column passes, ``load_blocks`` of them in the
  cast pass), ``unroll`` steps (``quantize_fp8_row``, ``dequantize_fp8_rows``), ``vectors_per_lane``
  vectors (pad / unpad), a chunk of ``vectors`` vectors per thread (``ep_send``), or the next row
  block of a window (``swizzle``, loaded while the current one is stored).

Sizes come from the config's fields and the kernel modules' constants, never restated here. Where
the count depends on the shape (a row shorter than a load batch or window), it is taken at
``cols`` = K = :data:`BENCH_COLS` (the benchmarks' width); kernels of fixed 128- or 256-column tiles
are full at that K. All counts are bytes; ``threads`` is threads per CTA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cute_utils.constants import BLOCK_SIZE, TILE_COLS, TILE_ROWS

from . import combine_sum as csum
from . import dequant_fp8 as dequant
from . import ep_send as send
from . import pad as pad_mod
from . import quantize as q1x32
from . import quantize_32x1 as q32x1
from . import quantize_dual as dual
from . import quantize_fp8 as fp8_row
from . import quantize_fp8_col as fp8_col
from . import swiglu as swg
from . import swizzle as swz
from .experimental import quantize_tma as tma

#: K (elements of a row of x) at which shape-dependent counts are taken: the benchmarks' width.
BENCH_COLS = 7168
_WARP = 32
_WORD_BYTES = 4  # swizzle stages 4-byte words


@dataclass(frozen=True)
class LoadsInFlight:
    """``threads``: threads per CTA; ``bytes_per_cta``: bytes of x one CTA has requested and not yet
    consumed at steady state; ``derivation``: one line saying how that product was formed."""

    threads: int
    bytes_per_cta: int
    derivation: str


def _elem_bytes(dtypes: dict, dtype: str) -> int:
    """Bytes of one element of the DSL type ``dtypes[dtype]``."""
    return dtypes[dtype].width // 8


def _ring_units(stages: int) -> int:
    """Units of a ``cp.async`` / TMA ring in flight while one converts: ``stages - 1``, or the one
    tile a single-stage ring issues and then waits for."""
    return max(stages - 1, 1)


def _swizzle(variant: swz.SwizzleVariant, config: swz.SwizzleConfig, cols: int) -> LoadsInFlight:
    """One 128-row block of the CTA's window (4-byte words, staged in registers while the previous
    block is stored); raw (not ``word_loads``) rows take up to one aligned word more."""
    scale_cols = cols // BLOCK_SIZE
    words = -(-min(config.window_cols, scale_cols) // TILE_COLS) + (0 if variant.word_loads else 1)
    extra = "" if variant.word_loads else ", up to 1 spill word"
    return LoadsInFlight(
        config.threads,
        TILE_ROWS * words * _WORD_BYTES,
        f"{TILE_ROWS} rows x {words} words{extra} x {_WORD_BYTES} B of E8M0 "
        f"({config.window_cols}-col window of K/32 = {scale_cols} cols; {config.threads} thr)",
    )


def _quantize_1x32(
    variant: q1x32.Quantize1x32Variant, config: q1x32.QuantizeConfig, cols: int
) -> LoadsInFlight:
    """Per lane ``stages - 1`` ring units of ``batch_vectors`` 8-element vectors."""
    elem = _elem_bytes(q1x32.DTYPES, variant.dtype)
    units = _ring_units(config.stages)
    return LoadsInFlight(
        _WARP * q1x32.WARPS,
        q1x32.WARPS * _WARP * units * config.batch_vectors * q1x32.VECTOR * elem,
        f"{q1x32.WARPS} warps x {_WARP} lanes x {units} units (stages {config.stages} - 1) x "
        f"{config.batch_vectors} vectors x {q1x32.VECTOR} elem x {elem} B",
    )


def _quantize_tma(variant: tma.TmaVariant, config: tma.TmaQuantizeConfig, cols: int) -> LoadsInFlight:
    """Per warp ``stages - 1`` TMA boxes of ``box_rows`` x 128 columns."""
    elem = _elem_bytes(q1x32.DTYPES, variant.dtype)
    units = _ring_units(config.stages)
    return LoadsInFlight(
        _WARP * q1x32.WARPS,
        q1x32.WARPS * units * config.box_rows * q1x32.TILE_K * elem,
        f"{q1x32.WARPS} warps x {units} boxes (stages {config.stages} - 1) x {config.box_rows} rows x "
        f"{q1x32.TILE_K} cols x {elem} B",
    )


def _quantize_32x1(
    variant: q32x1.Quantize32x1Variant, config: q32x1.Quantize32x1Config, cols: int
) -> LoadsInFlight:
    """Per thread one 32-row block of its column pair, all loads before the block max."""
    elem = _elem_bytes(q32x1.DTYPES, variant.dtype)
    return LoadsInFlight(
        q32x1.THREADS,
        q32x1.THREADS * BLOCK_SIZE * q32x1.COLS_PER_THREAD * elem,
        f"{q32x1.THREADS} thr x {BLOCK_SIZE} rows x {q32x1.COLS_PER_THREAD} cols x {elem} B",
    )


def _quantize_dual(variant: dual.DualVariant, config: dual.DualConfig, cols: int) -> LoadsInFlight:
    """Per lane an 8 x 8 fragment per ring unit; one stage: the tile issued, then waited for."""
    elem = _elem_bytes(dual.DTYPES, variant.dtype)
    warps = dual.WARPS_M * dual.WARPS_K
    units = _ring_units(config.stages)
    return LoadsInFlight(
        _WARP * warps,
        warps * _WARP * units * dual.LANE_ROWS * dual.LANE_COLS * elem,
        f"{warps} warps x {_WARP} lanes x {units} tile (stages {config.stages}: max(stages - 1, 1)) x "
        f"{dual.LANE_ROWS} rows x {dual.LANE_COLS} cols x {elem} B",
    )


def _pad(variant: pad_mod.RowGatherVariant, config: pad_mod.PadConfig, cols: int) -> LoadsInFlight:
    """Per warp one row chunk of ``32 x vectors_per_lane`` vectors (loaded, then stored), or the
    whole row where it is shorter."""
    row_bytes = cols * _elem_bytes(pad_mod.ELEMENT_TYPES, variant.dtype)
    chunk = _WARP * config.vectors_per_lane * variant.vector_bytes
    warps = config.threads // _WARP
    return LoadsInFlight(
        config.threads,
        warps * min(chunk, row_bytes),
        f"{warps} warps x min({_WARP} lanes x {config.vectors_per_lane} vectors x "
        f"{variant.vector_bytes} B, {row_bytes} B row at K = {cols})",
    )


def _combine_sum(variant: csum.CombineSumVariant, config: csum.CombineSumConfig, cols: int) -> LoadsInFlight:
    """``vectors`` 16-byte vectors per thread: a slot's loads are used before the next slot's."""
    return LoadsInFlight(
        config.threads,
        config.threads * config.vectors * csum.VECTOR * 2,
        f"{config.threads} thr x {config.vectors} vectors x {csum.VECTOR} bf16 x 2 B (one slot at a time)",
    )


def _ep_send(variant: send.SendVariant, config: send.SendConfig, cols: int) -> LoadsInFlight:
    """One token per CTA: a chunk of ``threads x vectors`` 16-byte vectors of its bf16 row, all
    loads issued before any is used, or the whole row where it is shorter."""
    row_bytes = cols * 2
    chunk = config.threads * config.vectors * send.VECTOR * 2
    return LoadsInFlight(
        config.threads,
        min(chunk, row_bytes),
        f"min({config.threads} thr x {config.vectors} vectors x {send.VECTOR} bf16 x 2 B, "
        f"{row_bytes} B row at K = {cols})",
    )


def _fp8_row(variant: fp8_row.Fp8RowVariant, config: fp8_row.Fp8RowConfig, cols: int) -> LoadsInFlight:
    """One batch of ``unroll`` steps per thread of each row the CTA works on (a whole CTA per row,
    or a warp per row), capped by the row's steps."""
    elem = _elem_bytes(fp8_row.DTYPES, variant.dtype)
    width = fp8_row.VECTOR if variant.vector else 1
    row_threads = config.threads if config.row_per_cta else _WARP
    rows = 1 if config.row_per_cta else config.threads // _WARP
    steps = min(row_threads * config.unroll, -(-cols // width))
    return LoadsInFlight(
        config.threads,
        rows * steps * width * elem,
        f"{rows} row(s) x min({row_threads} thr x {config.unroll} unroll, K = {cols} / {width}) steps "
        f"x {width} elem x {elem} B (each pass; the cast pass re-reads from L2)",
    )


def _dequant_rows(
    variant: dequant.DequantFp8RowsVariant, config: dequant.DequantFp8RowsConfig, cols: int
) -> LoadsInFlight:
    """One batch of ``unroll`` steps per lane of each warp's row (1-byte E4M3 elements), capped by
    the row's steps."""
    width = dequant.VECTOR if variant.vector else 1
    rows = config.threads // _WARP
    steps = min(_WARP * config.unroll, -(-cols // width))
    return LoadsInFlight(
        config.threads,
        rows * steps * width,
        f"{rows} rows x min({_WARP} lanes x {config.unroll} unroll, K = {cols} / {width}) steps "
        f"x {width} E4M3 x 1 B",
    )


def _col_pass(dtype: str, blocks: int) -> LoadsInFlight:
    """``blocks`` 32-row blocks of a column pair per thread, all loads before any use."""
    elem = _elem_bytes(fp8_col.DTYPES, dtype)
    return LoadsInFlight(
        fp8_col.THREADS,
        fp8_col.THREADS * blocks * fp8_col.BLOCK * fp8_col.PAIR * elem,
        f"{fp8_col.THREADS} thr x {blocks} block(s) x {fp8_col.BLOCK} rows x {fp8_col.PAIR} cols x {elem} B",
    )


def _fp8_col_amax(
    variant: fp8_col.Fp8ColVariant, config: fp8_col.Fp8ColAmaxConfig, cols: int
) -> LoadsInFlight:
    """Amax pass: one 32-row block per thread."""
    return _col_pass(variant.dtype, 1)


def _fp8_col_cast(
    variant: fp8_col.Fp8ColVariant, config: fp8_col.Fp8ColCastConfig, cols: int
) -> LoadsInFlight:
    """Cast pass: ``load_blocks`` 32-row blocks per thread."""
    return _col_pass(variant.dtype, config.load_blocks)


def _swiglu(variant: swg.SwigluVariant, config: swg.SwigluConfig, cols: int) -> LoadsInFlight:
    """One batch of ``unroll`` steps per thread of each row the CTA works on, capped by the row's
    steps (``cols`` = H, the gate / up width), each step's inputs: gate and up (and grad_h), bf16."""
    width = swg.VECTOR if variant.vector else 1
    inputs = 3 if variant.direction == "bwd" else 2
    row_threads = config.threads if config.row_per_cta else _WARP
    rows = 1 if config.row_per_cta else config.threads // _WARP
    steps = min(row_threads * config.unroll, -(-cols // width))
    return LoadsInFlight(
        config.threads,
        rows * steps * inputs * width * 2,
        f"{rows} row(s) x min({row_threads} thr x {config.unroll} unroll, H = {cols} / {width}) steps x "
        f"{inputs} inputs x {width} elem x 2 B (compute pass; the cast pass re-reads bf16 outputs from L2)",
    )


_COUNTS: dict[str, Callable[[Any, Any, int], LoadsInFlight]] = {
    "swizzle": _swizzle,
    "quantize_1x32": _quantize_1x32,
    "quantize_32x1": _quantize_32x1,
    "quantize_dual": _quantize_dual,
    "pad": _pad,
    "unpad": _pad,
    "row_scatter": _pad,
    "combine_sum": _combine_sum,
    "ep_send": _ep_send,
    "quantize_fp8_row": _fp8_row,
    "quantize_fp8_col_amax": _fp8_col_amax,
    "quantize_fp8_col_cast": _fp8_col_cast,
    "dequantize_fp8_rows": _dequant_rows,
    "quantize_tma": _quantize_tma,
    "swiglu_fp8": _swiglu,
}


def loads_in_flight(name: str, variant: Any, config: Any, *, cols: int = BENCH_COLS) -> LoadsInFlight:
    """Threads per CTA and bytes of x one CTA keeps in flight for registry kernel ``name``'s
    ``variant`` under ``config``; ``cols``: K, the row width in elements of x where the count
    depends on it (see the module docstring)."""
    try:
        count = _COUNTS[name]
    except KeyError:
        raise KeyError(f"no in-flight count for kernel {name!r} (known: {', '.join(_COUNTS)})") from None
    return count(variant, config, cols)


def _representatives() -> dict[str, Callable[[], Any]]:
    """Makers of each kernel's representative variant (see :func:`representative_variant`)."""
    return {
        "swizzle": lambda: swz.SwizzleVariant(swz.SwizzleLayout.PLAIN, rank=2, word_loads=True),
        "quantize_1x32": lambda: q1x32.Quantize1x32Variant("bfloat16", "rceil", q1x32.ScaleLayout.BLOCKED),
        "quantize_32x1": lambda: q32x1.Quantize32x1Variant(
            "bfloat16", "rceil", q32x1.ScaleLayout.BLOCKED, rank=2
        ),
        "quantize_dual": lambda: dual.DualVariant("bfloat16", "rceil", dual.ScaleLayout.BLOCKED),
        "pad": lambda: pad_mod.RowGatherVariant("int16", pad_mod.VECTOR_BYTES),
        "unpad": lambda: pad_mod.RowGatherVariant("int16", pad_mod.VECTOR_BYTES),
        "row_scatter": lambda: pad_mod.RowGatherVariant("bfloat16", pad_mod.VECTOR_BYTES),
        "combine_sum": lambda: csum.CombineSumVariant(),
        "ep_send": lambda: send.SendVariant("mxfp8"),
        "quantize_fp8_row": lambda: fp8_row.Fp8RowVariant("bfloat16", round_pow2=True, vector=True, rank=2),
        "quantize_fp8_col_amax": lambda: fp8_col.Fp8ColVariant("bfloat16", "plain"),
        "quantize_fp8_col_cast": lambda: fp8_col.Fp8ColVariant("bfloat16", "plain"),
        "dequantize_fp8_rows": lambda: dequant.DequantFp8RowsVariant(vector=True),
        "quantize_tma": lambda: tma.TmaVariant("bfloat16", "rceil", q1x32.ScaleLayout.BLOCKED),
        "swiglu_fp8": lambda: swg.SwigluVariant("fwd", round_pow2=True, vector=True),
    }


def representative_variant(name: str) -> Any:
    """The variant kernel ``name`` is benchmarked with: bf16 (E8M0 scales for ``swizzle``),
    ungrouped, 2-D, the scaling mode and scale layout the benches default to (``rceil``, blocked
    scales), vector loads; pad / unpad as their bf16 rows' 16-byte ``int16`` carrier, the row
    scatter as bf16 rows, the EP send as mxfp8 (rceil), SwiGLU + FP8 as its forward with
    power-of-2 scales, the FP8 row dequantization (E4M3 in, bf16 out) with 16-byte steps."""
    makers = _representatives()
    if name not in makers:
        raise KeyError(f"no representative variant for kernel {name!r} (known: {', '.join(makers)})")
    return makers[name]()


__all__ = ["BENCH_COLS", "LoadsInFlight", "loads_in_flight", "representative_variant"]
