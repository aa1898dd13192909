"""``quantize_mxfp8_2d_dual``: the 1x32 and 32x1 quantizations of x from one read.

Without groups, the dual variant of the 1x32 kernel (``cute_kernels.quantize``, ``dual=True``)
writes both results in one pass. With groups (M-groups 1x32 scales, K-groups 32x1 scales) the two
single kernels run, so x is read twice.
"""

from __future__ import annotations

import torch

from . import checks, reference, targets
from .quantize import launch_1x32, run_1x32_2d, scales_shape_1x32
from .quantize_32x1 import quantize_2d_32x1_fake, run_32x1_2d, scales_shape_32x1

_OP = "quantize_mxfp8_2d_dual"
_E4M3 = torch.float8_e4m3fn
_E8M0 = torch.float8_e8m0fnu


def _run_ungrouped(
    x: torch.Tensor, mode: str, blocked: bool, target: targets.DeviceTarget
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    checks.check_kernel_inputs(_OP, None, x)
    rows, cols = x.shape
    q_r = x.new_empty((rows, cols), dtype=_E4M3)
    s_r = x.new_empty(scales_shape_1x32((rows, cols), None, blocked), dtype=_E8M0)
    q_c = x.new_empty_strided((rows, cols), (1, rows), dtype=_E4M3)
    s_c = x.new_empty(scales_shape_32x1(rows, cols, None, blocked), dtype=_E8M0)
    if rows and cols:
        layout = "blocked" if blocked else "plain"
        launch_1x32(target, layout, x, q_r, s_r, mode, qt=q_c.t(), scales_t=s_c)
    return q_r, s_r, q_c, s_c


def run_dual_2d(
    x: torch.Tensor,
    group_end_offsets: torch.Tensor | None,
    mode: str,
    blocked: bool,
    target: targets.DeviceTarget,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_1x32, scales_1x32, q_32x1, scales_32x1)`` of x (M, K), M and K multiples of 32
    (contract checks done by the caller), bit-identical to the two single calls."""
    if group_end_offsets is None:
        return _run_ungrouped(x, mode, blocked, target)
    q_r, s_r = run_1x32_2d(x, group_end_offsets, mode, blocked, target)
    q_c, s_c = run_32x1_2d(x, group_end_offsets, mode, blocked, target)
    return q_r, s_r, q_c, s_c


@torch.library.custom_op("cute_kernels::quantize_mxfp8_2d_dual", mutates_args=())
def _dual_op(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return run_dual_2d(x, group_end_offsets, scaling_mode, blocked_scales, targets.select(_OP, "cute", x))


@_dual_op.register_fake
def _dual_fake(
    x: torch.Tensor, group_end_offsets: torch.Tensor | None, scaling_mode: str, blocked_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    num_groups = None if group_end_offsets is None else group_end_offsets.shape[0]
    s_r = x.new_empty(scales_shape_1x32(x.shape, num_groups, blocked_scales), dtype=_E8M0)
    q_c, s_c = quantize_2d_32x1_fake(x, group_end_offsets, scaling_mode, blocked_scales)
    return x.new_empty(x.shape, dtype=_E4M3), s_r, q_c, s_c


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
    offsets: M-groups 1x32 scales, K-groups 32x1 scales with ``kend = end / 32``). Without groups x
    is read once (the dual kernel); with groups the two single kernels run. No host sync."""
    checks.check_quantize_2d_dual(x, group_end_offsets, scaling_mode, blocked_scales)
    target = targets.select(_OP, backend, x)
    if target is None:
        return reference.quantize_mxfp8_2d_dual(
            x, group_end_offsets=group_end_offsets, scaling_mode=scaling_mode, blocked_scales=blocked_scales
        )
    if torch.compiler.is_compiling():
        return _dual_op(x, group_end_offsets, scaling_mode, blocked_scales)
    return run_dual_2d(x, group_end_offsets, scaling_mode, blocked_scales, target)
