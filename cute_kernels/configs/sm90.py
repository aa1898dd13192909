"""Hopper (sm_90a) launch configs, one function per registered kernel: ``name(variant) -> config``.

Every choice was measured with the kernel's tuner in ``bench/``; the reasons are one line here,
the numbers (and the device) in the note cited.
"""

from __future__ import annotations

from dataclasses import replace

from cute_kernels.pad import PadConfig
from cute_kernels.quantize import QuantizeConfig
from cute_kernels.quantize_32x1 import Quantize32x1Config
from cute_kernels.quantize_dual import DualConfig
from cute_kernels.swizzle import SwizzleConfig

# --- swizzle (notes/swizzle-persistent-grid.md, notes/swizzle-grouped-window-and-prefetch.md) ---
# A 64-column window, 256 threads, 4 CTAs per SM: faster than 2 CTAs per SM or 128-thread CTAs;
# the 128-column window only where it wins (grouped layouts, > 64 columns, <= 64 MiB) and
# never in 3-D (it spills there).
_SWIZZLE = SwizzleConfig()
_SWIZZLE_WIDE = SwizzleConfig(window_cols=128)


def swizzle(variant) -> SwizzleConfig:
    return _SWIZZLE_WIDE if variant.wide else _SWIZZLE


# --- quantize 1x32 (notes/quantize-1x32.md, notes/quantize-1x32-groups-and-padding.md) ---
# 2 vectors per unit x 3 stages (4 KB in flight per warp), warps side by side along K,
# ~32768 CTAs numbered run-fastest, a 40-register cap
# (12 CTAs per SM; uncapped took 42). fp32 without the cap: its padded variant spills under it.
_QUANTIZE_1X32 = QuantizeConfig()
_QUANTIZE_1X32_FP32 = replace(_QUANTIZE_1X32, min_ctas_per_sm=0)


def quantize_1x32(variant) -> QuantizeConfig:
    config = _QUANTIZE_1X32 if variant.dtype == "bfloat16" else _QUANTIZE_1X32_FP32
    return replace(config, max_groups=variant.max_groups)


# --- quantize 32x1 (notes/quantize-32x1-grid-and-groups.md) ---
# 4 CTAs per SM (128 registers, no spills in K-groups) beat no cap; ~32768 CTAs beat ~16384 and
# 4096 at the large shapes; lane-pair sector stores beat per-lane stores.
_QUANTIZE_32X1 = Quantize32x1Config()


def quantize_32x1(variant) -> Quantize32x1Config:
    return _QUANTIZE_32X1


# --- quantize dual (notes/quantize-dual-kernel.md, notes/quantize-dual-row-order.md) ---
# bf16: one tile per CTA, no ring beyond it (65 KiB of shared memory: 3 CTAs per SM at the
# 80-register cap), rows spread (notes/quantize-dual-row-order.md);
# longer CTAs were slower. fp32: tiles in order (the spread order's extra register spills the
# blocked variant); grouped fp32 takes 2 tiles per CTA and no ring (a 2-stage fp32 ring leaves one
# CTA per SM).
_DUAL_BF16 = DualConfig(stages=1, tiles_per_cta=1)
_DUAL_FP32 = DualConfig(stages=1, tiles_per_cta=1, spread_rows=False)
_DUAL_FP32_GROUPS = DualConfig(stages=1, tiles_per_cta=2, spread_rows=False)


def quantize_dual(variant) -> DualConfig:
    if variant.dtype == "bfloat16":
        return _DUAL_BF16
    return _DUAL_FP32_GROUPS if variant.layout.value == "groups" else _DUAL_FP32


# --- pad / unpad (notes/pad-unpad-grid.md) ---
# 128 threads, 4 x 16-byte vectors per lane, 2 row chunks per warp, a non-persistent grid: faster
# than a persistent grid of 4 x 256-thread CTAs per SM.
_PAD = PadConfig()


def pad(variant) -> PadConfig:
    return _PAD


def unpad(variant) -> PadConfig:
    return _PAD


# The EP row scatter (notes/ep-dispatch-combine.md) moves rows like pad: its launch shape.
def row_scatter(variant) -> PadConfig:
    return _PAD


# Combine's weighted sum: one 16-byte vector per thread, 128 threads (notes/ep-dispatch-combine.md).
def combine_sum(variant):
    from ..combine_sum import CombineSumConfig

    return CombineSumConfig()


