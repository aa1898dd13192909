"""``swizzle_scales``: PyTorch entry point of the blocked-scale kernel (``cute_kernels.swizzle``)."""

from __future__ import annotations

import torch

from . import backend as _backend
from . import checks, reference
from .kernel_cache import get_kernel

_OP = "swizzle_scales"
_TILE_ROWS, _TILE_COLS = 128, 4


def _round_up(value, multiple: int):
    return (value + multiple - 1) // multiple * multiple


def blocked_output_shape(
    scales_shape: tuple, num_groups: int | None, groups: str
) -> tuple:
    """Shape of the blocked result (SPEC section 3); works on SymInts too."""
    *lead, rows, cols = scales_shape
    padded_cols = _round_up(cols, _TILE_COLS)
    if num_groups is None:
        return (*lead, _round_up(rows, _TILE_ROWS), padded_cols)
    if groups == "M":
        return (rows + _TILE_ROWS * num_groups, padded_cols)
    return (_round_up(rows, _TILE_ROWS), cols + _TILE_COLS * num_groups)


def _layout(group_end_offsets: torch.Tensor | None, groups: str):
    from cute_kernels.swizzle import SwizzleLayout

    if group_end_offsets is None:
        return SwizzleLayout.PLAIN
    return SwizzleLayout.M_GROUPS if groups == "M" else SwizzleLayout.K_GROUPS


def _kernel(layout, arch: str):
    def build():
        from cute_kernels.swizzle import compile_swizzle

        return compile_swizzle(layout, arch)

    return get_kernel(("swizzle_scales", layout.value, arch), build)


def _run_kernel(
    scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str, arch: str
) -> torch.Tensor:
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    shape = blocked_output_shape(tuple(scales.shape), num_groups, groups)
    nbytes = 1
    for extent in shape:
        nbytes *= extent
    # The kernel writes whole 16-byte chunks: round the storage up, return a view of the exact size.
    buffer = torch.empty((_round_up(nbytes, 16) // 4,), dtype=torch.uint32, device=scales.device)
    if nbytes:
        source = scales.view(torch.uint8)
        if source.dim() == 2:
            source = source.unsqueeze(0)
        kernel = _kernel(_layout(group_end_offsets, groups), arch)
        kernel(source, buffer.view(-1, 4), group_end_offsets)
    return buffer.view(torch.uint8)[:nbytes].view(shape).view(torch.float8_e8m0fnu)


@torch.library.custom_op("cute_kernels::swizzle_scales", mutates_args=())
def _swizzle_op(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    arch = _backend.select(_OP, "cute", scales.device)
    return _run_kernel(scales, group_end_offsets, groups, arch)


@_swizzle_op.register_fake
def _swizzle_fake(scales: torch.Tensor, group_end_offsets: torch.Tensor | None, groups: str) -> torch.Tensor:
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    shape = blocked_output_shape(tuple(scales.shape), num_groups, groups)
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
