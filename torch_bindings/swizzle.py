"""``swizzle_scales``: PyTorch entry point of the blocked-scale kernel (``cute_kernels.swizzle``)."""

from __future__ import annotations

import torch

from . import backend as _backend
from . import checks, reference
from .kernel_cache import get_kernel, on_clear

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


_LAYOUT_BY_GROUPS = {None: "plain", "M": "m_groups", "K": "k_groups"}


_kernels: dict[tuple, object] = {}  # hot-path lookup in front of kernel_cache.get_kernel
on_clear(_kernels.clear)


def _kernel(layout: str, rank: int, word_loads: bool, arch: str):
    key = (layout, rank, word_loads, arch)
    kernel = _kernels.get(key)
    if kernel is None:

        def build():
            from cute_kernels.swizzle import SwizzleLayout, compile_swizzle

            return compile_swizzle(SwizzleLayout(layout), arch, rank, word_loads)

        kernel = _kernels[key] = get_kernel(("swizzle_scales", *key), build)
    return kernel


def _run_kernel(
    scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str, arch: str
) -> torch.Tensor:
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    shape = blocked_output_shape(scales.shape, num_groups, groups)
    out = torch.empty(shape, dtype=torch.float8_e8m0fnu, device=scales.device)
    if out.numel():
        if scales.dtype != torch.float8_e8m0fnu:
            scales = scales.view(torch.float8_e8m0fnu)
        layout = _LAYOUT_BY_GROUPS[None if group_end_offsets is None else groups]
        # Rows of whole, aligned 4-byte words (one word per tile column) load 4x fewer instructions.
        word_loads = (
            layout != "k_groups" and scales.shape[-1] % _TILE_COLS == 0 and scales.data_ptr() % 4 == 0
        )
        _kernel(layout, scales.dim(), word_loads, arch)(scales, out, group_end_offsets)
    return out


@torch.library.custom_op("cute_kernels::swizzle_scales", mutates_args=())
def _swizzle_op(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    arch = _backend.select(_OP, "cute", scales.device)
    return _run_kernel(scales, group_end_offsets, groups, arch)


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
    arch = _backend.select(_OP, backend, scales.device)
    if arch is None:
        return reference.swizzle_scales(scales, group_end_offsets=group_end_offsets, groups=groups)
    if torch.compiler.is_compiling():
        return _swizzle_op(scales, group_end_offsets, groups)
    return _run_kernel(scales, group_end_offsets, groups, arch)