# EP send (quantize + scatter, notes/ep-quantize-send.md): a CTA per token, 128 threads x 8 vectors
# of 16 bytes in flight (the whole row up to D = 8192), 8 CTAs per SM (64-register cap). Not yet
# measured on a GPU: the launch shape follows combine_sum's and the pad kernels' 128-thread CTAs.
def ep_send(variant):
    from ..ep_send import SendConfig

    return SendConfig()


# --- EP routing and layout (notes/ep-routing-kernel.md; not measured yet) ---
# Route: 8 warps (nine 4 KiB shared tables: 36 KiB), 16 steps per warp (4096 pairs per CTA), 16 ids
# per thread in flight in the prefix count. Layout: 256 threads x 8 pairs. Zero fill: 128 threads,
# 4 vectors per lane per row chunk (the row scatter's), at most 2 CTAs per SM looping over the rows.
def ep_route(variant):
    from ..ep_route import EpRouteConfig

    return EpRouteConfig()


def ep_layout(variant):
    from ..ep_route import EpLayoutConfig

    return EpLayoutConfig()


def ep_zero_fill(variant):
    from ..ep_route import EpZeroFillConfig

    return EpZeroFillConfig()


# --- FP8 rowwise, one scale per row (bench.tune quantize_fp8_row; notes/fp8-rowwise-row-kernel.md) ---
# The bindings pick per K class (quantize_fp8_row_for_shape below); without a shape (the SASS
# targets CI checks, the registry's default) the kernel takes the heuristic of the benchmarks' K
# class (K = 7168: class 8192), so the build CI inspects is one the bindings launch.
def quantize_fp8_row(variant):
    return quantize_fp8_row_for_shape(variant, f"{variant.dtype}/k8192", None)


