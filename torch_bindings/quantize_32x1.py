"""PyTorch runners of the 32x1 quantization kernel (``cute_kernels.quantize_32x1``), 2D and 3D.

``run_32x1_2d`` serves ``quantize_mxfp8_2d(block="32x1")``, ``run_32x1_3d`` serves
``quantize_mxfp8_3d(block="32x1")``. Both allocate the outputs with the SPEC's shapes and strides
(q^T storage), check what the kernel needs beyond the contract (alignment, group count) and launch
on the current stream with no host sync. The custom ops (``cute_kernels::quantize_mxfp8_2d_32x1``,
``cute_kernels::quantize_mxfp8_3d_32x1``) have fake implementations for ``torch.compile``.
"""

from __future__ import annotations

import torch

from . import backend as _backend
from . import checks
from .kernel_cache import get_kernel, on_clear
from .swizzle import blocked_output_shape

_OP_2D = "quantize_mxfp8_2d"
_OP_3D = "quantize_mxfp8_3d"
_BLOCK = 32
_E4M3 = torch.float8_e4m3fn
_E8M0 = torch.float8_e8m0fnu

_kernels: dict[tuple, object] = {}  # hot-path lookup in front of kernel_cache.get_kernel
on_clear(_kernels.clear)


def _kernel(dtype: torch.dtype, mode: str, layout: str, arch: str):
    key = (dtype, mode, layout, arch)
    kernel = _kernels.get(key)
    if kernel is None:
        dtype_name = str(dtype).removeprefix("torch.")

        def build():
            from cute_kernels.quantize_32x1 import ScaleLayout, compile_quantize_32x1

            return compile_quantize_32x1(dtype_name, mode, ScaleLayout(layout), arch)

        kernel = _kernels[key] = get_kernel(("quantize_32x1", dtype_name, mode, layout, arch), build)
    return kernel


