"""Blackwell (sm_100a) launch configs where they differ from Hopper's: ``name(variant) -> config``.

No Blackwell GPU has been measured. Every kernel runs the same instructions on sm_100a as on
sm_90a, so a kernel takes Hopper's config (``configs.pick`` falls back to ``sm90`` for every
function not defined here) unless the bytes-in-flight model
(``python -m cute_kernels.model``, notes/bandwidth-model.md) says that config keeps too few load
bytes in flight per SM for B200 (~62 KiB at Hopper's fitted latency, by the model); those
choices are here, each with the model's numbers at K = 7168. Hopper runs these configs too: the
GPU tests of the ops that launch them pass there under ``CUTE_KERNELS_TEST_CONFIG_ARCH=sm_100a``
(tests/conftest.py).

SwiGLU + FP8 keeps Hopper's config: forward 3 CTAs per SM x 28 KiB at H = 7168 (1.35x B200's need
on paper); the backward keeps 2 x 24 KiB (0.8x; its SwiGLU arithmetic, not its loads, is expected
to bind).
"""

from __future__ import annotations


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
