"""Global-memory load bytes one CTA keeps in flight, per registered kernel the model
covers (``registry.modelled()``: the bandwidth-bound ones), for a Little's-law model.

What the number means: ``bytes_per_cta`` is how many bytes of x (the input the kernel reads, at its
own dtype's size: bf16 2 bytes, fp32 4, E8M0 scales and E4M3 data 1) one CTA has asked the memory
system for and not yet used, once every warp of the CTA is in its steady-state loop. A latency
model divides the bytes it needs in flight per SM (bandwidth x latency) by this to get the CTAs per
SM a kernel needs (and compares that with the CTAs its config lets reside). Small loads (group
offsets, amax and scale words) are left out.

Each kernel class states its count (``Kernel.loads_in_flight(variant, config, cols)``, next to the
code that issues the loads), counting what a thread issues before it waits for the first of them:

- ``cp.async`` and TMA rings (``quantize_1x32``, ``quantize_dual``, ``quantize_tma``): the units the
  code keeps ahead while one converts, ``stages - 1`` (a one-stage ring issues its tile and waits
  for it at once: that one tile);
- register-staged loads (every other kernel): everything a thread issues before the first use, e.g.
  32 rows of a column pair (``quantize_32x1``, the FP8 column passes, ``load_blocks`` of them in the
  cast pass), ``unroll`` steps (``quantize_fp8_row``, ``dequantize_fp8_rows``), ``vectors_per_lane``
  vectors (pad / unpad), a chunk of ``vectors`` vectors per thread (``ep_send``), or the next row
  block of a window (``swizzle``, loaded while the current one is stored).

This module asks the classes through the registry and names the variant each kernel is benchmarked
with. Where the count depends on the shape (a row shorter than a load batch or window), it is taken
at ``cols`` = K = :data:`BENCH_COLS` (the benchmarks' width); kernels of fixed 128- or 256-column
tiles are full at that K. All counts are bytes; ``threads`` is threads per CTA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import registry
from .base import LoadsInFlight

#: K (elements of a row of x) at which shape-dependent counts are taken: the benchmarks' width.
BENCH_COLS = 7168


def loads_in_flight(name: str, variant: Any, config: Any, *, cols: int = BENCH_COLS) -> LoadsInFlight:
    """Threads per CTA and bytes of x one CTA keeps in flight for registry kernel ``name``'s
    ``variant`` under ``config`` (the kernel class's ``loads_in_flight``); ``cols``: K, the row
    width in elements of x where the count depends on it (see the module docstring)."""
    if name not in registry.modelled():
        known = ", ".join(registry.modelled())
        raise KeyError(f"no in-flight count for kernel {name!r} (known: {known})")
    return registry.entry(name).kernel_class().loads_in_flight(variant, config, cols)


def _representatives() -> dict[str, Callable[[], Any]]:
    """Makers of each kernel's representative variant (see :func:`representative_variant`)."""
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
        "quantize_fp8_col_pad_cast": lambda: fp8_col.Fp8ColVariant("bfloat16", fp8_col.PADDED),
        "dequantize_fp8_rows": lambda: dequant.DequantFp8RowsVariant(vector=True),
        "quantize_tma": lambda: tma.TmaVariant("bfloat16", "rceil", q1x32.ScaleLayout.BLOCKED),
        "swiglu_fp8": lambda: swg.SwigluVariant("fwd", round_pow2=True, vector=True),
    }


def representative_variant(name: str) -> Any:
    """The variant kernel ``name`` is benchmarked with: bf16 (E8M0 scales for ``swizzle``),
    ungrouped, 2-D, the scaling mode and scale layout the benches default to (``rceil``, blocked
    scales), vector loads; pad / unpad as their bf16 rows' 16-byte ``int16`` carrier, the row
    scatter as bf16 rows, the FP8 column cast into padded groups as bf16 (its only layout), the EP
    send as mxfp8 (rceil), SwiGLU + FP8 as its forward with
    power-of-2 scales, the FP8 row dequantization (E4M3 in, bf16 out) with 16-byte steps."""
    makers = _representatives()
    if name not in makers:
        raise KeyError(f"no representative variant for kernel {name!r} (known: {', '.join(makers)})")
    return makers[name]()


__all__ = ["BENCH_COLS", "LoadsInFlight", "loads_in_flight", "representative_variant"]
