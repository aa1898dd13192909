"""``quantize_mxfp8_2d``: PyTorch entry point of the 1x32 quantization kernel (``cute_kernels.quantize``).

The 32x1 block (issue 6) is not built yet: it runs the reference on CPU and refuses on a GPU unless
``backend="reference"`` is passed.
"""

from __future__ import annotations

import torch

from . import backend as _backend
from . import checks, reference
from .kernel_cache import get_kernel, on_clear
from .swizzle import blocked_output_shape

_OP = "quantize_mxfp8_2d"
_MAX_GROUPS = checks.MAX_KERNEL_GROUPS
_BLOCK = 32

_kernels: dict[tuple, object] = {}  # hot-path lookup in front of kernel_cache.get_kernel
on_clear(_kernels.clear)


_SMALL_GROUPS = 64  # cute_kernels.quantize.SMALL_GROUPS: the M-groups variant with small scan arrays


def _kernel(dtype: torch.dtype, mode: str, layout: str, max_groups: int, arch: str):
    key = (dtype, mode, layout, max_groups, arch)
    kernel = _kernels.get(key)
    if kernel is None:
        dtype_name = str(dtype).removeprefix("torch.")

        def build():
            from cute_kernels.quantize import ScaleLayout, compile_quantize

            return compile_quantize(dtype_name, mode, ScaleLayout(layout), arch, max_groups=max_groups)

        cache_key = ("quantize_1x32", dtype_name, mode, layout, max_groups, arch)
        kernel = _kernels[key] = get_kernel(cache_key, build)
    return kernel


def scales_shape_1x32(x_shape: tuple, num_groups: int | None, blocked: bool) -> tuple:
    """Shape of the 1x32 scales of x (M, K): (M, K/32), blocked (Rp, Cp), M-groups (M + 128 G, Cp)."""
    rows, cols = x_shape
    if not blocked:
        return (rows, cols // _BLOCK)
    return blocked_output_shape((rows, cols // _BLOCK), num_groups, "M")


def _layout(group_end_offsets: torch.Tensor | None, blocked: bool) -> str:
    if group_end_offsets is not None:
        return "m_groups"
    return "blocked" if blocked else "plain"


def launch_1x32(
    layout: str,
    x: torch.Tensor,
    q: torch.Tensor,
    scales: torch.Tensor,
    mode: str,
    arch: str,
    group_end_offsets: torch.Tensor | None = None,
    padded_start: torch.Tensor | None = None,
    padded_end: torch.Tensor | None = None,
    group_param: int = 0,
) -> None:
    """Launch the 1x32 kernel variant ``layout`` (``cute_kernels.quantize.ScaleLayout`` value) on
    pre-allocated outputs; argument contract in ``cute_kernels.quantize.make_quantize``."""
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    max_groups = _SMALL_GROUPS if num_groups is not None and num_groups <= _SMALL_GROUPS else _MAX_GROUPS
    kernel = _kernel(x.dtype, mode, layout, max_groups, arch)
    kernel(x, q, scales, group_end_offsets, padded_start, padded_end, group_param)


def _run_kernel(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, mode: str, blocked: bool, arch: str
) -> tuple[torch.Tensor, torch.Tensor]:
    checks.check_kernel_inputs(_OP, group_end_offsets, x)
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(
        scales_shape_1x32(x.shape, num_groups, blocked), dtype=torch.float8_e8m0fnu, device=x.device
    )
    if scales.numel():
        launch_1x32(_layout(group_end_offsets, blocked), x, q, scales, mode, arch, group_end_offsets)
    return q, scales


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_1x32", mutates_args=())
def _quantize_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    arch = _backend.select(_OP, "cute", x.device)
    return _run_kernel(x, group_end_offsets, scaling_mode, blocked_scales, arch)


@_quantize_op.register_fake
def _quantize_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    q = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    return q, x.new_empty(scales_shape_1x32(x.shape, num_groups, blocked_scales), dtype=torch.float8_e8m0fnu)


def quantize_mxfp8_2d(
    x: torch.Tensor,
    *,
    block: str = "1x32",
    group_end_offsets: torch.Tensor | None = None,
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize x (M, K), bf16 or fp32, contiguous (SPEC sections 2, 3 and 5).

    ``block="1x32"`` (K % 32 == 0): q (M, K) ``float8_e4m3fn`` row-major; scales
    ``float8_e8m0fnu``: (M, K/32) with ``blocked_scales=False``, else the blocked layout (Rp, Cp),
    or with int32 row end offsets the M-groups layout (M + 128 G, Cp) for any group sizes, written
    by the quantization kernel itself. One launch, no host sync, no recompile when M or the
    offsets change.

    ``block="32x1"`` (issue 6): reference only for now (CPU, or ``backend="reference"``).
    """
    checks.check_quantize_2d(x, block, group_end_offsets, scaling_mode, blocked_scales)
    arch = _backend.select(_OP, backend, x.device)
    if arch is None:
        return reference.quantize_mxfp8_2d(
            x,
            block=block,
            group_end_offsets=group_end_offsets,
            scaling_mode=scaling_mode,
            blocked_scales=blocked_scales,
        )
    if block != "1x32":
        raise NotImplementedError(
            f"{_OP}: the CuTeDSL kernel for block='32x1' is not built yet (issue #6); "
            "pass backend='reference' to run the PyTorch reference on this device"
        )
    if torch.compiler.is_compiling():
        return _quantize_op(x, group_end_offsets, scaling_mode, blocked_scales)
    return _run_kernel(x, group_end_offsets, scaling_mode, blocked_scales, arch)
