"""Blackwell (sm_100a) launch configs, one function per registered kernel: ``name(variant) -> config``.

No Blackwell GPU has been measured. Every kernel runs the same instructions on sm_100a as on
sm_90a, so a kernel takes Hopper's config (``sm90``) unless the bytes-in-flight model
(``python -m cute_kernels.model``, notes/bandwidth-model.md) says that config keeps too few load
bytes in flight per SM for B200 (~62 KiB at Hopper's fitted latency, by the model); those
choices are here, each with the model's numbers at K = 7168. Hopper runs these configs too: the
GPU tests of the ops that launch them pass there under ``CUTE_KERNELS_TEST_CONFIG_ARCH=sm_100a``
(tests/conftest.py).
"""

from __future__ import annotations

from . import sm90

quantize_1x32 = sm90.quantize_1x32
quantize_32x1 = sm90.quantize_32x1
quantize_dual = sm90.quantize_dual
pad = sm90.pad
unpad = sm90.unpad
row_scatter = sm90.row_scatter
combine_sum = sm90.combine_sum
ep_send = sm90.ep_send
ep_route = sm90.ep_route
ep_layout = sm90.ep_layout
ep_zero_fill = sm90.ep_zero_fill
quantize_tma = sm90.quantize_tma
quantize_fp8_col_amax = sm90.quantize_fp8_col_amax
quantize_fp8_col_cast = sm90.quantize_fp8_col_cast
quantize_fp8_col_amax_for_shape = sm90.quantize_fp8_col_amax_for_shape
quantize_fp8_col_cast_for_shape = sm90.quantize_fp8_col_cast_for_shape
# SwiGLU + FP8: forward 3 CTAs per SM x 28 KiB at H = 7168 (1.35x B200's need on paper); the
# backward keeps 2 x 24 KiB (0.8x; its SwiGLU arithmetic, not its loads, is expected to bind).
swiglu_fp8 = sm90.swiglu_fp8
dequantize_fp8_rows = sm90.dequantize_fp8_rows


# --- swizzle ---
# Hopper's 64-column window at 256 threads stages 8 KiB per CTA, 4 CTAs per SM: 32 KiB, 0.52 of
# B200's need. A 128-column window over 128 threads stages 16 KiB per CTA (32 words per thread) and
# still fits 4 CTAs per SM under the 128-register cap without spilling in any variant (100-126
# registers): 64 KiB per SM, 1.03x the need.
def swizzle(variant):
    from cute_kernels.swizzle import SwizzleConfig

    return SwizzleConfig(threads=128, window_cols=128, ctas_per_sm=4)


# --- FP8 rowwise, one scale per row ---
# Hopper's heuristic (a 512-thread CTA per row at K = 7168, 2048 threads per SM) keeps 14 KiB per
# CTA, 56 KiB per SM: 0.90x B200's need. 128-thread CTAs with the whole row in flight (``unroll``
# = the row's steps / 128, at most 8; the config Hopper's tuner picked at every K class) keep the same
# 14 KiB per CTA and fit ~9 CTAs per SM (52 registers, bf16): ~126 KiB per SM, ~2x the need.
def quantize_fp8_row(variant):
    return quantize_fp8_row_for_shape(variant, f"{variant.dtype}/k8192", None)


def quantize_fp8_row_for_shape(variant, shape_class: str, tuned: dict | None):
    """The row kernel per K class on sm_100a: a tuned entry (none is shipped: no Blackwell has been
    measured) for the vector variant, else a whole 128-thread CTA per row with the row in flight
    (wider CTAs past 8 steps per thread)."""
    from cute_kernels.quantize_fp8 import VECTOR, Fp8RowConfig

    if tuned is not None and variant.vector:
        return Fp8RowConfig(**tuned)
    steps = int(shape_class.rsplit("/k", 1)[1]) // (VECTOR if variant.vector else 1)
    unroll = min(max(steps // 128, 1), 8)
    threads = min(max(128, steps // unroll), 1024)
    return Fp8RowConfig(threads=threads, unroll=unroll, ctas_per_sm=1, row_per_cta=True)