def quantize_fp8_row_for_shape(variant, shape_class: str, tuned: dict | None):
    """The row kernel per K class (``"<dtype>/k<next power of 2 of K>"``): the tuned entry (measured
    on the vector variant: taken for it only), else a whole CTA per row, ``threads x unroll`` steps
    about the row's (unroll 4 up to K = 4096, else 2; 128 to 1024 threads; the tuner's figures for
    it: notes/fp8-rowwise-row-kernel.md)."""
    from cute_kernels.quantize_fp8 import VECTOR, Fp8RowConfig

    if tuned is not None and variant.vector:
        return Fp8RowConfig(**tuned)
    cols = int(shape_class.rsplit("/k", 1)[1])
    steps = cols // (VECTOR if variant.vector else 1)
    unroll = 4 if cols <= 4096 else 2
    threads = min(max(128, 1 << max(steps // unroll - 1, 1).bit_length()), 1024)
    return Fp8RowConfig(threads=threads, unroll=unroll, ctas_per_sm=1, row_per_cta=True)


# --- FP8 row dequantization, bounded (notes/bounded-row-passes.md) ---
# Not measured yet: one warp per row, 8 warps, 8 steps of 16 bytes per lane in flight (4 KiB per
# warp, 32 KiB per CTA: the FP8 row kernel's bytes in flight at K = 7168 twice over), 4 CTAs per SM.
def dequantize_fp8_rows(variant):
    from cute_kernels.dequant_fp8 import DequantFp8RowsConfig

    return DequantFp8RowsConfig()


# --- FP8 column scales (notes/fp8-col-kernels.md) ---
# Amax pass: 128-thread CTAs over 256-column tiles, row spans shrunk until ~8192 CTAs (2048 are
# slower); cast pass: 128 rows x a run of 256-column tiles per CTA, two 32-row blocks of loads in
# flight for bf16 (one block is slower, 4 blocks spill; fp32 and the element variants spill with
# two), 3 CTAs per SM (one block at 2 or 4 CTAs per SM is slower).
def quantize_fp8_col_amax(variant):
    from cute_kernels.quantize_fp8_col import Fp8ColAmaxConfig

    return Fp8ColAmaxConfig()


def quantize_fp8_col_cast(variant):
    from cute_kernels.quantize_fp8_col import Fp8ColCastConfig

    # two blocks in flight only where they fit the register cap (bf16, vector loads and stores)
    fits = variant.dtype == "bfloat16" and variant.vector_loads and variant.vector_stores
    # grouped byte stores (R % 16 != 0) spill under the 168-register cap, and so do the dual's
    # row stores (2-D and experts: the same row side): 2 CTAs per SM
    spills = variant.dual or (variant.grouped and not variant.vector_stores)
    return Fp8ColCastConfig(min_ctas_per_sm=2 if spills else 3, load_blocks=2 if fits else 1)


# Per shape class (``"<dtype>/<layout>[+dual]/k<K class>/g<group-count bucket>"``, see
# ``torch_bindings.quantize_fp8.col_shape_class``): the tuned entry (``bench.tune quantize_fp8_col``
# --write [--dual]; measured on the bf16 vector-load, vector-store variant of the class and taken
# for it only), else the configs above.
def _tuned_variant(variant) -> bool:
    return variant.dtype == "bfloat16" and variant.vector_loads and variant.vector_stores


def quantize_fp8_col_amax_for_shape(variant, shape_class: str, tuned: dict | None):
    from cute_kernels.quantize_fp8_col import Fp8ColAmaxConfig

    if tuned is not None and _tuned_variant(variant):
        return Fp8ColAmaxConfig(**tuned)
    return quantize_fp8_col_amax(variant)


def quantize_fp8_col_cast_for_shape(variant, shape_class: str, tuned: dict | None):
    from cute_kernels.quantize_fp8_col import Fp8ColCastConfig

    if tuned is not None and _tuned_variant(variant):
        return Fp8ColCastConfig(**tuned)
    return quantize_fp8_col_cast(variant)


# The cast into padded token groups does the unpadded grouped cast's work per element (plus a
# group scan per CTA): the same config; per shape the bindings take the grouped cast's
# (``torch_bindings.quantize_fp8.ColKey.config``: its function and tuned entries).
def quantize_fp8_col_pad_cast(variant):
    return quantize_fp8_col_cast(variant)


# --- SwiGLU + FP8 rowwise (notes/swiglu-fp8-kernel.md) ---
# The bindings pick per direction and H class (swiglu_fp8_for_shape below, `bench.tune swiglu`);
# without a shape (the SASS targets CI checks) the kernel takes the heuristic: a whole 256-thread
# CTA per row. Forward: 4 steps per thread in flight (H = 8192: the row in one batch), 3 CTAs per
# SM (79 registers; a 32 KiB silu table copy in shared memory per CTA). Backward: 2 steps (three
# 16-byte inputs per step; 122 registers), 2 CTAs per SM (a 64 KiB table copy each).
def swiglu_fp8(variant):
    from cute_kernels.swiglu import SwigluConfig

    if variant.direction == "fwd":
        return SwigluConfig(threads=256, unroll=4, ctas_per_sm=3)
    return SwigluConfig(threads=256, unroll=2, ctas_per_sm=2)


def swiglu_fp8_for_shape(variant, shape_class: str, tuned: dict | None):
    """Per ``"<direction>/h<H class>"``: the tuned entry (measured on the vector variant: taken for
    it only; a bounded variant takes its unbounded twin's), else :func:`swiglu_fp8`."""
    from cute_kernels.swiglu import SwigluConfig

    if tuned is not None and variant.vector:
        return SwigluConfig(**tuned)
    return swiglu_fp8(variant)


# --- quantize TMA, experimental (notes/quantize-tma.md) ---
# 8-row boxes, 3 stages, TMA stores of q: 4 KB in flight per warp, 6 CTAs per SM. Not tuned: it
# is slower than the cp.async 1x32 kernel and no public op runs it.
def quantize_tma(variant):
    from cute_kernels.experimental.quantize_tma import TmaQuantizeConfig

    return TmaQuantizeConfig()


# --- grouped GEMM (notes/grouped-gemm-sm90.md) ---
# A (128, 256) tile and a 3-deep ring (144 KiB), CUTLASS's Hopper register split (40 producer / 232
# consumer registers), 2d2d boxes from 128-row multiples: chosen with `python -m bench.tune
# grouped_gemm` and `python -m bench.bench_grouped_gemm --probe` (the note's tuning section).
# Clusters of two CTAs multicasting the shared box (same bytes; measured in the note's "Clusters of
# two" section).
def grouped_gemm_sm90(variant):
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmConfig

    return GroupedGemmConfig(cluster=2)