def scales_shape_32x1(rows: int, cols: int, num_groups: int | None, blocked: bool) -> tuple:
    """Shape of the 32x1 scales of an (M, K) matrix, S = (K, M/32): (K, M/32), blocked (Rp, Cp), or
    K-groups (Rp, M/32 + 4 G). Works on SymInts."""
    if not blocked:
        return (cols, rows // _BLOCK)
    return blocked_output_shape((cols, rows // _BLOCK), num_groups, "K")


def _launch(x3, qt3, scales3, offsets, dtype, mode: str, layout: str, arch: str) -> None:
    """Run the kernel on (E, M, K) x, (E, K, M) q^T and (E, R, C) scales."""
    kernel = _kernel(dtype, mode, layout, arch)
    kernel(x3, qt3, scales3, offsets)


def run_32x1_2d(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, mode: str, blocked: bool, arch: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """32x1 quantization of x (M, K) (contract checks done by the caller): q (M, K) with strides
    (1, M), scales E8M0 plain (K, M/32), blocked (Rp, Cp) or, with row end offsets, K-groups."""
    checks.check_kernel_inputs(_OP_2D, group_end_offsets, x)
    rows, cols = x.shape
    checks.check_divisible("x.shape[1] (K)", cols, _BLOCK, why="for the 32x1 kernel", op=_OP_2D)
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    q = torch.empty_strided((rows, cols), (1, rows), dtype=_E4M3, device=x.device)
    shape = scales_shape_32x1(rows, cols, num_groups, blocked)
    if rows == 0 or cols == 0:  # nothing to quantize: only padding bytes (zeros)
        return q, torch.zeros(shape, dtype=_E8M0, device=x.device)
    scales = torch.empty(shape, dtype=_E8M0, device=x.device)
    layout = "k_groups" if num_groups is not None else ("blocked" if blocked else "plain")
    _launch(x[None], q.t()[None], scales[None], group_end_offsets, x.dtype, mode, layout, arch)
    return q, scales


def run_32x1_3d(w: torch.Tensor, mode: str, blocked: bool, arch: str) -> tuple[torch.Tensor, torch.Tensor]:
    """32x1 quantization of expert weights w (E, N, K) along N (contract checks done by the caller):
    q (E, N, K) with strides (N*K, 1, N), scales E8M0 per expert of S = (K, N/32): plain (E, K, N/32)
    or blocked (E, Rp, Cp) with every padding byte 0."""
    checks.check_kernel_inputs(_OP_3D, None, w)
    experts, rows, cols = w.shape
    q = torch.empty_strided((experts, rows, cols), (rows * cols, 1, rows), dtype=_E4M3, device=w.device)
    shape = (experts, *scales_shape_32x1(rows, cols, None, blocked))
    if experts == 0 or rows == 0 or cols == 0:
        return q, torch.zeros(shape, dtype=_E8M0, device=w.device)
    scales = torch.empty(shape, dtype=_E8M0, device=w.device)
    _launch(w, q.transpose(1, 2), scales, None, w.dtype, mode, "blocked" if blocked else "plain", arch)
    return q, scales


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_32x1", mutates_args=())
def quantize_2d_32x1_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Custom op of ``quantize_mxfp8_2d(block="32x1")`` on the kernel path (torch.compile)."""
    arch = _backend.select(_OP_2D, "cute", x.device)
    return run_32x1_2d(x, group_end_offsets, scaling_mode, blocked_scales, arch)


@quantize_2d_32x1_op.register_fake
def _quantize_2d_32x1_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    q = x.new_empty_strided((rows, cols), (1, rows), dtype=_E4M3)
    return q, x.new_empty(scales_shape_32x1(rows, cols, num_groups, blocked_scales), dtype=_E8M0)


_OP_DUAL = "quantize_mxfp8_2d_dual"


def run_dual_2d(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, mode: str, blocked: bool, arch: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """1x32 and 32x1 quantization of x (M, K) (contract checks done by the caller):
    ``(q_1x32, scales_1x32, q_32x1, scales_32x1)``, bit-identical to the two single calls.

    Without groups, one read of x: the dual variant of the 1x32 kernel. With groups (M-groups 1x32
    scales, K-groups 32x1 scales) the two single kernels run (x is read twice).
    """
    from . import targets
    from .quantize import run_1x32_2d, run_dual_2d_ungrouped

    target = targets.target(x.device, arch)
    if group_end_offsets is None:
        return run_dual_2d_ungrouped(x, mode, blocked, target)
    q_r, s_r = run_1x32_2d(x, group_end_offsets, mode, blocked, target)
    q_c, s_c = run_32x1_2d(x, group_end_offsets, mode, blocked, arch)
    return q_r, s_r, q_c, s_c


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_dual", mutates_args=())
def quantize_dual_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Custom op of ``quantize_mxfp8_2d_dual`` on the kernel path (torch.compile)."""
    arch = _backend.select(_OP_DUAL, "cute", x.device)
    return run_dual_2d(x, group_end_offsets, scaling_mode, blocked_scales, arch)


@quantize_dual_op.register_fake
def _quantize_dual_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from .quantize import scales_shape_1x32  # (quantize imports this module)

    rows, cols = x.shape
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    s_r = x.new_empty(scales_shape_1x32((rows, cols), num_groups, blocked_scales), dtype=_E8M0)
    q_c, s_c = _quantize_2d_32x1_fake(x, group_end_offsets, scaling_mode, blocked_scales)
    return x.new_empty((rows, cols), dtype=_E4M3), s_r, q_c, s_c


def quantize_mxfp8_2d_dual(
    x: torch.Tensor,
    *,
    group_end_offsets: torch.Tensor | None = None,
    scaling_mode: str = "rceil",
    blocked_scales: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_1x32, scales_1x32, q_32x1, scales_32x1)`` of x (M, K), bf16/fp32, M and K multiples of
    32: bit-identical to ``quantize_mxfp8_2d`` with ``block="1x32"`` and ``block="32x1"`` (same
    offsets: M-groups 1x32 scales, K-groups 32x1 scales with ``kend = end / 32``). Without
    groups x is read once (the dual kernel); with groups the two single kernels run. No host sync."""
    checks.check_quantize_2d_dual(x, group_end_offsets, scaling_mode, blocked_scales)
    arch = _backend.select(_OP_DUAL, backend, x.device)
    if arch is None:
        from . import reference

        return reference.quantize_mxfp8_2d_dual(
            x, group_end_offsets=group_end_offsets, scaling_mode=scaling_mode, blocked_scales=blocked_scales
        )
    if torch.compiler.is_compiling():
        return quantize_dual_op(x, group_end_offsets, scaling_mode, blocked_scales)
    return run_dual_2d(x, group_end_offsets, scaling_mode, blocked_scales, arch)
