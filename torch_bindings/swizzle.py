"""``swizzle_scales``: PyTorch entry point of the blocked-scale kernel (``cute_kernels.swizzle``)."""

from __future__ import annotations

import torch

from . import checks, reference, targets
from .kernel_cache import get_kernel

_OP = "swizzle_scales"
_TILE_ROWS, _TILE_COLS = 128, 4


def _round_up(value, multiple: int):
    return (value + multiple - 1) // multiple * multiple


def blocked_output_shape(scales_shape: tuple, num_groups: int | None, groups: str) -> tuple:
    """Shape of the blocked result (SPEC section 3); works on SymInts too."""
    *lead, rows, cols = scales_shape
    padded_cols = _round_up(cols, _TILE_COLS)
    if num_groups is None:
        return (*lead, _round_up(rows, _TILE_ROWS), padded_cols)
    if groups == "M":
        return (rows + _TILE_ROWS * num_groups, padded_cols)
    return (_round_up(rows, _TILE_ROWS), cols + _TILE_COLS * num_groups)


_E8M0 = torch.float8_e8m0fnu
_LAYOUTS = ("plain", "plain", "m_groups", "k_groups")  # by variant // 2 (variant 1: 3-D plain)
_WIDE = 8  # key bit: the layout's 128-column-window config (cute_kernels.swizzle.wide_window)
_RAGGED = 16  # key bit: raw-word loads of a source that ends inside an aligned word
_WIDE_MAX_BYTES = 64 << 20  # cute_kernels.swizzle.WIDE_MAX_BYTES


def wide_window(rows: int, cols: int) -> bool:
    """Whether grouped (rows, cols) scales take the wide-window kernel: the host-side copy of
    ``cute_kernels.swizzle.wide_window`` (the hot path does not import the kernel modules)."""
    return cols > 64 and rows * cols <= _WIDE_MAX_BYTES


def _make_kernel(target: targets.DeviceTarget, key: int):
    """Compiled variant ``key = 2 * variant + word_loads (+ _WIDE) (+ _RAGGED)`` on ``target``;
    variant 0: 2-D plain, 1: 3-D plain, 2: M-groups, 3: K-groups."""
    layout, rank, word_loads = _LAYOUTS[(key & 7) >> 1], 3 if (key & 7) >> 1 == 1 else 2, bool(key & 1)
    wide, ragged = bool(key & _WIDE), bool(key & _RAGGED)
    arch, num_sms = target.arch, target.num_sms

    def build():
        from cute_kernels.swizzle import SwizzleLayout, compile_swizzle

        return compile_swizzle(
            SwizzleLayout(layout), arch, rank, word_loads, num_sms=num_sms, wide=wide, ragged_end=ragged
        )

    return get_kernel(("swizzle_scales", layout, rank, word_loads, wide, ragged, arch, num_sms), build)


def _run_kernel(
    scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str, target: targets.DeviceTarget
) -> torch.Tensor:
    if scales.dtype is not _E8M0:
        scales = scales.view(_E8M0)
    shape = scales.shape
    rows, cols = shape[-2], shape[-1]
    padded_cols = (cols + 3) & -4
    if group_end_offsets is None:
        variant = 0 if len(shape) == 2 else 2
        out_shape = (*shape[:-2], (rows + 127) & -128, padded_cols)  # 3-D: (E, Rp, Cp)
    else:
        checks.check_kernel_group_count(_OP, group_end_offsets)
        num_groups = group_end_offsets.shape[0]
        if groups == "M":
            variant, out_shape = 4, (rows + 128 * num_groups, padded_cols)
        else:
            variant, out_shape = 6, ((rows + 127) & -128, cols + 4 * num_groups)
    out = scales.new_empty(out_shape)
    if out_shape[0] and out_shape[-2] and out_shape[-1]:
        if variant >= 4 and wide_window(rows, cols):  # grouped layouts
            variant += _WIDE
        # Rows of whole, aligned 4-byte words (one word per tile column) stage with fewer instructions.
        if variant & 7 < 6 and not cols & 3 and not scales.data_ptr() & 3:
            variant += 1
        elif variant & 7 < 6 or rows & 3 or scales.data_ptr() & 3:
            # Raw words where the source may end inside a word, decided from the static dim (C for
            # plain and M-groups, R = K for K-groups) and the base, so M never switches kernels.
            variant += _RAGGED
        target.kernel(variant, _make_kernel)(scales, out, group_end_offsets)
    return out


@torch.library.custom_op("cute_kernels::swizzle_scales", mutates_args=())
def _swizzle_op(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    return _run_kernel(scales, group_end_offsets, groups, targets.select(_OP, "cute", scales))


@_swizzle_op.register_fake
def _swizzle_fake(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    shape = blocked_output_shape(scales.shape, num_groups, groups)
    return scales.new_empty(shape, dtype=torch.float8_e8m0fnu)


def swizzle_scales(
    scales: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    groups: str = "M",
    backend: str = "auto",
) -> torch.Tensor:
    """E8M0 scales to the blocked layout of tcgen05 / cuBLAS block-scaled GEMMs (SPEC section 3).

    ``scales``: (R, C) or (E, R, C) ``torch.float8_e8m0fnu`` (or uint8), contiguous.
    Without offsets: (Rp, Cp), or (E, Rp, Cp) with each expert blocked independently.
    ``groups="M"`` with int32 end offsets over the R rows: (R + 128 G, Cp), each group blocked from
    its own 128-row-aligned start. ``groups="K"`` with end offsets over the C scale columns:
    (Rp, C + 4 G), each group's tiles stored contiguously. Every byte not covered is 0.
    Never synchronizes with the host; the offsets' values are clamped, never trusted.
    """
    checks.check_swizzle(scales, group_end_offsets, groups)
    compiling = torch.compiler.is_compiling()
    if not compiling and (backend == "auto" or backend == "cute"):
        target = targets.known(scales)
        if target is not None:  # eager fast path: this device already runs the kernel
            return _run_kernel(scales, group_end_offsets, groups, target)
    target = targets.select(_OP, backend, scales)
    if target is None:
        return reference.swizzle_scales(scales, group_end_offsets=group_end_offsets, groups=groups)
    if compiling:
        return _swizzle_op(scales, group_end_offsets, groups)
    return _run_kernel(scales, group_end_offsets, groups, target)
