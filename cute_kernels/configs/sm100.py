"""Blackwell (sm_100a) launch configs, one function per registered kernel: ``name(variant) -> config``.

No Blackwell GPU has been measured: every kernel takes Hopper's config (``sm90``), which runs the
same instructions on sm_100a. Where a kernel needs more bytes in flight on B200, its choice goes
here with the model that motivates it.
"""

from __future__ import annotations

from . import sm90

swizzle = sm90.swizzle
quantize_1x32 = sm90.quantize_1x32
quantize_32x1 = sm90.quantize_32x1
quantize_dual = sm90.quantize_dual
pad = sm90.pad
unpad = sm90.unpad
quantize_tma = sm90.quantize_tma
quantize_fp8_row = sm90.quantize_fp8_row
quantize_fp8_row_for_shape = sm90.quantize_fp8_row_for_shape
quantize_fp8_col_amax = sm90.quantize_fp8_col_amax
quantize_fp8_col_cast = sm90.quantize_fp8_col_cast
